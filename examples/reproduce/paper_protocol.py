"""The paper's benchmark protocol on swap-S5 (symbolic prompts): train d ≤ 32, test d = 32 … 1,024 on 1,024 fresh
sequences per length with the stop rule, one row per (method, seed), mean ± sd over seeds.

    python examples/reproduce/paper_protocol.py --row recipe_halting --seed 0   # train (or resume) + evaluate
    python examples/reproduce/paper_protocol.py --row lstm --seed 0             # LSTM baseline (baselines/rnn.py)
    python examples/reproduce/paper_protocol.py --evaluate recipe_halting --seed 0   # re-evaluate a trained run
    python examples/reproduce/paper_protocol.py --long lstm --seed 0            # past the protocol: d = 2,048, 4,096
    python examples/reproduce/paper_protocol.py --in_range full_view --seed 0   # add in-range accuracy to a record
    python examples/reproduce/paper_protocol.py --collect                       # table.md, README.md, plot
    python examples/reproduce/paper_protocol.py --export recipe_halting --seed 0     # checkpoints/par-swap-s5-small
    python examples/reproduce/paper_protocol.py --protocol s5 --row self_distill --seed 0   # S5 / A5: train d ≤ 16
    python examples/reproduce/paper_protocol.py --protocol s5 --row recipe_then_halting --seed 0   # after --row recipe

Two-stage rows (`init_from`) fine-tune the same seed's trained parent row (`--init_from_par`); their record keeps both
training times (`train_seconds`, `train_seconds_total`) and the table shows both step counts.

PAR rows are `examples/train_par.py` with the protocol's common flags (`common_par`) and the row's over them (written
out explicitly, whatever the defaults), one torch thread each (two rows share this machine's 2 cores). They save a
checkpoint every `save_steps` steps; running the same command again after an interruption resumes from the newest one
(`--resume_from_checkpoint`), and the row's training budget (`--max_train_seconds`) counts every segment
(trainers.TimeBudgetCallback keeps the time trained in the checkpoint). Each segment's wall time is kept in the run
folder (segments.json) and in the row's JSON.

Test (every row, every seed): `state_tracking.evaluate_until_failed` on the grid, n sequences per depth drawn by
`evaluation.draw_test_problems` (seeded by the row's seed, apart from training data; the RNN rows score the same
problems), two consecutive depths under 2% end a grid; PAR rows at forced depth (R = d) and, when trained to halt,
with learned halting (the model stops at the first iteration R whose P(Yes) is above the threshold at R and at 6 of
the 8 iterations R..R+7: modeling_par.halt_iteration), plus the progress profile and padding control on d = 64 and
128 prompts (256 sequences). Depths a seed did not reach count as 0 in the mean (two shorter ones were < 2%).

Writes results/paper_protocol_cpu/runs/<row>_s<seed>.json (commands, seed, steps, segments and wall times, curve,
accuracy per depth, profiles, machine), table.md, README.md and accuracy_vs_depth.png.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from par_cli.flag_values import true_or_false  # noqa: E402
from par_studies import (
    FULL,
    HALTING,
    LOCAL,
    MASTERY,
    REPO,
    SELF_DISTILL,
    Preset,
    Row,
    argv,
    combine,
    curriculum_growth,
    load_run,
    protocol_tables,
    repo_module,
    row_train_seconds,
    rows_by_name,
    run_logged,
    save_record,
    train_segment,
    write_shipped_summary,
)

PAPER = [  # the paper's reported rows (Qwen2.5-0.5B retrofit, train d ≤ 32; its own report, not reproduced)
    ("Transformer (cited from RLT)", "—", "0.85 ± 0.30", "6"),
    ("RLT (cited)", "97.3 ± 2.8", "55.7 ± 25.8", "6"),
    ("explicit CoT, same backbone", "0.8", "0.8", "—"),
    ("PAR", "99.5 ± 1.2", "95.5 ± 11.0", "6"),
    ("PAR + learned halting", "98.7 ± 3.1", "92.9 ± 16.2", "6"),
]


@dataclass(frozen=True)
class Protocol:
    """One group's protocol: the task, the training range, the test grid (n fresh sequences per depth), the profile and
    in-range depths, the grid past the protocol (`--long`), where runs and results go, the paper's reported rows, and
    the rows it runs (None: every row). Every row trains `steps` steps of 64 with the depth curriculum d_max =
    min(train_max_depth, curriculum_start + ⌊t / curriculum_every⌋) (the default pace, +1 every 100 steps, would reach
    d ≤ 32 only at step 3,000) and saves a checkpoint every `save_steps` steps."""

    task: str
    label: str
    train_max_depth: int
    grid: list[int]
    profile_depths: list[int]
    in_range_depths: list[int]  # inside training: did the row learn what it saw?
    long_grid: list[int]  # --long: past the protocol, where its longest depth is saturated
    out: Path
    run_dir: Path
    paper: list[tuple[str, str, str, str]]
    rows: tuple[str, ...] | None = None
    n: int = 1024
    steps: int = 2000
    save_steps: int = 250
    curriculum_start: int = 2
    curriculum_every: int = 25
    profile_n: int = 256
    in_range_n: int = 256
    long_n: int = 256
    long_batch: int = 16  # the prelude's (b, t, t) attention at t ≈ 4,100 bounds the batch on this machine


def group_protocol(task: str, label: str, paper: list[tuple[str, str, str, str]]) -> Protocol:
    """`--protocol s5 / a5`: the paper's other groups (S5: any of the 120 permutations per step; A5: 3-cycles), train
    d ≤ 16, test 1× … 16×; the same evaluator, stop rule and curriculum pace (d_max reaches 16 at step 350)."""
    return Protocol(task=task, label=label, train_max_depth=16, grid=[16, 32, 64, 128, 256], profile_depths=[32, 64],
                    in_range_depths=[4, 8, 12, 16], long_grid=[512, 1024], out=REPO / "results" / "s5_a5_cpu" / task,
                    run_dir=REPO / "runs" / f"paper_protocol_{task}", paper=paper, rows=(
                        "recipe_halting", "recipe", "recipe_mastery", "recipe_mastery_nostop", "recipe_then_halting",
                        "self_distill", "self_distill_mastery", "self_distill_mastery_more",
                        "self_distill_mastery_more_stop", "self_distill_mastery_more_decay",
                        "self_distill_mastery_3e-4", "self_distill_mastery_cosine", "lstm", "gru"))


PROTOCOLS = {
    # swap-S5, the default: d_max reaches 32 at step 750, then 1,250 steps over d ~ U{1..32}
    "swap_s5": Protocol(task="swap_s5", label="swap-S5", train_max_depth=32, grid=[32, 64, 128, 256, 512, 1024],
                        profile_depths=[64, 128], in_range_depths=[4, 8, 16, 24, 32], long_grid=[2048, 4096],
                        out=REPO / "results" / "paper_protocol_cpu", run_dir=REPO / "runs" / "paper_protocol",
                        paper=PAPER),
    "s5": group_protocol("s5", "S5", [("PAR + label-free prefix self-distillation (S5, G ≥ 16)", "—", "85", "—")]),
    "a5": group_protocol("a5", "A5", []),
}


@dataclass(frozen=True)
class ProtocolRow(Row):
    """A PAR row of the protocol. probe_in_range: probe d = train_max_depth (256 fixed sequences) at every save, and
    stop once two probes in a row are 99% right unless early_stop=False; resume_curriculum: a two-stage row whose
    mastery curriculum starts at its parent's last d_max instead of d ≤ 2."""

    probe_in_range: bool = False
    early_stop: bool = True
    resume_curriculum: bool = False


