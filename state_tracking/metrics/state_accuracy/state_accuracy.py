"""Overall state accuracy as an `evaluate` metric.

Load with ``evaluate.load("<path to this folder>")``. Each prediction/reference is the list of
candidate indices of one state (one per query, e.g. the item in each of the 5 boxes):

    state_accuracy        = mean_i 1[ pred_i[q] == ref_i[q] for every q ]
    per_query_accuracy[q] = mean_i 1[ pred_i[q] == ref_i[q] ]

Self-contained on purpose: `evaluate` copies this file away from the package.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Fraction of predicted states with every query (e.g. every box) right, and per-query accuracy."
_KWARGS_DESCRIPTION = """
Args:
    predictions: list of lists of ints, shape (n, num_queries).
    references: list of lists of ints, same shape.
Returns:
    state_accuracy (float), per_query_accuracy (list of floats, one per query).
Example:
    >>> metric = evaluate.load("state_tracking/metrics/state_accuracy")
    >>> metric.compute(predictions=[[0, 1], [1, 1]], references=[[0, 1], [1, 0]])
    {'state_accuracy': 0.5, 'per_query_accuracy': [1.0, 0.5]}
"""
_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class StateAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("int64")),
                    "references": datasets.Sequence(datasets.Value("int64")),
                }
            ),
        )

    def _compute(self, predictions, references):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if predictions.shape != references.shape or predictions.ndim != 2:
            raise ValueError(
                "predictions and references must have the same shape (n, num_queries), "
                f"got {predictions.shape} and {references.shape}"
            )
        correct = predictions == references  # (n, Q)
        return {
            "state_accuracy": float(correct.all(axis=1).mean()),
            "per_query_accuracy": correct.mean(axis=0).tolist(),
        }
