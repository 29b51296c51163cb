"""A trained row along two paths: its probe over training beside the curriculum (`--probe_curve`, with the weights
compared against a run without the probe), and its weights moved back toward its parent's (`--interpolate`,
WiSE-FT)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import save_record
from .evaluation import evaluate_phrasing, test_task
from .rows import DEPTHS, OUT, PHRASINGS, ROWS
from .training import row_flags, run_path, scrub

PROBE_CURVES_OUT = OUT / "probe_curves"


def probe_curve(row: str, seed: int, compare_to: str | None = None) -> dict:
    """A trained row's probe over training (its summary.json `probe`: every probe's step and accuracy) beside its
    training curve's curriculum d_max, in probe_curves/<row>_s<seed>.json. With `compare_to`, a row trained with the
    same flags but the probe, the largest |Δ| between the two final models' weights: 0 (or kernel rounding) says the
    probe changed nothing, so that row's evaluation is this row's too and need not be run again."""
    from safetensors.torch import load_file

    from par_studies import row_train_seconds

    folder = run_path(row, seed)
    if not (folder / "summary.json").is_file():
        raise SystemExit(f"--probe_curve {row}: {folder} holds no finished run (summary.json)")
    summary = json.loads((folder / "summary.json").read_text())
    if not summary.get("probe"):
        raise SystemExit(f"--probe_curve {row}: its run logged no probe (give the row --probe_depth)")
    segments = json.loads((folder / "segments.json").read_text()) if (folder / "segments.json").is_file() else []
    depth_at = {entry["step"]: int(entry["curriculum_max_depth"]) for entry in summary.get("curve") or []
                if "curriculum_max_depth" in entry}

    def d_max(step: int) -> int | None:
        logged = [s for s in depth_at if s <= step]
        return depth_at[max(logged)] if logged else None

    record = {"row": row, "seed": seed, "steps": summary["steps"],
              "train_seconds": row_train_seconds(segments) if segments else summary["train_seconds"],
              "probe_flags": {k: v for k, v in ROWS[row].flags.items() if k.startswith("--probe_")},
              "probe": [dict(entry, curriculum_max_depth=d_max(entry["step"])) for entry in summary["probe"]],
              "segments": [dict(s, command=scrub(s["command"])) for s in segments],
              "command": f"python examples/reproduce/pretrained_smollm2.py --probe_curve {row} --seed {seed}"
                         + (f" --compare_to {compare_to}" if compare_to else "")}
    if compare_to is not None:
        other = run_path(compare_to, seed) / "model.safetensors"
        if not other.is_file():
            raise SystemExit(f"--compare_to {compare_to}: {other} does not exist")
        mine, theirs = load_file(str(folder / "model.safetensors")), load_file(str(other))
        if set(mine) != set(theirs):
            raise SystemExit(f"--compare_to {compare_to}: the two models hold different weights")
        record["compare_to"] = {"row": compare_to, "max_abs_weight_diff": max(
            float((mine[k].float() - theirs[k].float()).abs().max()) for k in mine)}
    for entry in record["probe"]:
        print(f"{row} s{seed} step {entry['step']}: {100 * entry['accuracy']:.2f}% "
              f"(d_max {entry['curriculum_max_depth']})", flush=True)
    if compare_to is not None:
        print(f"max |weight difference| against {compare_to}: {record['compare_to']['max_abs_weight_diff']:.3g}")
    PROBE_CURVES_OUT.mkdir(parents=True, exist_ok=True)
    save_record(record, PROBE_CURVES_OUT / f"{row}_s{seed}.json")
    return record


INTERPOLATION_OUT = OUT / "interpolation"
INTERPOLATION_N = 128  # prompts per depth and phrasing: a screen (the row's own test has 1,024)


def interpolate(row: str, seed: int, alphas: list[float], n: int = INTERPOLATION_N) -> dict:
    """WiSE-FT on a trained row (`par_studies.interpolation.interpolate_from_init`): for each α the parent's weights
    moved α of the way to the fine-tuned ones (the adapter fine-tuned), evaluated like the row (forced depth, DEPTHS,
    both phrasings, the row's seed) on `n` prompts per depth. Does a point between the parent, which reads any
    wording, and the fine-tuned loop, which extrapolates, keep both? Kept in interpolation/<row>_s<seed>.json."""
    import tempfile

    import torch

    from par_studies import load_run
    from par_studies.interpolation import initial_weights, interpolate_from_init

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    if not (folder / "summary.json").is_file():
        raise SystemExit(f"--interpolate {row}: {folder} holds no finished run (summary.json)")
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        initial = initial_weights(row_flags(row), seed, Path(scratch))
    model, tokenizer, trained = load_run(folder, max(DEPTHS))
    task = test_task(row, trained)
    tuned = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    built = round(time.time() - started, 1)
    points = []
    for alpha in alphas:
        model.load_state_dict(tuned)
        interpolate_from_init(model, initial, alpha)
        point = {"alpha": alpha}
        for phrasing in PHRASINGS:
            point[phrasing], environment = evaluate_phrasing(model, tokenizer, task, DEPTHS, n, seed, phrasing,
                                                             f"{row} s{seed} alpha={alpha}")
        points.append(point)
    command = (f"python examples/reproduce/pretrained_smollm2.py --interpolate {row} --seed {seed} "
               f"--alphas {','.join(str(a) for a in alphas)} --interpolation_n {n}")
    path = INTERPOLATION_OUT / f"{row}_s{seed}.json"
    earlier = json.loads(path.read_text()) if path.is_file() else None
    if earlier is not None and (earlier["n_per_depth"], earlier["depths"]) == (n, DEPTHS):
        # a later screen adds its alphas to the earlier ones (the same prompts: same seed, n and depths)
        points = [p for p in earlier["points"] if p["alpha"] not in alphas] + points
        kept = earlier.get("commands") or [earlier["command"]]  # a record of one screen may say "command"
        commands = [c for c in kept if c != command] + [command]
    else:
        commands = [command]
    record = {"row": row, "seed": seed, "n_per_depth": n, "depths": DEPTHS, "setup_seconds": built,
              "commands": commands, "environment": environment,
              "points": sorted(points, key=lambda p: -p["alpha"])}
    INTERPOLATION_OUT.mkdir(parents=True, exist_ok=True)
    save_record(record, path)
    return record
