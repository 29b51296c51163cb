"""The paper's claim put to the test at CPU scale: does a *pretrained* parent make the paper's full view extrapolate
on swap-S5 where a randomly initialised one of the same shape does not?

    python -m par_studies.parents fetch smollm2-135m                         # the parent (pip, ~100 MB, once)
    python examples/reproduce/pretrained_swap_s5.py --row smollm2_full --seed 0   # train (or resume) + evaluate
    python examples/reproduce/pretrained_swap_s5.py --row smollm2_full --more_seconds 3000  # a further segment
    python examples/reproduce/pretrained_swap_s5.py --collect                     # README table, summary.json

On a GPU machine (examples/reproduce/pretrained_swap_s5_gpu.sh: one call, the parent's first 4 layers carried as a
41 MB GGUF, `python -m par_studies.parents truncate smollm2-135m --layers 4 --out .gpu/smollm2-135m-4layers.gguf`):

    python examples/reproduce/pretrained_swap_s5.py --row smollm2_full_pace_3k --seed 1 \
        --parent_gguf .gpu/smollm2-135m-4layers.gguf --max_train_seconds 300   # trains and evaluates on cuda

Task: swap-S5 in its short text rendering (`examples/tasks/swap_s5_short.json`: "swap 1 3." per operation, "skip."
for the identity, the start state stated, five "Box b contains the ?" questions), identity start, train d ≤ 8,
forced depth, the token embeddings (and the tied LM head) frozen, the mastery curriculum (from d ≤ 2; d_max + 1
once the final answers of the last 20 steps at d_max are 90% right, at least 50 steps apart). The parent's BPE
tokenizer reads the prompt; the answers are the LM-head rows of the five item names. Each row trains until a probe of
128 fixed prompts at d = 8 is ≥ 99% twice in a row (in range reached), or its step / time budget ends (the miss,
with its curve); a row resumes from its newest checkpoint.

Rows ({view} × {init}; SmolLM2-135M's first 4 of 30 layers as prelude 1 + core 2 (looped) + coda 1):
- `smollm2_full` / `random_full`: the paper's full view (plain causal attention over the whole prompt, ordinary
  positions), the pretrained parent / the same shape and tokenizer with every weight drawn afresh;
- `smollm2_local` / `random_local`: the package's local view (at iteration k the queries read operation k only);
- `smollm2_full_no_anchor`: the pretrained full-view row without state-norm anchoring (the paper's ablation).
- pilots, 600 steps each (the learning-rate schedule decays over them): `smollm2_full_lr1e3` / `random_full_lr1e3`
  (every weight at lr 1e-3, the adapter's rate) and `smollm2_full_lr3e4`: what speeds up learning the training range,
  which the rows above at lr 1e-4 left at d <= 3; `smollm2_full_lr1e3_b32` / `random_full_lr1e3_b32` the same at
  batch 32;
- `smollm2_full_lr1e3_3k` / `random_full_lr1e3_3k`: the pilots' choice, lr 1e-3 at batch 8, on the 3,000-step schedule.
- `smollm2_full_lr1e3_constant`: the lr 1e-3 pilot with its rate held after the warm-up (does the decay let the
  curriculum advance?); `smollm2_full_lr1e3_no_anchor`: that pilot without norm anchoring; `smollm2_local_lr1e3`:
  the local view at lr 1e-3.
- `scratch_local` / `scratch_full`: the package's from-scratch recipe (hidden 128, 1 + 2 + 1, the task's word-level
  tokenizer, lr 1e-3, batch 64, 2,000 steps, the fixed pace) on the same rendering: can this rendering be learned
  at all by the recipe that learns swap-S5 symbolically? `scratch_local_b8`: that recipe at the SmolLM2 rows' batch 8
  and 3,000 steps (their prompt budget), `scratch_full_b8` its full view; `smollm2_local_pace_3k` /
  `random_local_pace_3k`: the SmolLM2 shape in that same setting (local view, lr 1e-3, batch 8, the fixed pace),
  pretrained and random.
- `smollm2_full_lr1e3_pace` / `random_full_lr1e3_pace`: the lr 1e-3 pilot with the fixed-pace curriculum (d_max + 1
  every 50 steps whatever the accuracy) instead of the mastery rule; `smollm2_full_pace_3k` / `random_full_pace_3k`
  the same over the 3,000-step schedule; `smollm2_full_pace_3k_no_anchor` that row without norm anchoring (the
  paper's ablation).

Test (after training): 1,024 fresh prompts per depth at d = 8 / 16 / 32 / 64 (the evaluation stop rule ends a grid
after two depths under 2%); the full-view rows' progress profiles (accuracy of every iteration) at d = 16 and 32. A
row that has not reached the training range is a miss (its probe curve is the result); it is tested at 256 prompts
per depth and profiled at d = 16 on 64 prompts only, to show where it stands.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from par_studies import (
    FULL,
    LOCAL,
    REPO,
    Row,
    load_records,
    peak_rss_gb,
    rows_by_name,
    save_record,
    splice_table,
    train_segment,
)
from par_studies.rows import combine

TASK_FILE = "examples/tasks/swap_s5_short.json"
OUT = REPO / "results" / "pretrained_swap_s5"
RUN_DIR = REPO / "runs" / "pretrained_swap_s5"
PARENT = "<smollm2>"  # the parent's cache folder (par_studies.parents), filled in when a row runs
TRAIN_MAX_DEPTH = 8
DEPTHS = [8, 16, 32, 64]
N = 1024
PROFILE_DEPTHS, PROFILE_N = [16, 32], 256
N_MISS = 256  # prompts per depth for a row that has not reached the training range (its miss is the result)
BUDGET = 3000  # seconds of training per session segment (--max_train_seconds); the row resumes in the next one

COMMON = {
    "--task_file": TASK_FILE, "--rendering": "text", "--max_train_depth": str(TRAIN_MAX_DEPTH),
    "--eval_depths": "8", "--eval_n": "64", "--logging_steps": "10", "--disable_tqdm": "true", "--report_to": "none",
    "--save_strategy": "steps", "--save_steps": "50", "--save_total_limit": "1",
    # the curriculum's steps: at least 50 apart under the mastery rule (MASTERY), every 50 under the fixed pace
    "--curriculum_every_steps": "50",
    # in range reached: a probe of 128 fixed prompts at d = 8 exact to 99%, twice in a row
    "--probe_depth": str(TRAIN_MAX_DEPTH), "--probe_n": "128", "--probe_every_steps": "100",
    "--probe_stop_accuracy": "0.99", "--probe_stop_patience": "2",
}
# the mastery curriculum (every row but the fixed-pace ones): d_max + 1 once the final answers of the last 20 steps at
# d_max are 90% right
MASTERY = {"--curriculum_advance_accuracy": "0.9", "--curriculum_window": "20"}
SMOLLM2 = {
    **MASTERY,
    "--init_from_qwen2": PARENT, "--gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "--truncate_parent": "true",
    "--prelude_layers": "1", "--core_layers": "2", "--coda_layers": "1",
    "--learning_rate": "1e-4", "--adapter_learning_rate": "1e-3", "--warmup_steps": "50",
    "--per_device_train_batch_size": "8", "--max_steps": "3000", "--max_train_seconds": str(BUDGET),
    # the cheaper step (benchmarks/bench_retrofit_step.py, step_cost.json): the embeddings and tied head not trained
    "--freeze_embeddings": "true",
}
PRETRAINED = {"--parent_weights": "pretrained"}
RANDOM = {"--parent_weights": "random"}
NO_ANCHOR = {"--norm_anchoring": "false"}
PILOT_BUDGET = 4800  # a guard only: the pilots end on their 600 steps


def pilot(learning_rate: str, batch: int = 8) -> dict:
    """SMOLLM2 as a pilot: 600 steps (the schedule decays over them) with every pretrained weight at `learning_rate`
    and `batch` prompts per step."""
    return {**SMOLLM2, "--learning_rate": learning_rate, "--per_device_train_batch_size": str(batch),
            "--max_steps": "600", "--max_train_seconds": str(PILOT_BUDGET)}


def fixed_pace(flags: dict) -> dict:
    """`flags` with the fixed-pace curriculum instead of the mastery rule: d_max + 1 every 50 steps whatever the
    accuracy (d <= 8 from step 300), the paper's kind of curriculum (+1 every 40 steps in its from-scratch probe)."""
    return {k: v for k, v in flags.items() if k not in MASTERY}


