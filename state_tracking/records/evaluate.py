"""Length generalization on recorded data: accuracy per sequence length present (`evaluate_records`) and the
progress profile against recorded step states (`records_progress_profile`), in the JSON of the task evaluators."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from datasets import Dataset

from modeling_par.record_format import RecordFormat

from ..data import LABEL_PAD_ID


def _rows_by_depth(encoded: Dataset) -> dict[int, np.ndarray]:
    depth = np.asarray(encoded.data.table.column("depth").to_numpy(), dtype=np.int64)
    return {int(d): np.flatnonzero(depth == d) for d in np.unique(depth)}


def _columns(encoded: Dataset, rows: np.ndarray) -> tuple[dict[str, list], list]:
    part = encoded.select(rows)
    return {k: part[k] for k in ("input_ids", "query_positions", "operation_ends")}, part["step_labels"]


def evaluate_records(model: Any, encoded: Dataset, record_format: RecordFormat, mode: str = "forced",
                     batch_size: int = 256, train_max_depth: int | None = None, workers: int = 1,
                     device: Any = None, sources: Sequence[str] = (), progress: bool = True,
                     split: str | None = None) -> dict[str, Any]:
    """Overall state accuracy (every query right) of the final answer, per sequence length present in `encoded`
    (`encode_records` output): the same JSON as `evaluate_length_generalization` (``per_depth`` entries with
    ``depth``, ``n``, ``accuracy``, ...), forced R = ⌈d / c⌉ or the learned halting rule."""
    import torch
    from tqdm.auto import tqdm

    from ..data import StateTrackingCollator
    from ..evaluation import (
        ACCURACY_THRESHOLD,
        MODES,
        depth_result,
        environment_info,
        extrapolation_factor,
        longest_accurate_depth,
        predict_encoded,
        to_json,
    )

    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    device = torch.device(device) if device is not None else model.device
    c = int(model.config.step_size)
    collate = StateTrackingCollator(int(model.config.pad_token_id), padding_side="right")
    if hasattr(model, "eval"):
        model.eval()
    groups = _rows_by_depth(encoded)
    per_depth = []
    bar = tqdm(total=len(groups), desc=f"eval {split or record_format.task_name} ({mode})", disable=not progress)
    for depth, rows in groups.items():
        columns, labels = _columns(encoded, rows)
        targets = np.array([row[depth] for row in labels], dtype=np.int64)  # (n, Q): the final states
        num_iterations = math.ceil(depth / c) if mode == "forced" else None
        answers, iterations, halted = predict_encoded(model, columns, collate, mode, num_iterations, batch_size,
                                                      workers, device)
        per_depth.append(depth_result(depth, answers, targets, iterations, halted, num_iterations,
                                      record_format.query_names))
        bar.update(1)
        bar.set_postfix(depth=depth, accuracy=f"{per_depth[-1]['accuracy']:.3f}")
    bar.close()
    depths = [row["depth"] for row in per_depth]
    accuracies = [row["accuracy"] for row in per_depth]
    return {
        "task": record_format.task_name, "split": split, "source": list(sources), "mode": mode, "rendering": "records",
        "n_records": len(encoded), "batch_size": batch_size, "workers": workers, "step_size": c,
        "train_max_depth": train_max_depth, "depths": depths, "accuracy": accuracies, "per_depth": per_depth,
        "d50": longest_accurate_depth(depths, accuracies),
        "extrapolation_factor": None if train_max_depth is None else extrapolation_factor(depths, accuracies,
                                                                                          train_max_depth),
        "extrapolation_factor_is_lower_bound": bool(min(accuracies) >= ACCURACY_THRESHOLD),
        "model_config": to_json(model.config.to_dict()), "environment": environment_info(device),
    }


def records_progress_profile(model: Any, encoded: Dataset, batch_size: int = 256, device: Any = None,
                             max_records_per_depth: int | None = None) -> dict[str, Any]:
    """The progress profile on recorded step states: per length d, the accuracy of every iteration k's readout
    against the recorded state after min(c·k, d) operations (over the records that recorded it), k = 1..⌈d/c⌉.
    Same JSON as `state_tracking.progress_profile` (``depths``, ``profile``, ``final_accuracy``, ...)."""
    import torch

    from ..data import StateTrackingCollator

    device = torch.device(device) if device is not None else model.device
    c = int(model.config.step_size)
    collate = StateTrackingCollator(int(model.config.pad_token_id), padding_side="right")
    model.eval()
    depths, profiles, finals, first_failure = [], [], [], []
    for depth, rows in _rows_by_depth(encoded).items():
        rows = rows[:max_records_per_depth]
        columns, labels = _columns(encoded, rows)
        num_iterations = math.ceil(depth / c)
        reads = list(range(1, num_iterations + 1))
        steps = np.minimum(c * np.arange(1, num_iterations + 1), depth)
        targets = np.array(labels, dtype=np.int64)[:, steps]  # (n, R, Q)
        answers = []
        for start in range(0, len(rows), batch_size):
            batch = collate({k: v[start:start + batch_size] for k, v in columns.items()})
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.inference_mode():
                out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                            num_iterations=num_iterations, readout_iterations=reads)
            answers.append(out.answer_logits.argmax(-1).cpu().numpy().transpose(1, 0, 2))  # (b, R, Q)
        answers = np.concatenate(answers)
        recorded = (targets != LABEL_PAD_ID).all(-1)  # (n, R)
        right = ((answers == targets).all(-1) & recorded).sum(0)
        accuracy = [float(r / m) if m else None for r, m in zip(right, recorded.sum(0))]
        depths.append(depth)
        profiles.append(accuracy)
        finals.append(accuracy[-1])
        below = [k + 1 for k, a in enumerate(accuracy) if a is not None and a < 0.5]
        first_failure.append(below[0] if below else None)
    return {"kind": "progress_profile", "padding_control_depth": None, "depths": depths, "profile": profiles,
            "final_accuracy": finals, "first_failure": first_failure, "step_size": c, "extra_iterations": 0,
            "n_per_depth": max_records_per_depth, "rendering": "records"}
