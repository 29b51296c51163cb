"""The local window: `loop_view="local"` computed on each iteration's own rows.

Under the local view the query region reads, at iteration k, only the operations of iteration k and itself; every
other token sees only its own segment and restarts from e. So each iteration can run the core and the coda on
[iteration k's operation rows | the query region] instead of the whole prompt: O(span + queries) per iteration
instead of O(prompt), the loop state being the query region's (b, Qmax, h). Exactly the masked computation of
`loop_views` restricted to those rows (tests/test_loop_views.py, tests/test_speed_paths.py).

The prelude (k = 0) of the local view is block-diagonal too: every operation sees only itself, the preamble sees
itself, and the query region sees the preamble and itself. `segment_rows` gathers those blocks into rows
(operations: (Σ d, longest operation); [preamble | query region]: (b, preamble + queries)), so the prelude costs
O(prompt) memory and time instead of a (b, t, t) mask and its scores, and the window path holds no (b, t, t) tensor.

The window is one loop backend (`WindowLoop`, the `loop_types.LoopBackend` interface), chosen once per batch by the
model (`runtime.local_window` under `loop_view="local"`) in place of the whole-prompt reference
(`modeling_par.ReferenceLoop`). Two speed-ups on top, both tested equal to one iteration at a time:
- window plans: the windows of `window_plan_iterations` iterations are built in one vectorized pass;
- blocks: with no grad, `block_iterations` iterations run as one unit (`window_block`), one graph under
  `compile_core`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from .loop_types import (
    AdapterHalves,
    CandidateWeights,
    LoopParts,
    LoopState,
    LoopStep,
    Readout,
    ReadoutInput,
)
from .loop_views import LoopView, attention_bias, mask_dtype, operations_read, rotary_at
from .split_adapter import adapter_halves, e_half_with, input_with


@dataclass(frozen=True)
class SegmentRows:
    """Independent attention blocks of the prompt, one per row: `index` (n, w) the token of each column in the
    flattened (b · t) prompt, `inside` (n, w) the columns that are the block's own tokens (each token of the prompt
    in at most one row; the other columns repeat one of them), `allowed` (n, w, w) the keys each column sees."""

    index: torch.Tensor
    inside: torch.Tensor
    allowed: torch.Tensor


def operation_rows(operation_ends: torch.Tensor, attention_mask: torch.Tensor) -> SegmentRows:
    """The operations of every sample as rows, (Σ_b d_b, longest operation): operation i's tokens
    (end_{i−1}, end_i], causal among its real tokens, as `loop_views.loop_view_mask` (local, k = 0) lets them see."""
    t = attention_mask.shape[1]
    sample, op = (operation_ends[:, 1:] >= 0).nonzero(as_tuple=True)  # (n,): operation op + 1 of sample
    start = operation_ends[sample, op] + 1
    length = operation_ends[sample, op + 1] - operation_ends[sample, op]
    offsets = torch.arange(int(length.max()) if length.numel() else 0, device=attention_mask.device)
    inside = offsets[None] < length[:, None]  # (n, w)
    index = sample[:, None] * t + torch.minimum(start[:, None] + offsets[None], (start + length - 1)[:, None])
    real = inside & attention_mask.reshape(-1)[index].bool()
    causal = offsets[None, :] <= offsets[:, None]  # key j not after query i, (w, w)
    return SegmentRows(index, inside, _with_self(causal[None] & real[:, None, :]))


def preamble_query_rows(segments: torch.Tensor, query_region: torch.Tensor, attention_mask: torch.Tensor,
                        bidirectional_queries: bool) -> SegmentRows:
    """One row per sample, (b, real preamble tokens + query region): the preamble causal among itself, the query region
    seeing all of the preamble and, causally (all of it with `bidirectional_queries`), itself — what
    `loop_views.loop_view_mask` (local, k = 0) lets them see. Padding is left out (its prelude output is never read
    on the window path)."""
    b, t = attention_mask.shape
    head = ((segments == 0) & attention_mask.bool()) | query_region  # (b, t)
    count = head.sum(-1)
    width = int(count.max())
    tokens = torch.arange(t, device=head.device).expand(b, t)
    table = torch.zeros(b, width + 1, dtype=torch.long, device=head.device)  # column `width`: the tokens left out
    table.scatter_(1, torch.where(head, head.long().cumsum(-1) - 1, width), tokens)
    inside = torch.arange(width, device=head.device)[None] < count[:, None]
    token = torch.where(inside, table[:, :width], table[:, :1])  # (b, w) in prompt order
    is_query = query_region.gather(1, token) & inside
    earlier = token[:, None, :] <= token[:, :, None]
    sees_query = is_query[:, :, None] & is_query[:, None, :] & bidirectional_queries
    allowed = inside[:, None, :] & (earlier | sees_query)
    index = torch.arange(b, device=head.device)[:, None] * t + token
    return SegmentRows(index, inside, _with_self(allowed))


def _with_self(allowed: torch.Tensor) -> torch.Tensor:
    """Every column sees itself, so no softmax row is empty (`loop_views.loop_view_mask` does the same)."""
    return allowed | torch.eye(allowed.shape[-1], dtype=torch.bool, device=allowed.device)[None]


def segment_rows(loop: LoopView, attention_mask: torch.Tensor, bidirectional_queries: bool) -> list[SegmentRows]:
    """The local view's prelude as independent blocks: the operations' rows and the [preamble | query region] rows."""
    return [operation_rows(loop.operation_ends, attention_mask),
            preamble_query_rows(loop.segments, loop.query_region, attention_mask, bidirectional_queries)]


def segmented_prelude(prelude, config, blocks: list[SegmentRows], hidden: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> torch.Tensor:
    """e = P(x) under the local view, block by block: `prelude` (the model's prelude layers, called like
    `_prelude_block`) on each `SegmentRows`' gathered rows with its own small mask, scattered back to the prompt
    (b, t, h). Equal to the prelude with the whole-prompt mask of `loop_view_mask` (local, k = 0) on every real
    token (tested); padding tokens get 0."""
    b, t, h = hidden.shape
    flat, cos, sin = hidden.reshape(b * t, h), cos.reshape(b * t, -1), sin.reshape(b * t, -1)
    out = hidden.new_zeros(b * t, h)
    for rows in blocks:
        if rows.index.numel() == 0:  # no operation in the batch
            continue
        mask = attention_bias(rows.allowed, mask_dtype(config, hidden))
        e = prelude(flat[rows.index], mask, cos[rows.index], sin[rows.index])
        out = out.index_copy(0, rows.index[rows.inside], e[rows.inside])
    return out.reshape(b, t, h)


@dataclass(frozen=True)
class LocalWindow:
    """The query region of each sample, gathered once per batch: the rows the local window iterates."""

    query_index: torch.Tensor  # (b, Qmax) token index of each query-region token (padded: last real token)
    query_valid: torch.Tensor  # (b, Qmax) bool
    query_e: torch.Tensor  # (b, Qmax, h) prelude output at the query region: s_0 = e
    readout_columns: torch.Tensor  # (b, q) column of each readout query inside the query region

    def select(self, keep: torch.Tensor) -> LocalWindow:
        return LocalWindow(*(x[keep] for x in vars(self).values()))


def local_window_of(loop: LoopView, prelude_out: torch.Tensor, query_positions: torch.Tensor) -> LocalWindow:
    """The `LocalWindow` of a batch: its query-region rows, their e, and where the readout queries sit among them."""
    query_start = loop.query_region.float().argmax(-1)  # first query-region token
    query_length = loop.query_region.sum(-1)
    offsets = torch.arange(int(query_length.max()), device=query_start.device)
    last = query_start + query_length - 1
    query_index = torch.minimum(query_start[:, None] + offsets[None], last[:, None])
    rows = torch.arange(query_index.shape[0], device=query_start.device)[:, None]
    return LocalWindow(query_index=query_index, query_valid=offsets[None] < query_length[:, None],
                       query_e=prelude_out[rows, query_index], readout_columns=query_positions - query_start[:, None])


class WindowRows(NamedTuple):
    """The token index of each operation row of a window (n, S) and which of them are real (n, S)."""

    index: torch.Tensor
    valid: torch.Tensor


def local_window_rows(operation_ends: torch.Tensor, depth: torch.Tensor, iteration: int | torch.Tensor,
                      step_size: int, samples: torch.Tensor | None = None) -> WindowRows:
    """Token indices of the operations iteration k reads, (end_{c·(k−1)}, end_{min(c·k, d)}], padded to the batch's
    longest span S. Returns index (n, S) and valid (n, S) for n rows of depth (n,) and iteration (n,) or an int;
    `samples` (n,) is each row's row of `operation_ends` (default: row i's, n = b)."""
    low, high = operations_read(iteration, depth, step_size)
    rows = torch.arange(depth.shape[0], device=depth.device) if samples is None else samples
    start = operation_ends[rows, low] + 1
    length = operation_ends[rows, high] - operation_ends[rows, low]  # 0 past ⌈d/c⌉
    span = max(int(length.max()), 0)
    offsets = torch.arange(span, device=depth.device)
    valid = offsets[None] < length[:, None]
    index = torch.where(valid, start[:, None] + offsets[None], start[:, None].clamp_max(operation_ends.max()))
    return WindowRows(index.clamp_min(0), valid)


class WindowView(NamedTuple):
    """What one iteration's layers read on the window (or K iterations', with a leading K): e at the iteration's
    operation rows (b, S, h), the mask (b, 1, w, w) and the rotary cos/sin (b, w, head_dim) of its rows
    [the operation rows | the query region] (w = S + Q)."""

    e_ops: torch.Tensor
    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


@dataclass(frozen=True)
class WindowPlan:
    """Iterations first..first+K−1 of the local window, built in one vectorized pass (instead of ~30 small tensor
    operations per iteration): e at the op rows (K, b, S, h), mask (K, b, 1, w, w), rotary cos/sin (K, b, w, head_dim)
    and the readout queries' rows among the window's (b, q); the K windows share their op columns S (the longest span
    among them; shorter spans are padding rows). `steps`: each iteration's `WindowView`, unbound once per plan."""

    first: int
    e_ops: torch.Tensor
    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    columns: torch.Tensor
    steps: tuple = field(init=False, repr=False)

    def __post_init__(self):
        views = zip(*(x.unbind(0) for x in (self.e_ops, self.mask, self.cos, self.sin)))
        object.__setattr__(self, "steps", tuple(WindowView(*view) for view in views))

    def covers(self, first: int, count: int = 1) -> bool:
        return self.first <= first and first + count <= self.first + len(self.steps)

    def views(self, first: int, count: int) -> WindowView:
        """Iterations first..first+count−1 as one `WindowView` of (count, b, ...) tensors."""
        i = first - self.first
        return WindowView(*(x[i:i + count] for x in (self.e_ops, self.mask, self.cos, self.sin)))

    def at(self, iteration: int) -> WindowView:
        return self.steps[iteration - self.first]

    def select(self, keep: torch.Tensor) -> WindowPlan:
        return WindowPlan(self.first, *(x[:, keep] for x in (self.e_ops, self.mask, self.cos, self.sin)),
                          self.columns[keep])


