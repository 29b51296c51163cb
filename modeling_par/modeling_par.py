"""PAR (Progress-Aligned Recurrence) looped, retrofitted Qwen2 for state tracking.

    e = P(x),  s_0 = e,  s_k = anchor(C(W [e ; s_{k-1}])),  y_k = Q(s_k)        (k = 1..R)

P (prelude), C (weight-shared core) and Q (coda) are slices of one Qwen2 decoder stack, built from
transformers' own `Qwen2Model` so every Qwen2 parameter keeps its name (`model.layers.{i}.…`,
`model.embed_tokens`, `model.norm`, `lm_head`); the only new parameter is the adapter W (Linear 2h → h,
initialised to [0 | I], so R = 1 computes exactly the parent model). The answer is a classification over
the LM-head rows of the candidate tokens at the query positions; learned halting reads the ("Yes", "No")
rows at the last query position.

This file and `configuration_par.py` are the remote code that `save_pretrained` copies next to the weights:
they import only torch, transformers, the standard library and each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface, PreTrainedModel, Qwen2ForCausalLM
from transformers import initialization as init
from transformers.models.qwen2.modeling_qwen2 import Qwen2Model, eager_attention_forward, repeat_kv
from transformers.utils import ModelOutput

from .configuration_par import ParLoopedQwenConfig

_RMS_EPS = 1e-12


# --------------------------------------------------------------------------------------------------------------
# The PAR mechanisms, each a small function with its formula.
# --------------------------------------------------------------------------------------------------------------


def state_rms(state: torch.Tensor) -> torch.Tensor:
    """Per-token RMS norm, rms(s) = sqrt(mean_j s_j²), computed in fp32.  # (..., h) -> (..., 1)"""
    return state.float().pow(2).mean(-1, keepdim=True).clamp_min(_RMS_EPS).sqrt()


def anchor_state_norm(state: torch.Tensor, reference_rms: torch.Tensor) -> torch.Tensor:
    """State-norm anchoring: s_k ← s_k · rms(s_1) / rms(s_k), per token.

    `reference_rms` is rms(s_1) of the same token, detached by the caller.  # (b, t, h), (b, t, 1) -> (b, t, h)
    """
    return state * (reference_rms / state_rms(state)).to(state.dtype)


def adapter_identity_init(hidden_size: int) -> torch.Tensor:
    """The adapter's initial weight W = [0 | I] ∈ R^{h×2h}, so W [e ; s] = s and R = 1 equals the parent."""
    return torch.cat([torch.zeros(hidden_size, hidden_size), torch.eye(hidden_size)], dim=1)


def grad_window_iterations(num_iterations: int, grad_window: int) -> list[int]:
    """The iterations that carry gradient: K = {max(1, R − window + 1), …, R} (1-based)."""
    return list(range(max(1, num_iterations - grad_window + 1), num_iterations + 1))


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of each token among its sample's real tokens, p = cumsum(mask) − 1 (0 on left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)  # (b, t)


def stretch_positions(position_ids: torch.Tensor, position_scale: torch.Tensor) -> torch.Tensor:
    """Positional stretch: p' = s · p with one scale s ∈ [1, s_max] per sample (float positions).

    Only the rotary embedding sees p'; the attention mask never does (see `padded_causal_mask`).
    """
    return position_ids.float() * position_scale.to(position_ids.device).float()[:, None]  # (b, t)


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


SMALL_BLOCK_KEYS = 32  # the local window's blocks: span + query region keys


def small_block_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scaling + mask) v, both products written as broadcast multiply-and-sum,
    scores_ij = Σ_d q_id k_jd, out_id = Σ_j p_ij v_jd, instead of two batched matmuls.

    The same values as transformers' `eager_attention_forward` (up to the order of the sums). Under torch.compile
    inductor fuses each into one loop over (b, h, q, k): on the local window's few-key blocks a batched matmul per
    (b, h) pair is mostly call overhead. Eagerly it would materialize (b, h, q, k, d): `par_eager_attention` only
    calls it while compiling. query (b, h, q, d), key/value (b, h, k, d) with h heads each (GQA repeated by the
    caller), mask additive (b, 1, q, k) -> output (b, q, h, d), weights (b, h, q, k)."""
    scores = (query[:, :, :, None, :] * key[:, :, None, :, :]).sum(-1) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = (weights[..., None] * value[:, :, None, :, :]).sum(-2)
    return output.transpose(1, 2).contiguous(), weights


def par_eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """The attention implementation "par_eager" (`attn_implementation="par_eager"`): transformers' eager attention
    (`eager_attention_forward`: matmul, softmax, matmul), except while torch.compile traces it (`compile_core`) on
    a block of at most `SMALL_BLOCK_KEYS` keys without dropout, where it is `small_block_attention`. Uncompiled it is
    exactly "eager". The CPU default for the local window (`state_tracking.default_attn_implementation`): measured
    4-10% faster per training step and evaluation than compiled "eager" (benchmarks/bench_speed.py)."""
    if (not torch.compiler.is_compiling() or key.shape[-2] > SMALL_BLOCK_KEYS
            or (dropout and module.training)):
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    groups = module.num_key_value_groups
    return small_block_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), attention_mask, scaling)


AttentionInterface.register("par_eager", par_eager_attention)


def token_segments(operation_ends: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Which part of the prompt each token belongs to, from `operation_ends` (b, D+1): the index of the last token
    of the preamble (entry 0) and of each operation i = 1..d (entries past d_b are −1).

    segment(t) = #{i ≤ d : end_i < t}: 0 = preamble (t ≤ end_0), i = operation i (end_{i−1} < t ≤ end_i),
    d + 1 = the query region (t > end_d). Returns segments (b, t), depth d (b,), query_region (b, t) bool (real
    tokens only).
    """
    valid = operation_ends >= 0
    depth = valid.sum(-1) - 1  # (b,)
    t = torch.arange(attention_mask.shape[-1], device=operation_ends.device)
    ends = operation_ends.masked_fill(~valid, torch.iinfo(torch.long).max)
    segments = (ends[:, None, :] < t[None, :, None]).sum(-1)  # (b, t)
    query_region = (segments == depth[:, None] + 1) & attention_mask.bool()
    return segments, depth, query_region