# Label-free with the mastery curriculum, at a constant rate after warm-up: with a budget or an early stop a run's
# length is not known in advance, and a cosine over max_steps may run out while d_max still grows.
LABEL_FREE_MASTERY = (LOCAL, SELF_DISTILL, MASTERY)
CONSTANT_RATE = Preset("constant rate after warm-up, at most 20,000 steps",
                       {"--max_steps": "20000", "--lr_scheduler_type": "constant_with_warmup"})
RATE_3E4 = Preset("rate 3e-4", {"--learning_rate": "3e-4", "--adapter_learning_rate": "6e-4"})
# The label-free second stage: the same seed's trained self_distill_mastery model, a fresh optimizer and warm-up, the
# mastery curriculum resumed where the parent's ended, at rate 3e-4, at most 1 h (both stages: at most 2 h).
SECOND_STAGE = dict(budget=3600, probe_in_range=True, init_from="self_distill_mastery", resume_curriculum=True)

ROWS = rows_by_name(
    ProtocolRow.of("recipe_halting", "PAR recipe (local view) + halting labels", LOCAL, HALTING, budget=3600),
    Row.of("lstm", "LSTM, hidden 288 (≈ PAR's parameters)", {"--cell": "lstm", "--hidden": "288"}, kind="rnn"),
    Row.of("gru", "GRU, hidden 336 (≈ PAR's parameters)", {"--cell": "gru", "--hidden": "336"}, kind="rnn"),
    ProtocolRow.of("full_view", "PAR, paper's setting (full view), no stretch", FULL, {"--grad_window": "16"},
                   budget=3 * 3600),
    ProtocolRow.of("full_view_stretch", "PAR, paper's setting (full view) + stretch phase", FULL,
                   {"--grad_window": "16", "--stretch_steps": "500", "--stretch_max_scale": "8"}, budget=3 * 3600),
    ProtocolRow.of("self_distill", "PAR recipe (local view), label-free prefix self-distillation", LOCAL, SELF_DISTILL,
                   budget=3600),
    # Two stages: is halting learned as a fine-tune of the trained forced-depth row (the tail + halting loss added to a
    # trained model, as the paper adds halting), where from scratch it may not be (results/s5_a5_cpu/study)?
    ProtocolRow.of("recipe", "PAR recipe (local view), step labels", LOCAL, budget=3600),
    # Does the recipe learn the group at d ≤ 16 when d_max grows with mastery instead of the protocol's pace?
    ProtocolRow.of("recipe_mastery", "PAR recipe (local view), step labels, mastery curriculum", LOCAL, MASTERY,
                   {"--max_steps": "10000"}, budget=3600, probe_in_range=True),
    # What does the in-range early stop cost? The same row over the whole cosine schedule (10,000 steps or 1 h).
    ProtocolRow.of("recipe_mastery_nostop", "PAR recipe (local view), step labels, mastery curriculum, no early stop",
                   LOCAL, MASTERY, {"--max_steps": "10000"}, budget=3600, probe_in_range=True, early_stop=False),
    ProtocolRow.of("recipe_then_halting", "PAR recipe (mastery curriculum), then halting labels as a 1,000-step "
                   "fine-tune", LOCAL, HALTING, RATE_3E4, {"--max_steps": "1000", "--warmup_steps": "50"},
                   budget=3600, init_from="recipe_mastery"),
    # Label-free with the mastery curriculum: from d ≤ 2, at most 20,000 steps or 1 h, stopped once two probes in a row
    # (d = train_max_depth, 256 fixed sequences, 250 steps apart) are 99% right.
    ProtocolRow.of("self_distill_mastery", "PAR recipe (local view), label-free prefix self-distillation, mastery "
                   "curriculum", *LABEL_FREE_MASTERY, CONSTANT_RATE, budget=3600, probe_in_range=True),
    # Its second 20,000 steps at rate 3e-4 (is the lower rate stable where 1e-3 was not?), no early stop.
    ProtocolRow.of("self_distill_mastery_more", "PAR recipe (local view), label-free prefix self-distillation, mastery "
                   "curriculum, 20,000 steps + 20,000 at rate 3e-4", *LABEL_FREE_MASTERY, CONSTANT_RATE, RATE_3E4,
                   early_stop=False, **SECOND_STAGE),
    # The same second stage with the in-range early stop.
    ProtocolRow.of("self_distill_mastery_more_stop", "PAR recipe (local view), label-free prefix self-distillation, "
                   "mastery curriculum, 20,000 steps + up to 20,000 at rate 3e-4 with the in-range early stop",
                   *LABEL_FREE_MASTERY, CONSTANT_RATE, RATE_3E4, **SECOND_STAGE),
    # The same second stage at a rate decaying to 0 (cosine over 6,000 steps), no early stop: does training on past
    # mastery while the rate falls keep the step?
    ProtocolRow.of("self_distill_mastery_more_decay", "PAR recipe (local view), label-free prefix self-distillation, "
                   "mastery curriculum, 20,000 steps + 6,000 at rate 3e-4 cosine-decayed to 0", *LABEL_FREE_MASTERY,
                   RATE_3E4, {"--max_steps": "6000", "--lr_scheduler_type": "cosine"}, early_stop=False,
                   **SECOND_STAGE),
    # One stage at the second stage's rate from scratch: is the first stage at 1e-3 needed at all?
    ProtocolRow.of("self_distill_mastery_3e-4", "PAR recipe (local view), label-free prefix self-distillation, mastery "
                   "curriculum, one stage at rate 3e-4", *LABEL_FREE_MASTERY, CONSTANT_RATE, RATE_3E4, budget=3600,
                   probe_in_range=True),
    # The mastery curriculum under a cosine rate over 10,000 steps: does the rate last until d_max reaches the range?
    ProtocolRow.of("self_distill_mastery_cosine", "PAR recipe (local view), label-free prefix self-distillation, "
                   "mastery curriculum, cosine over 10,000 steps", *LABEL_FREE_MASTERY, {"--max_steps": "10000"},
                   budget=3600, probe_in_range=True),
    # The paper's sample count: 6,250 steps x 64 = 400k sequences (the rows above see 128k). The sample count defines
    # the row, so its cap (5 h) lies above the ~3.5 h that 6,250 steps take on one thread.
    ProtocolRow.of("full_view_400k", "PAR, paper's setting (full view), no stretch, 400k samples", FULL,
                   {"--grad_window": "16", "--max_steps": "6250"}, budget=5 * 3600),
)