def window_plan(model, loop: LoopView, window: LocalWindow, first: int, count: int,
                prelude_out: torch.Tensor) -> WindowPlan:
    """The windows of iterations first..first+count−1, computed on the batch repeated `count` times: per row the
    mask of `loop_views.loop_view_mask` (local) and the positions of `loop_views.rotary_at`, restricted to the window,
    and e at its op rows, gathered from `prelude_out` (b, t, h) with gradient when e has one (a plan built in a no-grad
    iteration serves the gradient window too). Row j · b + i is sample i at iteration first + j; it reads the batch's
    (b, t) and (b, D+1) tensors through its sample index, never a copy of them: a plan costs O(count · window), not
    O(count · prompt)."""
    c = model.config
    b = window.query_index.shape[0]
    samples = torch.arange(b, device=loop.depth.device).repeat(count)  # (count·b,)
    iteration = torch.arange(first, first + count, device=loop.depth.device).repeat_interleave(b)  # (count·b,)
    query_index, query_valid = window.query_index.repeat(count, 1), window.query_valid.repeat(count, 1)
    op_index, op_valid = local_window_rows(loop.operation_ends, loop.depth[samples], iteration, c.step_size, samples)
    index = torch.cat([op_index, query_index], 1)  # (count·b, w)
    valid = torch.cat([op_valid, query_valid], 1)
    is_query = torch.cat([torch.zeros_like(op_valid), query_valid], 1)
    segment = loop.segments[samples[:, None], index]
    earlier = index[:, None, :] <= index[:, :, None]  # key j not after query i
    key_valid, query_row = valid[:, None, :], is_query[:, :, None]
    key_op = (valid & ~is_query)[:, None, :]
    sees_query = is_query[:, None, :] & (earlier | c.bidirectional_queries)
    allowed = key_valid & torch.where(query_row, key_op | sees_query,
                                      key_op & earlier & (segment[:, None, :] == segment[:, :, None]))
    allowed = allowed | torch.eye(index.shape[1], dtype=torch.bool, device=index.device)[None]
    cos, sin = rotary_at(c, model.model.rotary_emb, loop, loop.positions[samples[:, None], index], is_query, iteration,
                         prelude_out, samples)
    mask = attention_bias(allowed, mask_dtype(c, prelude_out))
    with torch.set_grad_enabled(prelude_out.requires_grad):  # e_ops and its per-iteration views keep e's gradient
        e_ops = prelude_out[samples[:, None], op_index]  # (count·b, S, h)
        return WindowPlan(first, *(x.reshape(count, b, *x.shape[1:]) for x in (e_ops, mask, cos, sin)),
                          window.readout_columns + op_index.shape[1])


