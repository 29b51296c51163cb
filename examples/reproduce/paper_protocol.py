"""The paper's benchmark protocol on swap-S5 (symbolic prompts): train d ≤ 32, test d = 32 … 1,024 on 1,024 fresh
sequences per length with the stop rule, one row per (method, seed), mean ± sd over seeds.

    python examples/reproduce/paper_protocol.py --row recipe_halting --seed 0   # train (or resume) + evaluate
    python examples/reproduce/paper_protocol.py --row lstm --seed 0             # LSTM baseline (examples/baselines/rnn.py)
    python examples/reproduce/paper_protocol.py --evaluate recipe_halting --seed 0   # re-evaluate a trained run
    python examples/reproduce/paper_protocol.py --collect                       # table.md, README.md, plot
    python examples/reproduce/paper_protocol.py --export recipe_halting --seed 0     # ship as checkpoints/par-swap-s5-small

PAR rows are `examples/train_par.py` with COMMON + the row's flags (written out explicitly, whatever the defaults), one
torch thread each (two rows share this machine's 2 cores). They save a checkpoint every SAVE_STEPS steps; running the
same command again after an interruption resumes from the newest one (`--resume_from_checkpoint`), and the row's
training budget (`--max_train_seconds`) counts every segment (trainers.TimeBudgetCallback keeps the time trained in
the checkpoint). Each segment's wall time is kept in the run folder (segments.json) and in the row's JSON.

Test (every row, every seed): `state_tracking.evaluate_until_failed` on GRID, N sequences per depth drawn by
`evaluation.draw_test_problems` (seeded by the row's seed, apart from training data; the RNN rows score the same
problems), two consecutive depths under 2% end a grid; PAR rows at forced depth (R = d) and, when trained to halt,
with learned halting (stop after two consecutive "Yes"), plus the progress profile and padding control on d = 64
and 128 prompts (256 sequences). Depths a seed did not reach count as 0 in the mean (two shorter ones were < 2%).

Writes results/paper_protocol_cpu/runs/<row>_s<seed>.json (commands, seed, steps, segments and wall times, curve,
accuracy per depth, profiles, machine), table.md, README.md and accuracy_vs_depth.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

OUT = REPO / "results" / "paper_protocol_cpu"
RUN_DIR = REPO / "runs" / "paper_protocol"
TRAIN_MAX_DEPTH = 32
GRID = [32, 64, 128, 256, 512, 1024]
N = 1024
PROFILE_DEPTHS = [64, 128]
PROFILE_N = 256
SAVE_STEPS = 250

# The depth curriculum of every row: d_max(t) = min(32, 2 + ⌊t / 25⌋) — d_max reaches 32 at step 750 (the default
# pace, +1 every 100 steps, would reach it only at step 3,000); then 1,250 steps over d ~ U{1..32}.
CURRICULUM = ["--curriculum_start_depth", "2", "--curriculum_every_steps", "25"]
STEPS = 2000


def common_par() -> list[str]:
    """train_par.py flags every PAR row shares (the row's flags follow and win)."""
    return [
        "--max_train_depth", str(TRAIN_MAX_DEPTH), *CURRICULUM, "--max_steps", str(STEPS),
        "--hidden_size", "128", "--intermediate_size", "256", "--num_attention_heads", "4",
        "--num_key_value_heads", "4", "--prelude_layers", "1", "--core_layers", "2", "--coda_layers", "1",
        "--per_device_train_batch_size", "64", "--learning_rate", "1e-3", "--adapter_learning_rate", "2e-3",
        "--warmup_steps", "100", "--lr_scheduler_type", "cosine", "--weight_decay", "0.01",
        "--eval_depths", str(TRAIN_MAX_DEPTH), "--eval_n", "64",  # train_par's own quick check; the protocol test follows
        "--logging_steps", "50", "--disable_tqdm", "true", "--report_to", "none",
        "--save_strategy", "steps", "--save_steps", str(SAVE_STEPS), "--save_total_limit", "1",
    ]


def common_rnn() -> list[str]:
    """examples/baselines/rnn.py flags every RNN row shares: the same data, curriculum, steps, batch and test."""
    return ["--max_train_depth", str(TRAIN_MAX_DEPTH), *CURRICULUM, "--max_steps", str(STEPS),
            "--batch_size", "64", "--learning_rate", "1e-3", "--logging_steps", "100",
            "--eval_depths", ",".join(map(str, GRID)), "--eval_n", str(N)]


LOCAL = ["--loop_view", "local", "--progress_positions", "true", "--bidirectional_queries", "true"]
FULL = ["--loop_view", "full", "--progress_positions", "false", "--bidirectional_queries", "false"]
HALTING = ["--depth_schedule", "hold", "--hold_extra_iterations", "8", "--grad_window", "16",
           "--halting_loss_weight", "0.5", "--halt_label_offset", "1"]

ROWS = {  # name -> kind ("par" | "rnn"), table label, flags on top of COMMON_*, training budget (s, PAR rows)
    "recipe_halting": dict(kind="par", label="PAR recipe (local view) + halting labels", budget=3600,
                           flags=LOCAL + HALTING),
    "lstm": dict(kind="rnn", label="LSTM, hidden 288 (≈ PAR's parameters)", flags=["--cell", "lstm", "--hidden", "288"]),
    "gru": dict(kind="rnn", label="GRU, hidden 336 (≈ PAR's parameters)", flags=["--cell", "gru", "--hidden", "336"]),
    "full_view": dict(kind="par", label="PAR, paper's setting (full view), no stretch", budget=3 * 3600,
                      flags=FULL + ["--grad_window", "16"]),
    "full_view_stretch": dict(kind="par", label="PAR, paper's setting (full view) + stretch phase", budget=3 * 3600,
                              flags=FULL + ["--grad_window", "16", "--stretch_steps", "500", "--stretch_max_scale", "8"]),
}

PAPER = [  # the paper's reported rows (Qwen2.5-0.5B retrofit, train d ≤ 32; its own report, not reproduced)
    ("Transformer (cited from RLT)", "—", "0.85 ± 0.30", "6"),
    ("RLT (cited)", "97.3 ± 2.8", "55.7 ± 25.8", "6"),
    ("explicit CoT, same backbone", "0.8", "0.8", "—"),
    ("PAR", "99.5 ± 1.2", "95.5 ± 11.0", "6"),
    ("PAR + learned halting", "98.7 ± 3.1", "92.9 ± 16.2", "6"),
]


def run_path(row: str, seed: int) -> Path:
    return RUN_DIR / f"{row}_s{seed}"


def record_path(row: str, seed: int) -> Path:
    return OUT / "runs" / f"{row}_s{seed}.json"


def latest_checkpoint(folder: Path) -> Path | None:
    checkpoints = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return checkpoints[-1] if checkpoints else None


def thread_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1", TOKENIZERS_PARALLELISM="false")


def train_par(row: str, seed: int) -> list[dict]:
    """Train (or resume) a PAR row; returns its segments (command, start, wall seconds, steps reached, status)."""
    folder = run_path(row, seed)
    folder.mkdir(parents=True, exist_ok=True)
    segments_file = folder / "segments.json"
    segments = json.loads(segments_file.read_text()) if segments_file.is_file() else []
    if (folder / "summary.json").is_file():
        return segments
    command = ["python", "examples/train_par.py", "--output_dir", str(folder.relative_to(REPO)), "--seed", str(seed),
               *common_par(), "--max_train_seconds", str(ROWS[row]["budget"]), *ROWS[row]["flags"]]
    resume = latest_checkpoint(folder)
    if resume is not None:
        command += ["--resume_from_checkpoint", str(resume.relative_to(REPO))]
    for segment in segments:  # a segment without an end was cut off (its process ended with the session)
        segment.setdefault("status", "interrupted")
    segments.append({"command": " ".join(command), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "resumed_from": None if resume is None else resume.name, "status": None})
    segments[-1].pop("status")
    segments_file.write_text(json.dumps(segments, indent=1))
    started = time.time()
    with open(folder / f"train_segment{len(segments)}.log", "w") as log:
        code = subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=thread_env(), stdout=log,
                              stderr=subprocess.STDOUT).returncode
    segments[-1].update(wall_seconds=round(time.time() - started, 1), status="finished" if code == 0 else f"exit {code}")
    segments_file.write_text(json.dumps(segments, indent=1))
    if code != 0:
        raise SystemExit(f"{row} seed {seed}: train_par.py exited {code}; see {folder}/train_segment{len(segments)}.log")
    return segments


