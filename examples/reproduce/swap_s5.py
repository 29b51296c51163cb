"""Reproduce the swap-S5 table: PAR × seeds, PAR + learned halting, and the two ablations, trained in parallel
processes under one wall-clock budget each, then evaluated on fresh sequences per depth.

    python examples/reproduce/swap_s5.py --scale cpu     # train d ≤ 8, test to 64: minutes on 2 CPU cores
    python examples/reproduce/swap_s5.py --scale gpu     # train d ≤ 32, test to 1024: one H200, ≤ 9 minutes

Writes OUT/<run>.json (config, seed, steps, samples seen, wall time, machine, per-depth accuracy),
OUT/README.md (mean ± sd across seeds beside the paper's numbers), OUT/accuracy_vs_depth.png, and copies the
best PAR run as a bf16 checkpoint to --checkpoint_dir. Each run is `examples/train_par.py` with the scale's flags and
the row's (ROWS) over them, then `--extra`'s over both.

The paper's protocol row by row (train d ≤ 32, 1,024 sequences per length, 6 seeds, resumable rows, LSTM / GRU
baselines, the stop rule) is `examples/reproduce/paper_protocol.py`, which also ships checkpoints/par-swap-s5-small;
this script is the one-call version (all runs in parallel under one wall-clock budget) for a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from par_cli.flag_values import true_or_false  # noqa: E402
from par_studies import (
    FULL,
    REPO,
    Row,
    argv,
    combine,
    halting,
    mean_sd,
    parse_argv,
    repo_module,
    rows_by_name,
    thread_env,
)
from state_tracking import plot_accuracy_vs_depth

SCALES = {
    # From-scratch Qwen2-architecture models (no pretrained weights can be downloaded here).
    "cpu": dict(
        common={"--hidden_size": "128", "--intermediate_size": "256", "--num_attention_heads": "4",
                "--num_key_value_heads": "4", "--prelude_layers": "1", "--core_layers": "2", "--coda_layers": "1",
                "--max_train_depth": "8", "--curriculum_start_depth": "2", "--curriculum_every_steps": "75",
                "--per_device_train_batch_size": "64", "--learning_rate": "1e-3", "--adapter_learning_rate": "2e-3",
                "--lr_scheduler_type": "cosine", "--warmup_steps": "100", "--max_steps": "1500",
                "--train_size": "100000", "--eval_depths": "8,16,32,64", "--eval_batch_size": "256",
                "--max_iterations": "200", "--use_cpu": "true"},
        budget=2400, threads=1, n=1024, train_max_depth=8,
    ),
    "gpu": dict(
        common={"--hidden_size": "256", "--intermediate_size": "1024", "--num_attention_heads": "4",
                "--num_key_value_heads": "4", "--prelude_layers": "2", "--core_layers": "2", "--coda_layers": "2",
                "--max_train_depth": "32", "--curriculum_start_depth": "2", "--curriculum_every_steps": "25",
                "--per_device_train_batch_size": "128", "--learning_rate": "1e-3", "--adapter_learning_rate": "2e-3",
                "--lr_scheduler_type": "cosine", "--warmup_steps": "100", "--max_steps": "3000",
                "--train_size": "400000", "--eval_depths": "32,64,128,256,512,1024", "--eval_batch_size": "512",
                "--bf16": "true", "--max_iterations": "1100"},
        budget=330, threads=2, n=1024, train_max_depth=32,
    ),
}

# The recipe (train_par.py's from-scratch default since the length-generalization study,
# results/length_generalization_cpu/): local loop view, progress-coupled query positions, bidirectional queries.
# The paper's setting (full causal view, ordinary positions) is the `par_faithful` row. A halting row is also evaluated
# with learned halting (--eval_halting).
ROWS = rows_by_name(
    Row.of("par_seed0", "PAR (recipe)", {"--seed": "0"}),
    Row.of("par_seed1", "PAR (recipe)", {"--seed": "1"}),
    Row.of("par_seed2", "PAR (recipe)", {"--seed": "2"}),
    Row.of("par_halting", "PAR (recipe) + learned halting", {"--seed": "0"}, halting(label_offset=None)),
    Row.of("par_faithful", "PAR, paper's setting (full view)", {"--seed": "0"}, FULL),
    Row.of("no_anchoring", "ablation: recipe without norm anchoring", {"--seed": "0", "--norm_anchoring": "false"}),
    Row.of("final_every_iteration", "ablation: recipe, final answer at every iteration",
           {"--seed": "0", "--objective": "final_every_iteration"}),
)

PAPER = """Paper (Qwen2.5-0.5B retrofit, train d ≤ 32, its own report; not reproduced here):