class WindowPlans:
    """The window plans of one batch's loop (a cache): the current plan, replaced by one of max(count,
    `window_plan_iterations`) iterations when the iterations asked for leave it; `select` cuts it with the batch."""

    def __init__(self, model, loop: LoopView, window: LocalWindow, prelude_out: torch.Tensor,
                 plan: WindowPlan | None = None):
        self.model, self.loop, self.window, self.prelude_out = model, loop, window, prelude_out
        self.plan = plan

    def covering(self, first: int, count: int) -> WindowPlan:
        if self.plan is None or not self.plan.covers(first, count):
            size = max(count, self.model.runtime.window_plan_iterations)
            self.plan = window_plan(self.model, self.loop, self.window, first, size, self.prelude_out)
        return self.plan

    def select(self, keep: torch.Tensor, loop: LoopView, window: LocalWindow, prelude_out: torch.Tensor
               ) -> WindowPlans:
        """The plans of the samples `keep` (the batch shrank to `loop` / `window` / `prelude_out`)."""
        return WindowPlans(self.model, loop, window, prelude_out, None if self.plan is None else self.plan.select(keep))


# ------------------------------------------------------------------------------------------ the update on the window
class WindowUpdate(NamedTuple):
    """Iteration k on the window (K iterations', with a leading K, from `window_block`): s_k of the query region after
    anchoring (b, Q, h), its rms before anchoring (b, Q, 1), and the rows the readout's coda reads, [the core output on
    the operation rows | s_k] (b, S + Q, h), anchored."""

    state: torch.Tensor
    raw_rms: torch.Tensor
    rows: torch.Tensor


