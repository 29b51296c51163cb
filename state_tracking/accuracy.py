"""Accuracy of predicted states: a state is right only if every query is right.

    overall state accuracy = mean_i  1[ pred[i, q] == ref[i, q] for all q ]
    per-query accuracy[q]  = mean_i  1[ pred[i, q] == ref[i, q] ]

(``state_tracking/metrics/state_accuracy`` is the same computation as an ``evaluate`` module.)
"""

from __future__ import annotations

import numpy as np


def _check(predictions, references) -> tuple[np.ndarray, np.ndarray]:
    predictions, references = np.asarray(predictions), np.asarray(references)
    if predictions.shape != references.shape or predictions.ndim != 2 or len(predictions) == 0:
        raise ValueError(
            "predictions and references must be non-empty arrays of the same shape (n, num_queries), "
            f"got {predictions.shape} and {references.shape}"
        )
    return predictions, references


def overall_state_accuracy(predictions, references) -> float:
    """Fraction of samples with every query right. predictions, references: (n, Q)."""
    predictions, references = _check(predictions, references)
    return float((predictions == references).all(axis=1).mean())


def per_query_accuracy(predictions, references) -> np.ndarray:
    """Accuracy of each query separately.  # (Q,)"""
    predictions, references = _check(predictions, references)
    return (predictions == references).mean(axis=0)
