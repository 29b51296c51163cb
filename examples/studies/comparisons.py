"""The paper's comparisons at CPU scale, on one protocol: train d ≤ 8 (swap-S5 unless the row says otherwise), test on
fresh sequences at d = 8 / 16 / 32 / 64 (in range, 2×, 4×, 8×), 256 per depth, overall state accuracy (every query
right). Every row is one committed command; its JSON keeps the command, seed, steps, wall time and loss curve.

    python examples/studies/comparisons.py --list                      # the rows and what each tests
    python examples/studies/comparisons.py --run plain_transformer --seed 0
    python examples/studies/comparisons.py --collect                   # table + plot + README in results/

Rows (flags on top of `examples/train_par.py`'s defaults, or the TRL script for CoT):
  * PAR, the package's recipe, and PAR in the paper's setting: taken from the length-generalization study
    (results/length_generalization_cpu/runs: local_bidir seeds 0–2 and baseline seed 0; same protocol and depths);
  * explicit chain of thought trained with TRL's SFTTrainer (examples/baselines/cot_trl.py): a 4-layer Qwen2ForCausalLM
    of the PAR model's width writes z_1 … z_d, then the answer; greedy generation with the KV cache at test;
  * a plain Transformer: the same 4-layer stack, no loop (R = 1), final-answer readout at the query tokens;
  * loop ablations: a fixed R = 8 whatever d, random R ~ U{1..16} with final-answer supervision (tested at R = d),
    an unshared 18-layer stack (prelude + 8 × core + coda, R = 1), no norm anchoring, final answer at every iteration;
  * S5 and A5 (PAR recipe, forced and learned halting), label-free prefix self-distillation on S5 and the same run with
    step labels, and a process state machine that is not a group (examples/tasks/batch_process.json).
Runs use one torch thread each (two share the machine's 2 cores).
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

OUT = REPO / "results" / "comparisons_cpu"
RUN_DIR = REPO / "runs" / "comparisons"
STUDY = REPO / "results" / "length_generalization_cpu" / "runs"
DEPTHS = [8, 16, 32, 64]
TRAIN_MAX_DEPTH = 8
EVAL = ["--eval_depths", ",".join(map(str, DEPTHS)), "--eval_n", "256"]

FULL = ["--loop_view", "full", "--progress_positions", "false", "--bidirectional_queries", "false"]
LOCAL = ["--loop_view", "local", "--progress_positions", "true", "--bidirectional_queries", "true"]
HALTING = ["--depth_schedule", "hold", "--hold_extra_iterations", "8", "--grad_window", "16",
           "--halting_loss_weight", "0.5", "--halt_label_offset", "1", "--eval_halting", "true"]
COT_STEPS = "1300"  # 0.54 s/step on one thread: 1,300 steps ≈ 12 min, so three seeds fit the budget

# name -> (group, what it tests, command after `python`)
RUNS = {
    "cot_trl": ("baseline", "explicit CoT (TRL SFTTrainer), 4-layer Qwen2ForCausalLM, greedy generation, "
                f"{COT_STEPS} steps", ["examples/baselines/cot_trl.py", "--max_steps", COT_STEPS]),
    "plain_transformer": ("baseline", "the same 4-layer Qwen2 stack, no loop (R = 1), final answer",
                          ["examples/train_par.py", *FULL, "--depth_schedule", "fixed", "--fixed_iterations", "1",
                           "--objective", "final_only", *EVAL]),
    "fixed_depth": ("loop ablation", "loop with R = 8 whatever d (full view), final answer at R",
                    ["examples/train_par.py", *FULL, "--depth_schedule", "fixed", "--fixed_iterations", "8",
                     "--objective", "final_only", *EVAL]),
    "random_depth_final": ("loop ablation", "loop with random R ~ U{1..16} (full view), final answer at R; test R = d",
                           ["examples/train_par.py", *FULL, "--depth_schedule", "random", "--random_max_iterations",
                            "16", "--objective", "final_only", *EVAL]),
    "unshared_stack": ("loop ablation", "unshared 18-layer stack: prelude + 8 × 2-layer core + coda, R = 1, final answer",
                       ["examples/train_par.py", *FULL, "--core_layers", "16", "--depth_schedule", "fixed",
                        "--fixed_iterations", "1", "--objective", "final_only", *EVAL]),
    "no_anchoring": ("loop ablation", "the recipe without state-norm anchoring",
                     ["examples/train_par.py", *LOCAL, "--norm_anchoring", "false", *EVAL]),
    "final_every_iteration": ("loop ablation", "the recipe with the final answer as every iteration's target",
                              ["examples/train_par.py", *LOCAL, "--objective", "final_every_iteration", *EVAL]),
    "s5_par_labels": ("S5 / A5", "S5, the recipe, step labels, forced depth (the labelled twin of s5_self_distill)",
                      ["examples/train_par.py", *LOCAL, "--task", "s5", *EVAL]),
    "s5_self_distill": ("S5 / A5", "S5, the recipe, label-free prefix self-distillation (EMA teacher, final answer only)",
                        ["examples/train_par.py", *LOCAL, "--task", "s5", "--self_distillation", "true", *EVAL]),
    "s5_par_halting": ("S5 / A5", "S5, the recipe + learned halting", ["examples/train_par.py", *LOCAL, "--task", "s5",
                                                                      *HALTING, *EVAL]),
    "a5_par_halting": ("S5 / A5", "A5 (3-cycles), the recipe + learned halting",
                       ["examples/train_par.py", *LOCAL, "--task", "a5", *HALTING, *EVAL]),
    "batch_process": ("process machine", "batch process with fault/reset (not a group), the recipe + learned halting",
                      ["examples/train_par.py", *LOCAL, "--task_file", "examples/tasks/batch_process.json", *HALTING,
                       *EVAL]),
}
FROM_STUDY = {  # rows measured by the length-generalization study on this protocol: name -> (study run, description)
    "par_recipe": ("local_bidir", "PAR, the package's recipe (local view, progress positions, bidirectional queries)"),
    "par_faithful": ("baseline", "PAR in the paper's setting (full causal view, ordinary positions)"),
}


def run_path(name: str, seed: int) -> Path:
    return RUN_DIR / f"{name}_s{seed}"


def run(name: str, seed: int) -> dict:
    group, description, command = RUNS[name]
    folder = run_path(name, seed)
    args = [*command, "--seed", str(seed), "--output_dir", str(folder.relative_to(REPO))]
    if name == "cot_trl":
        args += ["--results_json", str(folder.relative_to(REPO) / "results.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1")
    started = time.time()
    subprocess.run([sys.executable, *args], cwd=REPO, env=env, check=True)
    wall = round(time.time() - started, 1)
    row = dict(run=name, group=group, description=description, seed=seed, command="python " + " ".join(args),
               wall_seconds=wall)
    if name == "cot_trl":
        row.update(cot_row(json.loads((folder / "results.json").read_text())))
    else:
        summary = json.loads((folder / "summary.json").read_text())
        forced = json.loads((folder / "eval_forced.json").read_text())
        row.update(steps=summary["steps"], train_seconds=summary["train_seconds"], curve=summary["curve"],
                   depths=forced["depths"], accuracy=forced["accuracy"], per_depth=forced["per_depth"],
                   environment=forced["environment"])
        if (folder / "eval_halting.json").exists():
            halting = json.loads((folder / "eval_halting.json").read_text())
            row["halting"] = {k: halting[k] for k in ("depths", "accuracy", "per_depth")}
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    (OUT / "runs" / f"{name}_s{seed}.json").write_text(json.dumps(row, indent=1))
    print(f"{name} seed {seed}: " + " ".join(f"d={d}:{100 * a:.1f}" for d, a in zip(row["depths"], row["accuracy"])))
    return row


def cot_row(result: dict) -> dict:
    """The table's fields from examples/baselines/cot_trl.py's results JSON."""
    return dict(steps=result["steps"], train_seconds=result["wall_time_seconds"]["train"], curve=result["loss_curve"],
                depths=result["eval"]["depths"], accuracy=result["eval"]["accuracy"],
                intermediate_accuracy=result["eval"]["intermediate_accuracy"],
                tokens_per_problem=result["eval"]["mean_generated_tokens"], environment=result["machine"],
                date=result["date"])


def import_cot(path: str) -> dict:
    """A CoT row from a results JSON that cot_trl.py already wrote (its own command, seed and date are kept)."""
    result = json.loads(Path(path).read_text())
    row = dict(run="cot_trl", group=RUNS["cot_trl"][0], description=RUNS["cot_trl"][1], seed=result["seed"],
               command=result["command"], wall_seconds=round(sum(result["wall_time_seconds"].values()), 1),
               **cot_row(result))
    if str(result["steps"]) != COT_STEPS:
        raise ValueError(f"{path} ran {result['steps']} steps; the CoT row uses {COT_STEPS}")
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    (OUT / "runs" / f"cot_trl_s{row['seed']}.json").write_text(json.dumps(row, indent=1))
    return row


def study_rows() -> list[dict]:
    rows = []
    for name, (study_run, description) in FROM_STUDY.items():
        for path in sorted(STUDY.glob(f"{study_run}_s*.json")):
            source = json.loads(path.read_text())
            accuracy = dict(zip(source["depths"], source["accuracy"]))
            rows.append(dict(run=name, group="PAR", description=description, seed=source["seed"],
                             command=source["command"], steps=source["steps"], train_seconds=source["train_seconds"],
                             depths=DEPTHS, accuracy=[accuracy.get(d, 0.0) for d in DEPTHS],
                             source=str(path.relative_to(REPO))))
    return rows


def mean_sd(values: list[float]) -> str:
    values = 100 * np.asarray(values)
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{values.mean():.1f} ± {values.std(ddof=1):.1f}"


def collect() -> str:
    rows = study_rows() + [json.loads(p.read_text()) for p in sorted((OUT / "runs").glob("*.json"))]
    order = list(FROM_STUDY) + list(RUNS)
    by_run: dict[str, list[dict]] = {}
    for row in rows:
        by_run.setdefault(row["run"], []).append(row)
    lines = ["| row | what | seeds | d = 8 (train) | 16 (2×) | 32 (4×) | 64 (8×) | learned halting 8 / 16 / 32 / 64 | "
             "train min | command |", "|---|---|---|---|---|---|---|---|---|---|"]
    curves = {}
    for name in order:
        if name not in by_run:
            continue
        runs = by_run[name]
        cells = [mean_sd([r["accuracy"][r["depths"].index(d)] for r in runs]) for d in DEPTHS]
        halting = ""
        if all("halting" in r for r in runs):
            halting = " / ".join(mean_sd([r["halting"]["accuracy"][r["halting"]["depths"].index(d)] for r in runs])
                                 for d in DEPTHS)
        extra = ""
        if "tokens_per_problem" in runs[0]:
            tokens = np.mean([r["tokens_per_problem"] for r in runs], axis=0)
            extra = " (tokens generated per problem: " + " / ".join(f"{t:.0f}" for t in tokens) + ")"
        minutes = np.mean([r["train_seconds"] for r in runs]) / 60
        seeds = ",".join(str(r["seed"]) for r in runs)
        lines.append(f"| `{name}` | {runs[0]['description']}{extra} | {seeds} | " + " | ".join(cells)
                     + f" | {halting} | {minutes:.1f} | `{runs[0]['command']}` |")
        curves[name] = np.mean([r["accuracy"] for r in runs], axis=0)
    table = "\n".join(lines)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.md").write_text(table + "\n")
    plot(curves)
    print(table)
    return table


def plot(curves: dict[str, np.ndarray]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, accuracy in curves.items():
        style = "-" if name.startswith("par") else "--"
        ax.plot(DEPTHS, 100 * accuracy, style, marker="o", label=name)
    ax.axvline(TRAIN_MAX_DEPTH, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(DEPTHS, [str(d) for d in DEPTHS])
    ax.set_xlabel("test depth d (trained on d ≤ 8)")
    ax.set_ylabel("overall state accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Comparisons at CPU scale (mean over seeds)")
    fig.tight_layout()
    fig.savefig(OUT / "accuracy_vs_depth.png", dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", choices=list(RUNS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collect", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--import-cot", default=None, metavar="JSON", help="add a cot_trl.py results JSON as a row")
    args = parser.parse_args(argv)
    if args.list:
        for name, (group, description, command) in RUNS.items():
            print(f"{name:22s} [{group}] {description}\n    python {' '.join(command)}")
    if args.import_cot:
        import_cot(args.import_cot)
    if args.run:
        run(args.run, args.seed)
    if args.collect:
        collect()


if __name__ == "__main__":
    main()
