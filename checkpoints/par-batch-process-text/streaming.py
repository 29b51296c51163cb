"""A live monitor: events arrive one at a time and each gets the state after it, without re-reading the history.

    stream = model.stream(preamble_ids, query_ids, query_positions=[...])      # or StateStream(model, ...)
    for operation_ids in events:                                                # from a controller, an MES, ...
        out = stream.update(operation_ids)    # out.answers (q,) candidate indices, out.answer_logits (q, candidates)
    torch.save(stream.state_dict(), path)                                       # stop the monitor ...
    stream = StateStream.from_state_dict(model, torch.load(path))              # ... and resume it: the same answers

Why it is O(1) per event. Under `loop_view="local"` iteration k reads only [operations c·(k−1)+1..min(c·k, d) |
the query region] (`window_path`), every operation's prelude output is its own (the prelude is block-diagonal: an
operation sees only itself), and the loop state is the query region's alone. After event d the answer is iteration
K = ⌈d/c⌉ (c = `step_size`): one `window_path.window_update` from s_{K−1} on [the ≤ c operations of group K | the
query region], and its readout. The stream keeps s_{K−1} (and the anchoring reference rms(s_1)), the prelude
outputs of the operations of the unfinished group (fewer than c) and two counters; an update runs the prelude on
the new operation's tokens alone, then that one iteration, whatever the history's length. When a group fills (every
event with c = 1) its state becomes the new s_K.

Exact: the answers after d events equal `model.predict` on the whole prompt [preamble | operations 1..d | query
region] with `num_iterations` = max(1, ⌈d/c⌉) (the pipeline's forced depth), padding either side (tested:
tests/test_streaming.py). Positions (rotary) are those of that prompt: operation i's tokens sit at T_{i−1} + j
(`operation_positions`, T_i the tokens of the preamble and operations 1..i), and with `progress_positions` the query
region of iteration k sits at T_{min(c·k, d)} + j (`streamed_query_positions`): right after the last operation it
reads, whatever d is, so s_K never changes when more events arrive. A stretch (`position_scale`) multiplies them all.

Refused, each with one ValueError naming the config field (`check_streamable`):
- `loop_view` "full" / "prefix": the query region reads the whole history (or all of it so far) at every iteration,
  so each event would re-read the prompt; answer it with `predict` on the whole prompt instead.
- `progress_positions=False` with `position_encoding="rope"`: the query region then sits after the whole prompt, at
  T_d + j, so its prelude output and every iteration's state depend on the number of events so far: an event would
  change all of s_1..s_{K−1} and streaming could not be exact. `position_encoding="nope"` reads no positions, so it
  streams exactly with or without `progress_positions`.
Learned halting is not run: the stream answers at forced depth ⌈d/c⌉ and returns the halt logits of that readout.

Remote code: imports only torch and sibling modules.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from .loop_types import Readout, ReadoutInput
from .loop_views import attention_bias, encoded_positions, mask_dtype, stretch_positions

STATE_FORMAT = 1  # the version of `StateStream.state_dict()`
MASK_CACHE_SIZE = 256  # window masks kept per stream (`StateStream._mask`)
# the config fields a saved stream's state depends on: a state is refused by a model that differs in any of them
STATE_CONFIG_FIELDS = ("hidden_size", "step_size", "answer_token_ids", "halt_token_ids", "loop_view",
                       "progress_positions", "bidirectional_queries", "answer_feedback", "norm_anchoring",
                       "position_encoding")


# ------------------------------------------------------------------------------------ the mechanisms, with formulas
def check_streamable(config) -> None:
    """Raise one ValueError naming the config field unless a stream of this config is exact at O(1) per event:
    `loop_view == "local"` and (`progress_positions` or `position_encoding == "nope"`)."""
    if config.loop_view != "local":
        raise ValueError(
            f"StateStream needs ParLoopedQwenConfig.loop_view='local'; got {config.loop_view!r}. Under 'full' or "
            "'prefix' the query region reads the whole history at every iteration, so each event would re-read the "
            "prompt: answer the whole prompt with model.predict instead.")
    if not config.progress_positions and config.position_encoding == "rope":
        raise ValueError(
            "StateStream needs ParLoopedQwenConfig.progress_positions=True (or position_encoding='nope'); got "
            "progress_positions=False with position_encoding='rope'. With ordinary positions the query region sits "
            "after the whole prompt, so its prelude output and every iteration's state depend on the number of events "
            "so far, and a stream could not be exact.")


def operation_positions(tokens_before: int, length: int) -> torch.Tensor:
    """Rotary positions of operation i's tokens, where the whole prompt puts them: p = T_{i−1} + j (j = 0..L_i − 1),
    T_{i−1} the tokens before it (the preamble and operations 1..i−1), as `loop_views.positions_from_mask` gives them
    (padding never shifts them).  # -> (L_i,) float"""
    return torch.arange(tokens_before, tokens_before + length, dtype=torch.float32)