def rows_of(p: Protocol) -> list[str]:
    return list(p.rows or ROWS)


def common_par(p: Protocol) -> dict[str, str]:
    """train_par.py flags every PAR row shares (the row's flags go over them)."""
    return {
        "--task": p.task, "--max_train_depth": str(p.train_max_depth),
        "--curriculum_start_depth": str(p.curriculum_start), "--curriculum_every_steps": str(p.curriculum_every),
        "--max_steps": str(p.steps), "--hidden_size": "128", "--intermediate_size": "256",
        "--num_attention_heads": "4", "--num_key_value_heads": "4", "--prelude_layers": "1", "--core_layers": "2",
        "--coda_layers": "1", "--per_device_train_batch_size": "64", "--learning_rate": "1e-3",
        "--adapter_learning_rate": "2e-3", "--warmup_steps": "100", "--lr_scheduler_type": "cosine",
        "--weight_decay": "0.01",
        # train_par's own quick check; the protocol's evaluation follows
        "--eval_depths": str(p.train_max_depth), "--eval_n": "64",
        "--logging_steps": "50", "--disable_tqdm": "true", "--report_to": "none", "--save_strategy": "steps",
        "--save_steps": str(p.save_steps), "--save_total_limit": "1",
    }


def common_rnn(p: Protocol, depths: list[int] | None = None, n: int | None = None) -> dict[str, str]:
    """examples/baselines/rnn.py flags every RNN row shares: the same data, curriculum, steps, batch and test (the
    grid × n unless given)."""
    return {"--task": p.task, "--max_train_depth": str(p.train_max_depth),
            "--curriculum_start_depth": str(p.curriculum_start), "--curriculum_every_steps": str(p.curriculum_every),
            "--max_steps": str(p.steps), "--batch_size": "64", "--learning_rate": "1e-3", "--logging_steps": "100",
            "--eval_depths": ",".join(map(str, depths or p.grid)), "--eval_n": str(n or p.n)}