| method | 256 steps (8×) | 512 steps (16×) |
|---|---|---|
| Transformer (cited from RLT) | — | 0.85 ± 0.30 |
| RLT (cited) | 97.3 ± 2.8 | 55.7 ± 25.8 |
| explicit CoT, same backbone | 0.8 | 0.8 |
| PAR (6 seeds) | 99.5 ± 1.2 | 95.5 ± 11.0 |
| PAR + learned halting (length unknown) | 98.7 ± 3.1 | 92.9 ± 16.2 |

Ablations (paper): without norm anchoring G ≈ 1.8 (vs 16); final answer at every iteration G ≈ 2."""


def launch(name: str, scale: dict, work: Path, budget: float, n: int, extra: dict[str, str]) -> subprocess.Popen:
    """Start one row: the scale's flags, the run settings (output folder, budget, test size, logging, no checkpoints)
    and the row's flags over them, then `extra`'s (--extra) over all."""
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    row = ROWS[name]
    settings = {"--output_dir": str(out), "--max_train_seconds": str(budget), "--eval_n": str(n),
                "--logging_steps": "50", "--disable_tqdm": "true", "--report_to": "none", "--save_strategy": "no"}
    flags = {**scale["common"], **settings, **combine(
        name, row.flags, {"--eval_halting": "true"} if row.halting else {}), **extra}
    cmd = [sys.executable, str(REPO / "examples" / "train_par.py"), *argv(flags)]
    env = {**thread_env(), "OMP_NUM_THREADS": str(scale["threads"]), "MKL_NUM_THREADS": str(scale["threads"])}
    log = open(out / "train.log", "w")  # the process writes it until it ends
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def collect(name: str, label: str, work: Path, out_dir: Path, scale: str, command: str) -> dict:
    run_dir = work / name
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = {mode: json.loads((run_dir / f"eval_{mode}.json").read_text()) for mode in summary["accuracy"]}
    record = {
        "run": name, "label": label, "scale": scale, "seed": summary["seed"], "steps": summary["steps"],
        "samples_seen": summary["samples_seen"], "train_seconds": summary["train_seconds"],
        "max_train_depth": summary["max_train_depth"], "train_command": summary["command"],
        "reproduce_command": command, "machine": summary["environment"],
        "model_config": evals["forced"]["model_config"],
        "evaluation": {mode: {"depths": e["depths"], "accuracy": e["accuracy"], "n_per_depth": e["n_per_depth"],
                              "seed": e["seed"], "d50": e["d50"], "extrapolation_factor": e["extrapolation_factor"],
                              "mean_iterations": [row["mean_iterations"] for row in e["per_depth"]],
                              "fraction_not_halted": [row["fraction_not_halted"] for row in e["per_depth"]]}
                       for mode, e in evals.items()},
    }
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1))
    return record


def write_report(records: list[dict], out_dir: Path, scale: str, command: str, budget: float) -> str:
    depths = records[0]["evaluation"]["forced"]["depths"]
    train_max = records[0]["max_train_depth"]
    groups: dict[str, list[tuple[dict, str]]] = {}
    for r in records:
        for mode in r["evaluation"]:
            key = r["label"] + (" — learned halting" if mode == "halting" else " — forced depth")
            groups.setdefault(key, []).append((r, mode))
    header = "| method (runs) | " + " | ".join(f"d={d}" + (" (train)" if d <= train_max else f" ({d // train_max}×)")
                                               for d in depths) + " | G | steps |"
    lines = [header, "|---|" + "---|" * (len(depths) + 2)]
    for key, members in groups.items():
        cells = [mean_sd([r["evaluation"][m]["accuracy"][i] for r, m in members]) for i in range(len(depths))]
        gs = [r["evaluation"][m]["extrapolation_factor"] for r, m in members]
        steps = [r["steps"] for r, _ in members]
        lines.append(f"| {key} ({len(members)}) | " + " | ".join(cells) + f" | {mean_sd(gs, scale=1.0)} | "
                     f"{int(np.mean(steps))} |")
    machine = records[0]["machine"]
    table = "\n".join(lines)
    text = f"""# swap-S5 length generalization — {scale.upper()} scale

