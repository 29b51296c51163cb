"""The named types of the loop: what `forward` and `predict` return, the interface of a loop backend, and what the
loop passes between its steps (no positional tuples, no attributes added after construction)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

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
    prelude_states: with `output_prelude_states=True`, e = P(x) (batch, seq, hidden), the prelude's output (under the
        local view every operation encoded on its own; 0 at padding on the local window).
    """

    answer_logits: torch.FloatTensor | None = None
    halt_logits: torch.FloatTensor | None = None
    readout_iterations: torch.LongTensor | None = None
    state_rms: torch.FloatTensor | None = None
    loop_states: tuple[torch.FloatTensor, ...] | None = None
    prelude_states: torch.FloatTensor | None = None


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


class TokenSegments(NamedTuple):
    """Which part of the prompt each token belongs to (`loop_views.token_segments`)."""

    segments: torch.Tensor  # (b, t) long: 0 the preamble, i operation i, d + 1 the query region
    depth: torch.Tensor  # (b,) long: d, the number of operations
    query_region: torch.Tensor  # (b, t) bool: the real tokens after the last operation


class OperationRange(NamedTuple):
    """The operations iteration k reads, (low, high] (`loop_views.operations_read`), each (b,)."""

    low: torch.Tensor
    high: torch.Tensor


class IterationView(NamedTuple):
    """What one iteration's layers attend with on the whole prompt: the mask (b, 1, t, t), or None for sdpa's causal
    kernel, and the rotary cos/sin (b, t, head_dim)."""

    mask: torch.Tensor | None
    cos: torch.Tensor
    sin: torch.Tensor


class AdapterHalves(NamedTuple):
    """The adapter's weight W = [W_e | W_s] cut at its input, each (h, h)."""

    e: torch.Tensor
    s: torch.Tensor


class CandidateRows(NamedTuple):
    """The LM-head rows the readout reads, for one (answer ids, halt ids, device) `key`."""

    key: tuple
    answers: torch.Tensor  # (candidates,) the answer candidates' token ids
    halts: torch.Tensor | None  # (2,) the ("Yes", "No") ids, or None without `halt_token_ids`


class CandidateWeights(NamedTuple):
    """The weight rows the readout and answer feedback read, indexed once per batch (`candidate_weights`) instead of at
    every iteration: the LM-head rows of the answer candidates (C, h) and of ("Yes", "No") (2, h) or None, and the
    candidates' input embeddings E (C, h)."""

    answers: torch.Tensor
    halts: torch.Tensor | None
    embeddings: torch.Tensor


class CoreUpdate(NamedTuple):
    """One iteration of the core on the whole prompt: s_k after anchoring (b, t, h) and rms(s_k) before anchoring
    (b, t, 1), detached."""

    state: torch.Tensor
    raw_rms: torch.Tensor


class ReadoutInput(NamedTuple):
    """What the readout y_k = Q(s_k) of one iteration reads: the coda runs on `rows` (b, w, h) with that iteration's
    mask and rotary, and the answers are read at `columns` (b, q), the readout queries' rows among them."""

    rows: torch.Tensor
    mask: torch.Tensor | None
    cos: torch.Tensor
    sin: torch.Tensor
    columns: torch.Tensor

    def select(self, keep: torch.Tensor) -> ReadoutInput:
        """The same readout for the samples `keep` (a (b,) bool mask or index)."""
        return ReadoutInput(*(None if x is None else x[keep] for x in self))


class Readout(NamedTuple):
    """y_k: answer logits (b, q, candidates) and halt logits (b, 2) of ("Yes", "No") at the last query, or None."""

    answer_logits: torch.Tensor
    halt_logits: torch.Tensor | None

    def select(self, keep: torch.Tensor) -> Readout:
        """The readout of the samples `keep` (a (b,) bool mask or index)."""
        return Readout(self.answer_logits[keep], None if self.halt_logits is None else self.halt_logits[keep])


class LoopState(NamedTuple):
    """Where the loop stands after iteration k (k = 0: s_0 = e): s_k and the anchoring reference rms(s_1) (None
    before iteration 1 or without anchoring)."""

    iteration: int
    state: torch.Tensor
    reference_rms: torch.Tensor | None

    def select(self, keep: torch.Tensor) -> LoopState:
        return LoopState(self.iteration, self.state[keep],
                         None if self.reference_rms is None else self.reference_rms[keep])


class LoopStep(NamedTuple):
    """Iteration k of the loop: s_k after anchoring (b, rows, h), rms(s_k) before anchoring (b, rows, 1), the
    anchoring reference rms(s_1) (None without anchoring), and its readout's input (a `ReadoutInput` on the whole
    prompt and on the local window alike: only its backend's `readouts` reads it).
    `computed`: that readout itself when the backend already ran it (answer feedback reads out every iteration),
    under the grad mode the iteration ran in; else None."""

    iteration: int
    state: torch.Tensor
    raw_rms: torch.Tensor
    reference_rms: torch.Tensor | None
    readout: tuple
    computed: Readout | None = None

    def loop_state(self) -> LoopState:
        return LoopState(self.iteration, self.state, self.reference_rms)