LONG_BUDGET = 14400  # a guard only: these rows end on their 3,000 steps or the in-range probe


def long_row(learning_rate: str) -> dict:
    """SMOLLM2 at `learning_rate` for every weight, its 3,000 steps, no per-session time cap (a row cut off by the end
    of a session resumes from its newest checkpoint when its command runs again)."""
    return {**SMOLLM2, "--learning_rate": learning_rate, "--max_train_seconds": str(LONG_BUDGET)}


SCRATCH_BUDGET = 7200  # a guard only: the from-scratch rows end on their 2,000 steps or the in-range probe
# the package's from-scratch recipe (train_par.py's defaults: hidden 128, 1 + 2 + 1, lr 1e-3) at the main job's batch
# and steps, the fixed-pace curriculum (COMMON's +1 every 50 steps)
SCRATCH = {"--per_device_train_batch_size": "64", "--max_steps": "2000", "--max_train_seconds": str(SCRATCH_BUDGET)}
# the same at the SmolLM2 rows' batch and steps (their prompt budget)
SCRATCH_B8 = {**SCRATCH, "--per_device_train_batch_size": "8", "--max_steps": "3000"}

ROWS = rows_by_name(
    Row.of("smollm2_full", "SmolLM2 1+2+1, pretrained, full view (the paper's)", FULL, SMOLLM2, PRETRAINED,
           budget=BUDGET),
    Row.of("random_full", "SmolLM2 shape 1+2+1, random init, full view", FULL, SMOLLM2, RANDOM, budget=BUDGET),
    Row.of("smollm2_local", "SmolLM2 1+2+1, pretrained, local view", LOCAL, SMOLLM2, PRETRAINED, budget=BUDGET),
    Row.of("random_local", "SmolLM2 shape 1+2+1, random init, local view", LOCAL, SMOLLM2, RANDOM, budget=BUDGET),
    Row.of("smollm2_full_no_anchor", "SmolLM2 1+2+1, pretrained, full view, no norm anchoring", FULL, SMOLLM2,
           PRETRAINED, NO_ANCHOR, budget=BUDGET),
    # pilots (2026-12-05): every row above learned d <= 2 only after ~600-1,200 steps at lr 1e-4 and none passed d <= 3.
    # What speeds up learning the training range? 600 steps each (the schedule decays to 0 over them), one session
    Row.of("smollm2_full_lr1e3", "pilot: smollm2_full at lr 1e-3, 600 steps", FULL, pilot("1e-3"), PRETRAINED,
           budget=PILOT_BUDGET),
    Row.of("random_full_lr1e3", "pilot: random_full at lr 1e-3, 600 steps", FULL, pilot("1e-3"), RANDOM,
           budget=PILOT_BUDGET),
    Row.of("smollm2_full_lr3e4", "pilot: smollm2_full at lr 3e-4, 600 steps", FULL, pilot("3e-4"), PRETRAINED,
           budget=PILOT_BUDGET),
    # lr 1e-3 reached d <= 3 at step 600 (lr 1e-4: step 1,190); batch 8 is an eighth of the from-scratch full view's
    # 64 (results/paper_protocol_cpu), which learned its training range
    Row.of("smollm2_full_lr1e3_b32", "pilot: smollm2_full at lr 1e-3, batch 32, 600 steps", FULL,
           pilot("1e-3", batch=32), PRETRAINED, budget=PILOT_BUDGET),
    Row.of("random_full_lr1e3_b32", "pilot: random_full at lr 1e-3, batch 32, 600 steps", FULL,
           pilot("1e-3", batch=32), RANDOM, budget=PILOT_BUDGET),
    # the pilots' choice (pretrained d <= 3 at step 570; random still d <= 2 with iteration 1 at 66%; batch 32 no faster
    # per sample) on the rows' full 3,000-step schedule; they resume from their checkpoints across sessions
    Row.of("smollm2_full_lr1e3_3k", "smollm2_full at lr 1e-3, 3,000 steps", FULL, long_row("1e-3"), PRETRAINED,
           budget=LONG_BUDGET),
    Row.of("random_full_lr1e3_3k", "random_full at lr 1e-3, 3,000 steps", FULL, long_row("1e-3"), RANDOM,
           budget=LONG_BUDGET),
    # smollm2_full_lr1e3_3k was still at d <= 3 after 3,000 steps (from step 1,490, lr ~5e-4 there), where the 600-step
    # pilot reached d <= 3 at step 570 with its rate decayed to ~5e-5: is the decay what lets the mastery bar clear?
    # The pilot with the rate held at 1e-3 after its warm-up; and the pilot without norm anchoring (the paper's
    # ablation, at the stage this CPU reaches: how fast the first steps are learned, not extrapolation)
    Row.of("smollm2_full_lr1e3_constant", "pilot: smollm2_full_lr1e3 with the rate constant after warm-up", FULL,
           pilot("1e-3"), {"--lr_scheduler_type": "constant_with_warmup"}, PRETRAINED, budget=PILOT_BUDGET),
    Row.of("smollm2_full_lr1e3_no_anchor", "pilot: smollm2_full_lr1e3 without norm anchoring", FULL, pilot("1e-3"),
           PRETRAINED, NO_ANCHOR, budget=PILOT_BUDGET),
    # the local view (the package's, which extrapolates from scratch) at the pilots' rate: can a pretrained parent
    # learn swap-S5 at all here? At lr 1e-4 smollm2_local reached d <= 3 only at step 1,170
    Row.of("smollm2_local_lr1e3", "pilot: smollm2_local at lr 1e-3, 600 steps", LOCAL, pilot("1e-3"), PRETRAINED,
           budget=PILOT_BUDGET),
    # every pilot under the mastery rule ended near its 90% bar at d <= 2 or 3 (the bar clears only once the rate has
    # decayed); the from-scratch full view learned its training range under a fixed pace (results/paper_protocol_cpu).
    # The lr 1e-3 pilot with the fixed pace (d <= 8 from step 300), pretrained and random: is the gate what holds the
    # rows at d <= 3, and what does the loop learn when the depths come anyway?
    Row.of("smollm2_full_lr1e3_pace", "pilot: smollm2_full_lr1e3, fixed-pace curriculum (+1 every 50 steps)", FULL,
           fixed_pace(pilot("1e-3")), PRETRAINED, budget=PILOT_BUDGET),
    Row.of("random_full_lr1e3_pace", "pilot: random_full_lr1e3, fixed-pace curriculum (+1 every 50 steps)", FULL,
           fixed_pace(pilot("1e-3")), RANDOM, budget=PILOT_BUDGET),
    # the fixed pace's pilot read iterations 1 / 2 / 3 of a 16-operation prompt right 55 / 41 / 9% (the best mastery
    # row: 38 / 8 / 0) but nothing in range at 600 steps: the same over the 3,000-step schedule, resumable
    Row.of("smollm2_full_pace_3k", "smollm2_full at lr 1e-3, fixed-pace curriculum, 3,000 steps", FULL,
           fixed_pace(long_row("1e-3")), PRETRAINED, budget=LONG_BUDGET),
    Row.of("random_full_pace_3k", "random_full at lr 1e-3, fixed-pace curriculum, 3,000 steps", FULL,
           fixed_pace(long_row("1e-3")), RANDOM, budget=LONG_BUDGET),
    # the pretrained full view learns its range in this setting where the random one does not (2026-12-06): the
    # paper's ablation of it, norm anchoring off (the paper: 16x -> 1.8x)
    Row.of("smollm2_full_pace_3k_no_anchor", "smollm2_full_pace_3k without norm anchoring", FULL,
           fixed_pace(long_row("1e-3")), PRETRAINED, NO_ANCHOR, budget=LONG_BUDGET),
    # no row above, pretrained or random, local view or full, has learned the training range of this rendering, while
    # the package's from-scratch recipe learns swap-S5 in its symbolic rendering (the main job: 99.6% at 8x). The same
    # recipe (hidden 128, 1 + 2 + 1 layers, the task's word-level tokenizer, lr 1e-3, batch 64, the main job's 2,000
    # steps, the fixed pace) on this short text rendering tells the rendering from the parent's size and optimisation
    Row.of("scratch_local", "from scratch (hidden 128, 1+2+1, word-level tokenizer), local view, 2,000 steps", LOCAL,
           SCRATCH, budget=SCRATCH_BUDGET),
    Row.of("scratch_full", "from scratch (hidden 128, 1+2+1, word-level tokenizer), full view, 2,000 steps", FULL,
           SCRATCH, budget=SCRATCH_BUDGET),
    # scratch_local learned its range at step 800 of 64 prompts (51,200); the longest SmolLM2 rows saw 3,000 steps of
    # 8 (24,000). The same recipe at the SmolLM2 rows' batch and steps tells the prompt budget from the parent
    Row.of("scratch_local_b8", "from scratch (hidden 128, 1+2+1), local view, batch 8, 3,000 steps", LOCAL,
           SCRATCH_B8, budget=SCRATCH_BUDGET),
    Row.of("scratch_full_b8", "from scratch (hidden 128, 1+2+1), full view, batch 8, 3,000 steps", FULL,
           SCRATCH_B8, budget=SCRATCH_BUDGET),
    # scratch_local_b8 learned its range at step 1,200 of 8 prompts: the budget is not what holds the SmolLM2 rows
    # back. The SmolLM2 shape in the same setting (local view, lr 1e-3, batch 8, the fixed pace, 3,000 steps at most,
    # stopped by the in-range probe), pretrained and random: the parent against the from-scratch recipe, matched
    Row.of("smollm2_local_pace_3k", "smollm2_local at lr 1e-3, fixed-pace curriculum, 3,000 steps", LOCAL,
           fixed_pace(long_row("1e-3")), PRETRAINED, budget=LONG_BUDGET),
    Row.of("random_local_pace_3k", "random_local at lr 1e-3, fixed-pace curriculum, 3,000 steps", LOCAL,
           fixed_pace(long_row("1e-3")), RANDOM, budget=LONG_BUDGET),
)


