"""The named types of the loop: what `forward` and `predict` return, and what the loop passes between its steps
(no positional tuples, nothing mutated in place)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers.utils import ModelOutput


@dataclass
class ParLoopedOutput(ModelOutput):
    """
    answer_logits: (iterations read, batch, queries, candidates) logits over `config.answer_token_ids`.
    halt_logits: (iterations read, batch, 2) logits of ("Yes", "No") at the last query; None without halt ids.
    readout_iterations: (iterations read,) the 1-based iterations those readouts come from.
    state_rms: (R, batch) mean over real tokens of the per-token RMS of the core output *before* anchoring;
        `state_rms / state_rms[0]` is the norm drift that anchoring removes.
    loop_states: with `output_loop_states=True`, the R states s_k (batch, seq, hidden) after anchoring.
    """

    answer_logits: torch.FloatTensor | None = None
    halt_logits: torch.FloatTensor | None = None
    readout_iterations: torch.LongTensor | None = None
    state_rms: torch.FloatTensor | None = None
    loop_states: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class ParPrediction(ModelOutput):
    """
    answers: (batch, queries) index into `config.answer_token_ids` of the predicted candidate.
    answer_logits: (batch, queries, candidates) the readout used.
    iterations: (batch,) the iteration whose readout was used.
    halted: (batch,) False where halting never confirmed within the iteration limit (forced depth: all True).
    """

    answers: torch.LongTensor | None = None
    answer_logits: torch.FloatTensor | None = None
    iterations: torch.LongTensor | None = None
    halted: torch.BoolTensor | None = None


class IterationView(NamedTuple):
    """What one iteration's layers attend with: the mask (b, 1, rows, rows), or None for sdpa's causal kernel, and
    the rotary cos/sin (b, rows, head_dim). Under the local window `index` (b, w) holds the token index of each row
    of the window ([the iteration's operation rows | the query region]); None on the whole prompt."""

    mask: torch.Tensor | None
    cos: torch.Tensor
    sin: torch.Tensor
    index: torch.Tensor | None = None


class ReadoutInput(NamedTuple):
    """What the readout y_k = Q(s_k) of one iteration reads: the coda runs on [window_rows | state] with that
    iteration's mask and rotary, and the answers are read at `columns` of `state`.

    state (b, rows, h): s_k (the query region's under the local window); window_rows (b, S, h): under the local
    window, the core output on iteration k's operation rows (the queries attend to them in the coda), else None;
    columns (b, q): the readout queries' rows inside `state`."""

    state: torch.Tensor
    window_rows: torch.Tensor | None
    mask: torch.Tensor | None
    cos: torch.Tensor
    sin: torch.Tensor
    columns: torch.Tensor

    def select(self, keep: torch.Tensor) -> ReadoutInput:
        """The same readout for the samples `keep` (a (b,) bool mask or index)."""
        return ReadoutInput(*(None if x is None else x[keep] for x in self))


class LoopStep(NamedTuple):
    """Iteration k of the loop: s_k after anchoring (b, rows, h), rms(s_k) before anchoring (b, rows, 1), the
    anchoring reference rms(s_1) (None before iteration 1 or without anchoring), and its readout input."""

    iteration: int
    state: torch.Tensor
    raw_rms: torch.Tensor
    reference_rms: torch.Tensor | None
    readout: ReadoutInput


__all__ = ["IterationView", "LoopStep", "ParLoopedOutput", "ParPrediction", "ReadoutInput"]