def streamed_query_positions(tokens_read: int, num_tokens: int) -> torch.Tensor:
    """Rotary positions of the query region at iteration k under `progress_positions`: `loop_views.progress_shift`
    moves it back by Δ_k = pos(end_d) − pos(end_h), h = min(c·k, d), so it sits right after operation h,

        p = T_h + j   (j = 0..|query region| − 1, T_h the tokens of the preamble and operations 1..h),

    whatever d is. The stream reads iteration ⌈d/c⌉ (h = d: T_d, every token so far) and the prelude (k = 0, h = 0:
    T_0, the preamble). Under `position_encoding="nope"` the positions are not read.  # -> (num_tokens,) float"""
    return torch.arange(tokens_read, tokens_read + num_tokens, dtype=torch.float32)


def window_allowed(segment_lengths: list[int], num_query_tokens: int, bidirectional: bool) -> torch.Tensor:
    """Which keys each row of a window [segment 1 | … | segment n | query region] sees, (w, w) bool: a segment's
    token sees its own segment up to itself; a query token sees every segment token and the query tokens up to itself
    (all of them with `bidirectional`); every row sees itself. With the operations of iteration k as the segments it
    is `loop_views.loop_view_mask` (local, k ≥ 1) on those rows (`window_path.window_plan`); with the preamble as
    the one segment, the prelude's [preamble | query region] block (`window_path.preamble_query_rows`); with one
    operation and no query region, that operation's prelude block (`window_path.operation_rows`)."""
    lengths = torch.tensor([*segment_lengths, num_query_tokens])
    segment = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)  # (w,)
    is_query = segment == len(segment_lengths)
    order = torch.arange(segment.numel())
    earlier = order[None, :] <= order[:, None]  # key j not after row i
    own = earlier & (segment[None, :] == segment[:, None])
    sees = ~is_query[None, :] | earlier | bidirectional  # a query row: every segment key, the query keys so far
    allowed = torch.where(is_query[:, None], sees, own)
    return allowed | torch.eye(segment.numel(), dtype=torch.bool)


# ------------------------------------------------------------------------------------------------- what is returned
class StreamAnswer(NamedTuple):
    """The state after an event: answers (q,) index into `config.answer_token_ids` of each readout query's candidate,
    answer_logits (q, candidates) float, halt_logits (2,) of ("Yes", "No") at the last query or None without halt
    ids, events d (so far), iteration ⌈d/c⌉ (at least 1) whose readout it is."""

    answers: torch.Tensor
    answer_logits: torch.Tensor
    halt_logits: torch.Tensor | None
    events: int
    iteration: int


class PendingOperation(NamedTuple):
    """An operation of the unfinished group: its token ids (L,), its prelude output e (L, h), its first position."""

    ids: torch.Tensor
    e: torch.Tensor
    start: int


def _token_ids(name: str, ids, vocab_size: int) -> torch.Tensor:
    """`ids` as a non-empty 1-D long tensor of vocabulary ids, or one ValueError naming `name`."""
    try:
        tensor = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of token ids; got {ids!r} ({error}).") from None
    if tensor.dim() != 1 or tensor.numel() == 0 or tensor.is_floating_point() or tensor.dtype == torch.bool:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integer token ids; got shape "
                         f"{tuple(tensor.shape)}, dtype {tensor.dtype}.")
    if tensor.min() < 0 or tensor.max() >= vocab_size:
        raise ValueError(f"{name} must lie in [0, vocab_size={vocab_size}); got values in "
                         f"[{int(tensor.min())}, {int(tensor.max())}].")
    return tensor.long().cpu()


