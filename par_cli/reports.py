"""What a training run (`examples/train_par.py`) writes after training: the evaluation of the trained model (per-depth
or per-length accuracy as JSON, a table and a plot) and summary.json (time, steps, accuracy, the training curve,
the probes, the environment and the command).

`task_args` and `train_args` are train_par.py's argument dataclasses (any objects with their fields).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from state_tracking.diagnostics import plot_progress_profile
from state_tracking.evaluation import (
    default_workers,
    environment_info,
    evaluate_length_generalization,
    plot_accuracy_vs_depth,
    repo_relative,
    save_results,
)
from state_tracking.records import RecordSplits, evaluate_records, has_step_states, records_progress_profile
from trainers.step_budget import examples_per_step

# summary.json's curve: every loss part the trainer logs ("loss" and each "loss_*": loss_answer, loss_halt, loss_final,
# loss_distill, ...) and these
CURVE_KEYS = ("step", "acc_last_iteration", "acc_window_mean", "depth", "iterations", "curriculum_max_depth",
              "stretch_s_max", "learning_rate")


def training_curve(log_history: list[dict]) -> list[dict]:
    """The training logs of a run's history (those with a loss), each cut to its step, loss parts and CURVE_KEYS."""
    return [{k: v for k, v in row.items() if k in CURVE_KEYS or k == "loss" or k.startswith("loss_")}
            for row in log_history if "loss" in row]


def evaluate_and_report(model, tokenizer, task, task_args, train_args, output_dir: Path) -> dict:
    """Generated problems: accuracy at every --eval_depths depth, forced (and with learned halting under
    --eval_halting): eval_<mode>.json, eval_table.md (printed), accuracy_vs_depth.png."""
    depths = [int(d) for d in task_args.eval_depths.split(",")]
    modes = ["forced"] + (["halting"] if task_args.eval_halting else [])
    results = {}
    for mode in modes:
        results[mode] = evaluate_length_generalization(
            model, tokenizer, task, depths, n_per_depth=task_args.eval_n, mode=mode, seed=train_args.seed,
            batch_size=task_args.eval_batch_size, rendering=task_args.rendering,
            train_max_depth=train_args.max_train_depth, random_initial=task_args.random_initial,
            workers=task_args.eval_workers or default_workers(model.device, model.config._attn_implementation),
            fixed_iterations=train_args.fixed_iterations if mode == "forced" else None,
        )
        save_results(results[mode], output_dir / f"eval_{mode}.json")
    plot_accuracy_vs_depth({f"{task.name} ({m})": [r] for m, r in results.items()},
                           output_dir / "accuracy_vs_depth.png")
    lines = ["| depth | " + " | ".join(f"acc ({m})" for m in modes) + " |", "|---|" + "---|" * len(modes)]
    for i, d in enumerate(depths):
        marker = " (train)" if d <= train_args.max_train_depth else ""
        lines.append(f"| {d}{marker} | " + " | ".join(f"{results[m]['accuracy'][i]:.3f}" for m in modes) + " |")
    lines.append("")
    lines.append("G = d50 / d_train: " + ", ".join(f"{m}: {results[m]['extrapolation_factor']}" for m in modes))
    table = "\n".join(lines)
    (output_dir / "eval_table.md").write_text(table + "\n")
    print(table)
    return results


def evaluate_records_and_report(model, records: RecordSplits, task_args, train_args, output_dir: Path) -> dict:
    """Every evaluation split: accuracy per length present (eval_<split>.json, a table, one plot), and where the
    split records step states, the progress profile (profile_<split>.json / .png)."""
    results = {}
    workers = task_args.eval_workers or default_workers(model.device, model.config._attn_implementation)
    modes = ["forced"] + (["halting"] if task_args.eval_halting else [])
    lines = []
    for split, (loaded, encoded) in records.splits.items():
        for mode in modes:
            result = evaluate_records(model, encoded, records.record_format, mode=mode,
                                      batch_size=task_args.eval_batch_size, train_max_depth=train_args.max_train_depth,
                                      workers=workers, sources=[repo_relative(p) for p in loaded.sources],
                                      progress=not train_args.disable_tqdm, split=split)
            results[f"{split}_{mode}" if mode != "forced" else split] = result
            save_results(result, output_dir / f"eval_{split}{'' if mode == 'forced' else '_' + mode}.json")
            lines += [f"{split} ({mode}):", "| length | n | accuracy |", "|---|---|---|"]
            lines += [f"| {r['depth']} | {r['n']} | {r['accuracy']:.4f} |" for r in result["per_depth"]]
            lines.append("")
        if has_step_states(loaded):
            profile = records_progress_profile(model, encoded, batch_size=task_args.eval_batch_size,
                                               max_records_per_depth=task_args.eval_n)
            save_results(profile, output_dir / f"profile_{split}.json")
            plottable = dict(profile, profile=[[np.nan if a is None else a for a in row] for row in profile["profile"]])
            plot_progress_profile({f"progress profile ({split})": plottable}, output_dir / f"profile_{split}.png",
                                  train_max_depth=train_args.max_train_depth)
    if results:
        plot_accuracy_vs_depth({name: [r] for name, r in results.items()}, output_dir / "accuracy_vs_depth.png",
                               title=records.record_format.task_name)
        table = "\n".join(lines)
        (output_dir / "eval_table.md").write_text(table + "\n")
        print(table)
    return results


