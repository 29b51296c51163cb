"""Length-generalization study at CPU scale: what makes a PAR loop trained on d ≤ 8 solve longer problems.

Every run is `examples/train_par.py` with its defaults and the row's flags (ROWS), one torch thread
(two runs share the 2 cores), then a fixed evaluation: forced depth on fresh sequences at GRID (fine enough to
place d50), the progress profile (every iteration's readout vs z_min(c·k, d)) at PROFILE_DEPTHS, the padding
control (8 real ops + identity ops), and learned halting where the run trains it.

    python examples/studies/length_generalization.py --run local_bidir --seed 0      # train + evaluate one row
    python examples/studies/length_generalization.py --evaluate local_bidir --seed 0 # re-evaluate its model
    python examples/studies/length_generalization.py --collect                     # table, plot, README
    python examples/studies/length_generalization.py --export local_bidir_halting  # a Hub folder of a run

Writes results/length_generalization_cpu/runs/<run>_s<seed>.json (command, seed, steps, wall time, curve,
accuracy grid, G, profiles), README.md (one row per run, mean ± sd where there are seeds), every_run.md (one row per
run and seed) and plots.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from par_cli.flag_values import true_or_false  # noqa: E402
from par_studies import (
    FULL,
    HALTING,
    LOCAL,
    REPO,
    Row,
    argv,
    combine,
    halting,
    load_records,
    load_run,
    repo_module,
    rows_by_name,
    run_logged,
    save_record,
    seeds_cell,
)
from state_tracking.evaluation import STOP_BELOW, repo_relative

OUT = REPO / "results" / "length_generalization_cpu"
RUN_DIR = REPO / "runs" / "length_generalization"
GRID = [8, 10, 12, 16, 24, 32, 48, 64, 128, 256, 512]
FAILED = STOP_BELOW  # two consecutive depths below it end a grid early (d50 is placed; longer is not run)
PROFILE_DEPTHS = [8, 16, 32]
TRAIN_MAX_DEPTH = 8

# name, what it tests, flags on top of train_par.py's defaults (explicit, whatever the defaults are)
ROWS = rows_by_name(
    Row.of("baseline", "faithful PAR: the paper's setting (full view, ordinary positions, 2,000 steps)", FULL),
    Row.of("stretch_all", "positional stretch ramped 1→8 over the whole run", FULL,
           {"--stretch_steps": "2000", "--stretch_max_scale": "8"}),
    Row.of("stretch_half", "stretch as augmentation: half the batches, s_max ramped 1→8 over the run", FULL,
           {"--stretch_steps": "2000", "--stretch_max_scale": "8", "--stretch_fraction": "0.5"}),
    Row.of("random_positions", "randomized sorted positions from [0, 64) (Ruoss et al. 2023), ordinary at test", FULL,
           {"--random_positions_max": "64"}),
    Row.of("progress_positions", "full view, progress-coupled query positions",
           {"--loop_view": "full", "--progress_positions": "true", "--bidirectional_queries": "false"}),
    Row.of("prefix_view", "queries see preamble + ops ≤ k + queries; progress positions; bidirectional queries",
           {"--loop_view": "prefix", "--progress_positions": "true", "--bidirectional_queries": "true"}),
    Row.of("local_causal", "local view (queries see only op k), progress positions, causal queries",
           {"--loop_view": "local", "--progress_positions": "true", "--bidirectional_queries": "false"}),
    Row.of("local_bidir", "local view, progress positions, bidirectional queries (2,000 steps: the recipe, the main "
           "job)", LOCAL),
    Row.of("local_bidir_3000", "local_bidir trained 3,000 steps", LOCAL, {"--max_steps": "3000"}),
    Row.of("local_bidir_halting", "local_bidir + learned halting (weight 0.5), additive hold tail X ~ U{0..8}, window "
           "16", LOCAL, halting(label_offset=None)),
    Row.of("local_bidir_halting_offset", "local_bidir_halting with halting labels Yes once no operation is left "
           "(offset 1)", LOCAL, HALTING),
)


def run_path(name: str, seed: int) -> Path:
    return RUN_DIR / f"{name}_s{seed}"


def train(name: str, seed: int) -> dict:
    command = ["python", "examples/train_par.py", *argv(combine(name, {
        "--output_dir": repo_relative(run_path(name, seed)), "--seed": str(seed), "--eval_depths": "8",
        "--eval_n": "64"}, ROWS[name].flags))]
    started = time.time()
    run_logged(command)
    return {"command": " ".join(command), "wall_seconds": round(time.time() - started, 1)}


def grid_accuracy(model, tokenizer, task, mode: str, common: dict) -> dict:
    """Accuracy on GRID with the stop rule (`state_tracking.evaluate_until_failed`: two consecutive depths under
    FAILED end it; a full-view loop at d = 512 costs ~an hour on CPU, and d50 is already placed)."""
    from state_tracking import evaluate_until_failed

    return evaluate_until_failed(model, tokenizer, task, GRID, mode=mode, train_max_depth=TRAIN_MAX_DEPTH,
                                 stop_below=FAILED, progress=False, **common)


def evaluate(name: str, seed: int, record: dict | None = None) -> dict:
    import torch

    from state_tracking import progress_profile

    torch.set_num_threads(1)
    folder = run_path(name, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, task = load_run(folder, GRID[-1])
    common = dict(n_per_depth=256, seed=seed)
    forced = grid_accuracy(model, tokenizer, task, "forced", common)
    halting = None
    if model.config.halt_token_ids is not None and ROWS[name].halting:
        halting = grid_accuracy(model, tokenizer, task, "halting", common)
    profile = progress_profile(model, tokenizer, task, PROFILE_DEPTHS, **common)
    control = progress_profile(model, tokenizer, task, PROFILE_DEPTHS, padding_control_depth=TRAIN_MAX_DEPTH, **common)
    row = dict(record or {})
    row.update(
        run=name, seed=seed, description=ROWS[name].label, flags=dict(ROWS[name].flags),
        command=row.get("command") or summary["command"], steps=summary["steps"],
        train_seconds=summary["train_seconds"], curve=summary.get("curve"),
        depths=forced["depths"], accuracy=forced["accuracy"], d50=forced["d50"],
        G=forced["extrapolation_factor"], profile=profile, padding_control=control,
        halting=None if halting is None else {
            k: halting[k] for k in ("depths", "accuracy", "d50", "extrapolation_factor", "per_depth")},
        G_is_lower_bound=bool(forced["depths"][-1] == GRID[-1] and forced["accuracy"][-1] >= 0.5),
        environment=forced["environment"],
    )
    save_record(row, OUT / "runs" / f"{name}_s{seed}.json")
    print(f"{name} seed {seed}: " + " ".join(f"d={d}:{100 * a:.1f}" for d, a in zip(row["depths"], row["accuracy"]))
          + f"  G={row['G']}")
    return row


def every_run_table(rows: list[dict]) -> list[str]:
    """One line per run and seed: steps, training seconds, accuracy at every GRID depth, G."""
    head = "| run | seed | steps | train s | " + " | ".join(f"d={d}" for d in GRID) + " | G |"
    lines = [head, "|---|---|---|---|" + "---|" * len(GRID) + "---|"]
    for r in rows:
        acc = dict(zip(r["depths"], r["accuracy"]))
        lines.append(f"| {r['run']} | {r['seed']} | {r['steps']} | {r['train_seconds']:.0f} | "
                     + " | ".join(f"{100 * acc[d]:.1f}" if d in acc else "–" for d in GRID) + f" | {r['G']} |")
    return lines


def mean_table(by_run: dict[str, list]) -> list[str]:
    """One line per run: its number of seeds, the mean ± sd accuracy at every GRID depth, the mean G (and each)."""
    summary = ["| run | seeds | " + " | ".join(f"d={d}" for d in GRID) + " | G |",
               "|---|---|" + "---|" * len(GRID) + "---|"]
    for name, group in by_run.items():
        g = [r["G"] for r in group]
        summary.append(f"| {name} | {len(group)} | " + " | ".join(seeds_cell(group, d) for d in GRID)
                       + f" | {np.mean(g):.2f} ({', '.join(map(str, g))}) |")
    return summary


def profile_lines(rows: list[dict]) -> list[str]:
    """The progress profiles as table lines: per run, seed, prompt kind and depth, the accuracy of every iteration."""
    profiles = []
    for r in rows:
        for kind in ("profile", "padding_control"):
            for d, prof in zip(r[kind]["depths"], r[kind]["profile"]):
                profiles.append(f"| {r['run']} s{r['seed']} | {'padding' if kind != 'profile' else 'random'} | {d} | "
                                + " ".join(f"{100 * a:.0f}" for a in prof) + " |")
    return profiles


def readme_table(by_run: dict[str, list]) -> list[str]:
    """The table the repository README quotes: the mean over seeds at a few depths, and learned halting per seed."""
    short = [8, 12, 16, 32, 64, 128, 256, 512]  # the columns README.md shows
    readme = ["| run (seeds) | " + " | ".join(f"d={d}" for d in short) + " | G |", "|---|" + "---|" * (len(short) + 1)]
    for name, group in by_run.items():
        g = [r["G"] for r in group]
        bound = "≥ " if all(r.get("G_is_lower_bound") for r in group) else ""
        readme.append(f"| `{name}` ({len(group)}) | " + " | ".join(seeds_cell(group, d) for d in short)
                      + f" | {bound}{np.mean(g):.2f} |")
        for r in group if group[0].get("halting") else []:
            h = r["halting"]
            bound = "≥ " if h["depths"][-1] == GRID[-1] and h["accuracy"][-1] >= 0.5 else ""
            readme.append(f"| `{name}`, learned halting (d unknown) | " + " | ".join(seeds_cell([h], d) for d in short)
                          + f" | {bound}{h['extrapolation_factor']:.2f} |")
    return readme


def plot_study(rows: list[dict], by_run: dict[str, list]) -> None:
    """accuracy_vs_depth.png (every run), the best run's progress profile and the baseline's."""
    from state_tracking import plot_accuracy_vs_depth, plot_progress_profile

    def padded(r):  # depths a run stopped before count as 0 (two shorter depths were already below FAILED)
        acc = dict(zip(r["depths"], r["accuracy"]))
        return {**r, "depths": GRID, "accuracy": [acc.get(d, 0.0) for d in GRID]}

    plot_accuracy_vs_depth({name: [padded(r) for r in group] for name, group in by_run.items()},
                           OUT / "accuracy_vs_depth.png", title="swap-S5, train d ≤ 8 (CPU scale)")
    best = max(rows, key=lambda r: (r["G"], sum(r["accuracy"])))
    plot_progress_profile({f"{best['run']} s{best['seed']}: random ops": best["profile"],
                           "padding control (8 ops + identity)": best["padding_control"]},
                          OUT / "progress_profile_best.png", train_max_depth=TRAIN_MAX_DEPTH)
    base = [r for r in rows if r["run"] == "baseline"]
    if base:
        plot_progress_profile({"baseline s0: random ops": base[0]["profile"],
                               "padding control (8 ops + identity)": base[0]["padding_control"]},
                              OUT / "progress_profile_baseline.png", train_max_depth=TRAIN_MAX_DEPTH)


def collect() -> None:
    rows = load_records(OUT / "runs")
    order = {name: i for i, name in enumerate(ROWS)}
    rows.sort(key=lambda r: (order.get(r["run"], 99), r["seed"]))
    lines = every_run_table(rows)
    by_run: dict[str, list] = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    summary = mean_table(by_run)
    profiles = profile_lines(rows)
    (OUT / "readme_table.md").write_text("\n".join(readme_table(by_run)) + "\n")
    text = (OUT / "README.md").read_text() if (OUT / "README.md").exists() else ""
    marker = "<!-- generated below by examples/studies/length_generalization.py --collect -->"
    head_text = text.split(marker)[0] if marker in text else (text or "# Length generalization at CPU scale\n\n")
    (OUT / "every_run.md").write_text("# Every run (overall state accuracy, %)\n\n" + "\n".join(lines) + "\n")
    body = ["## Mean over seeds (overall state accuracy, %, 256 fresh sequences per depth, forced depth)", "",
            *summary, "",
            "## Progress profiles (accuracy of iteration k vs z_min(k, d), %)",
            "", "| run | prompts | d | k = 1, 2, … |", "|---|---|---|---|", *profiles, "",
            "Every run's steps, seconds and accuracy: `every_run.md`; commands, curves, environment: "
            "`runs/<run>_s<seed>.json`.", ""]
    (OUT / "README.md").write_text(head_text + marker + "\n\n" + "\n".join(body))
    plot_study(rows, by_run)
    print("\n".join(summary))


def export_checkpoint(name: str, seed: int, target: Path = RUN_DIR / "export") -> None:
    """Export a study run as a Hub folder (the shipped checkpoints/par-swap-s5-small now comes from the paper
    protocol, examples/reproduce/paper_protocol.py --export): bf16 weights, remote code, tokenizer, task, a card with
    the recipe, its measured accuracy and training curve, and training_summary.json (commands relative to the repo)."""
    import shutil

    hub = repo_module("examples.push_to_hub")
    row = json.loads((OUT / "runs" / f"{name}_s{seed}.json").read_text())
    intro = (f"Run `{name}` (seed {seed}) of the CPU length-generalization study (`results/length_generalization_cpu/` "
             f"in the package repository): {row['description']}.\n\nTraining command: `{row['command']}` "
             f"({row['steps']} steps, {row['train_seconds']:.0f} s on 2 CPU cores shared by two runs, train d ≤ "
             f"{TRAIN_MAX_DEPTH}).\n\nOverall state accuracy (all five boxes right), 256 fresh sequences per depth, "
             "ordinary positions:")
    rows = {"forced depth": row["accuracy"]}
    if row.get("halting"):
        rows["learned halting"] = row["halting"]["accuracy"]
    halting_per_depth = (row.get("halting") or {}).get("per_depth")
    text = hub.results_section(intro, row["depths"], rows, halting_per_depth, row.get("curve"))
    results = OUT / "runs" / f"{name}_s{seed}_card.md"
    results.write_text(text)
    if target.exists():
        shutil.rmtree(target)
    hub.export_for_hub(
        run_path(name, seed), target, repo_id="par-swap-s5-small", dtype="bfloat16", results=results,
        training_data=(f"swap-S5 word problems (identity start, symbolic prompts), depths 1..{TRAIN_MAX_DEPTH} "
                       f"with a depth curriculum; {row['steps']} steps of 64 samples, from scratch."),
        limits=(f"A CPU-scale from-scratch model trained on d ≤ {TRAIN_MAX_DEPTH}; its length generalization "
                "comes from the local loop view (see the study); it reads symbolic prompts only."),
    )
    results.unlink()
    summary = {k: row[k] for k in ("run", "seed", "description", "command", "steps", "train_seconds", "depths",
                                   "accuracy", "d50", "G")}
    summary["halting"] = None if not row.get("halting") else {k: row["halting"][k] for k in ("depths", "accuracy")}
    summary["study"] = "python examples/studies/length_generalization.py --run " + f"{name} --seed {seed}"
    (target / "training_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"exported {name} seed {seed} to {target}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--run", choices=list(ROWS), help="train and evaluate one run")
    group.add_argument("--evaluate", choices=list(ROWS), help="evaluate a trained run again")
    group.add_argument("--collect", type=true_or_false, nargs="?", const=True, default=False,
                       help="rebuild the table, plots and README")
    group.add_argument("--export", choices=list(ROWS), help="export this run to runs/length_generalization/export")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.collect:
        collect()
    elif args.export:
        export_checkpoint(args.export, args.seed)
    elif args.run:
        evaluate(args.run, args.seed, train(args.run, args.seed))
    else:
        evaluate(args.evaluate, args.seed)


if __name__ == "__main__":
    main()