def window_update(model, e_half, state, reference_rms, e_ops, mask, cos, sin,
                  halves: AdapterHalves | None) -> WindowUpdate:
    """s_k = anchor(C(W [e ; s_{k−1}])) on the window's rows [iteration k's op rows | the query region]: the op rows
    `e_ops` (b, S, h) restart from e (so their adapter input is W [e ; e]); `e_half` (b, Q, h) is the query region's
    W_e e and `halves` the adapter's (W_e, W_s) as the loop cut them once per batch (`adapter_halves`; None: the
    adapter is called whole). The queries are anchored against rms(s_1) = `reference_rms` (None at iteration 1: not
    anchored); the op rows against their own rms, which is their iteration-1 rms since they compute the same value
    every iteration. rms is computed once, for every row: the trace reads it detached, the anchoring with its
    gradient. One unit, so `compile_core` fuses it whole."""
    span, x = e_ops.shape[1], state
    if span:  # else no operation is left to read (past d): the query region alone
        e_half, x = torch.cat([e_half_with(halves, e_ops), e_half], 1), torch.cat([e_ops, state], 1)
    rows = model._core_layers(input_with(halves, model.adapter, e_half, x), mask, cos, sin)
    rms = model.state_rms(rows)  # (b, S + Q, 1)
    if model.config.norm_anchoring and reference_rms is not None:
        reference = torch.cat([rms[:, :span].detach(), reference_rms], 1) if span else reference_rms
        rows = model.anchor_state_norm(rows, reference, rms)
    return WindowUpdate(rows[:, span:], rms[:, span:].detach(), rows)