def stopped_by(log_history: list[dict], steps: int, max_steps: int, records: bool) -> str | None:
    """What ended training, named by its flag: the probe's stop rule ("stop_when_validation_exact" with records,
    "probe_stop_accuracy" with a task probe), the learned-nothing stop ("stop_when_learning_nothing_after"), the
    wall-clock cap ("max_train_seconds"), the step budget ("max_steps"); None if none of them (training ended
    otherwise). Only a stop logged at the last step counts (a resumed run's history holds its earlier segments'
    stops)."""
    last = [row for row in log_history if row.get("step") == steps]
    if any("probe_stop" in row for row in last):
        return "stop_when_validation_exact" if records else "probe_stop_accuracy"
    if any("probe_at_chance_stop" in row for row in last):
        return "stop_when_learning_nothing_after"
    if any("time_budget_stop" in row for row in last):
        return "max_train_seconds"
    return "max_steps" if steps >= max_steps else None


def run_summary(trainer, train_args, results: dict, train_seconds: float, world: int, device, command: str,
                records: RecordSplits | None = None) -> dict:
    """summary.json of a finished run: its training time, steps and samples, what ended training (`stopped_by`), the
    accuracy per depth (and the extrapolation factor, mean iterations) per evaluation, the training curve, the probes
    and where the weights it ends with came from, the environment, the command; with records, what was read."""
    args, state = train_args, trainer.state
    steps = state.global_step
    summary = {
        "train_seconds": round(train_seconds, 1), "steps": steps, "max_steps": args.max_steps,
        "samples_seen": steps * examples_per_step(args, world),
        "seed": args.seed, "max_train_depth": args.max_train_depth,
        "accuracy": {m: dict(zip(r["depths"], r["accuracy"])) for m, r in results.items()},
        "extrapolation_factor": {m: r["extrapolation_factor"] for m, r in results.items()},
        "mean_iterations": {m: dict(zip(r["depths"], (row["mean_iterations"] for row in r["per_depth"])))
                            for m, r in results.items()},
        "curve": training_curve(state.log_history),
        "probe": [{"step": row["step"], "accuracy": row["probe_accuracy"]} for row in state.log_history
                  if "probe_accuracy" in row],
        "stopped_by": stopped_by(state.log_history, steps, args.max_steps, records is not None),
        "max_train_seconds": getattr(args, "max_train_seconds", None),
        "probe_stopped_at": next((row["step"] for row in state.log_history if "probe_stop" in row), None),
        "probe_restored_step": next((row["probe_restored_step"] for row in state.log_history
                                     if "probe_restored_step" in row), None),
        # the checkpoint holding the weights the run ends with, when the validation probe keeps the best
        "best_model_checkpoint": state.best_model_checkpoint,
        "environment": next(iter(results.values()))["environment"] if results else environment_info(device),
        "command": command,
    }
    if records is not None:
        summary["records"] = {"training_mode": records.mode, "train_records": len(records.encoded),
                              "prepare_seconds": round(records.seconds, 2),
                              "train_sources": [repo_relative(p) for p in records.train.sources],
                              "operations": len(records.record_format.operations),
                              "labels": len(records.record_format.candidates),
                              "queries": list(records.record_format.query_names),
                              "skipped": {k: len(v) for k, v in records.skipped.items()},
                              "notes": list(records.notes)}
    return summary


__all__ = ["CURVE_KEYS", "evaluate_and_report", "evaluate_records_and_report", "run_summary", "stopped_by",
           "training_curve"]