def _query_columns(query_positions, num_query_tokens: int) -> list[int]:
    """The readout queries' indices into query_ids (default its last token, as `predict`'s default)."""
    if query_positions is None:
        return [num_query_tokens - 1]
    columns = torch.as_tensor(query_positions).reshape(-1)
    if (columns.numel() == 0 or columns.is_floating_point() or columns.dtype == torch.bool
            or columns.min() < 0 or columns.max() >= num_query_tokens):
        raise ValueError(f"query_positions must be a non-empty list of indices into query_ids, in "
                         f"[0, {num_query_tokens}); got {query_positions!r}.")
    return [int(c) for c in columns]


def _position_scale(config, position_scale) -> float | None:
    if position_scale is None:
        return None
    if isinstance(position_scale, bool) or not isinstance(position_scale, (int, float)) or not (
            1.0 <= position_scale <= config.max_position_scale):
        raise ValueError(f"position_scale must be None or a number in [1, max_position_scale="
                         f"{config.max_position_scale}]; got {position_scale!r}.")
    return float(position_scale)


# ------------------------------------------------------------------------------------------------------ the stream
class StateStream:
    """The loop state of one prompt kept between events (see the module docstring): `update(operation_ids)` reads one
    more operation and returns its `StreamAnswer`; `state_dict()` / `load_state_dict()` (`save` / `load`) stop and
    resume the monitor. One prompt per stream; inputs are token ids (the tokenizer's, as in the whole prompt).

    preamble_ids: the tokens before the first operation (at least one, e.g. <bos>). query_ids: the query region, the
    tokens after the last operation. query_positions: indices into query_ids of the readout queries (default its last
    token). position_scale: a positional stretch in [1, max_position_scale], as `predict`'s.
    """

    def __init__(self, model, preamble_ids, query_ids, query_positions=None, position_scale=None):
        config = model.config
        check_streamable(config)
        self.model = model
        self.preamble_ids = _token_ids("preamble_ids", preamble_ids, config.vocab_size)
        self.query_ids = _token_ids("query_ids", query_ids, config.vocab_size)
        self.query_positions = _query_columns(query_positions, self.query_ids.numel())
        self.position_scale = _position_scale(config, position_scale)
        self.events, self.tokens = 0, self.preamble_ids.numel()
        self.iteration, self.reference_rms = 0, None  # groups read so far (K − 1), rms(s_1) once set
        self.pending: list[PendingOperation] = []
        self.last: Readout | None = None
        with torch.no_grad():
            self.query_e = self._prelude_queries()
        self.state = self.query_e  # s_0 = e

    # ------------------------------------------------------------------------------------------ public
    @torch.no_grad()
    def update(self, operation_ids) -> StreamAnswer:
        """Read one more operation (its token ids) and return the state after it: the prelude on its tokens alone,
        then iteration ⌈d/c⌉ on [the operations of its group | the query region]. O(1) in the history."""
        ids = _token_ids("operation_ids", operation_ids, self.model.config.vocab_size)
        e = self._run_prelude(ids, operation_positions(self.tokens, ids.numel()), [ids.numel()], 0)
        pending, tokens = [*self.pending, PendingOperation(ids, e, self.tokens)], self.tokens + ids.numel()
        state, raw_rms, last = self._iterate(pending, tokens)  # nothing changes before it has run
        self.pending, self.events, self.tokens, self.last = pending, self.events + 1, tokens, last
        if len(pending) == self.model.config.step_size:  # the group is full: s_K is final
            if self.model.config.norm_anchoring and self.reference_rms is None:
                self.reference_rms = raw_rms
            self.state, self.iteration, self.pending = state, self.iteration + 1, []
        return self.answer()

    @torch.no_grad()
    def answer(self) -> StreamAnswer:
        """The state after the events so far, without a new one (before any: iteration 1 on the query region alone,
        what `predict` gives a prompt with no operation at `num_iterations=1`)."""
        if self.last is None:
            _, _, self.last = self._iterate(self.pending, self.tokens)
        logits = self.last.answer_logits[0].float()
        halts = None if self.last.halt_logits is None else self.last.halt_logits[0].float()
        return StreamAnswer(logits.argmax(-1), logits, halts, self.events,
                            max(1, math.ceil(self.events / self.model.config.step_size)))

    def state_dict(self) -> dict[str, Any]:
        """Everything the stream needs to go on, as plain values and CPU tensors (`torch.save` /
        `torch.load(weights_only=True)` read it): O(1) in the history (the unfinished group holds < c operations)."""
        config = self.model.config
        cpu = (lambda t: None if t is None else t.detach().cpu().clone())  # noqa: E731
        return {
            "format": STATE_FORMAT,
            "config": {name: getattr(config, name) for name in STATE_CONFIG_FIELDS},
            "preamble_ids": self.preamble_ids.tolist(), "query_ids": self.query_ids.tolist(),
            "query_positions": list(self.query_positions), "position_scale": self.position_scale,
            "events": self.events, "tokens": self.tokens, "iteration": self.iteration,
            "query_e": cpu(self.query_e), "state": cpu(self.state), "reference_rms": cpu(self.reference_rms),
            "pending": [{"ids": p.ids.tolist(), "e": cpu(p.e), "start": p.start} for p in self.pending],
            "last": None if self.last is None else {"answer_logits": cpu(self.last.answer_logits),
                                                    "halt_logits": cpu(self.last.halt_logits)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> StateStream:
        """Go on from `state` (a `state_dict()`, of this stream or another of a model of the same config): its
        prompt, events and loop state replace this stream's. A state of another config is refused, naming the
        field."""
        config = self.model.config
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"state must be a StateStream.state_dict() (format {STATE_FORMAT}); got {found!r}.")
        for name in STATE_CONFIG_FIELDS:
            if state["config"].get(name) != getattr(config, name):
                raise ValueError(f"this state was saved by a model with ParLoopedQwenConfig.{name}="
                                 f"{state['config'].get(name)!r}; this model has {getattr(config, name)!r}.")
        device, dtype = self.model.device, self.model.model.embed_tokens.weight.dtype

        def here(t):
            return None if t is None else t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

        self.preamble_ids = _token_ids("preamble_ids", state["preamble_ids"], config.vocab_size)
        self.query_ids = _token_ids("query_ids", state["query_ids"], config.vocab_size)
        self.query_positions = _query_columns(state["query_positions"], self.query_ids.numel())
        self.position_scale = _position_scale(config, state["position_scale"])
        self.events, self.tokens, self.iteration = int(state["events"]), int(state["tokens"]), int(state["iteration"])
        self.query_e, self.state = here(state["query_e"]), here(state["state"])
        rms = state["reference_rms"]  # rms(s_1) is computed in fp32 (`state_rms`) whatever the model's dtype
        self.reference_rms = None if rms is None else rms.to(device=device, dtype=torch.float32)
        self.pending = [PendingOperation(torch.tensor(p["ids"], dtype=torch.long), here(p["e"]), int(p["start"]))
                        for p in state["pending"]]
        last = state["last"]
        self.last = None if last is None else Readout(last["answer_logits"].to(device),
                                                      None if last["halt_logits"] is None
                                                      else last["halt_logits"].to(device))
        return self

    @classmethod
    def from_state_dict(cls, model, state: dict[str, Any]) -> StateStream:
        """A stream of `model` resumed from `state` (a `state_dict()`): no prelude or iteration is rerun."""
        check_streamable(model.config)
        stream = cls.__new__(cls)
        stream.model = model
        return stream.load_state_dict(state)

    def save(self, path) -> None:
        """`torch.save(self.state_dict(), path)`."""
        torch.save(self.state_dict(), path)

    @classmethod
    def load(cls, model, path) -> StateStream:
        """The stream saved at `path` (`save`), resumed on `model`."""
        return cls.from_state_dict(model, torch.load(path, map_location="cpu", weights_only=True))

    # ------------------------------------------------------------------------------------------ the computation
    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        """cos/sin of `positions` (w,): the stretch, the encoding (rope / nope), Qwen2's rotary, as `rotary_at`."""
        config = self.model.config
        positions = positions.to(hidden.device)[None]
        if self.position_scale is not None:
            positions = stretch_positions(positions, torch.tensor([self.position_scale]))
        return self.model.model.rotary_emb(hidden, encoded_positions(config, positions))

    def _mask(self, segment_lengths: list[int], num_query_tokens: int, hidden: torch.Tensor) -> torch.Tensor:
        """The layers' mask (1, 1, w, w) of `window_allowed`, built once per window shape (events of a few lengths
        repeat the same few windows; the cache is never saved and is bounded)."""
        config = self.model.config
        key = (tuple(segment_lengths), num_query_tokens, config.bidirectional_queries, mask_dtype(config, hidden),
               hidden.device)
        cache = self.__dict__.setdefault("_masks", {})
        if key not in cache:
            if len(cache) >= MASK_CACHE_SIZE:
                cache.clear()
            allowed = window_allowed(segment_lengths, num_query_tokens, config.bidirectional_queries)
            cache[key] = attention_bias(allowed.to(hidden.device)[None], key[3])
        return cache[key]

    def _run_prelude(self, ids: torch.Tensor, positions: torch.Tensor, segment_lengths: list[int],
                     num_query_tokens: int) -> torch.Tensor:
        """e = P(x) of one prelude block (an operation alone, or [preamble | query region]): (w, h)."""
        model = self.model
        hidden = model.model.embed_tokens(ids.to(model.device)[None])
        cos, sin = self._rotary(hidden, positions)
        return model.parts.prelude(hidden, self._mask(segment_lengths, num_query_tokens, hidden), cos, sin)[0]

    def _prelude_queries(self) -> torch.Tensor:
        """e of the query region, (1, |query region|, h): the prelude on [preamble | query region], the preamble at
        0..T_0 − 1 and the query region at `streamed_query_positions`(T_0) (the prelude's progress shift)."""
        t0, n = self.preamble_ids.numel(), self.query_ids.numel()
        positions = torch.cat([operation_positions(0, t0), streamed_query_positions(t0, n)])
        e = self._run_prelude(torch.cat([self.preamble_ids, self.query_ids]), positions, [t0], n)
        return e[t0:][None]

    def _iterate(self, pending: list[PendingOperation], tokens: int) -> tuple[torch.Tensor, torch.Tensor, Readout]:
        """Iteration K = (groups read) + 1 from s_{K−1} on [`pending`, the group's operations | the query region],
        `tokens` = T_d the tokens so far: `window_path.window_update` and the readout on the same rows
        (`update.rows`), then, with answer feedback, the state the next iteration reads
        (`answer_feedback_state`). Returns s_K, its rms before anchoring and the readout; changes nothing."""
        model = self.model
        num_queries = self.query_ids.numel()
        lengths = [p.ids.numel() for p in pending]
        h = self.query_e.shape[-1]
        e_ops = torch.cat([p.e for p in pending])[None] if pending else self.query_e.new_zeros(1, 0, h)
        positions = torch.cat([*(operation_positions(p.start, p.ids.numel()) for p in pending),
                               streamed_query_positions(tokens, num_queries)])
        mask = self._mask(lengths, num_queries, self.query_e)
        cos, sin = self._rotary(self.query_e, positions)
        update = model.parts.window_update(model.adapter_e_half(self.query_e), self.state, self.reference_rms, e_ops,
                                           mask, cos, sin, model._adapter_halves())
        columns = torch.tensor([self.query_positions], device=self.query_e.device)
        (readout,) = model.readout([ReadoutInput(update.rows, mask, cos, sin, columns + e_ops.shape[1])])
        state = update.state
        if model.config.answer_feedback:  # the next iteration restarts from e with the soft answers written in
            state = model.feed_back(self.query_e, readout, columns)
        return state, update.raw_rms, readout


__all__ = ["PendingOperation", "STATE_CONFIG_FIELDS", "STATE_FORMAT", "StateStream", "StreamAnswer",
           "check_streamable", "operation_positions", "streamed_query_positions", "window_allowed"]