def run_path(p: Protocol, row: str, seed: int) -> Path:
    return p.run_dir / f"{row}_s{seed}"


def record_path(p: Protocol, row: str, seed: int) -> Path:
    return p.out / "runs" / f"{row}_s{seed}.json"


def train_flags(p: Protocol, row: str, seed: int) -> dict[str, str]:
    """A PAR row's train_par.py flags after --output_dir and --seed: the common flags, the row's over them with its
    budget, probe and parent (each once)."""
    spec = ROWS[row]
    return {**common_par(p), **combine(row, {"--max_train_seconds": str(spec.budget)}, spec.flags,
                                       probe_flags(p, row), parent_flags(p, row, seed))}


def parent_flags(p: Protocol, row: str, seed: int) -> dict[str, str]:
    """`--init_from_par <the trained parent row>` for a row with `init_from` (its parent must be trained: summary.json),
    with its resumed curriculum; else nothing."""
    parent = ROWS[row].init_from
    if parent is None:
        return {}
    folder = run_path(p, parent, seed)
    if not (folder / "summary.json").is_file():
        raise SystemExit(f"{row} fine-tunes the trained {parent} row: run --row {parent} --seed {seed} first "
                         f"({folder} has no summary.json)")
    from state_tracking.evaluation import repo_relative

    return {"--init_from_par": repo_relative(folder), **resumed_curriculum_flags(p, row, seed)}


