"""Issue 68: which position scheme lets the paper's full view extrapolate on swap-S5, from scratch first?

    python examples/reproduce/full_view_positions.py --row nope_conv --seed 0   # train (or resume) + test + profiles
    python examples/reproduce/full_view_positions.py --collect                  # summary.json, README table, plot

Task: swap-S5 in its short text rendering (`examples/tasks/swap_s5_short.json`: "swap 1 3." per operation, "skip."
for the identity, five "Box b contains the ?" questions), identity start, train d ≤ 8 (`*_d16`: d ≤ 16; `*_d12`:
d ≤ 12 at batch 32), forced depth, the full view (no operation boundaries given). Every row is the package's
from-scratch recipe (hidden 128, prelude 1 + core 2 + coda 1, the task's word-level tokenizer, lr 1e-3, batch 64,
at most 2,000 steps, +1 depth every 50 steps), stopped once a probe of 128 fixed prompts at d = 8 is ≥ 99% twice in a
row; only the position scheme (and the hold tail) changes:

- `baseline`: ordinary rotary positions (the paper's full view as this package trains it from scratch);
- `stretch_end` / `stretch_all`: the paper's positional stretch, s ~ U[1, s_max], s_max ramping 1 → 8 over the last
  500 steps / over all of training (`--stretch_steps`);
- `randomized`: randomized sorted positions in [0, 1024) (Ruoss et al. 2023);
- `pose`: PoSE, two chunks, the second shifted by a random skip within [0, 1024) (`trainers.pose_positions`);
- `nope`: no positional encoding (`--position_encoding nope`);
- `nope_conv`: NoPE and a causal depthwise convolution (4 taps) before each core layer (`--core_conv_kernel 4`, FPRM);
- `*_hold`: hold iterations (R = d + X, X ~ U{0..8}, gradient window 16, targets z_d past d), the iteration count;
- `*_dense`: dense prefix targets (`--prefix_state_weight 1`, FPRM's deep supervision in PAR's form): a state head
  reads, at iteration k, z_j at the last token of every operation j ≤ k (the wavefront); `*_dense_light`: weight 0.1;
- `pose_conv`: PoSE and the causal convolution; `pose_near_conv`: PoSE's skips in [0, 320); `randomized_conv`:
  randomized positions and the convolution; `pose_conv_noise` / `_noise_ft`: loop-state noise (`--loop_state_noise`).

Test: 1,024 fresh prompts per depth at 8 / 16 / 32 / 64 (the evaluation stop rule ends a grid after two depths under
2%), and for rotary rows the same with test-time position interpolation (positions × d_train / d, 256 prompts); the
progress profile (every iteration's readout against z_k) at d = 16 and 32 and the padding control (8 operations, then
"skip." up to d = 16), 256 prompts each; for `*_dense` rows also the wavefront (`diagnostics.wavefront_profile`).
Rows resume from their newest checkpoint (`runs/full_view_positions/`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from par_studies import (
    FULL,
    REPO,
    Row,
    hold_tail,
    load_records,
    load_run,
    peak_rss_gb,
    row_train_seconds,
    rows_by_name,
    save_record,
    splice_table,
    train_segment,
)
from par_studies.rows import combine

TASK_FILE = "examples/tasks/swap_s5_short.json"
OUT = REPO / "results" / "full_view_positions"
RUN_DIR = REPO / "runs" / "full_view_positions"
N, N_INTERPOLATED, PROFILE_N, POINTER_N = 1024, 256, 256, 64
BUDGET = 7200  # a guard only: rows end on their steps or the in-range probe
NEAR_RANGE = "320"  # `pose_near_conv`'s PoSE range: the d = 64 test prompt's length, rounded up
SHIPPED = "checkpoints/par-swap-s5-full"  # `pose_conv` s0, exported (--export)
POSITION_RANGE = "1024"  # random / PoSE positions: beyond the longest test prompt (d = 64: ~300 tokens; d = 128: ~560)


def common(train_max_depth: int) -> dict:
    """The flags every row shares at training depth `train_max_depth` (the probe at that depth)."""
    return {
        "--task_file": TASK_FILE, "--rendering": "text", "--max_train_depth": str(train_max_depth),
        "--eval_depths": str(train_max_depth), "--eval_n": "64", "--logging_steps": "10", "--disable_tqdm": "true",
        "--report_to": "none", "--save_strategy": "steps", "--save_steps": "100", "--save_total_limit": "1",
        "--curriculum_every_steps": "50",
        "--probe_depth": str(train_max_depth), "--probe_n": "128", "--probe_every_steps": "100",
        "--probe_stop_accuracy": "0.99", "--probe_stop_patience": "2",
    }


# the package's from-scratch recipe (train_par.py's size defaults: hidden 128, 1 + 2 + 1, word-level tokenizer)
SCRATCH = {"--per_device_train_batch_size": "64", "--max_steps": "2000", "--max_train_seconds": str(BUDGET)}
PARENT = "<smollm2>"  # the parent's cache folder (par_studies.parents), filled in when a row runs
# results/pretrained_swap_s5's smollm2_full_pace_3k, the full-view row that learned its range (95.31% at d = 8):
# SmolLM2's first 4 layers as 1 + 2 + 1, lr 1e-3, batch 8, 3,000 steps, embeddings frozen, the fixed pace
SMOLLM2 = {
    "--init_from_qwen2": PARENT, "--gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "--truncate_parent": "true",
    "--prelude_layers": "1", "--core_layers": "2", "--coda_layers": "1", "--learning_rate": "1e-3",
    "--adapter_learning_rate": "1e-3", "--warmup_steps": "50", "--per_device_train_batch_size": "8",
    "--max_steps": "3000", "--max_train_seconds": "14400", "--freeze_embeddings": "true",
}
INITS = {"scratch": SCRATCH, "smollm2": {**SMOLLM2, "--parent_weights": "pretrained"},
         "random": {**SMOLLM2, "--parent_weights": "random"}}
N_PARENT = 256  # prompts per test depth for the SmolLM2-shaped rows (~1 h per 1,024 at d = 64 on this CPU)


# each scheme: (flags, what summary.json calls its positions, its stretch)
SCHEMES = {
    "baseline": ({}, "rope", None),
    "stretch_end": ({"--stretch_steps": "500", "--stretch_max_scale": "8"}, "rope", "last 500 steps, s_max 1 -> 8"),
    "stretch_all": ({"--stretch_steps": "2000", "--stretch_max_scale": "8"}, "rope", "all steps, s_max 1 -> 8"),
    "randomized": ({"--random_positions_max": POSITION_RANGE}, "rope + randomized positions", None),
    "pose": ({"--pose_max_positions": POSITION_RANGE}, "rope + PoSE", None),
    "nope": ({"--position_encoding": "nope"}, "nope", None),
    "nope_conv": ({"--position_encoding": "nope", "--core_conv_kernel": "4"}, "nope + causal conv (4)", None),
    "conv": ({"--core_conv_kernel": "4"}, "rope + causal conv (4)", None),  # keeps a parent's rotary
    "pose_conv": ({"--pose_max_positions": POSITION_RANGE, "--core_conv_kernel": "4"}, "rope + PoSE + causal conv (4)",
                  None),
    # PoSE's skips within [0, 320), just past the d = 64 test prompt (~300 tokens), where [0, 1024) put most training
    # distances beyond every test prompt: conv's contiguous positions held a state best, PoSE + conv extrapolated best
    "pose_near_conv": ({"--pose_max_positions": NEAR_RANGE, "--core_conv_kernel": "4"},
                       "rope + PoSE (320) + causal conv (4)", None),
    "randomized_conv": ({"--random_positions_max": POSITION_RANGE, "--core_conv_kernel": "4"},
                        "rope + randomized positions + causal conv (4)", None),
}
HOLD = hold_tail(extra=8, grad_window=16)
DENSE = {"--prefix_state_weight": "1"}
D12 = {"--per_device_train_batch_size": "32"}  # d <= 12 at half the batch: about the d <= 8 row's cost per step
DENSE_LIGHT = {"--prefix_state_weight": "0.1"}
# the depth grows (+1, ≥ 50 steps apart) once the last 20 steps at d_max average ≥ 90% right (fixed pace: d = 8 at 300)
MASTERY = {"--curriculum_advance_accuracy": "0.9"}
# the carried answer through a finite-state bottleneck (the query rows restart from e + softmax(y) E, the others keep)
QUERY_FEEDBACK = {"--answer_feedback": "true", "--answer_feedback_rows": "queries"}
# the scheme's own row (same seed), in range, fine-tuned with the hold tail (R = d + X, X ~ U{0..8}, targets z_d past
# d, 16 iterations with gradient) at a fifth of the rate, every depth <= 8 (drift.json: a step breaks past k_train)
HOLD_FINE_TUNE = {"--learning_rate": "2e-4", "--warmup_steps": "20", "--max_steps": "500",
                  "--curriculum_start_depth": "8"}
# twice the steps (the _qfb row's probe was still rising when its 2,000 steps ended)
LONG = {"--max_steps": "4000", "--max_train_seconds": "14400"}
# the rows of operations not yet reached held at a fixed point (trainers.objectives.waiting_row_change): row_freeze.json
# found they change by ~75% of their norm at every pass, so each can count its passes (a count learned to k_train)
STILL = {"--waiting_row_weight": "1"}
STILL_LIGHT = {"--waiting_row_weight": "0.1"}
# the read-so-far flag (trainers.objectives.progress_flag_loss): row_probe.json found no row holding which operation is
# next (the query rows fetch operation k); a 1[j <= k] wave the convolution can carry finds it by content
FLAG = {"--progress_flag_weight": "1"}
# half the learning rate: two of six PoSE-family seeds never learned d <= 8 at lr 1e-3, their loss jumping by 1-3 nats
LOW_LR = {"--learning_rate": "5e-4"}
# the shipped pose_conv s0 (runs/ does not outlive a session) fine-tuned as `_hold_ft` without the hold tail, each
# iteration's state perturbed by loop-state noise σ = 0.5 (break_depth.json: it tolerates 0.3); `_noise`: from scratch
NOISE_FINE_TUNE = {**SCRATCH, **HOLD_FINE_TUNE, "--init_from_par": SHIPPED, "--loop_state_noise": "0.5"}
PARENT_SCHEMES = ("baseline", "stretch_all", "conv", "nope_conv", "pose", "pose_conv")  # pose_conv: best from scratch


def scheme_flags(scheme: str, init: str) -> dict:
    """A scheme's flags; stretch over all of training spans the row's own steps."""
    flags = dict(SCHEMES[scheme][0])
    if scheme == "stretch_all":
        flags["--stretch_steps"] = INITS[init]["--max_steps"]
    return flags


def declare_rows() -> dict[str, Row]:
    rows = []
    for name in SCHEMES:
        flags = scheme_flags(name, "scratch")
        rows.append(Row.of(name, f"scratch, full view, {name}", FULL, SCRATCH, flags, budget=BUDGET))
        rows.append(Row.of(f"{name}_hold", f"scratch, full view, {name}, hold iterations", FULL, SCRATCH, flags, HOLD,
                           budget=BUDGET))
        rows.append(Row.of(f"{name}_d16", f"scratch, full view, {name}, train d <= 16", FULL, SCRATCH, flags,
                           budget=BUDGET))
        rows.append(Row.of(f"{name}_d12", f"scratch, full view, {name}, train d <= 12, batch 32", FULL,
                           {**SCRATCH, **D12}, flags, budget=BUDGET))
        rows.append(Row.of(f"{name}_dense", f"scratch, full view, {name}, dense prefix targets", FULL, SCRATCH, flags,
                           DENSE, budget=BUDGET))
        rows.append(Row.of(f"{name}_mastery", f"scratch, full view, {name}, mastery curriculum (0.9)", FULL, SCRATCH,
                           flags, MASTERY, budget=BUDGET))
        rows.append(Row.of(f"{name}_qfb", f"scratch, full view, {name}, answer feedback at the query rows", FULL,
                           SCRATCH, flags, QUERY_FEEDBACK, budget=BUDGET))
        long_flags = {**flags, **({"--stretch_steps": LONG["--max_steps"]} if name == "stretch_all" else {})}
        rows.append(Row.of(f"{name}_qfb_4k", f"scratch, full view, {name}, answer feedback at the query rows, 4,000 "
                           "steps", FULL, {**SCRATCH, **LONG}, long_flags, QUERY_FEEDBACK, budget=14400))
        rows.append(Row.of(f"{name}_still", f"scratch, full view, {name}, waiting rows held still (weight 1)", FULL,
                           SCRATCH, flags, STILL, budget=BUDGET))
        rows.append(Row.of(f"{name}_still_light", f"scratch, full view, {name}, waiting rows held still (weight 0.1)",
                           FULL, SCRATCH, flags, STILL_LIGHT, budget=BUDGET))
        # `*_still_ft`: as `*_hold_ft` with STILL instead of hold iterations (from scratch, weight 1 kept the loop
        # from learning its range; on a loop that already knows it, do still rows extrapolate?)
        fine_tune = {**SCRATCH, **HOLD_FINE_TUNE, "--init_from_par": f"<{name}>"}  # its own trained row, same seed
        ft_flags = {**flags, **({"--stretch_steps": HOLD_FINE_TUNE["--max_steps"]} if name == "stretch_all" else {})}
        rows.append(Row.of(f"{name}_hold_ft", f"scratch, full view, {name}: its trained row fine-tuned with hold "
                           "iterations", FULL, fine_tune, ft_flags, HOLD, budget=BUDGET))
        rows.append(Row.of(f"{name}_still_ft", f"scratch, full view, {name}: its trained row fine-tuned with waiting "
                           "rows held still (weight 1)", FULL, fine_tune, ft_flags, STILL, budget=BUDGET))
        for suffix, steps, scheme in (("_flag", SCRATCH, flags), ("_flag_4k", {**SCRATCH, **LONG}, long_flags)):
            rows.append(Row.of(f"{name}{suffix}", f"scratch, full view, {name}, read-so-far flag (weight 1), "
                               f"{int(steps['--max_steps']):,} steps", FULL, steps, scheme, FLAG,
                               budget=int(steps["--max_train_seconds"])))
        rows.append(Row.of(f"{name}_lr5e4", f"scratch, full view, {name}, lr 5e-4", FULL, {**SCRATCH, **LOW_LR}, flags,
                           budget=BUDGET))
        rows.append(Row.of(f"{name}_dense_light", f"scratch, full view, {name}, dense prefix targets at weight 0.1",
                           FULL, SCRATCH, flags, DENSE_LIGHT, budget=BUDGET))
    rows.append(Row.of("pose_conv_noise_ft", "scratch, full view, pose_conv: the shipped seed 0 fine-tuned with "
                       "loop-state noise (0.5)", FULL, NOISE_FINE_TUNE, SCHEMES["pose_conv"][0], budget=BUDGET))
    rows.append(Row.of("pose_conv_noise", "scratch, full view, pose_conv, loop-state noise (0.3) from the start", FULL,
                       SCRATCH, SCHEMES["pose_conv"][0], {"--loop_state_noise": "0.3"}, budget=BUDGET))
    for init in ("smollm2", "random"):
        for name in PARENT_SCHEMES:
            rows.append(Row.of(f"{init}_{name}", f"SmolLM2 1+2+1 {'pretrained' if init == 'smollm2' else 'random'}, "
                               f"full view, {name}", FULL, INITS[init], scheme_flags(name, init)))
    return rows_by_name(*rows)


ROWS = declare_rows()


def init_of(row: str) -> str:
    return next((init for init in ("smollm2", "random") if row.startswith(init + "_")), "scratch")


def train_max_depth(row: str) -> int:
    return 16 if row.endswith("_d16") else 12 if row.endswith("_d12") else 8


def scheme_of(row: str) -> str:
    init = init_of(row)
    name = row if init == "scratch" else row.removeprefix(init + "_")
    for suffix in ("_d16", "_d12", "_noise_ft", "_noise", "_hold_ft", "_hold", "_mastery", "_qfb_4k", "_qfb",
                   "_dense_light", "_dense", "_lr5e4", "_flag_4k", "_flag", "_still_ft", "_still_light", "_still"):
        name = name.removesuffix(suffix)
    return name


def test_depths(row: str) -> list[int]:
    d = train_max_depth(row)
    return [d, 2 * d, 4 * d, 8 * d]


def run_path(row: str, seed: int) -> Path:
    return RUN_DIR / f"{row}_s{seed}"


def record_path(row: str, seed: int) -> Path:
    return OUT / "runs" / f"{row}_s{seed}.json"


def row_flags(row: str, seed: int = 0) -> dict:
    """The row's train_par.py flags, the parent's cache folder filled in, and a fine-tuned row's `--init_from_par
    <row>` as that row's run folder for `seed`."""
    flags = combine(row, common(train_max_depth(row)), ROWS[row].flags)
    source = flags.get("--init_from_par", "")
    if source.startswith("<"):
        from state_tracking.evaluation import repo_relative

        flags["--init_from_par"] = repo_relative(run_path(source.strip("<>"), seed))  # train_par runs in the repo
    if source:  # it starts in range: the probe's stop rule would end it at its first probe
        flags.pop("--probe_stop_accuracy"), flags.pop("--probe_stop_patience")
    if flags.get("--init_from_qwen2") == PARENT:
        from par_studies.parents import get_parent

        flags["--init_from_qwen2"] = str(get_parent("smollm2-135m").ensure())
    return flags


def evaluate(row: str, seed: int, segments: list[dict]) -> dict:
    """The row's test grid, the same with test-time interpolation (rotary rows), its progress profiles and padding
    control, as one record."""
    import torch

    from state_tracking import evaluate_until_failed
    from state_tracking.diagnostics import progress_profile

    torch.set_num_threads(1)
    folder, d_train, depths = run_path(row, seed), train_max_depth(row), test_depths(row)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, task = load_run(folder, max(depths))
    shared = dict(mode="forced", seed=seed, rendering="text", train_max_depth=d_train, progress=False)

    def grid(n: int, interpolate: bool) -> dict:
        started = time.time()
        result = evaluate_until_failed(model, tokenizer, task, depths, n_per_depth=n, interpolate_positions=interpolate,
                                       **shared)
        print(f"{row} s{seed}{' interpolated' if interpolate else ''}: "
              + " ".join(f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
        return {"depths": result["depths"], "accuracy": result["accuracy"], "grid": depths, "n_per_depth": n,
                "seconds": round(time.time() - started, 1), "environment": result["environment"]}

    n = N if init_of(row) == "scratch" else N_PARENT
    evaluation = grid(n, False)
    rotary = model.config.position_encoding == "rope"
    interpolated = grid(min(n, N_INTERPOLATED), True) if rotary else None
    profiles = {}
    for name, kwargs in (("profile", {}), ("padding_control", {"padding_control_depth": d_train})):
        started = time.time()
        profiles[name] = progress_profile(model, tokenizer, task, [2 * d_train, 4 * d_train] if not kwargs
                                          else [2 * d_train], n_per_depth=PROFILE_N, seed=seed, rendering="text",
                                          batch_size=64, **kwargs)
        profiles[name]["seconds"] = round(time.time() - started, 1)
    if getattr(model.config, "prefix_state_queries", 0):  # dense rows: does each operation's own state hold?
        from state_tracking.diagnostics import wavefront_profile

        started = time.time()
        profiles["wavefront"] = wavefront_profile(model, tokenizer, task, [d_train, 2 * d_train, 4 * d_train],
                                                  n_per_depth=PROFILE_N, seed=seed, batch_size=64)
        profiles["wavefront"]["seconds"] = round(time.time() - started, 1)
    profiles["attention_pointer"] = pointer_profile(model, tokenizer, task, d_train, seed)
    if rotary:
        profiles["profile_interpolated"] = progress_profile(model, tokenizer, task, [2 * d_train], seed=seed,
                                                            n_per_depth=PROFILE_N, rendering="text", batch_size=64,
                                                            interpolate_from_depth=d_train)
    curve = summary.get("curve") or []
    probes = [p["accuracy"] for p in summary.get("probe") or []]
    _, positions, stretch = SCHEMES[scheme_of(row)]
    return dict(row=row, label=ROWS[row].label, seed=seed, task=task.name, task_file=TASK_FILE, init=init_of(row),
                command=f"python examples/reproduce/full_view_positions.py --row {row} --seed {seed}",
                train_commands=[scrub(s["command"]) for s in segments], segments=segments, steps=summary["steps"],
                train_seconds=row_train_seconds(segments), curve=curve, probe=summary.get("probe"),
                in_range_reached=summary.get("probe_stopped_at") is not None or (
                    len(probes) >= 2 and min(probes[-2:]) >= 0.99),
                positions=positions, stretch=stretch, hold=row.endswith("_hold") or "_hold_" in row,
                dense_prefix_targets=row.endswith(("_dense", "_dense_light")),
                train_max_depth=d_train, evaluation=evaluation, interpolated=interpolated, **profiles,
                parameters=sum(p.numel() for p in model.parameters()), peak_rss_gb=peak_rss_gb(segments))


def pointer_profile(model, tokenizer, task, d_train: int, seed: int) -> dict:
    """Where each iteration looks (`diagnostics.attention_pointer_profile`) at d_train, 2 d_train and 4 d_train."""
    from state_tracking.diagnostics import attention_pointer_profile

    started = time.time()
    result = attention_pointer_profile(model, tokenizer, task, [d_train, 2 * d_train, 4 * d_train],
                                       n_per_depth=POINTER_N, seed=seed, batch_size=32)
    return {**result, "seconds": round(time.time() - started, 1)}


def add_pointer(row: str, seed: int) -> dict:
    """--pointer: the attention pointer of a finished row (its folder on this machine) added to its record."""
    import torch

    torch.set_num_threads(1)
    record = json.loads(record_path(row, seed).read_text())
    model, tokenizer, task = load_run(run_path(row, seed), 4 * train_max_depth(row))
    record["attention_pointer"] = pointer_profile(model, tokenizer, task, train_max_depth(row), seed)
    save_record(record, record_path(row, seed))
    return record


def scrub(text: str) -> str:
    """A recorded command with the machine's parent cache folder written as <smollm2>."""
    from par_studies.parents import get_parent

    return text.replace(str(get_parent("smollm2-135m").cache_folder), PARENT)


def run_row(row: str, seed: int) -> dict:
    flags = row_flags(row, seed)
    if ROWS[row].flags.get("--init_from_par", "").startswith("<") and not (
            Path(flags["--init_from_par"]) / "summary.json").is_file():
        raise SystemExit(f"--row {row}: it fine-tunes {flags['--init_from_par']}, which has not finished training; "
                         f"run that row with --seed {seed} first")
    segments = train_segment(run_path(row, seed), seed, flags, row)
    record = evaluate(row, seed, segments)
    save_record(record, record_path(row, seed))
    return record


def profile_checkpoint(row: str, seed: int) -> dict:
    """results/full_view_positions/checkpoints/<row>_s<seed>.json: where a row stands that was stopped (or paused)
    before its end: the progress profile at d_train / 2, d_train, 2 and 4 d_train (64 prompts each) of its newest
    complete checkpoint, with that checkpoint's step. The row resumes from it when its command runs again."""
    import torch

    from modeling_par import ParLoopedQwenForStateTracking
    from par_studies import latest_checkpoint
    from state_tracking import build_tokenizer, load_task
    from state_tracking.diagnostics import progress_profile

    torch.set_num_threads(1)
    checkpoint = latest_checkpoint(run_path(row, seed))
    if checkpoint is None:
        raise SystemExit(f"{row} seed {seed}: no checkpoint under {run_path(row, seed)}")
    model = ParLoopedQwenForStateTracking.from_pretrained(checkpoint).eval()
    task = load_task(TASK_FILE)
    if init_of(row) == "scratch":
        tokenizer = build_tokenizer(task, "text")
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(row_flags(row)["--init_from_qwen2"], gguf_file=SMOLLM2["--gguf_file"])
    d = train_max_depth(row)
    profile = progress_profile(model, tokenizer, task, [d // 2, d, 2 * d, 4 * d], n_per_depth=64, seed=seed,
                               rendering="text", batch_size=64)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    record = {"row": row, "seed": seed, "checkpoint": checkpoint.name, "step": state["global_step"],
              "probe": [e for e in state["log_history"] if "probe_accuracy" in e],
              "command": f"python examples/reproduce/full_view_positions.py --profile_checkpoint --row {row} "
                         f"--seed {seed}", "date": time.strftime("%Y-%m-%d"), "profile": profile}
    for depth, row_profile in zip(profile["depths"], profile["profile"]):
        print(f"{row} s{seed} {checkpoint.name} d={depth}: " + " ".join(f"{100 * a:.0f}" for a in row_profile))
    if getattr(model.config, "prefix_state_queries", 0):  # a dense row: how far its wavefront has formed
        from state_tracking.diagnostics import wavefront_profile

        record["wavefront"] = wavefront_profile(model, tokenizer, task, [d, 2 * d], n_per_depth=64, seed=seed,
                                                batch_size=64)
        print(f"{row} s{seed} wavefront: {record['wavefront']['wavefront']}")
    save_record(record, OUT / "checkpoints" / f"{row}_s{seed}.json")
    return record


# ------------------------------------------------------------------------------------------------------ collect
TABLE_START, TABLE_END = "<!-- rows: generated by --collect -->", "<!-- end rows -->"


def accuracy_by_depth(evaluation: dict | None) -> dict[int, float]:
    """Accuracy per grid depth; a depth cut by the stop rule counts 0 (two depths under 2% before it)."""
    if evaluation is None:
        return {}
    got = dict(zip(evaluation["depths"], evaluation["accuracy"]))
    return {d: got.get(d, 0.0) for d in evaluation["grid"]}


def summary_rows(records: list[dict]) -> list[dict]:
    """One entry per row over its seeds, the issue's schema (accuracies as fractions)."""
    by_row: dict[str, list[dict]] = {}
    for r in records:
        by_row.setdefault(r["row"], []).append(r)
    rows = []
    for name, group in by_row.items():
        first = group[0]
        accuracy = {}
        for d in first["evaluation"]["grid"]:
            per_seed = [accuracy_by_depth(r["evaluation"])[d] for r in group]
            accuracy[str(d)] = {"mean": sum(per_seed) / len(per_seed), "per_seed": per_seed}
        interpolated = {}
        if first.get("interpolated"):
            for d in first["interpolated"]["grid"]:
                per_seed = [accuracy_by_depth(r["interpolated"])[d] for r in group]
                interpolated[str(d)] = {"mean": sum(per_seed) / len(per_seed), "per_seed": per_seed}
        rows.append({"row": name, "init": first.get("init", "scratch"), "view": "full", "positions": first["positions"],
                     "hold": first["hold"], "stretch": first["stretch"], "seeds": [r["seed"] for r in group],
                     "train_max_depth": first["train_max_depth"], "steps": [r["steps"] for r in group],
                     "train_seconds": [r["train_seconds"] for r in group],
                     "in_range_reached": [r["in_range_reached"] for r in group], "accuracy": accuracy,
                     "accuracy_interpolated": interpolated or None, "command": first["command"]})
    return rows


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def rows_table(records: list[dict]) -> str:
    lines = ["| row | seed | steps | train s | in range | d_train | 1× | 2× | 4× | 8× | interpolated 2× / 4× / 8× |",
             "|" + "---|" * 11]
    for r in records:
        acc = list(accuracy_by_depth(r["evaluation"]).values())
        inter = list(accuracy_by_depth(r.get("interpolated")).values())[1:]
        lines.append(f"| {r['row']} | {r['seed']} | {r['steps']} | {r['train_seconds']:.0f} | "
                     f"{'yes' if r['in_range_reached'] else 'no'} | {r['train_max_depth']} | "
                     + " | ".join(pct(a) for a in acc) + " | " + (" / ".join(pct(a) for a in inter) or "–") + " |")
    return "\n".join(lines)


def profiles_table(records: list[dict]) -> str:
    """profiles.md: every row's progress profiles, padding control, wavefront and attention pointer, by seed."""
    lines = ["# Inside the loop: the rows of `README.md`, iteration by iteration", "",
             "Generated by `python examples/reproduce/full_view_positions.py --collect`.", "",
             "Progress profiles (accuracy % of iteration k = 1, 2, … against z_k; padding control: d_train "
             "operations then \"skip.\", scored against z_min(k, d_train); wavefront (`*_dense` rows): the state "
             "head at operation j's last token after R = d against z_j, j = 1, 2, …; attention on operation k: the "
             "share of problems whose query tokens attend most to operation k's tokens at iteration k, "
             "`diagnostics.attention_pointer_profile`):", "",
             "| row | seed | kind | d | k (or j) = 1, 2, … |", "|---|---|---|---|---|"]
    for r in records:
        for kind, key in (("profile", "profile"), ("padding_control", "profile"), ("profile_interpolated", "profile"),
                          ("wavefront", "wavefront")):
            if r.get(kind):
                for d, row in zip(r[kind]["depths"], r[kind][key]):
                    lines.append(f"| {r['row']} | {r['seed']} | {kind} | {d} | "
                                 + " ".join(f"{100 * a:.0f}" for a in row) + " |")
        pointer = r.get("attention_pointer")
        for d, layers in zip(pointer["depths"], pointer["on_target"]) if pointer else ():
            for layer, row in enumerate(layers):  # % of problems whose query attends most to operation k
                lines.append(f"| {r['row']} | {r['seed']} | attention on operation k, core layer {layer + 1} | {d} | "
                             + " ".join(f"{100 * a:.0f}" for a in row) + " |")
    return "\n".join(lines)


def plot_profiles(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in records:
        if r.get("profile") and r["seed"] == 0:
            ax.plot(range(1, len(r["profile"]["profile"][-1]) + 1), [100 * a for a in r["profile"]["profile"][-1]],
                    label=f"{r['row']} (d = {r['profile']['depths'][-1]})")
    ax.axvline(8, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("iteration k")
    ax.set_ylabel("readout = z_k (%)")
    ax.set_title("swap-S5 full view, from scratch, train d ≤ 8: progress profile at 4×")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def collect() -> dict:
    records = sorted(load_records(OUT / "runs"), key=lambda r: (list(ROWS).index(r["row"]), r["seed"]))
    summary = {"command": "python examples/reproduce/full_view_positions.py --collect", "task_file": TASK_FILE,
               "date": time.strftime("%Y-%m-%d"), "rows": summary_rows(records)}
    save_record(summary, OUT / "summary.json")
    table = rows_table(records)
    (OUT / "profiles.md").write_text(profiles_table(records) + "\n")
    if not splice_table(OUT / "README.md", TABLE_START, TABLE_END, table):
        print(f"{OUT / 'README.md'} has no table markers; the table:")
    plot_profiles(records, OUT / "profiles.png")
    print(table)
    return summary


def export(row: str, seed: int, target: Path | None = None) -> Path:
    """--export: ship a trained scratch row as checkpoints/par-swap-s5-full (issue 68 item 5): fp32 weights, remote
    code, the word-level tokenizer, the task, and a card with this run's accuracy per test depth (n prompts each),
    its progress profile at 2x and its training curve; training_summary.json beside them. The run's folder must be
    on this machine (`--row ROW --seed S` trains it)."""
    import shutil

    from par_studies import repo_module, write_shipped_summary
    from state_tracking.evaluation import repo_relative

    hub = repo_module("examples.push_to_hub")
    if init_of(row) != "scratch":
        raise SystemExit(f"--export ships a from-scratch row; {row} is {init_of(row)}.")
    record = json.loads(record_path(row, seed).read_text())
    target = target or REPO / SHIPPED
    evaluation, d = record["evaluation"], record["train_max_depth"]
    rows = {hub.MODE_LABELS["forced"]: evaluation["accuracy"]}
    profile = record.get("profile") or {}
    profile = (profile["depths"][0], profile["profile"][0]) if profile.get("depths") else None  # at 2x
    intro = (f"Row `{row}` (seed {seed}) of `examples/reproduce/full_view_positions.py` (`results/full_view_positions/`"
             f" in the package repository): {record['label']}. The paper's **full view**: the loop re-reads the whole "
             f"prompt with causal attention, no operation boundaries given. Trained on swap-S5 text prompts, d ≤ {d}, "
             f"{record['steps']} steps of 64 ({record['train_seconds']:.0f} s on one CPU thread).\n\nOverall state "
             f"accuracy (%, all five boxes right) on {evaluation['n_per_depth']} fresh prompts per depth:")
    card = OUT / "runs" / f"{row}_s{seed}_card.md"
    card.write_text(hub.results_section(intro, evaluation["grid"], rows, None, record["curve"]))
    if target.exists():
        shutil.rmtree(target)
    try:
        hub.export_for_hub(
            run_path(row, seed), target, repo_id="par-swap-s5-full", results=card, rendering="text",
            learned_halting=False,
            training_data=(f"swap-S5 word problems in the short text rendering (examples/tasks/swap_s5_short.json), "
                           f"identity start, depths 1..{d} with a depth curriculum, {record['steps']} steps of 64, "
                           "from scratch."),
            limits=("A from-scratch CPU-scale model (hidden 128) of the full view. It extrapolates partly to 2x and "
                    "not to 4x: the progress profile shows the position solved at 2x and the iteration count failing "
                    "past about 1.4x the trained iterations (results/full_view_positions/README.md)"
                    + (f"; at d = {profile[0]} iterations 1, 2, ... read z_k right "
                       + " / ".join(f"{100 * a:.0f}" for a in profile[1]) + "%" if profile else "") + "."),
            measured={"depths": evaluation["grid"], "rows": rows, "train_max_depth": d,
                      "n_sequences": evaluation["n_per_depth"]})
    finally:
        card.unlink()
    summary = {"row": row, "label": record["label"], "seed": seed, "steps": record["steps"],
               "train_seconds": record["train_seconds"], "max_train_depth": d, "command": record["command"],
               "train_commands": record["train_commands"], "n_per_depth": evaluation["n_per_depth"],
               "depths": evaluation["depths"], "accuracy": evaluation["accuracy"],
               "results": repo_relative(record_path(row, seed)), "curve": record["curve"]}
    write_shipped_summary(target, summary)
    print(f"exported {row} seed {seed} to {repo_relative(target)}")
    return target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", choices=list(ROWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collect", action="store_true", help="summary.json, README table and plot from runs/*.json")
    parser.add_argument("--profile_checkpoint", action="store_true",
                        help="with --row: the progress profile of the row's newest checkpoint (a stopped row)")
    parser.add_argument("--pointer", action="store_true",
                        help="with --row: add the attention pointer profile to a finished row's record")
    parser.add_argument("--export", action="store_true",
                        help="with --row: ship the trained row as checkpoints/par-swap-s5-full")
    parser.add_argument("--parent_loss", action="store_true",
                        help="what SmolLM2 loses at R = 1 under each scheme (parent_loss.json)")
    args = parser.parse_args(argv)
    if not (args.row or args.collect or args.parent_loss):
        parser.error("give --row, --collect or --parent_loss")
    if args.parent_loss:  # its own script; this flag is the command its record names
        from par_studies import repo_module

        repo_module("examples.studies.full_view_parent_loss").parent_loss()
    if args.export or args.pointer:
        if not args.row:
            parser.error("--export and --pointer need --row")
        (export if args.export else add_pointer)(args.row, args.seed)
    elif args.profile_checkpoint:
        if not args.row:
            parser.error("--profile_checkpoint needs --row")
        profile_checkpoint(args.row, args.seed)
    elif args.row:
        run_row(args.row, args.seed)
    if args.collect:
        collect()


if __name__ == "__main__":
    main()