class LoopBackend(Protocol):
    """How one batch's loop is computed, chosen once per `forward` / `predict` call: on the whole prompt
    (`modeling_par.ReferenceLoop`, the reference) or on the local window (`window_path.WindowLoop`, tested equal).
    Built after the prelude e = P(x); holds what every iteration shares and never changes it."""

    @property
    def num_queries(self) -> int: ...  # q, the readout queries per sample

    def initial_state(self) -> torch.Tensor: ...  # s_0 = e, (b, rows, h)

    def state_valid(self) -> torch.Tensor: ...  # (b, rows) float: the rows of s that are real tokens

    def advance(self, current: LoopState, last: int) -> list[LoopStep]:
        """The next iteration(s) after `current`, never past `last`, one `LoopStep` each."""

    def readouts(self, inputs: list) -> list[Readout]:
        """The readouts of some `LoopStep.readout`s, in order."""

    def select(self, keep: torch.Tensor) -> LoopBackend:
        """The same backend for the samples `keep` (a (b,) bool mask)."""


class LoopParts(NamedTuple):
    """The loop's hot functions, each called alike eager or compiled (`compile_support`)."""

    core_update: Callable  # the model's `core_update`: C(W [e ; s]) and the anchoring, on the whole prompt
    window_update: Callable  # `window_path.window_update`: the same on the local window's rows
    window_block: Callable  # `window_path.window_block`: K no-grad window iterations as one unit
    coda: Callable  # the model's `_coda_block`: the coda and the final norm
    prelude: Callable  # the model's `_prelude_block`


@dataclass
class PredictionRecord:
    """`predict`'s answers so far, indexed by the original sample: each sample's entry is written when it finishes."""

    answer_logits: torch.Tensor  # (b, q, candidates) float
    iterations: torch.Tensor  # (b,) long
    halted: torch.Tensor  # (b,) bool

    @classmethod
    def empty(cls, batch: int, queries: int, candidates: int, device) -> PredictionRecord:
        return cls(torch.zeros(batch, queries, candidates, device=device), torch.zeros(batch, dtype=torch.long,
                   device=device), torch.zeros(batch, dtype=torch.bool, device=device))

    def finish(self, samples: torch.Tensor, answer_logits: torch.Tensor, iteration: int, halted: bool) -> None:
        """Samples `samples` (original indices) answer with `answer_logits` read at `iteration`."""
        self.answer_logits[samples] = answer_logits.float()
        self.iterations[samples] = iteration
        self.halted[samples] = halted

    def prediction(self) -> ParPrediction:
        return ParPrediction(answers=self.answer_logits.argmax(-1), answer_logits=self.answer_logits,
                             iterations=self.iterations, halted=self.halted)


@dataclass
class HaltingWindow:
    """The readouts of the last m iterations of every sample, for learned halting: ring buffers indexed by the
    iteration's slot (k − 1) mod m and the original sample."""

    answer_logits: torch.Tensor  # (m, b, q, candidates) float
    p_yes: torch.Tensor  # (m, b) P(Yes) = softmax(halt logits)[Yes]

    @classmethod
    def empty(cls, m: int, batch: int, queries: int, candidates: int, device) -> HaltingWindow:
        return cls(torch.zeros(m, batch, queries, candidates, device=device), torch.zeros(m, batch, device=device))

    def push(self, iteration: int, samples: torch.Tensor, readout: Readout) -> None:
        slot = (iteration - 1) % self.p_yes.shape[0]
        self.answer_logits[slot, samples] = readout.answer_logits.float()
        self.p_yes[slot, samples] = readout.halt_logits.float().softmax(-1)[:, 0]

    def p_yes_from(self, first: int, samples: torch.Tensor) -> torch.Tensor:
        """P(Yes) of iterations first..first+m−1 (all pushed) in order, (m, n)."""
        m = self.p_yes.shape[0]
        return self.p_yes[[(first - 1 + j) % m for j in range(m)]][:, samples]

    def answers_at(self, iteration: int, samples: torch.Tensor) -> torch.Tensor:
        return self.answer_logits[(iteration - 1) % self.p_yes.shape[0], samples]


__all__ = ["AdapterHalves", "CandidateRows", "CandidateWeights", "CoreUpdate", "HaltingWindow", "IterationView",
           "LoopBackend", "LoopParts", "LoopState", "LoopStep", "OperationRange", "ParLoopedOutput", "ParPrediction",
           "PredictionRecord", "Readout", "ReadoutInput", "TokenSegments"]