def resumed_curriculum_flags(p: Protocol, row: str, seed: int) -> dict[str, str]:
    """`--curriculum_start_depth <the parent's last d_max>` for a two-stage row with `resume_curriculum` (its mastery
    curriculum goes on where the parent's ended instead of from d ≤ 2 again), else nothing."""
    if not getattr(ROWS[row], "resume_curriculum", False):
        return {}
    parent = ROWS[row].init_from
    start = curriculum_of(p, parent, run_path(p, parent, seed), seed)
    if start.get("growth_steps") is None:
        raise SystemExit(f"{row} resumes the mastery curriculum of {parent} seed {seed}, whose newest checkpoint has "
                         "no curriculum state")
    return {"--curriculum_start_depth": str(min(p.train_max_depth, start["start"] + len(start["growth_steps"])))}


def probe_flags(p: Protocol, row: str) -> dict[str, str]:
    """A row with `probe_in_range`: the in-range probe (d = train_max_depth, 256 fixed sequences every save) and,
    unless `early_stop=False`, its early stop (two probes in a row at 99%)."""
    spec = ROWS[row]
    if not getattr(spec, "probe_in_range", False):
        return {}
    probe = {"--probe_depth": str(p.train_max_depth), "--probe_n": "256", "--probe_every_steps": str(p.save_steps)}
    return {**probe, **({"--probe_stop_accuracy": "0.99", "--probe_stop_patience": "2"} if spec.early_stop else {})}


def train_par(p: Protocol, row: str, seed: int) -> list[dict]:
    """Train (or resume) a PAR row; returns its segments."""
    return train_segment(run_path(p, row, seed), seed, train_flags(p, row, seed), row)


def curriculum_of(p: Protocol, row: str, folder: Path, seed: int) -> dict:
    """The depth curriculum a PAR row trained with: the fixed pace, or the mastery rule and its growth steps (from
    the newest checkpoint's curriculum_state.json; a `resume_curriculum` row starts where its parent's ended)."""
    flags = {**common_par(p), **ROWS[row].flags, **resumed_curriculum_flags(p, row, seed)}
    start, every = int(flags["--curriculum_start_depth"]), int(flags["--curriculum_every_steps"])
    if "--curriculum_advance_accuracy" not in flags:
        return {"start": start, "every_steps": every,
                f"reaches_{p.train_max_depth}_at_step": every * (p.train_max_depth - start)}
    return {"start": start, "mastery_accuracy": float(flags["--curriculum_advance_accuracy"]),
            "window_steps": int(flags["--curriculum_window"]), "min_steps_between": every,
            "growth_steps": curriculum_growth(folder)}


def parent_train_seconds(p: Protocol, row: str, seed: int) -> float:
    """Training seconds of the row a two-stage row starts from (0 for a one-stage row)."""
    parent = ROWS[row].init_from
    if parent is None:
        return 0.0
    segments = json.loads((run_path(p, parent, seed) / "segments.json").read_text())
    return row_train_seconds(segments) + parent_train_seconds(p, parent, seed)


def in_range_of(p: Protocol, model, tokenizer, task, seed: int) -> dict:
    """Accuracy inside the training range (forced depth, in_range_n sequences per in-range depth)."""
    from state_tracking import evaluate_length_generalization

    result = evaluate_length_generalization(model, tokenizer, task, p.in_range_depths, n_per_depth=p.in_range_n,
                                            seed=seed, progress=False)
    return {k: result[k] for k in ("depths", "accuracy", "n_per_depth", "seed")}


def add_in_range(p: Protocol, row: str, seed: int) -> dict:
    """--in_range: add the in-range accuracy to a row's record measured before it was part of the evaluation."""
    import torch

    torch.set_num_threads(1)
    record = json.loads(record_path(p, row, seed).read_text())
    model, tokenizer, task = load_run(run_path(p, row, seed), max(p.in_range_depths))
    record["in_range"] = in_range_of(p, model, tokenizer, task, seed)
    print(f"{row} seed {seed} in range: " + " ".join(
        f"d={d}:{100 * a:.1f}" for d, a in zip(record["in_range"]["depths"], record["in_range"]["accuracy"])))
    save(p, record)
    return record