def evaluate_par(row: str, seed: int, segments: list[dict]) -> dict:
    import torch
    from transformers import AutoTokenizer

    from modeling_par import ParLoopedQwenForStateTracking
    from state_tracking import evaluate_until_failed, load_task_from_dir, progress_profile

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model = ParLoopedQwenForStateTracking.from_pretrained(folder).eval()
    # the loop cap is an inference setting: let forced depth reach the grid's end and halting confirm there
    model.config.max_iterations = max(model.config.max_iterations, GRID[-1] + model.config.halt_window + 8)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    task = load_task_from_dir(folder)
    modes = ["forced"] + (["halting"] if "--halting_loss_weight" in ROWS[row]["flags"] else [])
    evaluation, eval_seconds = {}, {}
    for mode in modes:
        started = time.time()
        result = evaluate_until_failed(model, tokenizer, task, GRID, mode=mode, train_max_depth=TRAIN_MAX_DEPTH,
                                       n_per_depth=N, seed=seed, progress=False)
        eval_seconds[mode] = round(time.time() - started, 1)
        evaluation[mode] = {k: result[k] for k in ("depths", "accuracy", "d50", "extrapolation_factor", "per_depth",
                                                   "stopped_early", "n_per_depth", "seed")}
        print(f"{row} seed {seed} {mode}: " + " ".join(
            f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
    common = dict(n_per_depth=PROFILE_N, seed=seed)
    profile = progress_profile(model, tokenizer, task, PROFILE_DEPTHS, **common)
    control = progress_profile(model, tokenizer, task, PROFILE_DEPTHS, padding_control_depth=TRAIN_MAX_DEPTH, **common)
    return dict(
        row=row, kind="par", label=ROWS[row]["label"], seed=seed, flags=ROWS[row]["flags"],
        command=f"python examples/reproduce/paper_protocol.py --row {row} --seed {seed}",
        train_commands=[s["command"] for s in segments], segments=segments,
        steps=summary["steps"], samples_seen=summary["samples_seen"],
        train_seconds=round(sum(s.get("wall_seconds", 0.0) for s in segments), 1),
        budget_seconds=ROWS[row]["budget"], curriculum={"start": 2, "every_steps": 25, "reaches_32_at_step": 750},
        curve=summary.get("curve"), evaluation=evaluation, eval_seconds=eval_seconds,
        profile=profile, padding_control=control, environment=result["environment"],
        parameters=sum(p.numel() for p in model.parameters()),
    )


def train_and_evaluate_rnn(row: str, seed: int) -> dict:
    folder = run_path(row, seed)
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rnn.json"
    command = ["python", "examples/baselines/rnn.py", "--seed", str(seed), *common_rnn(), *ROWS[row]["flags"],
               "--results_json", str(raw.relative_to(REPO))]
    started = time.time()
    with open(folder / "train.log", "w") as log:
        subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=thread_env(), stdout=log, stderr=subprocess.STDOUT,
                       check=True)
    result = json.loads(raw.read_text())
    from state_tracking import extrapolation_factor, longest_accurate_depth

    forced = {"depths": result["depths"], "accuracy": result["accuracy"],
              "d50": longest_accurate_depth(result["depths"], result["accuracy"]),
              "extrapolation_factor": extrapolation_factor(result["depths"], result["accuracy"], TRAIN_MAX_DEPTH),
              "per_depth": result["per_depth"], "stopped_early": len(result["depths"]) < len(GRID), "n_per_depth": N,
              "seed": seed}
    return dict(row=row, kind="rnn", label=ROWS[row]["label"], seed=seed, flags=ROWS[row]["flags"],
                command=f"python examples/reproduce/paper_protocol.py --row {row} --seed {seed}",
                train_commands=[" ".join(command)], steps=result["steps"],
                samples_seen=result["steps"] * result["batch_size"], train_seconds=result["train_seconds"],
                wall_seconds=round(time.time() - started, 1), curriculum=result["curriculum"], curve=result["curve"],
                evaluation={"forced": forced}, eval_seconds={"forced": result["eval_seconds"]},
                parameters=result["parameters"], environment={"machine": result["machine"], "date": result["date"]})


def save(record: dict) -> None:
    path = record_path(record["row"], record["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))


# ---------------------------------------------------------------------------------------------------------------- table
def padded(evaluation: dict) -> list[float]:
    """Accuracy on GRID; depths past the stop rule count as 0 (two shorter depths were already under 2%)."""
    got = dict(zip(evaluation["depths"], evaluation["accuracy"]))
    return [got.get(d, 0.0) for d in GRID]


def cell(values: list[float]) -> str:
    values = [100 * v for v in values]
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}"


def load_records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((OUT / "runs").glob("*.json"))]


def groups(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for row in ROWS:
        for r in (r for r in records if r["row"] == row):
            for mode in r["evaluation"]:
                out.setdefault((row, mode), []).append(r)
    return out


def name_of(row: str, mode: str) -> str:
    if ROWS[row]["kind"] == "rnn":
        return ROWS[row]["label"]
    return ROWS[row]["label"] + (", learned halting" if mode == "halting" else ", forced depth")


def detailed_table(records: list[dict]) -> str:
    header = "| row (seeds) | " + " | ".join(f"d={d} ({d // TRAIN_MAX_DEPTH}×)" for d in GRID) + \
             " | min over seeds at 16× | train s (mean) | steps |"
    lines = [header, "|---|" + "---|" * (len(GRID) + 3)]
    for (row, mode), members in groups(records).items():
        curves = np.array([padded(r["evaluation"][mode]) for r in members])
        cells = [cell(list(curves[:, i])) for i in range(len(GRID))]
        at16 = (f"{100 * curves[:, GRID.index(16 * TRAIN_MAX_DEPTH)].min():.1f}"
                if 16 * TRAIN_MAX_DEPTH in GRID else "—")
        lines.append(f"| {name_of(row, mode)} ({len(members)}) | " + " | ".join(cells) + f" | {at16} | "
                     f"{np.mean([r['train_seconds'] for r in members]):.0f} | {int(np.mean([r['steps'] for r in members]))} |")
    return "\n".join(lines)


def paper_shaped_table(records: list[dict]) -> str:
    """The paper's columns (8×, 16×) and 32× where measured: its reported rows above ours."""
    lines = ["| method | seeds | 8× (d = 256) | 16× (d = 512) | 32× (d = 1,024) |", "|---|---|---|---|---|"]
    for name, a8, a16, seeds in PAPER:
        lines.append(f"| {name} — *paper, reported* | {seeds} | {a8} | {a16} | — |")
    for (row, mode), members in groups(records).items():
        curves = np.array([padded(r["evaluation"][mode]) for r in members])
        cells = [cell(list(curves[:, GRID.index(k * TRAIN_MAX_DEPTH)])) if k * TRAIN_MAX_DEPTH in GRID else "—"
                 for k in (8, 16, 32)]
        lines.append(f"| {name_of(row, mode)} — *ours, CPU* | {len(members)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def collect() -> None:
    from state_tracking import plot_accuracy_vs_depth

    records = load_records()
    if not records:
        raise SystemExit(f"no runs in {OUT / 'runs'}")
    detailed, shaped = detailed_table(records), paper_shaped_table(records)
    (OUT / "table.md").write_text(shaped + "\n\n" + detailed + "\n")
    series = {name_of(row, mode): [{"depths": GRID, "accuracy": padded(r["evaluation"][mode])} for r in members]
              for (row, mode), members in groups(records).items()}
    plot_accuracy_vs_depth(series, OUT / "accuracy_vs_depth.png", title="swap-S5, train d ≤ 32, 1,024 sequences per depth")
    env = next((r["environment"] for r in records if r["kind"] == "par"), records[0]["environment"])
    (OUT / "README.md").write_text(f"""# swap-S5 at the paper's protocol (CPU scale)

Train d ≤ {TRAIN_MAX_DEPTH} (curriculum d_max = min(32, 2 + ⌊step / 25⌋): 32 from step 750; {STEPS} steps of 64
sequences), test d = {', '.join(map(str, GRID))} on {N} fresh sequences per depth (the row's seed; the same problems
for every method), overall state accuracy (%, all five boxes right; chance 0.8%), mean ± sd over seeds (sample sd).
Two consecutive depths under 2% end a seed's grid; the depths it did not reach count as 0. From-scratch models on
this machine (2 cores, one torch thread per run, two runs at a time), not the paper's Qwen2.5-0.5B retrofit.

Every row: `python examples/reproduce/paper_protocol.py --row <row> --seed <seed>` (then `--collect`); the exact
train command of each segment, its wall time, the curve, the per-depth accuracy and the progress profiles on d = 64 and
128 prompts are in `runs/<row>_s<seed>.json`. Machine: {env.get('platform', env.get('machine'))}; torch
{env.get('torch', '')}, transformers {env.get('transformers', '')}; dates and git commits in each JSON.

{shaped}

{detailed}

Plot: `accuracy_vs_depth.png`.
""")
    print(shaped)
    print(detailed)


def export(row: str, seed: int, target: Path | None = None) -> Path:
    """Ship a trained PAR row as checkpoints/par-swap-s5-small: bf16 weights, remote code, tokenizer, task, a card
    with this run's accuracy (forced and halting, N sequences per depth), halting iterations and training curve,
    and training_summary.json."""
    import shutil

    sys.path.insert(0, str(REPO / "examples"))
    from push_to_hub import export_for_hub, results_section
    from state_tracking.evaluation import repo_relative

    record = json.loads(record_path(row, seed).read_text())
    target = target or REPO / "checkpoints" / "par-swap-s5-small"
    forced, halting = record["evaluation"]["forced"], record["evaluation"].get("halting")
    rows = {"forced depth (R = d)": forced["accuracy"]}
    if halting:
        rows["learned halting (no R given)"] = halting["accuracy"]
    intro = (f"Row `{row}` (seed {seed}) of the paper-protocol reproduction (`examples/reproduce/paper_protocol.py`, "
             f"`results/paper_protocol_cpu/` in the package repository): {record['label']}. Trained on swap-S5, "
             f"d ≤ {TRAIN_MAX_DEPTH}, {record['steps']} steps of 64 ({record['train_seconds']:.0f} s on one CPU thread)."
             f"\n\nOverall state accuracy (%, all five boxes right) on {N} fresh sequences per depth, ordinary "
             f"positions; under the local view learned halting stops at R = d + 1, the first iteration whose window "
             f"holds no operation (the operation boundaries are an input):")
    card = OUT / "runs" / f"{row}_s{seed}_card.md"
    card.write_text(results_section(intro, GRID, rows, (halting or {}).get("per_depth"), record["curve"]))
    if target.exists():
        shutil.rmtree(target)
    try:
        export_for_hub(
            run_path(row, seed), target, repo_id="par-swap-s5-small", dtype="bfloat16", results=card,
            training_data=(f"swap-S5 word problems (identity start, symbolic prompts), depths 1..{TRAIN_MAX_DEPTH} "
                           f"with a depth curriculum (d_max = min(32, 2 + ⌊step / 25⌋)); {record['samples_seen']:,} "
                           f"samples in {record['steps']} steps, from scratch."),
            limits="A from-scratch CPU-scale model (0.7M parameters) for swap-S5 symbolic prompts only.",
        )
    finally:
        card.unlink()
    summary = {"row": row, "label": record["label"], "seed": seed, "steps": record["steps"],
               "samples_seen": record["samples_seen"], "train_seconds": record["train_seconds"],
               "max_train_depth": TRAIN_MAX_DEPTH, "curriculum": record["curriculum"], "command": record["command"],
               "train_commands": record["train_commands"], "n_per_depth": N, "depths": forced["depths"],
               "accuracy": forced["accuracy"], "d50": forced["d50"], "G": forced["extrapolation_factor"],
               "halting": None if not halting else {k: halting[k] for k in ("depths", "accuracy", "d50")},
               "results": repo_relative(record_path(row, seed)), "curve": record["curve"]}
    (target / "training_summary.json").write_text(json.dumps(summary, indent=1))
    size = sum(p.stat().st_size for p in target.iterdir())
    if size > 16 * 2**20:
        raise SystemExit(f"the checkpoint is {size / 2**20:.1f} MiB; the shipped one must be ≤ 16 MiB.")
    print(f"exported {row} seed {seed} to {repo_relative(target)}")
    return target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--row", choices=sorted(ROWS), help="train (or resume) and evaluate this row")
    action.add_argument("--evaluate", choices=sorted(r for r in ROWS if ROWS[r]["kind"] == "par"),
                        help="evaluate a trained PAR row again")
    action.add_argument("--collect", action="store_true", help="rebuild the table, README and plot")
    action.add_argument("--export", choices=sorted(r for r in ROWS if ROWS[r]["kind"] == "par"),
                        help="ship a trained PAR row as checkpoints/par-swap-s5-small")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0; got {args.seed}")
    if args.collect:
        return collect()
    if args.export:
        return export(args.export, args.seed)
    row = args.row or args.evaluate
    if ROWS[row]["kind"] == "rnn":
        record = train_and_evaluate_rnn(row, args.seed)
    else:
        segments = train_par(row, args.seed) if args.row else json.loads(
            (run_path(row, args.seed) / "segments.json").read_text())
        record = evaluate_par(row, args.seed, segments)
    save(record)


if __name__ == "__main__":
    main()
