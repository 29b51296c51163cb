"""Loop views: what the query tokens read at iteration k (`ParLoopedQwenConfig.loop_view`,
`progress_positions`, `bidirectional_queries`), as masks and positions over the whole prompt.

The prompt is split by `operation_ends` (b, D+1) into the preamble, operations 1..d and the query region (the
tokens after the last operation). These functions build the masked full-prompt computation of every view: the
reference that the local window (`window_path`) is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .loop_types import IterationView, OperationRange, TokenSegments


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of each token among its sample's real tokens, p = cumsum(mask) − 1 (0 on left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)  # (b, t)


def stretch_positions(position_ids: torch.Tensor, position_scale: torch.Tensor) -> torch.Tensor:
    """Positional stretch: p' = s · p with one scale s ∈ [1, s_max] per sample (float positions).

    Only the rotary embedding sees p'; the attention mask never does (see `padded_causal_mask`).
    """
    return position_ids.float() * position_scale.to(position_ids.device).float()[:, None]  # (b, t)


def nope_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """No positional encoding (NoPE): every position read as p' = 0, so the rotary embedding is cos = 1, sin = 0 and
    q, k are not rotated (attention sees order only through the causal mask).  # (b, t) -> (b, t)"""
    return torch.zeros_like(position_ids, dtype=torch.float32)


def encoded_positions(config, position_ids: torch.Tensor) -> torch.Tensor:
    """The positions the rotary embedding reads under `config.position_encoding`: `position_ids` with "rope",
    `nope_positions` with "nope"."""
    return nope_positions(position_ids) if config.position_encoding == "nope" else position_ids