def operations_read(iteration: int | torch.Tensor, depth: torch.Tensor,
                    step_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The operations iteration k reads: (c·(k−1), min(c·k, d)], as (exclusive low, inclusive high), each (b,).

    k = 0 is the prelude (low = high = 0: no operation); past ⌈d/c⌉ the range is empty (low ≥ d). `iteration` is an
    int or a tensor of one k per sample (b,).
    """
    if isinstance(iteration, torch.Tensor):
        high = torch.minimum(depth, step_size * iteration)
        low = torch.minimum(depth, step_size * (iteration - 1).clamp_min(0))
        return torch.where(iteration > 0, low, high), high
    high = torch.clamp(depth, max=step_size * iteration)
    low = torch.clamp(depth, max=step_size * max(iteration - 1, 0)) if iteration > 0 else high
    return low, high


def progress_shift(operation_end_positions: torch.Tensor, depth: torch.Tensor, iteration: int | torch.Tensor,
                   step_size: int) -> torch.Tensor:
    """Progress-coupled positions: at iteration k the query region's positions move back by
    Δ_k = pos(end_d) − pos(end_min(c·k, d)), so the queries sit right after the last operation read at iteration k
    whatever d is (Δ = 0 from k = ⌈d/c⌉ on: ordinary positions; k = 0, the prelude: right after the preamble).
    operation_end_positions (b, D+1), depth (b,) -> Δ_k (b,)
    """
    _, high = operations_read(iteration, depth, step_size)
    rows = torch.arange(depth.shape[0], device=depth.device)
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


def default_compile_options(compile_kwargs: dict, device: torch.device) -> dict:
    """`torch.compile` keyword arguments for `compile_core`: on a CPU with the inductor backend, `cpp_wrapper=True`
    (the compiled graph is called through C++ instead of a Python wrapper: ~0.3–0.5 ms less per call of the loop,
    see benchmarks/bench_speed.py) unless the caller passes `mode` or sets `cpp_wrapper` in `options`."""
    kwargs = dict(compile_kwargs)
    if torch.device(device).type == "cpu" and kwargs.get("backend", "inductor") == "inductor" and "mode" not in kwargs:
        kwargs["options"] = {"cpp_wrapper": True, **(kwargs.get("options") or {})}
    return kwargs


def halt_confirmed(p_yes_window: torch.Tensor, threshold: float, confirm: int) -> torch.Tensor:
    """The halting rule on one window of iterations R..R+m−1, for a batch.

    Halt at R iff P_R(Yes) > τ and #{j ∈ R..R+m−1 : P_j(Yes) > τ} ≥ k.  # (m, b) -> (b,) bool
    """
    above = p_yes_window > threshold
    return above[0] & (above.sum(0) >= confirm)


def halt_iteration(p_yes: torch.Tensor, threshold: float = 0.5, confirm: int = 6, window: int = 8) -> int | None:
    """First iteration R (1-based) confirmed by `halt_confirmed` over R..R+m−1, or None if none is.

    A window that would run past the last iteration given cannot confirm.  # p_yes: (iters,)
    """
    for start in range(p_yes.shape[0] - window + 1):
        if halt_confirmed(p_yes[start : start + window, None], threshold, confirm)[0]:
            return start + 1
    return None


# --------------------------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------------------------


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


@dataclass
class _LoopView:
    """What the iteration-dependent views (`loop_view`, `progress_positions`) need, per sample."""

    base_allowed: torch.Tensor  # (b, t, t) bool, the padded causal mask
    segments: torch.Tensor  # (b, t) long, see `token_segments`
    depth: torch.Tensor  # (b,) long
    query_region: torch.Tensor  # (b, t) bool
    positions: torch.Tensor  # (b, t) float, before stretch
    operation_ends: torch.Tensor  # (b, D+1) token indices
    operation_end_positions: torch.Tensor  # (b, D+1) float
    position_scale: torch.Tensor | None  # (b,) or None

    def select(self, keep: torch.Tensor) -> _LoopView:
        return _LoopView(*(None if x is None else x[keep] for x in vars(self).values()))

    def repeat(self, times: int) -> _LoopView:
        """The batch `times` times over, (times · b, ...): sample i of copy j is row j · b + i. The (b, t, t) base
        mask and the query region are left out (None): the window plans that use this read neither."""
        return _LoopView(*(None if x is None or name in ("base_allowed", "query_region")
                           else x.repeat(times, *([1] * (x.dim() - 1))) for name, x in vars(self).items()))


@dataclass
class _Context:
    """Per-batch tensors shared by every iteration: prelude output, mask, rotary cos/sin, query positions, and
    (iteration-dependent views only) the `_LoopView` from which each iteration's mask and positions are built."""

    prelude_out: torch.Tensor  # (b, t, h)
    mask: torch.Tensor  # (b, 1, t, t)
    cos: torch.Tensor  # (b, t, head_dim)
    sin: torch.Tensor  # (b, t, head_dim)
    query_positions: torch.Tensor  # (b, q)
    loop: _LoopView | None = None
    window: _LocalWindow | None = None
    e_half: torch.Tensor | None = None  # (b, rows, h) the adapter's e half of the loop-state rows (`adapter_e_half`)

    def select(self, keep: torch.Tensor) -> _Context:
        fields = (self.prelude_out, self.mask, self.cos, self.sin, self.query_positions)
        return _Context(*(None if x is None else x[keep] for x in fields),
                        None if self.loop is None else self.loop.select(keep),
                        None if self.window is None else self.window.select(keep),
                        None if self.e_half is None else self.e_half[keep])

    def initial_state(self) -> torch.Tensor:
        """s_0 = e: the prelude output (the query region's under the local window)."""
        return self.prelude_out if self.window is None else self.window.query_e

    def state_valid(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """Which rows of the loop state are real tokens, (b, rows) float."""
        return (attention_mask if self.window is None else self.window.query_valid).float()


@dataclass
class _WindowPlan:
    """Iterations first..first+K−1 of the local window, built in one vectorized pass (instead of ~30 small tensor
    operations per iteration): token index (K, b, w), mask (K, b, 1, w, w), rotary cos/sin (K, b, w, head_dim); the
    K windows share their op columns S (the longest span among them; shorter spans are padding rows)."""

    first: int
    index: torch.Tensor
    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def covers(self, iteration: int) -> bool:
        return self.first <= iteration < self.first + self.index.shape[0]

    def at(self, iteration: int) -> tuple[torch.Tensor, ...]:
        i = iteration - self.first
        return self.index[i], self.mask[i], self.cos[i], self.sin[i]

    def select(self, keep: torch.Tensor) -> _WindowPlan:
        return _WindowPlan(self.first, *(x[:, keep] for x in (self.index, self.mask, self.cos, self.sin)))


@dataclass
class _LocalWindow:
    """`loop_view="local"` without the rest of the prompt: each iteration runs the core and coda on the tokens of
    its operations plus the query region only (the only rows the local view lets the queries read), so an
    iteration costs O(span + queries) instead of O(prompt). The loop state is the query region's (b, Qmax, h).

    Exactly the masked local computation restricted to those rows (tested against it)."""

    query_index: torch.Tensor  # (b, Qmax) token index of each query-region token (padded: last real token)
    query_valid: torch.Tensor  # (b, Qmax) bool
    query_e: torch.Tensor  # (b, Qmax, h) prelude output at the query region
    readout_columns: torch.Tensor  # (b, q) column of each readout query inside the window's query part
    ops_out: torch.Tensor | None = None  # (b, S, h) the core output on iteration k's op rows (read by the coda)
    plan: _WindowPlan | None = None  # the windows of the current block of iterations

    def select(self, keep: torch.Tensor) -> _LocalWindow:
        values = {k: (v[keep] if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        values["plan"] = None if self.plan is None else self.plan.select(keep)
        return _LocalWindow(**values)


def local_window_rows(operation_ends: torch.Tensor, depth: torch.Tensor, iteration: int | torch.Tensor,
                      step_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices of the operations iteration k reads, (end_{c·(k−1)}, end_{min(c·k, d)}], padded to the batch's
    longest span S. Returns index (b, S) and valid (b, S)."""
    low, high = operations_read(iteration, depth, step_size)
    rows = torch.arange(depth.shape[0], device=depth.device)
    start = operation_ends[rows, low] + 1
    length = operation_ends[rows, high] - operation_ends[rows, low]  # 0 past ⌈d/c⌉
    span = max(int(length.max()), 0)
    offsets = torch.arange(span, device=depth.device)
    valid = offsets[None] < length[:, None]
    index = torch.where(valid, start[:, None] + offsets[None], start[:, None].clamp_max(operation_ends.max()))
    return index.clamp_min(0), valid


# --------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------


class ParLoopedQwenPreTrainedModel(PreTrainedModel):
    config: ParLoopedQwenConfig
    config_class = ParLoopedQwenConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Qwen2DecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False

    def _init_weights(self, module):
        super()._init_weights(module)
        if module is getattr(self, "adapter", None):
            init.copy_(module.weight, adapter_identity_init(self.config.hidden_size))


class ParLoopedQwenForStateTracking(ParLoopedQwenPreTrainedModel):
    """Looped Qwen2 with progress-aligned readouts; see the module docstring for the recurrence."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: ParLoopedQwenConfig):
        super().__init__(config)
        config.validate_par(require_answers=True)
        if getattr(config, "use_sliding_window", False):
            raise ValueError("ParLoopedQwenConfig.use_sliding_window must be False: the loop uses full attention.")
        self.model = Qwen2Model(config)  # embed_tokens, layers, norm, rotary_emb — Qwen2's own modules and names
        self.adapter = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # loop_view="local": run each iteration on its operations + the query region only (same result, O(window)
        # per iteration instead of O(prompt)); False uses the masked full-prompt computation (the reference).
        self.local_window = True
        self.window_plan_iterations = 16  # local window: iterations whose windows are built in one vectorized pass
        self.readout_batch_iterations = 8  # forward: readouts of up to this many iterations share one coda call
        # Full view, sdpa, no padding in the batch: give the layers no mask, so sdpa runs its causal kernel instead
        # of reading a materialized (b, 1, t, t) mask (same result); False always builds the mask (the reference).
        self.causal_fast_path = True
        # W [e ; s] = W_e e + W_s s: W_e e is computed once per batch, each iteration multiplies only s (half the
        # adapter's work); False runs the adapter on [e ; s] every iteration (the reference). A wrapped adapter (e.g.
        # PEFT's modules_to_save) is always called whole.
        self.split_adapter = True
        # Local window, no grad: run this many iterations as one unit (`core_iterations`), compiled as one graph by
        # `compile_core` (fewer calls, buffers reused across iterations); 1 runs every iteration on its own.
        self.block_iterations = 4
        self._compiled_core = self._compiled_coda = self._compiled_prelude = self._compiled_block = None
        self.post_init()

    # The three slices of the one decoder stack.
    @property
    def prelude(self) -> nn.ModuleList:
        return self.model.layers[: self.config.prelude_layers]

    @property
    def core(self) -> nn.ModuleList:
        p = self.config.prelude_layers
        return self.model.layers[p : p + self.config.core_layers]

    @property
    def coda(self) -> nn.ModuleList:
        return self.model.layers[self.config.prelude_layers + self.config.core_layers :]

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    # ----------------------------------------------------------------------------------------------------------
    @classmethod
    def from_qwen2(
        cls,
        model_or_path,
        prelude_layers: int,
        core_layers: int,
        coda_layers: int,
        answer_token_ids: list[int],
        halt_token_ids: tuple[int, int] | None = None,
        dtype: torch.dtype | str | None = None,
        **par_kwargs,
    ) -> ParLoopedQwenForStateTracking:
        """Retrofit a Qwen2 causal LM (a Hub id, a local path or a `Qwen2ForCausalLM`) into a looped PAR model.

        Layers [0, P) become the prelude, [P, P+C) the shared core, the rest the coda; every Qwen2 weight is
        copied unchanged and only the adapter is new (W = [0 | I]), so with R = 1 the answer logits equal the
        parent's logits at the candidate rows.
        """
        if isinstance(model_or_path, (str, os.PathLike)):
            kwargs = {} if dtype is None else {"dtype": dtype}
            parent = Qwen2ForCausalLM.from_pretrained(model_or_path, **kwargs)
        elif isinstance(model_or_path, Qwen2ForCausalLM):
            parent = model_or_path
        else:
            raise ValueError(
                "from_qwen2: model_or_path must be a Hub id, a local path or a Qwen2ForCausalLM; "
                f"got {type(model_or_path).__name__}."
            )
        parent_config = parent.config.to_dict()
        for key in ("model_type", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype"):
            parent_config.pop(key, None)
        if parent_config.get("num_hidden_layers") != prelude_layers + core_layers + coda_layers:
            raise ValueError(
                f"from_qwen2: prelude_layers + core_layers + coda_layers = {prelude_layers + core_layers + coda_layers} "
                f"must equal the parent's num_hidden_layers = {parent_config.get('num_hidden_layers')}."
            )
        config = ParLoopedQwenConfig(
            prelude_layers=prelude_layers,
            core_layers=core_layers,
            coda_layers=coda_layers,
            answer_token_ids=answer_token_ids,
            halt_token_ids=halt_token_ids,
            **par_kwargs,
            **parent_config,
        )
        config._attn_implementation = parent.config._attn_implementation
        model = cls(config).to(dtype=next(parent.parameters()).dtype, device=next(parent.parameters()).device)
        missing, unexpected = model.load_state_dict(parent.state_dict(), strict=False)
        if unexpected or set(missing) - {"adapter.weight", "lm_head.weight"}:
            raise ValueError(f"from_qwen2: parent weights do not match: missing {missing}, unexpected {unexpected}.")
        if "lm_head.weight" in missing:  # a parent whose state dict left out its tied head
            model.lm_head.weight = model.model.embed_tokens.weight
        return model

    # ----------------------------------------------------------------------------------------------------------
    def _check_inputs(self, input_ids, attention_mask, query_positions, position_scale):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq); got {tuple(input_ids.shape)}.")
        if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
            raise ValueError(
                f"input_ids must lie in [0, vocab_size={self.config.vocab_size}); "
                f"got values in [{int(input_ids.min())}, {int(input_ids.max())}]."
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        elif attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}; "
                f"got {tuple(attention_mask.shape)}."
            )
        if query_positions is None:  # the last real token of each sample (left or right padding)
            last = input_ids.shape[1] - 1 - attention_mask.flip(-1).long().argmax(-1)
            query_positions = last[:, None]
        query_positions = torch.as_tensor(query_positions, device=input_ids.device).long()
        if query_positions.dim() == 1:
            query_positions = query_positions[:, None]
        if query_positions.dim() != 2 or query_positions.shape[0] != input_ids.shape[0]:
            raise ValueError(
                f"query_positions must have shape (batch, queries) with batch={input_ids.shape[0]}; "
                f"got {tuple(query_positions.shape)}."
            )
        if query_positions.min() < 0 or query_positions.max() >= input_ids.shape[1]:
            raise ValueError(f"query_positions must lie in [0, seq_len={input_ids.shape[1]}).")
        if not attention_mask.gather(1, query_positions).bool().all():
            raise ValueError("query_positions must point at real tokens (attention_mask == 1), not padding.")
        if position_scale is not None:
            position_scale = torch.as_tensor(position_scale, device=input_ids.device, dtype=torch.float32)
            if position_scale.dim() == 0:
                position_scale = position_scale.expand(input_ids.shape[0])
            smax = self.config.max_position_scale
            if position_scale.shape != (input_ids.shape[0],) or (position_scale < 1).any() or (
                position_scale > smax
            ).any():
                raise ValueError(
                    f"position_scale must be a float or a (batch,) tensor with values in [1, max_position_scale={smax}]."
                )
        return attention_mask, query_positions, position_scale

    def _check_operation_ends(self, operation_ends, attention_mask, query_positions):
        """`operation_ends` (b, D+1): per sample the last token index of the preamble and of operations 1..d,
        strictly increasing, then −1; real tokens; every query after the last operation."""
        c = self.config
        needed = c.loop_view != "full" or c.progress_positions
        if operation_ends is None:
            if needed:
                raise ValueError(
                    f"operation_ends is required with loop_view={c.loop_view!r} / progress_positions="
                    f"{c.progress_positions}: give (batch, depth + 1) token indices of the end of the preamble and of "
                    "each operation (the collator builds them from the dataset's 'operation_ends')."
                )
            return None
        if not needed:
            return None
        b, t = attention_mask.shape
        operation_ends = torch.as_tensor(operation_ends, device=attention_mask.device).long()
        if operation_ends.dim() != 2 or operation_ends.shape[0] != b or operation_ends.shape[1] < 1:
            raise ValueError(f"operation_ends must have shape (batch={b}, depth + 1); got {tuple(operation_ends.shape)}.")
        valid = operation_ends >= 0
        step = operation_ends[:, 1:] - operation_ends[:, :-1]
        if (not valid[:, 0].all() or (valid[:, 1:] & ~valid[:, :-1]).any() or (operation_ends >= t).any()
                or (operation_ends < -1).any() or ((step <= 0) & valid[:, 1:]).any()
                or not attention_mask.gather(1, operation_ends.clamp_min(0)).bool()[valid].all()):
            raise ValueError(
                "operation_ends must hold, per sample, strictly increasing indices of real tokens in "
                f"[0, seq_len={t}) (preamble end, then each operation's end), padded with -1 at the end."
            )
        last = operation_ends.gather(1, (valid.sum(-1) - 1)[:, None])
        if (query_positions <= last).any():
            raise ValueError("query_positions must lie after the last operation (operation_ends[:, depth]).")
        return operation_ends

    def _check_iterations(self, num_iterations, name="num_iterations"):
        limit = self.config.max_iterations
        if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or not 1 <= num_iterations <= limit:
            raise ValueError(f"{name} must be an integer in [1, max_iterations={limit}]; got {num_iterations!r}.")
        return num_iterations

    def _prepare(self, input_ids, attention_mask, query_positions, position_scale, operation_ends=None,
                 position_ids=None) -> _Context:
        """Run the prelude once and build what every iteration shares."""
        attention_mask, query_positions, position_scale = self._check_inputs(
            input_ids, attention_mask, query_positions, position_scale
        )
        operation_ends = self._check_operation_ends(operation_ends, attention_mask, query_positions)
        hidden = self.model.embed_tokens(input_ids)
        if position_ids is None:
            positions = positions_from_mask(attention_mask)
        else:
            positions = torch.as_tensor(position_ids, device=input_ids.device)
            if positions.shape != input_ids.shape:
                raise ValueError(f"position_ids must have the shape of input_ids {tuple(input_ids.shape)}; "
                                 f"got {tuple(positions.shape)}.")
        if operation_ends is None:
            if position_scale is not None:
                positions = stretch_positions(positions, position_scale)
            cos, sin = self.model.rotary_emb(hidden, positions)
            context = _Context(hidden, self._full_view_mask(attention_mask, hidden), cos, sin, query_positions)
        else:
            segments, depth, query_region = token_segments(operation_ends, attention_mask)
            positions = positions.float()
            loop = _LoopView(
                base_allowed=padded_causal_mask(attention_mask, None)[:, 0], segments=segments, depth=depth,
                query_region=query_region, positions=positions, operation_ends=operation_ends,
                operation_end_positions=positions.gather(1, operation_ends.clamp_min(0)), position_scale=position_scale,
            )
            context = _Context(hidden, None, None, None, query_positions, loop)
            context.mask, context.cos, context.sin = self._view_at(context, 0, hidden)
        prelude = self._prelude_block if self._compiled_prelude is None else self._compiled_prelude
        context.prelude_out = prelude(hidden, context.mask, context.cos, context.sin)
        if context.loop is not None and self.config.loop_view == "local" and self.local_window:
            context.window = self._local_window(context, query_positions)
        context.e_half = self.adapter_e_half(context.initial_state())
        return context

    def _local_window(self, context: _Context, query_positions: torch.Tensor) -> _LocalWindow:
        loop = context.loop
        query_start = loop.query_region.float().argmax(-1)  # first query-region token
        query_length = loop.query_region.sum(-1)
        offsets = torch.arange(int(query_length.max()), device=query_start.device)
        last = query_start + query_length - 1
        query_index = torch.minimum(query_start[:, None] + offsets[None], last[:, None])
        rows = torch.arange(query_index.shape[0], device=query_start.device)[:, None]
        return _LocalWindow(
            query_index=query_index, query_valid=offsets[None] < query_length[:, None],
            query_e=context.prelude_out[rows, query_index], readout_columns=query_positions - query_start[:, None],
        )

    def _full_view_mask(self, attention_mask: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """The full view's mask: `padded_causal_mask`, or None (sdpa's causal kernel, the same mask implicitly) when
        `causal_fast_path` is on, the layers use sdpa and no token of the batch is padding."""
        if self.causal_fast_path and self.config._attn_implementation == "sdpa" and bool(attention_mask.bool().all()):
            return None
        return padded_causal_mask(attention_mask, self._mask_dtype(hidden))

    def _mask_dtype(self, hidden: torch.Tensor) -> torch.dtype | None:
        """None (a boolean mask) for sdpa, else the additive float mask's dtype."""
        return None if self.config._attn_implementation == "sdpa" else hidden.dtype

    def _rotary_at(self, loop: _LoopView, positions: torch.Tensor, is_query: torch.Tensor,
                   iteration: int | torch.Tensor, hidden: torch.Tensor):
        """cos/sin of iteration k: `progress_shift` on the query rows, then the stretch, then Qwen2's rotary."""
        c = self.config
        if c.progress_positions:
            shift = progress_shift(loop.operation_end_positions, loop.depth, iteration, c.step_size)
            positions = positions - shift[:, None] * is_query
        if loop.position_scale is not None:
            positions = stretch_positions(positions, loop.position_scale)
        return self.model.rotary_emb(hidden, positions)

    def _window_at(self, context: _Context, iteration: int, hidden: torch.Tensor):
        """Token indices, mask and rotary of iteration k's window: [its operations | the query region], read from
        the plan of its block of `window_plan_iterations` iterations (built when k leaves the current one)."""
        return self._plan_covering(context, iteration, 1, hidden).at(iteration)

    def _plan_covering(self, context: _Context, first: int, count: int, hidden: torch.Tensor) -> _WindowPlan:
        """The window plan holding iterations first..first+count−1: the current one, or a new one of
        max(count, `window_plan_iterations`) iterations from `first`."""
        window = context.window
        if window.plan is None or not (window.plan.covers(first) and window.plan.covers(first + count - 1)):
            window.plan = self._window_plan(context, first, max(count, self.window_plan_iterations), hidden)
        return window.plan

    @staticmethod
    def _op_rows_e(prelude_out: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
        """e at a window's op rows, (b, S, h): the op rows restart from e each iteration. `index` (b, w) is the
        window's token index, whose last `rows` columns are the query region."""
        batch = torch.arange(index.shape[0], device=index.device)[:, None]
        return prelude_out[batch, index[:, :index.shape[1] - rows]]

    def _window_plan(self, context: _Context, first: int, count: int, hidden: torch.Tensor) -> _WindowPlan:
        """The windows of iterations first..first+count−1, computed on the batch repeated `count` times."""
        c, window = self.config, context.window
        b = window.query_index.shape[0]
        loop = context.loop.repeat(count)
        iteration = torch.arange(first, first + count, device=loop.depth.device).repeat_interleave(b)  # (count·b,)
        query_index, query_valid = window.query_index.repeat(count, 1), window.query_valid.repeat(count, 1)
        op_index, op_valid = local_window_rows(loop.operation_ends, loop.depth, iteration, c.step_size)
        index = torch.cat([op_index, query_index], 1)  # (count·b, w)
        valid = torch.cat([op_valid, query_valid], 1)
        is_query = torch.cat([torch.zeros_like(op_valid), query_valid], 1)
        segment = loop.segments.gather(1, index)
        earlier = index[:, None, :] <= index[:, :, None]  # key j not after query i
        key_valid, query_row = valid[:, None, :], is_query[:, :, None]
        key_op = (valid & ~is_query)[:, None, :]
        sees_query = is_query[:, None, :] & (earlier | c.bidirectional_queries)
        allowed = key_valid & torch.where(query_row, key_op | sees_query,
                                          key_op & earlier & (segment[:, None, :] == segment[:, :, None]))
        allowed = allowed | torch.eye(index.shape[1], dtype=torch.bool, device=index.device)[None]
        cos, sin = self._rotary_at(loop, loop.positions.gather(1, index), is_query, iteration, hidden)
        mask = attention_bias(allowed, self._mask_dtype(hidden))
        return _WindowPlan(first, *(x.reshape(count, b, *x.shape[1:]) for x in (index, mask, cos, sin)))

    def _view_at(self, context: _Context, iteration: int, hidden: torch.Tensor):
        """(mask, cos, sin) at iteration k (0: the prelude): `loop_view_mask` and `progress_shift` positions."""
        loop = context.loop
        if loop is None:
            return context.mask, context.cos, context.sin
        c = self.config
        allowed = loop_view_mask(loop.base_allowed, loop.segments, loop.depth, loop.query_region, c.loop_view,
                                 iteration, c.step_size, c.bidirectional_queries)
        cos, sin = self._rotary_at(loop, loop.positions, loop.query_region, iteration, hidden)
        return attention_bias(allowed, self._mask_dtype(hidden)), cos, sin

    @staticmethod
    def _run_layers(layers, hidden, mask, cos, sin) -> torch.Tensor:
        for layer in layers:
            out = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin))
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def compile_core(self, **compile_kwargs) -> ParLoopedQwenForStateTracking:
        """`torch.compile` the loop's hot path: the core update (C(W [e ; s]) and the anchoring), the coda + final norm,
        and the prelude (the Python loop and the mask/position bookkeeping stay eager). `compile_kwargs` go to
        `torch.compile` (default `dynamic=None`: one graph per shape, then dynamic shapes on a recompile).
        `compile_core(disable=True)` returns to eager. No-grad runs of `block_iterations` iterations on the local
        window (`core_iterations`) are one graph of their own (its first compile takes longer). Same result up to
        kernel rounding. On a CPU, inductor's C++ wrapper is on unless `options`/`mode` say otherwise
        (`default_compile_options`).
        Each new input shape (depth, batch, window) recompiles, up to `torch._dynamo.config.recompile_limit` graphs;
        past it the block runs eager (pass `dynamic=True` when shapes vary a lot). On a CPU, pair it with
        `attn_implementation="par_eager"` for the local window's few-row attention (`par_eager_attention`; see
        benchmarks/bench_speed.py)."""
        if compile_kwargs.pop("disable", False):
            self._compiled_core = self._compiled_coda = self._compiled_prelude = self._compiled_block = None
        else:
            compile_kwargs = default_compile_options(compile_kwargs, self.device)
            self._compiled_core = torch.compile(self._core_update, **compile_kwargs)
            self._compiled_block = torch.compile(self.core_iterations, **compile_kwargs)
            self._compiled_coda = torch.compile(self._coda_block, **compile_kwargs)
            self._compiled_prelude = torch.compile(self._prelude_block, **compile_kwargs)
        return self

    def _adapter_halves(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(W_e, W_s), the adapter's weight cut at its input, W = [W_e | W_s]; None when the adapter is called whole
        (`split_adapter` off, an adapter that is not a plain bias-free `nn.Linear`, e.g. wrapped by PEFT, or one with
        forward hooks, e.g. accelerate's offloading, which only a call runs)."""
        adapter = self.adapter
        if (not self.split_adapter or type(adapter) is not nn.Linear or adapter.bias is not None
                or adapter._forward_hooks or adapter._forward_pre_hooks):
            return None
        return adapter.weight.split(self.config.hidden_size, dim=1)

    def adapter_e_half(self, e: torch.Tensor) -> torch.Tensor:
        """The part of the adapter that depends on e alone, W_e e: computed once per batch, since e does not change
        across iterations. (e itself when the adapter is called whole.)"""
        halves = self._adapter_halves()
        return e if halves is None else F.linear(e, halves[0])

    def adapter_input(self, e_half: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """W [e ; s] = W_e e + W_s s, from e's half (`adapter_e_half`): one product of s per iteration instead of one
        of [e ; s]. Same value up to the order of the sum (tested against the whole adapter)."""
        halves = self._adapter_halves()
        if halves is None:
            return self.adapter(torch.cat([e_half, s], dim=-1))
        return e_half + F.linear(s, halves[1])

    def _core_block(self, e_half, s, mask, cos, sin):
        """C(W [e ; s]) — one pass of the shared core, from e's half of the adapter (`adapter_e_half`)."""
        return self._run_layers(self.core, self.adapter_input(e_half, s), mask, cos, sin)

    def _prelude_block(self, hidden, mask, cos, sin):
        """e = P(x): the prelude layers on the embedded prompt."""
        return self._run_layers(self.prelude, hidden, mask, cos, sin)

    def _coda_block(self, hidden, mask, cos, sin):
        """Q(s): the coda layers, then the final norm."""
        return self.model.norm(self._run_layers(self.coda, hidden, mask, cos, sin))

    def core_step(self, state, reference_rms, context: _Context, iteration: int = 1):
        """One iteration: s_k = anchor(C(W [e ; s_{k−1}])). Returns (s_k, rms before anchoring, reference rms).

        With an iteration-dependent view, `context.mask/cos/sin` are set to iteration k's (the readout of k uses
        them); under `loop_view="local"` only the query region iterates: other rows restart from e. Under the local
        window `state` is the query region's (b, Qmax, h) and the core runs on [iteration k's op rows | queries].
        """
        window, x, e_ops = context.window, state, None
        if window is not None:
            x = state.contiguous()  # one stride for the compiled graph whether s came from a unit or an iteration
            index, context.mask, context.cos, context.sin = self._window_at(context, iteration, state)
            e_ops = self._op_rows_e(context.prelude_out, index, state.shape[1])
        else:
            context.mask, context.cos, context.sin = self._view_at(context, iteration, state)
            if context.loop is not None and self.config.loop_view == "local":
                x = torch.where(context.loop.query_region[..., None], state, context.prelude_out)
        args = (context.e_half, x, context.mask, context.cos, context.sin, reference_rms, e_ops)
        update = self._core_update if self._compiled_core is None else self._compiled_core
        if self.config.checkpoint_core and self.training and torch.is_grad_enabled():
            ops_out, new_state, raw_rms = checkpoint(update, *args, use_reentrant=False)
        else:
            ops_out, new_state, raw_rms = update(*args)
        if window is not None:
            window.ops_out = ops_out
        if self.config.norm_anchoring and reference_rms is None:  # iteration 1 sets the per-token reference
            reference_rms = raw_rms
        return new_state, raw_rms, reference_rms

    def _core_update(self, e_half, x, mask, cos, sin, reference_rms, e_ops=None):
        """The core block, then the anchoring: s_k = anchor(C(W [e ; s_{k−1}])), with `anchor_state_norm` against
        rms(s_1) (iteration 1, `reference_rms` None, is not anchored); `e_half` is W_e e (`adapter_e_half`). Under the
        local window, `e_ops` (b, S, h) are iteration k's op rows, prepended to both e and s (they restart from e) and
        anchored to their own rms: they compute the same value every iteration, so their iteration-1 RMS is today's.
        One unit, so `compile_core` fuses it whole.

        Returns (op rows' output (b, S, h) or None, s_k, rms(s_k) before anchoring (detached))."""
        span = 0 if e_ops is None else e_ops.shape[1]
        if span:
            e_half, x = torch.cat([self.adapter_e_half(e_ops), e_half], 1), torch.cat([e_ops, x], 1)
        new_state = self._core_block(e_half, x, mask, cos, sin)
        ops_out, new_state = new_state[:, :span], new_state[:, span:]
        raw_rms = state_rms(new_state).detach()  # (b, rows, 1)
        if self.config.norm_anchoring and reference_rms is not None:
            new_state = anchor_state_norm(new_state, reference_rms)
            if span:
                ops_out = anchor_state_norm(ops_out, state_rms(ops_out).detach())
        return ops_out, new_state, raw_rms

    def core_iterations(self, e_half, state, reference_rms, prelude_out, index, mask, cos, sin):
        """Iterations k..k+K−1 of the local window as one unit: K times `_core_update` on [iteration k's op rows |
        the query region], from the window plan's (K, b, ...) slices: `core_step` K times (tested), but
        `compile_core` makes it one graph. Bit-identical when the window plans coincide; when a unit starts a new
        plan (`_block_steps`), the plans' op-column padding differs, so attention sums round differently (~1e-7
        relative in fp32, as with another `window_plan_iterations`).

        Returns (the op rows' outputs (K, b, S, h), the states (K, b, Q, h), their rms before anchoring
        (K, b, Q, 1))."""
        ops_outs, states, raws = [], [], []
        for i in range(index.shape[0]):
            e_ops = self._op_rows_e(prelude_out, index[i], state.shape[1])
            ops_out, state, raw_rms = self._core_update(e_half, state, mask[i], cos[i], sin[i], reference_rms, e_ops)
            ops_outs.append(ops_out)
            states.append(state)
            raws.append(raw_rms)
        return torch.stack(ops_outs), torch.stack(states), torch.stack(raws)

    def _block_fits(self, context: _Context, reference_rms, first: int, last: int) -> bool:
        """Whether iterations first..first+K−1 (K = `block_iterations`) can run as one `core_iterations` unit: the
        local window, no grad, the anchoring reference set (iteration ≥ 2) if there is one, and nothing read before
        `last`."""
        count = self.block_iterations
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"block_iterations must be an int >= 1 (1: every iteration on its own); got {count!r}.")
        return (count > 1 and context.window is not None and not torch.is_grad_enabled()
                and (reference_rms is not None or not self.config.norm_anchoring)
                and first + count - 1 <= last)

    def _block_steps(self, state, reference_rms, context: _Context, first: int):
        """`core_step` for iterations first..first+K−1 in one `core_iterations` call; leaves `context` as the last
        iteration's `core_step` leaves it. Returns (states (K, b, Q, h), rms before anchoring (K, b, Q, 1), the op
        rows' outputs (K, b, S, h))."""
        window, count = context.window, self.block_iterations
        plan = self._plan_covering(context, first, count, state)
        start = first - plan.first
        index, mask, cos, sin = (x[start:start + count] for x in (plan.index, plan.mask, plan.cos, plan.sin))
        run = self.core_iterations if self._compiled_block is None else self._compiled_block
        ops_outs, states, raws = run(context.e_half, state.contiguous(), reference_rms, context.prelude_out, index,
                                     mask, cos, sin)
        context.mask, context.cos, context.sin = mask[-1], cos[-1], sin[-1]
        window.ops_out = ops_outs[-1]
        return states, raws, ops_outs

    def readout(self, state, context: _Context):
        """y_k = Q(s_k), final norm, LM-head rows of the candidates at the query positions (the coda uses the
        mask and positions of the iteration `state` comes from, as left in `context` by `core_step`).

        Returns answer logits (b, q, candidates) and halt logits (b, 2) of (Yes, No) at the last query, or None.
        """
        return self._readout_batch([self._readout_input(state, context)])[0]

    @staticmethod
    def _readout_input(state, context: _Context) -> tuple:
        """What the readout of this iteration reads: (coda input, mask, cos, sin, rows before the queries' part,
        readout columns). Under the local window the coda runs on [iteration k's op rows | query region]."""
        window = context.window
        if window is not None:
            return ParLoopedQwenForStateTracking._window_readout_input(window, window.ops_out, state, context.mask,
                                                                       context.cos, context.sin)
        return state, context.mask, context.cos, context.sin, 0, context.query_positions

    @staticmethod
    def _window_readout_input(window: _LocalWindow, ops_out, state, mask, cos, sin) -> tuple:
        """`_readout_input` on the local window, from one iteration's op rows' output and view (mask, cos, sin)."""
        return torch.cat([ops_out, state], 1), mask, cos, sin, ops_out.shape[1], window.readout_columns

    def _readout_batch(self, inputs: list[tuple]) -> list[tuple]:
        """The readouts of several iterations in one coda call: their inputs (`_readout_input`, same shapes) are
        stacked along the batch, which computes per row exactly what separate calls compute (tested)."""
        x, mask, cos, sin, span, columns = inputs[0]
        if len(inputs) > 1:
            x, cos, sin, columns = (torch.cat([item[i] for item in inputs]) for i in (0, 2, 3, 5))
            mask = None if mask is None else torch.cat([item[1] for item in inputs])
        coda = self._coda_block if self._compiled_coda is None else self._compiled_coda
        hidden = coda(x, mask, cos, sin)[:, span:]
        at_queries = hidden.gather(1, columns[..., None].expand(-1, -1, hidden.shape[-1]))  # (n·b, q, h)
        answer_rows, halt_rows = self._candidate_rows(self.lm_head.weight.device)
        answers = F.linear(at_queries, self.lm_head.weight[answer_rows]).chunk(len(inputs))
        if halt_rows is None:
            return [(a, None) for a in answers]
        halts = F.linear(at_queries[:, -1], self.lm_head.weight[halt_rows]).chunk(len(inputs))
        return list(zip(answers, halts))

    def _readouts(self, pending: list[tuple]) -> list[tuple]:
        """Readouts of the pending iterations, batched by shape (the window's span may change between plans)."""
        groups: dict[tuple, list[int]] = {}
        for n, item in enumerate(pending):
            key = (tuple(item[0].shape), None if item[1] is None else tuple(item[1].shape), item[4])
            groups.setdefault(key, []).append(n)
        out = [None] * len(pending)
        for members in groups.values():
            for n, result in zip(members, self._readout_batch([pending[n] for n in members])):
                out[n] = result
        return out

    def _candidate_rows(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """LM-head rows of the answer candidates and of (Yes, No), built once per (ids, device), not per readout."""
        key = (tuple(self.config.answer_token_ids), self.config.halt_token_ids and tuple(self.config.halt_token_ids),
               device)
        cached = getattr(self, "_rows_cache", None)
        if cached is None or cached[0] != key:
            halt = None if key[1] is None else torch.tensor(key[1], device=device)
            self._rows_cache = (key, torch.tensor(key[0], device=device), halt)
        return self._rows_cache[1], self._rows_cache[2]

    # ----------------------------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        query_positions: torch.LongTensor | None = None,
        num_iterations: int | None = None,
        readout_iterations: list[int] | None = None,
        position_scale: float | torch.Tensor | None = None,
        output_loop_states: bool = False,
        operation_ends: torch.LongTensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> ParLoopedOutput:
        """Run the prelude once, the core `num_iterations` = R times (default 1) and the coda at the
        `readout_iterations` (default: [R]). Core iterations before the last `config.grad_window` run without grad
        (truncated backprop); a readout of such an iteration still carries gradient into the coda and LM head. On the
        local window, no-grad iterations between readouts run `block_iterations` at a time (`core_iterations`).

        input_ids, attention_mask: (b, t), left or right padding. query_positions: (b, q); default the last real
        token. position_scale: positional stretch, a float or (b,) in [1, max_position_scale].
        operation_ends: (b, D+1) last token index of the preamble and of each operation (−1 past d); needed by
        `loop_view` "prefix"/"local" and `progress_positions`. position_ids: (b, t) positions to use instead of
        the ordinary ones (e.g. randomized sorted positions during training).
        """
        num_iterations = self._check_iterations(1 if num_iterations is None else num_iterations)
        reads = [num_iterations] if readout_iterations is None else sorted(set(int(k) for k in readout_iterations))
        if not reads or reads[0] < 1 or reads[-1] > num_iterations:
            raise ValueError(
                f"readout_iterations must be a non-empty list of iterations in [1, num_iterations={num_iterations}]; "
                f"got {readout_iterations!r}."
            )
        context = self._prepare(input_ids, attention_mask, query_positions, position_scale, operation_ends,
                                position_ids)
        grad_from = grad_window_iterations(num_iterations, self.config.grad_window)[0]
        grad_allowed = torch.is_grad_enabled()
        valid = context.state_valid(attention_mask if attention_mask is not None else torch.ones_like(input_ids))
        state, reference, read_set = context.initial_state(), None, set(reads)
        readouts, pending, rms_trace, states = [], [], [], []
        k = 0
        while k < num_iterations:
            with torch.set_grad_enabled(grad_allowed and k + 1 >= grad_from):
                # no-grad iterations up to the next readout (or the window) run `block_iterations` at a time
                last = min([r for r in reads if r > k] + [grad_from - 1 if grad_allowed else num_iterations])
                if self._block_fits(context, reference, k + 1, last):
                    block, raws, _ = self._block_steps(state, reference, context, k + 1)
                    rms_trace += list(raws[:-1, ..., 0])
                    if output_loop_states:
                        states += list(block[:-1])
                    k, state, raw_rms = k + block.shape[0], block[-1], raws[-1]
                else:
                    k += 1
                    state, raw_rms, reference = self.core_step(state, reference, context, k)
            if k in read_set:  # a readout before the window still trains the coda (its state is detached)
                pending.append(self._readout_input(state, context))
                if len(pending) == self.readout_batch_iterations or k == reads[-1]:
                    readouts += self._readouts(pending)  # one coda call for up to `readout_batch_iterations`
                    pending = []
            rms_trace.append(raw_rms[..., 0])
            if output_loop_states:
                states.append(state)

        answers, halts = zip(*readouts)
        return ParLoopedOutput(
            answer_logits=torch.stack(answers),
            halt_logits=torch.stack(halts) if halts[0] is not None else None,
            readout_iterations=torch.tensor(reads, device=input_ids.device),
            state_rms=(torch.stack(rms_trace) * valid).sum(-1) / valid.sum(-1),
            loop_states=tuple(states) if output_loop_states else None,
        )

    @torch.no_grad()
    def predict(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        query_positions: torch.LongTensor | None = None,
        num_iterations: int | torch.Tensor | None = None,
        halting: bool = False,
        max_iterations: int | None = None,
        position_scale: float | torch.Tensor | None = None,
        operation_ends: torch.LongTensor | None = None,
    ) -> ParPrediction:
        """Answer each sample with per-sample early exit: a finished sample leaves the batch.

        Forced depth (`num_iterations` = R, an int or a (b,) tensor): read iteration R of each sample.
        Learned halting (`halting=True`, depth unknown): read the first iteration R confirmed by `halt_confirmed`
        over R..R+m−1, so a sample runs R + m − 1 iterations. One never confirmed by `max_iterations` (default
        `config.max_iterations`) returns its last readout with `halted=False`. On the local window, forced depth runs
        `block_iterations` iterations at a time up to the nearest depth (`core_iterations`), and halting runs them
        `block_iterations` at a time with their readouts in one coda call (a sample that halts inside a block leaves
        the batch at its end: the same answers, up to K − 1 iterations computed and not read).
        """
        batch = input_ids.shape[0]
        device = input_ids.device
        if halting:
            if num_iterations is not None:
                raise ValueError("predict: give num_iterations (forced depth) or halting=True, not both.")
            if self.config.halt_token_ids is None:
                raise ValueError("predict(halting=True) needs ParLoopedQwenConfig.halt_token_ids (Yes, No).")
            limit = self._check_iterations(
                self.config.max_iterations if max_iterations is None else max_iterations, "max_iterations"
            )
        else:
            if num_iterations is None:
                raise ValueError("predict: num_iterations (forced depth) is required unless halting=True.")
            target = torch.as_tensor(num_iterations, device=device).long().expand(batch).clone()
            limit = self._check_iterations(int(target.max()), "num_iterations")
            self._check_iterations(int(target.min()), "num_iterations")

        context = self._prepare(input_ids, attention_mask, query_positions, position_scale, operation_ends)
        num_queries = context.query_positions.shape[1]
        num_candidates = len(self.config.answer_token_ids)
        answer_out = torch.zeros(batch, num_queries, num_candidates, device=device)
        iterations_out = torch.zeros(batch, dtype=torch.long, device=device)
        halted_out = torch.zeros(batch, dtype=torch.bool, device=device)
        m = self.config.halt_window
        if halting:  # ring buffers of the last m readouts, indexed by the original sample index
            ring_answers = torch.zeros(m, batch, num_queries, num_candidates, device=device)
            ring_p_yes = torch.zeros(m, batch, device=device)

        def read_halting(k: int, answer_logits, halt_logits, live):
            """Iteration k's readout of the active samples into the ring buffers; confirms halts among `live`
            (the active samples not yet finished). Returns which of them finished at k."""
            ring_answers[(k - 1) % m, active] = answer_logits.float()
            ring_p_yes[(k - 1) % m, active] = halt_logits.float().softmax(-1)[:, 0]
            done = torch.zeros_like(live)
            if k >= m:  # the window R..k with R = k − m + 1 is complete; R's slot is k % m
                order = [(k - m + j) % m for j in range(m)]
                done = live & halt_confirmed(ring_p_yes[order][:, active], self.config.halt_threshold,
                                             self.config.halt_confirm)
                finished = active[done]
                answer_out[finished] = ring_answers[k % m, finished]
                iterations_out[finished] = k - m + 1
                halted_out[finished] = True
            if k == limit:  # never confirmed: flagged, last readout returned
                unconfirmed = live & ~done
                answer_out[active[unconfirmed]] = answer_logits[unconfirmed].float()
                iterations_out[active[unconfirmed]] = k
            return done

        active = torch.arange(batch, device=device)
        state, reference = context.initial_state(), None
        k = 0
        while k < limit:
            # forced depth: iterations before the nearest depth run `block_iterations` at a time; halting: blocks
            # of iterations, then their readouts in one coda call, read in order (a sample leaves the batch at the
            # end of the block in which it halts: the iterations it runs past its halt are computed, never read)
            nearest = limit if halting else int(target[active].min())
            if self._block_fits(context, reference, k + 1, nearest):
                block, _, ops_outs = self._block_steps(state, reference, context, k + 1)
                if halting:
                    window, live = context.window, torch.ones(active.shape[0], dtype=torch.bool, device=device)
                    inputs = [self._window_readout_input(window, ops_outs[i], block[i], *window.plan.at(k + 1 + i)[1:])
                              for i in range(block.shape[0])]
                    for i, (answer_logits, halt_logits) in enumerate(self._readout_batch(inputs)):
                        live = live & ~read_halting(k + 1 + i, answer_logits, halt_logits, live)
                    done = ~live
                k, state = k + block.shape[0], block[-1]
            else:
                k += 1
                state, _, reference = self.core_step(state, reference, context, k)
                if halting:
                    answer_logits, halt_logits = self.readout(state, context)
                    done = read_halting(k, answer_logits, halt_logits,
                                        torch.ones(active.shape[0], dtype=torch.bool, device=device))
            if not halting:  # read only the samples whose depth is reached
                done = target[active] == k
                if done.any():
                    answer_logits, _ = self.readout(state[done], context.select(done))
                    answer_out[active[done]] = answer_logits.float()
                    iterations_out[active[done]] = k
                    halted_out[active[done]] = True
            if done.any():
                keep = ~done
                active, state, context = active[keep], state[keep], context.select(keep)
                reference = reference[keep] if reference is not None else None
            if active.numel() == 0:
                break
        return ParPrediction(
            answers=answer_out.argmax(-1), answer_logits=answer_out, iterations=iterations_out, halted=halted_out
        )


ParLoopedQwenConfig.register_for_auto_class()
ParLoopedQwenForStateTracking.register_for_auto_class("AutoModel")

__all__ = [
    "ParLoopedQwenPreTrainedModel",
    "ParLoopedQwenForStateTracking",
    "ParLoopedOutput",
    "ParPrediction",
    "anchor_state_norm",
    "adapter_identity_init",
    "default_compile_options",
    "grad_window_iterations",
    "halt_confirmed",
    "halt_iteration",
    "loop_view_mask",
    "operations_read",
    "padded_causal_mask",
    "par_eager_attention",
    "progress_shift",
    "token_segments",
    "positions_from_mask",
    "small_block_attention",
    "state_rms",
    "stretch_positions",
]
