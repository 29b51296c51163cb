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

Two speed-ups on top, both tested equal to one iteration at a time:
- window plans: the windows of `window_plan_iterations` iterations are built in one vectorized pass;
- blocks: with no grad, `block_iterations` iterations run as one unit (`core_iterations`), one graph under
  `compile_core`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .loop_types import IterationView, LoopStep, ReadoutInput
from .loop_views import LoopView, attention_bias, mask_dtype, operations_read, rotary_at


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


def local_window_rows(operation_ends: torch.Tensor, depth: torch.Tensor, iteration: int | torch.Tensor,
                      step_size: int, samples: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    return index.clamp_min(0), valid


def op_rows_e(prelude_out: torch.Tensor, index: torch.Tensor, query_rows: int) -> torch.Tensor:
    """e at a window's operation rows, (b, S, h): they restart from e each iteration. `index` (b, w) is the
    window's token index, whose last `query_rows` columns are the query region."""
    batch = torch.arange(index.shape[0], device=index.device)[:, None]
    return prelude_out[batch, index[:, :index.shape[1] - query_rows]]


@dataclass(frozen=True)
class WindowPlan:
    """Iterations first..first+K−1 of the local window, built in one vectorized pass (instead of ~30 small tensor
    operations per iteration): token index (K, b, w), mask (K, b, 1, w, w), rotary cos/sin (K, b, w, head_dim); the
    K windows share their op columns S (the longest span among them; shorter spans are padding rows)."""

    first: int
    index: torch.Tensor
    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def covers(self, first: int, count: int = 1) -> bool:
        return self.first <= first and first + count <= self.first + self.index.shape[0]

    def views(self, first: int, count: int) -> IterationView:
        """Iterations first..first+count−1 as one `IterationView` of (count, b, ...) tensors."""
        i = first - self.first
        return IterationView(self.mask[i:i + count], self.cos[i:i + count], self.sin[i:i + count],
                             self.index[i:i + count])

    def at(self, iteration: int) -> IterationView:
        i = iteration - self.first
        return IterationView(self.mask[i], self.cos[i], self.sin[i], self.index[i])

    def select(self, keep: torch.Tensor) -> WindowPlan:
        return WindowPlan(self.first, *(x[:, keep] for x in (self.index, self.mask, self.cos, self.sin)))


def window_plan(model, loop: LoopView, window: LocalWindow, first: int, count: int,
                hidden: torch.Tensor) -> WindowPlan:
    """The windows of iterations first..first+count−1, computed on the batch repeated `count` times: per row the
    mask of `loop_views.loop_view_mask` (local) and the positions of `loop_views.rotary_at`, restricted to the window.
    Row j · b + i is sample i at iteration first + j; it reads the batch's (b, t) and (b, D+1) tensors through its
    sample index, never a copy of them: a plan costs O(count · window), not O(count · prompt)."""
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
                         hidden, samples)
    mask = attention_bias(allowed, mask_dtype(c, hidden))
    return WindowPlan(first, *(x.reshape(count, b, *x.shape[1:]) for x in (index, mask, cos, sin)))


def core_iterations(core_update, e_half, state, reference_rms, prelude_out, index, mask, cos, sin):
    """Iterations k..k+K−1 of the local window as one unit: K times `core_update` (the model's `_core_update`) on
    [iteration k's op rows | the query region], from a window plan's (K, b, ...) slices. Bit-identical to K single
    iterations when their window plans coincide; when a unit starts a new plan, the plans' op-column padding
    differs, so attention sums round differently (~1e-7 relative in fp32, as with another `window_plan_iterations`).

    Returns (the op rows' outputs (K, b, S, h), the states (K, b, Q, h), their rms before anchoring (K, b, Q, 1))."""
    ops_outs, states, raws = [], [], []
    for i in range(index.shape[0]):
        e_ops = op_rows_e(prelude_out, index[i], state.shape[1])
        ops_out, state, raw_rms = core_update(e_half, state, mask[i], cos[i], sin[i], reference_rms, e_ops)
        ops_outs.append(ops_out)
        states.append(state)
        raws.append(raw_rms)
    return torch.stack(ops_outs), torch.stack(states), torch.stack(raws)


class WindowPlans:
    """The window plans of one batch's loop: the current plan, replaced by one of max(count,
    `window_plan_iterations`) iterations when the iterations asked for leave it, and cut with the batch when samples
    finish. Also runs a no-grad block of iterations over them (`block`)."""

    def __init__(self, model, loop: LoopView, window: LocalWindow):
        self.model, self.loop, self.window = model, loop, window
        self.plan: WindowPlan | None = None

    def covering(self, first: int, count: int, hidden: torch.Tensor) -> WindowPlan:
        if self.plan is None or not self.plan.covers(first, count):
            size = max(count, self.model.runtime.window_plan_iterations)
            self.plan = window_plan(self.model, self.loop, self.window, first, size, hidden)
        return self.plan

    def view_at(self, iteration: int, hidden: torch.Tensor) -> IterationView:
        return self.covering(iteration, 1, hidden).at(iteration)

    def block(self, context, first: int, state: torch.Tensor, reference_rms: torch.Tensor | None) -> list[LoopStep]:
        """Iterations first..first+K−1 (K = `block_iterations`) in one `core_iterations` call (compiled under
        `compile_core`), as K `LoopStep`s: what K calls of `core_step` return (tested)."""
        count = self.model.runtime.block_iterations
        views = self.covering(first, count, state).views(first, count)
        ops_outs, states, raws = self.model._part("core_iterations")(
            context.e_half, state.contiguous(), reference_rms, context.prelude_out, views.index, views.mask,
            views.cos, views.sin)
        columns = self.window.readout_columns
        return [LoopStep(first + i, states[i], raws[i], reference_rms,
                         ReadoutInput(states[i], ops_outs[i], views.mask[i], views.cos[i], views.sin[i], columns))
                for i in range(count)]

    def select(self, keep: torch.Tensor, loop: LoopView, window: LocalWindow) -> None:
        """Keep the samples `keep` (the loop's batch shrank to `loop` / `window`)."""
        self.loop, self.window = loop, window
        self.plan = None if self.plan is None else self.plan.select(keep)


__all__ = ["LocalWindow", "SegmentRows", "WindowPlan", "WindowPlans", "core_iterations", "local_window_of",
           "local_window_rows", "op_rows_e", "operation_rows", "preamble_query_rows", "segment_rows",
           "segmented_prelude", "window_plan"]