def attention_bias(allowed: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """(b, t, t) boolean -> the layers' mask (b, 1, t, t): boolean for sdpa (`dtype=None`), else additive float."""
    if dtype is None:
        return allowed[:, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )[:, None]


def padded_causal_mask(attention_mask: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Attention mask (b, 1, t, t): query i sees key j iff j ≤ i and key j is a real token.

    Built from `attention_mask` alone, never from position ids: transformers 5.x's `create_causal_mask` reads
    non-unit steps in `position_ids` as packed-sequence boundaries, which would cut every stretched prompt into
    one-token documents. A padding query sees itself, so no softmax row is empty. `dtype=None` gives a boolean
    mask (sdpa), otherwise an additive float mask (eager).
    """
    t = attention_mask.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = causal[None] & attention_mask.bool()[:, None, :]
    allowed = allowed | torch.eye(t, dtype=torch.bool, device=attention_mask.device)[None]
    return attention_bias(allowed, dtype)


def token_segments(operation_ends: torch.Tensor, attention_mask: torch.Tensor) -> TokenSegments:
    """Which part of the prompt each token belongs to, from `operation_ends` (b, D+1): the index of the last token
    of the preamble (entry 0) and of each operation i = 1..d (entries past d_b are −1).

    segment(t) = #{i ≤ d : end_i < t}: 0 = preamble (t ≤ end_0), i = operation i (end_{i−1} < t ≤ end_i),
    d + 1 = the query region (t > end_d). Returns `TokenSegments`: segments (b, t), depth d (b,), query_region (b, t)
    bool (real tokens only).

    Computed as a running count of operation-end markers, O(b · t) (no (b, t, D+1) comparison): a marker at
    t = end_i + 1 for every valid entry, segment(t) = cumsum(markers)(t).
    """
    valid = operation_ends >= 0
    depth = valid.sum(-1) - 1  # (b,)
    b, t = attention_mask.shape
    starts = torch.where(valid, operation_ends + 1, t).clamp(max=t)  # where each next segment starts; t: none
    markers = torch.zeros(b, t + 1, dtype=torch.long, device=operation_ends.device)
    markers.scatter_add_(1, starts, torch.ones_like(starts))
    segments = markers[:, :t].cumsum(-1)  # (b, t)
    query_region = (segments == depth[:, None] + 1) & attention_mask.bool()
    return TokenSegments(segments, depth, query_region)


def operations_read(iteration: int | torch.Tensor, depth: torch.Tensor, step_size: int) -> OperationRange:
    """The operations iteration k reads: (c·(k−1), min(c·k, d)], as (exclusive low, inclusive high), each (b,).

    k = 0 is the prelude (low = high = 0: no operation); past ⌈d/c⌉ the range is empty (low ≥ d). `iteration` is an
    int or a tensor of one k per sample (b,).
    """
    if isinstance(iteration, torch.Tensor):
        high = torch.minimum(depth, step_size * iteration)
        low = torch.minimum(depth, step_size * (iteration - 1).clamp_min(0))
        return OperationRange(torch.where(iteration > 0, low, high), high)
    high = torch.clamp(depth, max=step_size * iteration)
    low = torch.clamp(depth, max=step_size * max(iteration - 1, 0)) if iteration > 0 else high
    return OperationRange(low, high)


def progress_shift(operation_end_positions: torch.Tensor, depth: torch.Tensor, iteration: int | torch.Tensor,
                   step_size: int, samples: torch.Tensor | None = None) -> torch.Tensor:
    """Progress-coupled positions: at iteration k the query region's positions move back by
    Δ_k = pos(end_d) − pos(end_min(c·k, d)), so the queries sit right after the last operation read at iteration k
    whatever d is (Δ = 0 from k = ⌈d/c⌉ on: ordinary positions; k = 0, the prelude: right after the preamble).
    operation_end_positions (b, D+1), depth (n,) -> Δ_k (n,); `samples` (n,) is each row's row of
    `operation_end_positions` (default: row i's, n = b).
    """
    high = operations_read(iteration, depth, step_size).high
    rows = torch.arange(depth.shape[0], device=depth.device) if samples is None else samples
    return operation_end_positions[rows, depth] - operation_end_positions[rows, high]


def loop_view_mask(base_allowed: torch.Tensor, segments: torch.Tensor, depth: torch.Tensor,
                   query_region: torch.Tensor, view: str, iteration: int, step_size: int,
                   bidirectional_queries: bool) -> torch.Tensor:
    """Keys each token may see at iteration k (k = 0: the prelude), as a boolean (b, t, t).

    `base_allowed` is the padded causal mask (key j ≤ query i, j real; padding sees itself). Rows of the query
    region Q (the tokens after the last operation) see:
      full:   the base mask;
      prefix: segments 0..min(c·k, d) (preamble and operations read so far) and Q;
      local:  segments in (c·(k−1), min(c·k, d)] (the operations of iteration k; k = 0: the preamble) and Q.
    Under `local`, every other row sees only its own segment. `bidirectional_queries`: Q sees all of Q.
    """
    t = base_allowed.shape[-1]
    eye = torch.eye(t, dtype=torch.bool, device=base_allowed.device)[None]
    low, high = operations_read(iteration, depth, step_size)
    key_segment = segments[:, None, :]  # (b, 1, t)
    key_query = query_region[:, None, :]  # (b, 1, t)
    within = base_allowed | (key_query & query_region[:, :, None] & bidirectional_queries)
    if view == "full":
        return within
    if view == "prefix":
        visible = key_segment <= high[:, None, None]
    elif iteration == 0:
        visible = key_segment == 0
    else:
        visible = (key_segment > low[:, None, None]) & (key_segment <= high[:, None, None])
    query_rows = within & (visible | key_query)
    if view == "prefix":
        other_rows = base_allowed
    else:
        other_rows = base_allowed & (key_segment == segments[:, :, None])
    return torch.where(query_region[:, :, None], query_rows, other_rows) | eye


@dataclass(frozen=True)
class LoopView:
    """What the iteration-dependent views (`loop_view`, `progress_positions`) need, per sample."""

    base_allowed: torch.Tensor | None  # (b, t, t) bool, the padded causal mask (None on the local window: unread)
    segments: torch.Tensor  # (b, t) long, see `token_segments`
    depth: torch.Tensor  # (b,) long
    query_region: torch.Tensor  # (b, t) bool
    positions: torch.Tensor  # (b, t) float, before stretch
    operation_ends: torch.Tensor  # (b, D+1) token indices
    operation_end_positions: torch.Tensor  # (b, D+1) float
    position_scale: torch.Tensor | None  # (b,) or None

    @classmethod
    def of(cls, operation_ends: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
           position_scale: torch.Tensor | None, base_allowed: torch.Tensor | None) -> LoopView:
        """The loop view of a batch: its `token_segments`, its positions (b, t) as floats, where each operation ends.
        `base_allowed` is the padded causal mask the whole-prompt views read (None on the local window)."""
        segments, positions = token_segments(operation_ends, attention_mask), positions.float()
        return cls(base_allowed, segments.segments, segments.depth, segments.query_region, positions, operation_ends,
                   positions.gather(1, operation_ends.clamp_min(0)), position_scale)

    def select(self, keep: torch.Tensor) -> LoopView:
        return LoopView(*(None if x is None else x[keep] for x in vars(self).values()))


def mask_dtype(config, hidden: torch.Tensor) -> torch.dtype | None:
    """The layers' mask type: None (a boolean mask) for sdpa, else the additive float mask's dtype."""
    return None if config._attn_implementation == "sdpa" else hidden.dtype


def full_view_mask(config, causal_fast_path: bool, attention_mask: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor | None:
    """The full view's mask: `padded_causal_mask`, or None (sdpa's causal kernel, the same mask implicitly) when
    `causal_fast_path` (`runtime.causal_fast_path`) is on, the layers use sdpa and no token of the batch is padding."""
    if causal_fast_path and config._attn_implementation == "sdpa" and bool(attention_mask.bool().all()):
        return None
    return padded_causal_mask(attention_mask, mask_dtype(config, hidden))


def rotary_at(config, rotary_emb, loop: LoopView, positions: torch.Tensor, is_query: torch.Tensor,
              iteration: int | torch.Tensor, hidden: torch.Tensor,
              samples: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of iteration k: `progress_shift` on the query rows (`progress_positions`), then the stretch
    (`stretch_positions`), then Qwen2's rotary embedding `rotary_emb`. positions / is_query (n, w); `samples` (n,) is
    each row's sample in `loop` (default: row i is sample i, n = b)."""
    depth, scale = loop.depth, loop.position_scale
    if samples is not None:
        depth, scale = depth[samples], None if scale is None else scale[samples]
    if config.progress_positions:
        shift = progress_shift(loop.operation_end_positions, depth, iteration, config.step_size, samples)
        positions = positions - shift[:, None] * is_query
    if scale is not None:
        positions = stretch_positions(positions, scale)
    return rotary_emb(hidden, encoded_positions(config, positions))


def whole_prompt_view(config, rotary_emb, loop: LoopView, iteration: int, hidden: torch.Tensor) -> IterationView:
    """Iteration k's view of the whole prompt (k = 0: the prelude): `loop_view_mask` and `rotary_at` positions."""
    allowed = loop_view_mask(loop.base_allowed, loop.segments, loop.depth, loop.query_region, config.loop_view,
                             iteration, config.step_size, config.bidirectional_queries)
    cos, sin = rotary_at(config, rotary_emb, loop, loop.positions, loop.query_region, iteration, hidden)
    return IterationView(attention_bias(allowed, mask_dtype(config, hidden)), cos, sin)


__all__ = ["LoopView", "attention_bias", "encoded_positions", "full_view_mask", "loop_view_mask", "mask_dtype",
           "nope_positions", "operations_read", "padded_causal_mask", "positions_from_mask", "progress_shift",
           "rotary_at", "stretch_positions", "token_segments", "whole_prompt_view"]