def run_path(row: str, seed: int) -> Path:
    return RUN_DIR / f"{row}_s{seed}"


def record_path(row: str, seed: int) -> Path:
    return OUT / "runs" / f"{row}_s{seed}.json"


def row_flags(row: str, parent_gguf: str | None = None, max_train_seconds: float | None = None) -> dict:
    """The row's train_par.py flags with the parent's cache folder filled in, or `parent_gguf` (a GGUF file holding at
    least the parent's first 4 layers, e.g. `python -m par_studies.parents truncate`'s copy: the same weights) read
    instead; `max_train_seconds` in place of the row's time guard (a machine lent for a fixed time)."""
    from par_studies.parents import get_parent

    flags = combine(row, COMMON, ROWS[row].flags)
    if flags.get("--init_from_qwen2") == PARENT:
        if parent_gguf is None:
            flags["--init_from_qwen2"] = str(get_parent("smollm2-135m").ensure())
        else:
            path = Path(parent_gguf)
            if not path.is_file():
                raise SystemExit(f"--parent_gguf: no file {parent_gguf}")
            flags["--init_from_qwen2"], flags["--gguf_file"] = str(path.parent), path.name
    if max_train_seconds is not None:
        flags["--max_train_seconds"] = str(round(max_train_seconds))
    return flags


