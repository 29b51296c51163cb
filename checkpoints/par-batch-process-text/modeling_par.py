"""PAR (Progress-Aligned Recurrence) looped, retrofitted Qwen2 for state tracking.

    e = P(x),  s_0 = e,  s_k = anchor(C(W [e ; s_{k-1}])),  y_k = Q(s_k)        (k = 1..R)

P (prelude), C (weight-shared core) and Q (coda) are slices of one Qwen2 decoder stack, built from
transformers' own `Qwen2Model` so every Qwen2 parameter keeps its name (`model.layers.{i}.…`,
`model.embed_tokens`, `model.norm`, `lm_head`); the only new parameter is the adapter W (Linear 2h → h,
initialised to [0 | I], so R = 1 computes exactly the parent model). The answer is a classification over
the LM-head rows of the candidate tokens at the query positions; learned halting reads the ("Yes", "No")
rows at the last query position.

This file holds the model and its reference loop (`_Loop`, shared by `forward` and `predict`). Beside it, imported
relatively (transformers copies them into a checkpoint folder as remote code, so a checkpoint needs only torch and
transformers): `configuration_par.py` (the config), `loop_views.py` (what the queries read at iteration k: masks and
positions), `loop_types.py` (the outputs and the named types passed between steps), `input_checks.py`,
`runtime_options.py` (the fast paths' switches, `model.runtime`), `window_path.py` (the local window, window plans,
no-grad blocks), `par_attention.py` (the "par_eager" attention), `compile_support.py` (`compile_core`),
`prompt_format.py` (raw text → `operation_ends`, the rule in `config.prompt_format`) and `pipeline_par.py` (the
`state-tracking` pipeline, named in `config.custom_pipelines`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel, Qwen2ForCausalLM
from transformers import initialization as init
from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

from .compile_support import CompiledParts, compile_parts, default_compile_options
from .configuration_par import ParLoopedQwenConfig
from .loop_types import IterationView, LoopStep, ParLoopedOutput, ParPrediction, ReadoutInput
from .input_checks import check_inputs, check_iterations, check_operation_ends
from .loop_views import (
    LoopView,
    loop_view_mask,
    mask_dtype,
    operations_read,
    padded_causal_mask,
    positions_from_mask,
    progress_shift,
    rotary_at,
    stretch_positions,
    token_segments,
    whole_prompt_view,
)
from .par_attention import par_eager_attention, small_block_attention
from .pipeline_par import StateTrackingPipeline  # noqa: F401  (imported so save_pretrained copies the pipeline code)
from .runtime_options import RUNTIME_OPTION_NAMES, ParRuntimeOptions
from .window_path import (
    LocalWindow,
    WindowPlans,
    core_iterations,
    local_window_of,
    op_rows_e,
    segment_rows,
    segmented_prelude,
)

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


@dataclass(frozen=True)
class _Context:
    """What every iteration of one batch shares, built once by `_prepare` and never changed: the prelude output e,
    the prelude's view (the full view's for every iteration), the query positions, the loop view (iteration-dependent
    views only), the local window (its query region) and W_e e (`adapter_e_half`)."""

    prelude_out: torch.Tensor  # (b, t, h); on the local window 0 at padding (never read there)
    view: IterationView  # the prelude's mask and rotary, (b, 1, t, t) / (b, t, head_dim); on the local window the
    # mask is None: the prelude ran per segment (`window_path.segmented_prelude`)
    query_positions: torch.Tensor  # (b, q)
    loop: LoopView | None  # iteration-dependent views (loop_view != "full" or progress_positions)
    window: LocalWindow | None  # the local window (`runtime.local_window` under loop_view="local")
    e_half: torch.Tensor  # (b, rows, h) the adapter's e half of the loop-state rows

    def select(self, keep: torch.Tensor) -> _Context:
        """The same context for the samples `keep`."""
        return _Context(self.prelude_out[keep], IterationView(*(None if x is None else x[keep] for x in self.view)),
                        self.query_positions[keep], None if self.loop is None else self.loop.select(keep),
                        None if self.window is None else self.window.select(keep), self.e_half[keep])

    def initial_state(self) -> torch.Tensor:
        """s_0 = e: the prelude output (the query region's under the local window)."""
        return self.prelude_out if self.window is None else self.window.query_e

    def state_valid(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """Which rows of the loop state are real tokens, (b, rows) float."""
        return (attention_mask if self.window is None else self.window.query_valid).float()


class _Loop:
    """The recurrence on one batch, s_k = anchor(C(W [e ; s_{k−1}])), advanced one iteration at a time — or, on the
    local window without grad, `block_iterations` at a time (`window_path.WindowPlans.block`, the same steps).

    `forward` and `predict` both drive it: `advance(last)` runs the next iteration(s), never past `last`, and returns
    one `LoopStep` per iteration; `select(keep)` drops finished samples. It holds only what changes between
    iterations: k, s_k, the anchoring reference rms(s_1), and the local window's plan cache."""

    def __init__(self, model: ParLoopedQwenForStateTracking, context: _Context):
        self.model, self.context = model, context
        self.iteration, self.state, self.reference = 0, context.initial_state(), None
        self.windows = None if context.window is None else WindowPlans(model, context.loop, context.window)

    def advance(self, last: int) -> list[LoopStep]:
        first = self.iteration + 1
        if self.windows is not None and self.model._block_fits(self.reference, first, last):
            steps = self.windows.block(self.context, first, self.state, self.reference)
        else:
            view = None if self.windows is None else self.windows.view_at(first, self.state)
            steps = [self.model.core_step(self.state, self.reference, self.context, first, view)]
        self.iteration, self.state, self.reference = steps[-1].iteration, steps[-1].state, steps[-1].reference_rms
        return steps

    def select(self, keep: torch.Tensor) -> None:
        self.context = self.context.select(keep)
        self.state = self.state[keep]
        self.reference = None if self.reference is None else self.reference[keep]
        if self.windows is not None:
            self.windows.select(keep, self.context.loop, self.context.window)


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
    # the compiled counterpart of each hot method (`compile_core`); `_part` picks one or the other
    _EAGER_PARTS = {"core_update": "_core_update", "core_iterations": "core_iterations", "coda": "_coda_block",
                    "prelude": "_prelude_block"}

    def __init__(self, config: ParLoopedQwenConfig):
        super().__init__(config)
        config.validate_par(require_answers=True)
        if getattr(config, "use_sliding_window", False):
            raise ValueError("ParLoopedQwenConfig.use_sliding_window must be False: the loop uses full attention.")
        self.model = Qwen2Model(config)  # embed_tokens, layers, norm, rotary_emb — Qwen2's own modules and names
        self.adapter = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.runtime = ParRuntimeOptions()  # the fast paths (same results as the reference); see runtime_options.py
        self.compiled: CompiledParts | None = None  # set by `compile_core`
        self.post_init()

    def __setattr__(self, name, value):
        if name in RUNTIME_OPTION_NAMES:  # would silently do nothing: the options live on `model.runtime`
            raise AttributeError(f"{name} is a runtime option: set model.runtime.{name} (see ParRuntimeOptions).")
        super().__setattr__(name, value)

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

    # ---------------------------------------------------------------------------------------------------------- views
    def _prepare(self, input_ids, attention_mask, query_positions, position_scale, operation_ends=None,
                 position_ids=None) -> _Context:
        """Check the inputs, run the prelude once, e = P(x), and build what every iteration shares."""
        attention_mask, query_positions, position_scale = check_inputs(
            self.config, input_ids, attention_mask, query_positions, position_scale
        )
        operation_ends = check_operation_ends(self.config, operation_ends, attention_mask, query_positions)
        hidden = self.model.embed_tokens(input_ids)
        if position_ids is None:
            positions = positions_from_mask(attention_mask)
        else:
            positions = torch.as_tensor(position_ids, device=input_ids.device)
            if positions.shape != input_ids.shape:
                raise ValueError(f"position_ids must have the shape of input_ids {tuple(input_ids.shape)}; "
                                 f"got {tuple(positions.shape)}.")
        loop = window = None
        on_window = operation_ends is not None and self.config.loop_view == "local" and self.runtime.local_window
        if operation_ends is None:  # the full view with ordinary positions: one view for every iteration
            if position_scale is not None:
                positions = stretch_positions(positions, position_scale)
            view = IterationView(self._full_view_mask(attention_mask, hidden), *self.model.rotary_emb(hidden, positions))
        else:
            segments, depth, query_region = token_segments(operation_ends, attention_mask)
            positions = positions.float()
            loop = LoopView(  # the window path reads no (b, t, t) mask: it is built only for the whole-prompt views
                base_allowed=None if on_window else padded_causal_mask(attention_mask, None)[:, 0], segments=segments,
                depth=depth, query_region=query_region, positions=positions, operation_ends=operation_ends,
                operation_end_positions=positions.gather(1, operation_ends.clamp_min(0)), position_scale=position_scale,
            )
            if on_window:  # the local prelude is block-diagonal: run it per segment, O(prompt) (`segmented_prelude`)
                view = IterationView(None, *rotary_at(self.config, self.model.rotary_emb, loop, positions,
                                                      query_region, 0, hidden))
            else:
                view = whole_prompt_view(self.config, self.model.rotary_emb, loop, 0, hidden)
        if on_window:
            blocks = segment_rows(loop, attention_mask, self.config.bidirectional_queries)
            prelude_out = segmented_prelude(self._part("prelude"), self.config, blocks, hidden, view.cos, view.sin)
            window = local_window_of(loop, prelude_out, query_positions)
        else:
            prelude_out = self._part("prelude")(hidden, view.mask, view.cos, view.sin)
        initial = prelude_out if window is None else window.query_e
        return _Context(prelude_out, view, query_positions, loop, window, self.adapter_e_half(initial))

    def _full_view_mask(self, attention_mask: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """The full view's mask: `padded_causal_mask`, or None (sdpa's causal kernel, the same mask implicitly) when
        `runtime.causal_fast_path` is on, the layers use sdpa and no token of the batch is padding."""
        if (self.runtime.causal_fast_path and self.config._attn_implementation == "sdpa"
                and bool(attention_mask.bool().all())):
            return None
        return padded_causal_mask(attention_mask, mask_dtype(self.config, hidden))

    def _iteration_view(self, context: _Context, iteration: int, hidden: torch.Tensor) -> IterationView:
        """Iteration k's view: the local window's (a plan of one iteration), the loop view's, or the full view's."""
        if context.window is not None:
            return WindowPlans(self, context.loop, context.window).view_at(iteration, hidden)
        if context.loop is not None:
            return whole_prompt_view(self.config, self.model.rotary_emb, context.loop, iteration, hidden)
        return context.view

    # ----------------------------------------------------------------------------------------------- the core update
    @staticmethod
    def _run_layers(layers, hidden, mask, cos, sin) -> torch.Tensor:
        for layer in layers:
            out = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin))
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def compile_core(self, **compile_kwargs) -> ParLoopedQwenForStateTracking:
        """`torch.compile` the loop's hot path (`compile_support.compile_parts`): the core update (C(W [e ; s]) and the
        anchoring), the no-grad unit of `runtime.block_iterations` local-window iterations (`core_iterations`, one
        graph; its first compile takes longer), the coda + final norm, and the prelude. `compile_kwargs` go to
        `torch.compile` (default `dynamic=None`: one graph per shape, then dynamic shapes on a recompile);
        `compile_core(disable=True)` returns to eager. Same result up to kernel rounding. On a CPU, inductor's C++
        wrapper is on unless `options`/`mode` say otherwise (`default_compile_options`).
        Each new input shape (depth, batch, window) recompiles, up to `torch._dynamo.config.recompile_limit` graphs;
        past it the part runs eager (pass `dynamic=True` when shapes vary a lot). On a CPU, pair it with
        `attn_implementation="par_eager"` for the local window's few-row attention (`par_attention`)."""
        self.compiled = None if compile_kwargs.pop("disable", False) else compile_parts(self, **compile_kwargs)
        return self

    def _part(self, name: str):
        """The compiled `name` ("core_update", "core_iterations", "coda", "prelude") after `compile_core`, else
        the eager method."""
        return getattr(self.compiled, name) if self.compiled is not None else getattr(self, self._EAGER_PARTS[name])

    def _adapter_halves(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(W_e, W_s), the adapter's weight cut at its input, W = [W_e | W_s]; None when the adapter is called whole
        (`runtime.split_adapter` off, an adapter that is not a plain bias-free `nn.Linear`, e.g. wrapped by PEFT, or
        one with forward hooks, e.g. accelerate's offloading, which only a call runs)."""
        adapter = self.adapter
        if (not self.runtime.split_adapter or type(adapter) is not nn.Linear or adapter.bias is not None
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

    def core_step(self, state, reference_rms, context: _Context, iteration: int = 1,
                  view: IterationView | None = None) -> LoopStep:
        """Iteration k: s_k = anchor(C(W [e ; s_{k−1}])), as a `LoopStep` (s_k, rms(s_k) before anchoring, the
        anchoring reference — rms(s_1), set at iteration 1 — and the input of its readout). Changes nothing it is given.

        `view` is iteration k's (`_iteration_view` when None). Under `loop_view="local"` only the query region
        iterates: other rows restart from e. Under the local window `state` is the query region's (b, Qmax, h) and the
        core runs on [iteration k's op rows | queries]."""
        view = self._iteration_view(context, iteration, state) if view is None else view
        x, e_ops = state, None
        if context.window is not None:
            x = state.contiguous()  # one stride for the compiled graph whether s came from a unit or an iteration
            e_ops = op_rows_e(context.prelude_out, view.index, state.shape[1])
        elif context.loop is not None and self.config.loop_view == "local":
            x = torch.where(context.loop.query_region[..., None], state, context.prelude_out)
        args = (context.e_half, x, view.mask, view.cos, view.sin, reference_rms, e_ops)
        update = self._part("core_update")
        if self.config.checkpoint_core and self.training and torch.is_grad_enabled():
            ops_out, new_state, raw_rms = checkpoint(update, *args, use_reentrant=False)
        else:
            ops_out, new_state, raw_rms = update(*args)
        if self.config.norm_anchoring and reference_rms is None:  # iteration 1 sets the per-token reference
            reference_rms = raw_rms
        columns = context.query_positions if context.window is None else context.window.readout_columns
        readout = ReadoutInput(new_state, None if context.window is None else ops_out, view.mask, view.cos, view.sin,
                               columns)
        return LoopStep(iteration, new_state, raw_rms, reference_rms, readout)

    def core_iterations(self, e_half, state, reference_rms, prelude_out, index, mask, cos, sin):
        """K local-window iterations as one no-grad unit (`window_path.core_iterations` over `_core_update`): the
        method `compile_core` compiles as one graph."""
        return core_iterations(self._core_update, e_half, state, reference_rms, prelude_out, index, mask, cos, sin)

    def _block_fits(self, reference_rms, first: int, last: int) -> bool:
        """Whether iterations first..first+K−1 (K = `runtime.block_iterations`) may run as one no-grad unit on the
        local window: K > 1, no grad, the anchoring reference set (iteration ≥ 2) if there is one, and no iteration
        before `last` that must be seen on its own."""
        count = self.runtime.block_iterations
        return (count > 1 and not torch.is_grad_enabled()
                and (reference_rms is not None or not self.config.norm_anchoring) and first + count - 1 <= last)

    # ------------------------------------------------------------------------------------------------------- readout
    def readout(self, readout_input: ReadoutInput):
        """y_k = Q(s_k): the coda and final norm with iteration k's view, then the LM-head rows of the candidates at
        the query positions. `readout_input` is a `LoopStep.readout`.

        Returns answer logits (b, q, candidates) and halt logits (b, 2) of (Yes, No) at the last query, or None.
        """
        return self._readout_batch([readout_input])[0]

    def _readout_batch(self, inputs: list[ReadoutInput]) -> list[tuple]:
        """The readouts of several iterations in one coda call: their inputs (same shapes) are stacked along the
        batch, which computes per row exactly what separate calls compute (tested)."""

        def rows(item):  # the coda's input: [the window's op rows | s_k]
            return item.state if item.window_rows is None else torch.cat([item.window_rows, item.state], 1)

        first = inputs[0]
        skip = 0 if first.window_rows is None else first.window_rows.shape[1]
        if len(inputs) == 1:
            x, mask, cos, sin, columns = rows(first), first.mask, first.cos, first.sin, first.columns
        else:
            x = torch.cat([rows(item) for item in inputs])
            cos, sin, columns = (torch.cat([getattr(item, f) for item in inputs]) for f in ("cos", "sin", "columns"))
            mask = None if first.mask is None else torch.cat([item.mask for item in inputs])
        hidden = self._part("coda")(x, mask, cos, sin)[:, skip:]
        at_queries = hidden.gather(1, columns[..., None].expand(-1, -1, hidden.shape[-1]))  # (n·b, q, h)
        answer_rows, halt_rows = self._candidate_rows(self.lm_head.weight.device)
        answers = F.linear(at_queries, self.lm_head.weight[answer_rows]).chunk(len(inputs))
        if halt_rows is None:
            return [(a, None) for a in answers]
        halts = F.linear(at_queries[:, -1], self.lm_head.weight[halt_rows]).chunk(len(inputs))
        return list(zip(answers, halts))

    def _readouts(self, pending: list[ReadoutInput]) -> list[tuple]:
        """Readouts of the pending iterations, batched by shape (the window's span may change between plans)."""
        groups: dict[tuple, list[int]] = {}
        for n, item in enumerate(pending):
            key = tuple(None if x is None else tuple(x.shape) for x in (item.state, item.window_rows, item.mask))
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
            with torch.inference_mode(False):  # built under an evaluator's inference_mode, it must still index in training
                halt = None if key[1] is None else torch.tensor(key[1], device=device)
                self._rows_cache = (key, torch.tensor(key[0], device=device), halt)
        return self._rows_cache[1], self._rows_cache[2]

    # ---------------------------------------------------------------------------------------------- forward, predict
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
    ) -> ParLoopedOutput:
        """Run the prelude once, the core `num_iterations` = R times (default 1) and the coda at the
        `readout_iterations` (default: [R]). Core iterations before the last `config.grad_window` run without grad
        (truncated backprop); a readout of such an iteration still carries gradient into the coda and LM head. On the
        local window, no-grad iterations between readouts run `runtime.block_iterations` at a time.

        input_ids, attention_mask: (b, t), left or right padding. query_positions: (b, q); default the last real
        token. position_scale: positional stretch, a float or (b,) in [1, max_position_scale].
        operation_ends: (b, D+1) last token index of the preamble and of each operation (−1 past d); needed by
        `loop_view` "prefix"/"local" and `progress_positions` (accepted and unused otherwise). position_ids: (b, t)
        positions to use instead of the ordinary ones (e.g. randomized sorted positions during training).
        """
        num_iterations = check_iterations(self.config, 1 if num_iterations is None else num_iterations)
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
        loop, read_set = _Loop(self, context), set(reads)
        readouts, pending, rms_trace, states = [], [], [], []
        while loop.iteration < num_iterations:
            k = loop.iteration
            # the next iteration that must be seen on its own: the next readout, or the last before the window
            last = min([r for r in reads if r > k] + [grad_from - 1 if grad_allowed else num_iterations])
            with torch.set_grad_enabled(grad_allowed and k + 1 >= grad_from):
                steps = loop.advance(last)
            for step in steps:
                if step.iteration in read_set:  # a readout before the window still trains the coda
                    pending.append(step.readout)
                    if len(pending) == self.runtime.readout_batch_iterations or step.iteration == reads[-1]:
                        readouts += self._readouts(pending)  # one coda call for up to `readout_batch_iterations`
                        pending = []
                rms_trace.append(step.raw_rms[..., 0])
                if output_loop_states:
                    states.append(step.state)

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
        Learned halting (`halting=True`, no iteration count given): read the first iteration R confirmed by
        `halt_confirmed` over R..R+m−1, so a sample runs R + m − 1 iterations. One never confirmed by `max_iterations` (default
        `config.max_iterations`) returns its last readout with `halted=False`. On the local window, forced depth runs
        `runtime.block_iterations` iterations at a time up to the nearest depth, and halting runs them that many at a
        time with their readouts in one coda call (a sample that halts inside a block leaves the batch at its end:
        the same answers, up to K − 1 iterations computed and not read).

        Under the local view the depth is not hidden from the loop: `operation_ends` marks every operation, and
        iteration k > d reads an empty window, which is what a model trained with `halt_label_offset=1` learns to
        halt on (at R = d + 1). Halting there means "stop where the given operations end", not the paper's
        "depth unknown"; under the full view the queries must infer it from the prompt.
        """
        batch = input_ids.shape[0]
        device = input_ids.device
        if not isinstance(halting, bool):
            raise ValueError(f"predict: halting must be a bool; got {halting!r}.")
        if halting:
            if num_iterations is not None:
                raise ValueError("predict: give num_iterations (forced depth) or halting=True, not both.")
            if self.config.halt_token_ids is None:
                raise ValueError("predict(halting=True) needs ParLoopedQwenConfig.halt_token_ids (Yes, No).")
            limit = check_iterations(self.config, 
                self.config.max_iterations if max_iterations is None else max_iterations, "max_iterations"
            )
        else:
            if num_iterations is None:
                raise ValueError("predict: num_iterations (forced depth) is required unless halting=True.")
            if max_iterations is not None:
                raise ValueError("predict: max_iterations bounds learned halting (halting=True); forced depth runs "
                                 "exactly num_iterations.")
            target = torch.as_tensor(num_iterations, device=device).long().expand(batch).clone()
            limit = check_iterations(self.config, int(target.max()), "num_iterations")
            check_iterations(self.config, int(target.min()), "num_iterations")

        loop = _Loop(self, self._prepare(input_ids, attention_mask, query_positions, position_scale, operation_ends))
        num_queries = loop.context.query_positions.shape[1]
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
        while loop.iteration < limit:
            # halting reads every iteration (a block's readouts in one coda call, in order); forced depth runs up to
            # the nearest depth and reads only the samples whose depth it is
            steps = loop.advance(limit if halting else int(target[active].min()))
            if halting:
                live = torch.ones(active.shape[0], dtype=torch.bool, device=device)
                for step, (answer_logits, halt_logits) in zip(steps, self._readout_batch([s.readout for s in steps])):
                    live = live & ~read_halting(step.iteration, answer_logits, halt_logits, live)
                done = ~live
            else:
                k = loop.iteration
                done = target[active] == k
                if done.any():
                    answer_logits, _ = self.readout(steps[-1].readout.select(done))
                    answer_out[active[done]] = answer_logits.float()
                    iterations_out[active[done]] = k
                    halted_out[active[done]] = True
            if done.any():  # finished samples leave the batch
                active = active[~done]
                loop.select(~done)
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
    "ParRuntimeOptions",
    "IterationView",
    "LoopStep",
    "ReadoutInput",
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