def window_block(model, e_half, state, reference_rms, e_ops, mask, cos, sin,
                 halves: AdapterHalves | None) -> WindowUpdate:
    """Iterations k..k+K−1 of the local window as one no-grad unit: K times `window_update` from a window plan's
    (K, b, ...) slices (`e_ops` (K, b, S, h): e at each iteration's op rows). Bit-identical to K single iterations
    when their window plans coincide; when a unit starts a new plan, the plans' op-column padding differs, so
    attention sums round differently (~1e-7 relative in fp32, as with another `window_plan_iterations`). Returns the
    K updates stacked, (K, b, ...)."""
    updates = []
    for i in range(mask.shape[0]):
        update = window_update(model, e_half, state, reference_rms, e_ops[i], mask[i], cos[i], sin[i], halves)
        updates.append(update)
        state = update.state
    return WindowUpdate(*(torch.stack(parts) for parts in zip(*updates)))


# ---------------------------------------------------------------------------------------------------- the backend
@dataclass(frozen=True)
class WindowLoop:
    """The loop on the local window, a `loop_types.LoopBackend`: the prelude run per segment, then each iteration on
    [its operation rows | the query region], the loop state being the query region's (b, Q, h). What every iteration
    reads is built once per batch: the adapter's halves, W_e e of the query region, e at the op rows (per window
    plan), and the readout's and the answer feedback's weight rows (`CandidateWeights`)."""

    model: Any
    parts: LoopParts
    loop: LoopView
    window: LocalWindow
    prelude_out: torch.Tensor  # (b, t, h) e; 0 at padding (never read)
    e_half: torch.Tensor  # (b, Q, h) W_e e of the query region (`e_half_with`)
    plans: WindowPlans
    halves: AdapterHalves | None  # (W_e, W_s), or None: the adapter is called whole (`adapter_halves`)
    weights: CandidateWeights

    @classmethod
    def prepare(cls, model, hidden, attention_mask, query_positions, positions, position_scale,
                operation_ends) -> WindowLoop:
        """e = P(x) block by block (`segmented_prelude`: O(prompt), no (b, t, t) mask), the query region, and what
        every iteration reads (under the caller's grad mode, so the gradient window's iterations train them)."""
        loop = LoopView.of(operation_ends, attention_mask, positions, position_scale, None)
        cos, sin = rotary_at(model.config, model.model.rotary_emb, loop, loop.positions, loop.query_region, 0, hidden)
        parts = model.parts
        blocks = segment_rows(loop, attention_mask, model.config.bidirectional_queries)
        prelude_out = segmented_prelude(parts.prelude, model.config, blocks, hidden, cos, sin)
        window = local_window_of(loop, prelude_out, query_positions)
        halves = adapter_halves(model)
        return cls(model, parts, loop, window, prelude_out, e_half_with(halves, window.query_e),
                   WindowPlans(model, loop, window, prelude_out), halves, model.candidate_weights())

    @property
    def num_queries(self) -> int:
        return self.window.readout_columns.shape[1]

    def initial_state(self) -> torch.Tensor:
        return self.window.query_e

    def state_valid(self) -> torch.Tensor:
        return self.window.query_valid.float()

    def advance(self, current: LoopState, last: int) -> list[LoopStep]:
        """The next iteration, or the next K = `runtime.block_iterations` as one unit (`window_block`) when K > 1,
        without grad, the anchoring reference set (if anchoring), none of them before `last` to be seen alone and no
        answer feedback (which reads out every iteration)."""
        first, count = current.iteration + 1, self.model.runtime.block_iterations
        config = self.model.config
        if (count > 1 and not torch.is_grad_enabled() and first + count - 1 <= last and not config.answer_feedback
                and (current.reference_rms is not None or not config.norm_anchoring)):
            return self._block(current, first, count)
        plan = self.plans.covering(first, 1)
        view = plan.at(first)
        state = current.state.contiguous()  # one stride for the compiled graph whether s came from a block or not
        update = self.model.run_core(self.parts.window_update, self.e_half, state, current.reference_rms, view.e_ops,
                                     view.mask, view.cos, view.sin, self.halves)
        readout = ReadoutInput(update.rows, view.mask, view.cos, view.sin, plan.columns)
        computed = None
        if config.answer_feedback:  # the next iteration reads the answer alone (`answer_feedback_state`)
            computed = self.readouts([readout])[0]
            update = update._replace(state=self.model.answer_feedback_state(
                self.window.query_e, computed.answer_logits, self.window.readout_columns, self.weights.embeddings))
        return [self.model.loop_step(first, update, current.reference_rms, readout, computed)]

    def _block(self, current: LoopState, first: int, count: int) -> list[LoopStep]:
        """Iterations first..first+K−1 in one `window_block` call, as K `LoopStep`s: what K single steps give."""
        plan = self.plans.covering(first, count)
        views = plan.views(first, count)
        out = self.parts.window_block(self.e_half, current.state.contiguous(), current.reference_rms, views.e_ops,
                                      views.mask, views.cos, views.sin, self.halves)
        return [LoopStep(first + i, out.state[i], out.raw_rms[i], current.reference_rms,
                         ReadoutInput(out.rows[i], views.mask[i], views.cos[i], views.sin[i], plan.columns))
                for i in range(count)]

    def readouts(self, inputs: list[ReadoutInput]) -> list[Readout]:
        """y_k = Q(s_k) on [iteration k's op rows | s_k]: one coda call per group of iterations whose windows have
        the same shape (the span may change between plans)."""
        if len(inputs) == 1:
            return self.model.readout(inputs, self.weights)
        groups: dict[tuple, list[int]] = {}
        for n, item in enumerate(inputs):
            groups.setdefault((item.rows.shape, item.mask.shape), []).append(n)
        out: list[Readout | None] = [None] * len(inputs)
        for members in groups.values():
            for n, result in zip(members, self.model.readout([inputs[n] for n in members], self.weights)):
                out[n] = result
        return out

    def select(self, keep: torch.Tensor) -> WindowLoop:
        loop, window, prelude_out = self.loop.select(keep), self.window.select(keep), self.prelude_out[keep]
        return WindowLoop(self.model, self.parts, loop, window, prelude_out, self.e_half[keep],
                          self.plans.select(keep, loop, window, prelude_out), self.halves, self.weights)


__all__ = ["LocalWindow", "SegmentRows", "WindowLoop", "WindowPlan", "WindowPlans", "WindowRows", "WindowUpdate",
           "WindowView", "local_window_of", "local_window_rows", "operation_rows", "preamble_query_rows",
           "segment_rows", "segmented_prelude", "window_block", "window_plan", "window_update"]