def scrub(text: str) -> str:
    """A recorded command with the machine's cache folder written as <smollm2>."""
    from par_studies.parents import get_parent

    return text.replace(str(get_parent("smollm2-135m").cache_folder), PARENT)


def evaluate(row: str, seed: int, segments: list[dict], n_test: int | None = None) -> dict:
    """The row's test (accuracy per depth of DEPTHS, the evaluation stop rule) and, for the full view, its progress
    profiles. `n_test` prompts per depth instead of N (in range) / N_MISS (a miss): the full view of a SmolLM2-shaped
    row costs about an hour per 1,024 prompts at d = 64 on this CPU; the record keeps the number used."""
    import torch

    from par_studies import load_run, row_train_seconds
    from state_tracking import evaluate_until_failed
    from state_tracking.diagnostics import progress_profile

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, task = load_run(folder, max(DEPTHS))
    if torch.cuda.is_available():  # a row trained on a GPU machine is tested there
        model.to("cuda")
    reached = in_range_reached(summary)
    # a row that has not reached the training range is a miss: its probe curve is the result, and the test grid
    # (1,024 prompts per depth, hours for the full view on this CPU) is run at N_MISS prompts to show where it stands
    n, profile_depths, profile_n = (N, PROFILE_DEPTHS, PROFILE_N) if reached else (N_MISS, PROFILE_DEPTHS[:1], 64)
    if n_test is not None:
        n, profile_n = n_test, min(profile_n, n_test)
    started = time.time()
    result = evaluate_until_failed(model, tokenizer, task, DEPTHS, mode="forced", n_per_depth=n, seed=seed,
                                   rendering="text", train_max_depth=TRAIN_MAX_DEPTH, progress=False)
    evaluation = {"depths": result["depths"], "accuracy": result["accuracy"], "grid": DEPTHS, "n_per_depth": n,
                  "seconds": round(time.time() - started, 1)}
    print(f"{row} s{seed}: " + " ".join(f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])),
          flush=True)
    profile = None
    if model.config.loop_view == "full":
        started = time.time()
        profile = progress_profile(model, tokenizer, task, profile_depths, n_per_depth=profile_n, seed=seed,
                                   rendering="text", batch_size=64)
        profile["seconds"] = round(time.time() - started, 1)
    segments = [dict(s, command=scrub(s["command"])) for s in segments]
    trained = row_train_seconds(segments)
    curve = summary.get("curve") or []
    return dict(row=row, label=ROWS[row].label, seed=seed, task=task.name, task_file=TASK_FILE,
                command=f"python examples/reproduce/pretrained_swap_s5.py --row {row} --seed {seed}",
                train_commands=[s["command"] for s in segments], segments=segments, steps=summary["steps"],
                samples_seen=summary.get("samples_seen"), train_seconds=trained,
                seconds_per_step=round(trained / max(1, summary["steps"]), 3), curve=curve,
                probe=summary.get("probe"), probe_stopped_at=summary.get("probe_stopped_at"),
                in_range_reached=reached,
                final_curriculum_max_depth=curve[-1].get("curriculum_max_depth") if curve else None,
                evaluation=evaluation, n_per_depth=n, profile=profile, environment=result["environment"],
                parameters=sum(p.numel() for p in model.parameters()))