Overall state accuracy (%, all five boxes right) on {records[0]['evaluation']['forced']['n_per_depth']} fresh
sequences per depth (evaluation seed separate from training), mean ± sd across seeds where there are several.
Train depth ≤ {train_max}; G = d50 / d_train (d50: the longest tested depth whose accuracy, and every shorter
one's, is ≥ 50%). All runs trained in parallel, each for its step budget (see `steps`) under a {budget:.0f} s \
wall-clock cap.

{table}

- Command: `{command}`
- Machine: {machine.get('platform')}, {machine.get('gpu', 'CPU only')}, torch {machine.get('torch')},
  transformers {machine.get('transformers')}; date {machine.get('date')}; git {machine.get('git_commit')}.
- Per-run details (config, seed, steps, samples seen, wall time, per-depth accuracy): `<run>.json` here.
- Plot: `accuracy_vs_depth.png`.

{PAPER}
"""
    (out_dir / "README.md").write_text(text)
    return table


def save_best_checkpoint(records: list[dict], work: Path, target: Path, results_markdown: Path) -> str:
    """Export the PAR run (halting included) with the best mean forced accuracy beyond the training depth as a
    bf16, Hub-ready folder (examples/push_to_hub.py: weights, remote code, tokenizer, task, model card)."""
    export_for_hub = repo_module("examples.push_to_hub").export_for_hub
    candidates = [r for r in records if r["label"].startswith("PAR")]

    def beyond(r):
        e = r["evaluation"]["forced"]
        return np.mean([a for d, a in zip(e["depths"], e["accuracy"]) if d > r["max_train_depth"]])

    best = max(candidates, key=lambda r: (beyond(r), np.mean(r["evaluation"]["forced"]["accuracy"])))
    if target.exists():
        shutil.rmtree(target)
    scale = best["scale"]
    export_for_hub(
        work / best["run"], target, repo_id=f"par-swap-s5-small-{scale}", dtype="bfloat16", results=results_markdown,
        training_data=(f"swap-S5 word problems (identity start, symbolic prompts), depths ≤ {best['max_train_depth']} "
                       f"with a depth curriculum; {best['samples_seen']:,} samples seen in {best['steps']} steps "
                       f"({best['train_seconds']:.0f} s, {scale.upper()} scale); run `{best['run']}`, "
                       f"seed {best['seed']}."),
        limits=f"A {scale.upper()}-scale from-scratch model: see the results for how far it extrapolates.",
    )
    (target / "training_summary.json").write_text(json.dumps(
        {k: best[k] for k in ("run", "label", "scale", "seed", "steps", "samples_seen", "train_seconds",
                              "max_train_depth", "train_command", "evaluation")}, indent=1))
    size = sum(p.stat().st_size for p in target.iterdir())
    if size > 16 * 2**20:
        raise ValueError(f"the best checkpoint is {size / 2**20:.1f} MiB; the shipped one must be ≤ 16 MiB.")
    return best["run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--out", default=None, help="results folder (default results/swap_s5[_cpu])")
    parser.add_argument("--work_dir", "--work-dir", default="runs/reproduce_swap_s5", help="run folders (models, logs)")
    parser.add_argument("--budget_seconds", "--budget-seconds", type=float, default=None,
                        help="training wall time per run")
    parser.add_argument("--n", type=int, default=None, help="test sequences per depth (protocol: 1024)")
    parser.add_argument("--runs", default=",".join(ROWS), help=f"comma-separated subset of {list(ROWS)}")
    parser.add_argument("--checkpoint_dir", "--checkpoint-dir", default=None,
                        help="where the best PAR run goes as bf16 (optional)")
    parser.add_argument("--extra", default="", help="train_par.py '--flag value' pairs for every run (quoted); they "
                        "replace the scale's and the row's values")
    parser.add_argument("--collect_only", "--collect-only", type=true_or_false, nargs="?", const=True, default=False,
                        help="do not train: rebuild the report and checkpoint from the runs already in --work_dir")
    return parser


def train_runs(names: list[str], scale: dict, work: Path, budget: float, n: int, extra: dict) -> list[str]:
    """Launch every row's training in parallel, wait for all; the names of those that failed."""
    procs = {name: launch(name, scale, work, budget, n, extra) for name in names}
    failed = []
    for name, proc in procs.items():
        if proc.wait() != 0:
            failed.append(name)
            print(f"[{name}] FAILED (exit {proc.returncode}); see {work / name / 'train.log'}", flush=True)
    return failed


def plot_runs(records: list[dict], path: Path, title: str) -> None:
    """Accuracy against depth of every run, a series per row and mode (halting apart)."""
    series: dict[str, list[dict]] = {}
    for r in records:
        for mode, e in r["evaluation"].items():
            label = r["label"] + (" (halting)" if mode == "halting" else "")
            series.setdefault(label, []).append({"depths": e["depths"], "accuracy": e["accuracy"]})
    plot_accuracy_vs_depth(series, path, title=title)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    names = args.runs.split(",")
    unknown = sorted(set(names) - set(ROWS))
    if unknown:
        parser.error(f"--runs: unknown {unknown}; allowed {list(ROWS)}")
    try:
        extra = parse_argv(shlex.split(args.extra), "--extra")
    except ValueError as error:
        parser.error(str(error))
    budget = args.budget_seconds or scale["budget"]
    n = args.n or scale["n"]
    out_dir = Path(args.out or f"results/swap_s5{'_cpu' if args.scale == 'cpu' else ''}")
    work = Path(args.work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python examples/reproduce/swap_s5.py " + " ".join(argv if argv is not None else sys.argv[1:])

    started = time.time()
    failed = [] if args.collect_only else train_runs(names, scale, work, budget, n, extra)
    if args.collect_only:  # the report names the command that trained the runs, kept in each run's record
        previous = out_dir / f"{names[0]}.json"
        if previous.is_file():
            command = json.loads(previous.read_text())["reproduce_command"]
    print(f"all runs finished in {time.time() - started:.0f} s", flush=True)
    records = [collect(name, ROWS[name].label, work, out_dir, args.scale, command)
               for name in names if name not in failed]
    if not records:
        raise SystemExit("every run failed")
    table = write_report(records, out_dir, args.scale, command, budget)
    plot_runs(records, out_dir / "accuracy_vs_depth.png",
              f"swap-S5, train d ≤ {scale['train_max_depth']} ({args.scale} scale)")
    print(table)
    if args.checkpoint_dir:
        print("best PAR run:", save_best_checkpoint(records, work, Path(args.checkpoint_dir), out_dir / "README.md"))
    if failed:
        raise SystemExit(f"runs failed: {failed}")

if __name__ == "__main__":
    main()