def padding_control(p: Protocol, model, tokenizer, task, common: dict) -> dict:
    """The padding control (train_max_depth real operations, then identity operations) on the profile depths, or
    {"skipped": why} for a task without an identity operation (A5: every operation is a 3-cycle)."""
    from state_tracking import progress_profile
    from state_tracking.diagnostics import identity_operation

    try:
        identity_operation(task)
    except ValueError as error:
        return {"skipped": str(error)}
    return progress_profile(model, tokenizer, task, p.profile_depths, padding_control_depth=p.train_max_depth, **common)


def evaluate_par(p: Protocol, row: str, seed: int, segments: list[dict]) -> dict:
    import torch

    from state_tracking import evaluate_until_failed, progress_profile

    torch.set_num_threads(1)
    spec, folder = ROWS[row], run_path(p, row, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, task = load_run(folder, p.grid[-1])
    evaluation, eval_seconds = {}, {}
    for mode in ["forced"] + (["halting"] if spec.halting else []):
        started = time.time()
        result = evaluate_until_failed(model, tokenizer, task, p.grid, mode=mode, train_max_depth=p.train_max_depth,
                                       n_per_depth=p.n, seed=seed, progress=False)
        eval_seconds[mode] = round(time.time() - started, 1)
        evaluation[mode] = {k: result[k] for k in ("depths", "accuracy", "d50", "extrapolation_factor", "per_depth",
                                                   "stopped_early", "n_per_depth", "seed")}
        print(f"{row} seed {seed} {mode}: " + " ".join(
            f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
    in_range = in_range_of(p, model, tokenizer, task, seed)
    common = dict(n_per_depth=p.profile_n, seed=seed)
    profile = progress_profile(model, tokenizer, task, p.profile_depths, **common)
    control = padding_control(p, model, tokenizer, task, common)
    return dict(
        row=row, kind="par", label=spec.label, seed=seed, flags=dict(spec.flags),
        command=f"python examples/reproduce/paper_protocol.py --row {row} --seed {seed}",
        train_commands=[s["command"] for s in segments], segments=segments,
        steps=summary["steps"], samples_seen=summary["samples_seen"],
        train_seconds=row_train_seconds(segments), init_from=spec.init_from,
        train_seconds_total=round(row_train_seconds(segments) + parent_train_seconds(p, row, seed), 1),
        budget_seconds=spec.budget, curriculum=curriculum_of(p, row, folder, seed),
        probe=summary.get("probe"), probe_stopped_at=summary.get("probe_stopped_at"),
        curve=summary.get("curve"), evaluation=evaluation, eval_seconds=eval_seconds, in_range=in_range,
        profile=profile, padding_control=control, environment=result["environment"],
        parameters=sum(t.numel() for t in model.parameters()),
    )


def run_rnn(p: Protocol, row: str, seed: int, depths: list[int], n: int, name: str,
            extra: dict[str, str] | None = None) -> tuple[dict, str]:
    """Train an RNN row with examples/baselines/rnn.py (the common flags and the row's, scored on `depths` × `n`),
    logged to <run>/<name>.log; returns (its results JSON, the command)."""
    folder = run_path(p, row, seed)
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f"{name}.json"
    from state_tracking.evaluation import repo_relative

    command = ["python", ROWS[row].script, *argv({"--seed": str(seed), **common_rnn(p, depths, n), **combine(
        row, ROWS[row].flags, extra or {}, {"--results_json": repo_relative(raw)})})]
    run_logged(command, folder / f"{name}.log")
    return json.loads(raw.read_text()), " ".join(command)


def train_and_evaluate_rnn(p: Protocol, row: str, seed: int) -> dict:
    started = time.time()
    result, command = run_rnn(p, row, seed, p.grid, p.n, "rnn")
    from state_tracking import extrapolation_factor, longest_accurate_depth

    forced = {"depths": result["depths"], "accuracy": result["accuracy"],
              "d50": longest_accurate_depth(result["depths"], result["accuracy"]),
              "extrapolation_factor": extrapolation_factor(result["depths"], result["accuracy"], p.train_max_depth),
              "per_depth": result["per_depth"], "stopped_early": len(result["depths"]) < len(p.grid),
              "n_per_depth": p.n, "seed": seed}
    return dict(row=row, kind="rnn", label=ROWS[row].label, seed=seed, flags=dict(ROWS[row].flags),
                command=f"python examples/reproduce/paper_protocol.py --row {row} --seed {seed}",
                train_commands=[command], steps=result["steps"],
                samples_seen=result["steps"] * result["batch_size"], train_seconds=result["train_seconds"],
                wall_seconds=round(time.time() - started, 1), curriculum=result["curriculum"], curve=result["curve"],
                evaluation={"forced": forced}, eval_seconds={"forced": result["eval_seconds"]},
                parameters=result["parameters"], environment={"machine": result["machine"], "date": result["date"]})


def evaluate_long(p: Protocol, row: str, seed: int) -> dict:
    """Past the protocol: forced depth on the long grid, long_n fresh sequences (the stop rule applies). A PAR row is
    read from its saved model; an RNN row (rnn.py saves no weights) is trained again with the row's command — the
    same seed and data, one thread — and scored on the long grid. Writes <out>/long/<row>_s<seed>.json."""
    started = time.time()
    if ROWS[row].kind == "rnn":
        result, how = run_rnn(p, row, seed, p.long_grid, p.long_n, "rnn_long",
                              {"--eval_batch_size": str(p.long_batch)})
        evaluation = {"depths": result["depths"], "accuracy": result["accuracy"], "n_per_depth": p.long_n}
    else:
        import torch

        from state_tracking import evaluate_until_failed
        from state_tracking.evaluation import repo_relative

        torch.set_num_threads(1)
        folder = run_path(p, row, seed)
        model, tokenizer, task = load_run(folder, p.long_grid[-1])
        result = evaluate_until_failed(model, tokenizer, task, p.long_grid, mode="forced",
                                       train_max_depth=p.train_max_depth, n_per_depth=p.long_n, seed=seed,
                                       batch_size=p.long_batch, progress=False)
        evaluation = {k: result[k] for k in ("depths", "accuracy", "n_per_depth", "per_depth")}
        how = f"the saved model of {repo_relative(folder)}"
    record = dict(row=row, seed=seed, label=ROWS[row].label, mode="forced", model=how, evaluation=evaluation,
                  command=f"python examples/reproduce/paper_protocol.py --long {row} --seed {seed}",
                  wall_seconds=round(time.time() - started, 1))
    save_record(record, p.out / "long" / f"{row}_s{seed}.json")
    print(f"{row} seed {seed} past the protocol: " + " ".join(
        f"d={d}:{100 * a:.2f}" for d, a in zip(evaluation["depths"], evaluation["accuracy"])), flush=True)
    return record


def save(p: Protocol, record: dict) -> None:
    save_record(record, record_path(p, record["row"], record["seed"]))


def collect(p: Protocol) -> None:
    """--collect: table.md, the README's tables and the plot from the saved records (par_studies.protocol_tables)."""
    protocol_tables.collect(p, ROWS, record_path)


def export(p: Protocol, row: str, seed: int, target: Path | None = None) -> Path:
    """Ship a trained PAR row as checkpoints/par-swap-s5-small: bf16 weights, remote code, tokenizer, task, a card
    with this run's accuracy (forced and halting, n sequences per depth), halting iterations and training curve,
    and training_summary.json."""
    import shutil

    from state_tracking.evaluation import repo_relative

    hub = repo_module("examples.push_to_hub")
    record = json.loads(record_path(p, row, seed).read_text())
    target = target or REPO / "checkpoints" / "par-swap-s5-small"
    forced, halting = record["evaluation"]["forced"], record["evaluation"].get("halting")
    rows = {hub.MODE_LABELS["forced"]: forced["accuracy"]}
    if halting:
        rows[hub.MODE_LABELS["halting"]] = halting["accuracy"]
    intro = (f"Row `{row}` (seed {seed}) of the paper-protocol reproduction (`examples/reproduce/paper_protocol.py`, "
             f"`results/paper_protocol_cpu/` in the package repository): {record['label']}. Trained on swap-S5, "
             f"d ≤ {p.train_max_depth}, {record['steps']} steps of 64 ({record['train_seconds']:.0f} s on one CPU "
             f"thread).\n\nOverall state accuracy (%, all five boxes right) on {p.n} fresh sequences per depth, "
             f"ordinary positions; under the local view learned halting stops at R = d + 1, the first iteration "
             f"whose window holds no operation (the operation boundaries are an input):")
    card = p.out / "runs" / f"{row}_s{seed}_card.md"
    card.write_text(hub.results_section(intro, p.grid, rows, (halting or {}).get("per_depth"), record["curve"]))
    if target.exists():
        shutil.rmtree(target)
    try:
        hub.export_for_hub(
            run_path(p, row, seed), target, repo_id="par-swap-s5-small", dtype="bfloat16", results=card,
            training_data=(f"swap-S5 word problems (identity start, symbolic prompts), depths 1..{p.train_max_depth} "
                           f"with a depth curriculum (d_max = min(32, 2 + ⌊step / 25⌋)); {record['samples_seen']:,} "
                           f"samples in {record['steps']} steps, from scratch."),
            limits="A from-scratch CPU-scale model (0.7M parameters) for swap-S5 symbolic prompts only.",
            measured={"depths": p.grid, "rows": rows, "train_max_depth": p.train_max_depth, "n_sequences": p.n},
            rendering="symbolic", learned_halting=ROWS[row].halting,
        )
    finally:
        card.unlink()
    summary = {"row": row, "label": record["label"], "seed": seed, "steps": record["steps"],
               "samples_seen": record["samples_seen"], "train_seconds": record["train_seconds"],
               "max_train_depth": p.train_max_depth, "curriculum": record["curriculum"], "command": record["command"],
               "train_commands": record["train_commands"], "n_per_depth": p.n, "depths": forced["depths"],
               "accuracy": forced["accuracy"], "d50": forced["d50"], "G": forced["extrapolation_factor"],
               "halting": None if not halting else {k: halting[k] for k in ("depths", "accuracy", "d50")},
               "results": repo_relative(record_path(p, row, seed)), "curve": record["curve"]}
    write_shipped_summary(target, summary)
    print(f"exported {row} seed {seed} to {repo_relative(target)}")
    return target


def main(argv=None) -> None:
    par_rows = sorted(r for r in ROWS if ROWS[r].kind == "par")
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--row", choices=sorted(ROWS), help="train (or resume) and evaluate this row")
    action.add_argument("--evaluate", choices=par_rows, help="evaluate a trained PAR row again")
    action.add_argument("--long", choices=sorted(ROWS), help="score a trained row past the protocol (its long grid)")
    action.add_argument("--collect", type=true_or_false, nargs="?", const=True, default=False,
                        help="rebuild the table, README and plot")
    action.add_argument("--in_range", "--in-range", dest="in_range", choices=par_rows,
                        help="add the accuracy inside the training range to a row's saved record")
    action.add_argument("--export", choices=par_rows, help="ship a trained PAR row as checkpoints/par-swap-s5-small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protocol", default="swap_s5", choices=list(PROTOCOLS),
                        help="swap_s5 (train d ≤ 32, the default) or s5 / a5 (train d ≤ 16, test to 16×)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0; got {args.seed}")
    p = PROTOCOLS[args.protocol]
    row = args.row or args.evaluate or args.long or args.export or args.in_range
    if row and row not in rows_of(p):
        parser.error(f"--protocol {args.protocol} runs the rows {rows_of(p)}; got {row!r}")
    if args.protocol != "swap_s5" and args.export:
        parser.error("--export ships the swap-S5 checkpoint; it takes --protocol swap_s5")
    if args.collect:
        return collect(p)
    if args.export:
        return export(p, args.export, args.seed)
    if args.long:
        return evaluate_long(p, args.long, args.seed)
    if args.in_range:
        return add_in_range(p, args.in_range, args.seed)
    row = args.row or args.evaluate
    if ROWS[row].kind == "rnn":
        record = train_and_evaluate_rnn(p, row, args.seed)
    else:
        segments = train_par(p, row, args.seed) if args.row else json.loads(
            (run_path(p, row, args.seed) / "segments.json").read_text())
        record = evaluate_par(p, row, args.seed, segments)
    save(p, record)


if __name__ == "__main__":
    main()