def in_range_reached(summary: dict) -> bool:
    """Whether training ended on the in-range rule (the probe at d = 8 ≥ 99% twice in a row)."""
    probes = [p["accuracy"] for p in summary.get("probe") or []]
    return summary.get("probe_stopped_at") is not None or (len(probes) >= 2 and min(probes[-2:]) >= 0.99)


def run_row(row: str, seed: int, more_seconds: float | None = None, n_test: int | None = None,
            parent_gguf: str | None = None, max_train_seconds: float | None = None) -> dict:
    segments = train_segment(run_path(row, seed), seed, row_flags(row, parent_gguf, max_train_seconds), row,
                             more_seconds=more_seconds)
    record = evaluate(row, seed, segments, n_test)
    record["peak_rss_gb"] = peak_rss_gb(segments)
    save_record(record, record_path(row, seed))
    return record


PARITY_CASES = [("qwen2.5-coder-0.5b", (8, 8, 8), False), ("qwen2.5-coder-0.5b", (1, 2, 1), True),
                ("smollm2-135m", (10, 10, 10), False), ("smollm2-135m", (1, 2, 1), True)]


def run_parity() -> dict:
    """results/pretrained_swap_s5/parity.json: R = 1 of the retrofit against its parent on the real weights (fp32), for
    the Qwen2.5-shaped parent at the paper's split 8 / 8 / 8 and every parent at the truncation the study uses."""
    import torch

    from par_studies.parents import parity
    from state_tracking.evaluation import environment_info

    torch.set_num_threads(1)
    cases = []
    for name, split, truncate in PARITY_CASES:
        cases.append(parity(name, split, truncate=truncate))
        c = cases[-1]
        print(f"{name} split {c['split']} truncated_to {c['truncated_to']}: conversion max|d| "
              f"{c['conversion_max_abs_diff']:.3g}, R = 1 max|d| {c['r1_max_abs_diff']:.3g} "
              f"(answer logits up to {c['answer_logit_scale']:.3g})", flush=True)
    record = {"command": "python examples/reproduce/pretrained_swap_s5.py --parity", "cases": cases,
              "date": time.strftime("%Y-%m-%d"), "environment": environment_info(torch.device("cpu"))}
    save_record(record, OUT / "parity.json")
    return record


# ------------------------------------------------------------------------------------------------------ collect
TABLE_START, TABLE_END = "<!-- rows: generated by --collect -->", "<!-- end rows -->"


def accuracy_at(record: dict, depth: int) -> float | None:
    evaluation = record["evaluation"]
    if depth in evaluation["depths"]:
        return evaluation["accuracy"][evaluation["depths"].index(depth)]
    return 0.0 if depth in evaluation["grid"] else None  # cut by the stop rule: counted as 0


def cell(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def machine(record: dict) -> str:
    """Where a row ran: the GPU's name, else "CPU" (its train seconds are that machine's)."""
    return record["environment"].get("gpu") or "CPU"


def summary_entry(r: dict) -> dict:
    flags = r["train_commands"][-1]
    scratch = "--init_from_qwen2" not in flags  # the package's from-scratch recipe: no parent, its own tokenizer
    return {"row": r["row"], "seed": r["seed"],
            "parent": "none (from scratch, hidden 128, word-level tokenizer)" if scratch
            else "SmolLM2-135M-Instruct (Q4_1)",
            "layers": [1, 2, 1], "view": "full" if "--loop_view full" in flags else "local",
            "init": "random" if scratch or "--parent_weights random" in flags else "pretrained",
            "norm_anchoring": "--norm_anchoring false" not in flags, "machine": machine(r), "steps": r["steps"],
            "train_seconds": r["train_seconds"], "in_range_reached": r["in_range_reached"],
            "n_per_depth": r["evaluation"].get("n_per_depth", r.get("n_per_depth")),
            "accuracy": {str(d): accuracy_at(r, d) for d in DEPTHS},
            "stopped_by_evaluation_rule": [d for d in DEPTHS if d not in r["evaluation"]["depths"]]}


def curriculum_reached(record: dict) -> str:
    """The curriculum's last d_max and the first logged step at it ("d ≤ 3 (step 570)"), from the record's curve."""
    curve = [p for p in record.get("curve") or [] if p.get("curriculum_max_depth") is not None]
    if not curve:
        return "–"
    top = max(p["curriculum_max_depth"] for p in curve)
    return f"d ≤ {top:g} (step {next(p['step'] for p in curve if p['curriculum_max_depth'] == top)})"


def rows_table(records: list[dict]) -> str:
    lines = ["| row | seed | machine | steps | train s | s / step | curriculum reached | in range (probe ≥ 99%) "
             "| prompts per depth | d=8 | d=16 | d=32 | d=64 |", "|" + "---|" * 13]
    for r in records:
        lines.append(f"| {r['row']} | {r['seed']} | {machine(r)} | {r['steps']} | {r['train_seconds']:.0f} | "
                     f"{r['seconds_per_step']} | {curriculum_reached(r)} | "
                     f"{'yes' if r['in_range_reached'] else 'no'} | "
                     f"{r['evaluation'].get('n_per_depth', r.get('n_per_depth'))} | "
                     + " | ".join(cell(accuracy_at(r, d)) for d in DEPTHS) + " |")
    profiled = [r for r in records if r.get("profile")]
    if profiled:
        lines += ["", "Progress profiles (full-view rows; accuracy % of iteration k = 1, 2, … against the state "
                  "after k operations):", "", "| row | d | prompts | k = 1, 2, … |", "|---|---|---|---|"]
        for r in profiled:
            for d, row in zip(r["profile"]["depths"], r["profile"]["profile"]):
                lines.append(f"| {r['row']} | {d} | {r['profile']['n_per_depth']} | "
                             + " ".join(f"{100 * a:.0f}" for a in row) + " |")
    lines += ["", "Last-iteration accuracy of the training batches (the record's curve, logged every 10 steps), mean "
              "per 100 steps:", "", "| row | seed | steps 1–100, 101–200, … |", "|---|---|---|"]
    lines += [f"| {r['row']} | {r['seed']} | " + " ".join(f"{a:.2f}" for a in batch_accuracy_per_100(r["curve"])) + " |"
              for r in records if r.get("curve")]
    return "\n".join(lines)


def batch_accuracy_per_100(curve: list[dict]) -> list[float]:
    """The mean `acc_last_iteration` of a training curve over steps 1–100, 101–200, … (each block that has entries)."""
    blocks: dict[int, list[float]] = {}
    for entry in curve:
        if "acc_last_iteration" in entry:
            blocks.setdefault((int(entry["step"]) - 1) // 100, []).append(float(entry["acc_last_iteration"]))
    return [sum(values) / len(values) for _, values in sorted(blocks.items())]


def collect() -> dict:
    records = sorted(load_records(OUT / "runs"), key=lambda r: (list(ROWS).index(r["row"]), r["seed"]))
    summary = {"command": "python examples/reproduce/pretrained_swap_s5.py --collect", "task_file": TASK_FILE,
               "train_max_depth": TRAIN_MAX_DEPTH, "n_per_depth": N, "depths": DEPTHS,
               "rows": [summary_entry(r) for r in records]}
    save_record(summary, OUT / "summary.json")
    table = rows_table(records)
    if not splice_table(OUT / "README.md", TABLE_START, TABLE_END, table):
        print(f"{OUT / 'README.md'} has no table markers; the table:")
    print(table)
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", choices=sorted(ROWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--more_seconds", type=float, default=None,
                        help="train a row that ended on its time budget (not in range, under max_steps) on for this "
                             "many more seconds from its newest checkpoint (its schedule unchanged)")
    parser.add_argument("--n_test", type=int, default=None,
                        help=f"prompts per test depth (default {N} for a row in range, {N_MISS} for a miss); the "
                             "record keeps the number used")
    parser.add_argument("--parent_gguf", default=None,
                        help="read the SmolLM2 parent from this GGUF file (e.g. the 4-layer copy `python -m "
                             "par_studies.parents truncate` writes) instead of the cache")
    parser.add_argument("--max_train_seconds", type=float, default=None,
                        help="the row's training time guard in seconds instead of its own (a machine lent for a "
                             "fixed time); the row stops there and is tested as it stands")
    parser.add_argument("--parity", action="store_true", help="R = 1 against the parents (parity.json)")
    parser.add_argument("--collect", action="store_true", help="README.md table and summary.json from runs/*.json")
    args = parser.parse_args(argv)
    if not (args.row or args.parity or args.collect):
        parser.error("give --row, --parity or --collect")
    if args.n_test is not None and args.n_test < 1:
        parser.error(f"--n_test (prompts per test depth) must be >= 1, got {args.n_test}")
    if args.max_train_seconds is not None and args.max_train_seconds <= 0:
        parser.error(f"--max_train_seconds must be > 0, got {args.max_train_seconds}")
    if args.parity:
        run_parity()
    if args.row:
        run_row(args.row, args.seed, args.more_seconds, args.n_test, args.parent_gguf, args.max_train_seconds)
    if args.collect:
        collect()


if __name__ == "__main__":
    main()
