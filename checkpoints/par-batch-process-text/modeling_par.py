"""PAR (Progress-Aligned Recurrence) looped, retrofitted Qwen2 for state tracking.

    e = P(x),  s_0 = e,  s_k = anchor(C(W [e ; s_{k-1}])),  y_k = Q(s_k)        (k = 1..R)

(with `config.answer_feedback`, the state handed on is the answer alone: s_k ← e + softmax(y_k) E at the queries,
`answer_feedback_state`; off by default)

P (prelude), C (weight-shared core) and Q (coda) are slices of one Qwen2 decoder stack, built from transformers' own
`Qwen2Model` so every Qwen2 parameter keeps its name (`model.layers.{i}.…`, `model.embed_tokens`, `model.norm`,
`lm_head`); the only new parameter is the adapter W (Linear 2h → h, initialised to [0 | I], so R = 1 computes exactly
the parent model). The answer is a classification over the LM-head rows of the candidate tokens at the query
positions; learned halting reads the ("Yes", "No") rows at the last query position.

This file holds the model: `forward` and `predict` drive one loop over a backend chosen once per batch (`_backend`):
the whole-prompt `ReferenceLoop` (`reference_loop.py`), or the local window (`window_path.WindowLoop`), tested equal
to it. Beside it, imported relatively (remote code: a checkpoint needs only torch and transformers):
`configuration_par.py`, `halting.py` (the halting rule), `token_mixing.py` (the core's causal convolution),
`prefix_state.py` (the state head of dense prefix targets), `loop_views.py` (masks and positions of iteration k),
`loop_types.py` (outputs, the backend interface, the named types between steps), `input_checks.py`,
`runtime_options.py` (`model.runtime`, the fast paths' switches), `window_path.py`, `split_adapter.py`,
`par_attention.py` ("par_eager"), `compile_support.py` (`compile_core`), `prompt_format.py` (raw text →
`operation_ends`; `sentences.py`, the sentence rule; `trained_record.py`, the record of what training wrote, checked),
`pipeline_par.py` (the `state-tracking` pipeline) and `streaming.py` (`stream`, a live monitor: one event at a time,
O(1) per event under the local view). Not `parent_conversion.py`, the parent conversion: only `from_pretrained_parent`
loads it, so no checkpoint carries it.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

from .compile_support import compile_parts, default_compile_options, eager_parts
from .configuration_par import ParLoopedQwenConfig
from .halting import halt_confirmed, halt_iteration
from .input_checks import (
    check_inputs,
    check_iterations,
    check_operation_ends,
    check_position_ids,
    check_predict_depth,
    check_readout_iterations,
)
from .loop_types import (
    AdapterHalves,
    CandidateRows,
    CandidateWeights,
    CoreUpdate,
    HaltingWindow,
    IterationView,
    LoopBackend,
    LoopParts,
    LoopState,
    LoopStep,
    ParLoopedOutput,
    ParPrediction,
    PredictionRecord,
    Readout,
    ReadoutInput,
)
from .loop_views import (
    full_view_mask,
    loop_view_mask,
    operations_read,
    padded_causal_mask,
    positions_from_mask,
    progress_shift,
    stretch_positions,
    token_segments,
)
from .par_attention import par_eager_attention, small_block_attention
from .pipeline_par import StateTrackingPipeline  # noqa: F401  (imported so save_pretrained copies the pipeline code)
from .prefix_state import prefix_state_logits
from .reference_loop import ReferenceLoop
from .runtime_options import RUNTIME_OPTION_NAMES, ParRuntimeOptions
from .split_adapter import adapter_e_half, adapter_halves, adapter_input
from .streaming import StateStream, StreamAnswer
from .token_mixing import causal_depthwise_mix
from .window_path import WindowLoop

_RMS_EPS = 1e-12


# ----------------------------------------------------------- the PAR mechanisms, each a small function with its formula


def state_rms(state: torch.Tensor) -> torch.Tensor:
    """Per-token RMS norm, rms(s) = sqrt(mean_j s_j²), computed in fp32.  # (..., h) -> (..., 1)"""
    return state.float().pow(2).mean(-1, keepdim=True).clamp_min(_RMS_EPS).sqrt()


def anchor_state_norm(state: torch.Tensor, reference_rms: torch.Tensor, rms: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """State-norm anchoring: s_k ← s_k · rms(s_1) / rms(s_k), per token.

    `reference_rms` is rms(s_1) of the same token, detached by the caller; `rms` is `state_rms(state)` (not detached)
    when the caller has it already.  # (b, t, h), (b, t, 1) -> (b, t, h)
    """
    return state * (reference_rms / (state_rms(state) if rms is None else rms)).to(state.dtype)


def perturb_loop_state(state: torch.Tensor, reference_rms: torch.Tensor, std: float) -> torch.Tensor:
    """Loop-state noise (training only): s_k ← s_k + σ · rms(s_1) · ε, ε ~ N(0, I) drawn per element from torch's
    global generator; `reference_rms` is the token's rms(s_1) (detached by the caller), σ = `std`.
    # (b, t, h), (b, t, 1) -> (b, t, h)
    """
    return state + torch.randn_like(state) * (std * reference_rms).to(state.dtype)


def answer_feedback_state(e: torch.Tensor, answer_logits: torch.Tensor, columns: torch.Tensor,
                          candidate_embeddings: torch.Tensor) -> torch.Tensor:
    """Answer feedback, the loop state as the answer: the next iteration restarts from the prelude output e, with each
    readout query's soft answer written into its row,

        s_k ← e + Σ_q 1[row = col_q] · softmax(y_{k,q}) E,   E: the candidates' input embeddings (C, h),

    so all that one iteration passes to the next is a distribution over the answer candidates (a finite-state
    bottleneck: exact when the answer is the whole state).  # (b, t, h), (b, q, C), (b, q), (C, h) -> (b, t, h)
    """
    index = columns[..., None].expand(-1, -1, e.shape[-1])
    written = answer_logits.float().softmax(-1).to(e.dtype) @ candidate_embeddings.to(e.dtype)  # (b, q, h)
    return e.scatter(1, index, e.gather(1, index) + written)


def feedback_base(e: torch.Tensor, state: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """What answer feedback with `answer_feedback_rows="queries"` writes the soft answers into: the core's output s_k
    with each query row col_q restarted from e,  base_t = e_t if t ∈ {col_q} else s_{k,t}; `answer_feedback_state` on
    it gives s_k ← s_k with row col_q replaced by e_q + softmax(y_{k,q}) E.  # (b, t, h) ×2, (b, q) -> (b, t, h)
    """
    index = columns[..., None].expand(-1, -1, e.shape[-1])
    return state.scatter(1, index, e.gather(1, index))


def adapter_identity_init(hidden_size: int) -> torch.Tensor:
    """The adapter's initial weight W = [0 | I] ∈ R^{h×2h}, so W [e ; s] = s and R = 1 equals the parent."""
    return torch.cat([torch.zeros(hidden_size, hidden_size), torch.eye(hidden_size)], dim=1)


def grad_window_iterations(num_iterations: int, grad_window: int) -> list[int]:
    """The iterations that carry gradient: K = {max(1, R − window + 1), …, R} (1-based)."""
    return list(range(max(1, num_iterations - grad_window + 1), num_iterations + 1))


# ------------------------------------------------------------------------------------------------------------ the model


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
        if isinstance(module, nn.Conv1d):  # the core's convolutions: u + conv(u) = u, R = 1 still computes the parent
            init.zeros_(module.weight)


class ParLoopedQwenForStateTracking(ParLoopedQwenPreTrainedModel):
    """Looped Qwen2 with progress-aligned readouts; see the module docstring for the recurrence."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # the PAR mechanisms, for the local window's update too (window_path cannot import this file, which imports it)
    state_rms = staticmethod(state_rms)
    anchor_state_norm = staticmethod(anchor_state_norm)
    answer_feedback_state = staticmethod(answer_feedback_state)

    def __init__(self, config: ParLoopedQwenConfig):
        super().__init__(config)
        config.validate_par(require_answers=True)
        if getattr(config, "use_sliding_window", False):
            raise ValueError("ParLoopedQwenConfig.use_sliding_window must be False: the loop uses full attention.")
        self.model = Qwen2Model(config)  # embed_tokens, layers, norm, rotary_emb — Qwen2's own modules and names
        self.adapter = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        kernel, h = config.core_conv_kernel, config.hidden_size  # one `causal_depthwise_mix` per core layer, or None
        self.core_conv = (nn.ModuleList(nn.Conv1d(h, h, kernel, groups=h, bias=False)
                                        for _ in range(config.core_layers)) if kernel > 0 else None)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        queries = config.prefix_state_queries  # the auxiliary state head of dense prefix targets, or None
        self.state_head = (nn.Linear(h, queries * len(config.answer_token_ids), bias=False) if queries > 0 else None)
        self.runtime = ParRuntimeOptions()  # the fast paths (same results as the reference); see runtime_options.py
        self.compiled: LoopParts | None = None  # set by `compile_core`
        self._candidate_rows_cache: CandidateRows | None = None  # built by the first readout (`_candidate_rows`)
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

    def _stack(self, part: str) -> tuple:
        """The layers of `part` ("prelude", "core" or "coda") as a plain tuple, for the loop's hot path: slicing the
        ModuleList (the properties above) builds a new module at every call."""
        p, c = self.config.prelude_layers, self.config.core_layers
        start, stop = {"prelude": (0, p), "core": (p, p + c), "coda": (p + c, None)}[part]
        return tuple(self.model.layers)[start:stop]

    def freeze_prelude(self) -> ParLoopedQwenForStateTracking:
        """Stop training the token embeddings and the prelude P (e = P(x) stays the parent's): a retrofit then keeps the
        parent's reading of words, so a sentence never trained on is encoded as the pretrained model encodes it. With
        tied embeddings the LM-head rows (the answer readout) are the embeddings and stay frozen too; the core, the
        coda and the adapter train."""
        self.freeze_embeddings()
        self.prelude.requires_grad_(False)
        return self

    @torch.no_grad()
    def reinitialize_weights(self, seed: int = 0) -> ParLoopedQwenForStateTracking:
        """Every weight drawn afresh as a new model of this config draws it (`_init_weights`: normal(0,
        initializer_range) matrices, unit norms, the adapter W = [0 | I]), from `seed`: a retrofit's shape and tokenizer
        without its pretrained weights, the control for what pretraining brings."""
        with torch.random.fork_rng(devices=[]):  # the caller's CPU generator is left as it was
            torch.manual_seed(seed)
            fresh = type(self)(self.config)
        self.load_state_dict(fresh.state_dict())
        return self

    def freeze_embeddings(self) -> ParLoopedQwenForStateTracking:
        """Stop training the token embeddings only (the prelude, core, coda and adapter train). For a retrofit they are
        most of the parameters (SmolLM2-135M: 28 M of a 2 + 2 + 2 retrofit's 56 M; Qwen2.5-0.5B: 136 M) and of AdamW's
        state, and the step only ever reads a few rows of them. With tied embeddings the LM head (the answer
        readout's rows) is the same tensor and stays frozen too."""
        self.model.embed_tokens.requires_grad_(False)
        return self

    # ------------------------------------------------------------------------------------------- from a parent LM
    @classmethod
    def from_pretrained_parent(cls, model_or_path, prelude_layers: int, core_layers: int, coda_layers: int,
                               answer_token_ids: list[int], halt_token_ids: tuple[int, int] | None = None,
                               dtype: torch.dtype | str | None = None, gguf_file: str | None = None,
                               truncate: bool = False, **par_kwargs) -> ParLoopedQwenForStateTracking:
        """Retrofit a pretrained causal LM into a looped PAR model: a Qwen2 one (a Hub id, a local folder or a
        `Qwen2ForCausalLM`) or a Llama-architecture one (a `LlamaForCausalLM`, or a folder of one; `gguf_file` for a
        GGUF file in the folder), converted exactly into Qwen2 first (`parents.load_parent`: zero q/k/v biases; a
        config Qwen2 cannot express is refused, naming the field).

        Layers [0, P) become the prelude, [P, P+C) the shared core, the rest the coda; every weight is copied
        unchanged and only the adapter is new (W = [0 | I]), so with R = 1 (and the full view) the answer logits equal
        the parent's logits at the candidate rows. P + C + Q must equal the parent's layer count, or, with
        `truncate=True`, be at most it: only the parent's first P + C + Q layers are read (a truncated parent, whose
        final norm and LM head read layer P + C + Q; R = 1 equals that truncated parent).

        `dtype` (a `torch.dtype`, its name such as "bfloat16", or "auto": as saved) is the new model's; default the
        parent's. A model passed in is only read: its weights are copied, never cast or cut. `par_kwargs` go to
        `ParLoopedQwenConfig`. Needs the installed package: the conversion (`parent_conversion.retrofit`) is imported
        here only, by importlib, which transformers' remote-code scanner does not follow, so no checkpoint carries it.
        """
        conversion = importlib.import_module(".parent_conversion", __package__)
        return conversion.retrofit(cls, model_or_path, prelude_layers, core_layers, coda_layers, answer_token_ids,
                                halt_token_ids, dtype=dtype, gguf_file=gguf_file, truncate=truncate, **par_kwargs)

    @classmethod
    def from_qwen2(cls, *args, **kwargs) -> ParLoopedQwenForStateTracking:
        """Alias of `from_pretrained_parent`, kept under its old name (it takes Llama and GGUF parents too)."""
        return cls.from_pretrained_parent(*args, **kwargs)

    def stream(self, preamble_ids, query_ids, query_positions=None, position_scale=None) -> StateStream:
        """A live monitor on this model (`streaming.StateStream`): `update(operation_ids)` reads one more event and
        returns the state after it (`StreamAnswer`), O(1) in the history, equal to `predict` on the whole prompt at
        forced depth ⌈d / step_size⌉; `state_dict()` / `from_state_dict` stop and resume it. Only `loop_view="local"`
        with `progress_positions` (or `position_encoding="nope"`); other configs are refused, naming the field."""
        return StateStream(self, preamble_ids, query_ids, query_positions, position_scale)

    # ------------------------------------------------------------------------------------------------- the backend
    def _backend(self, input_ids, attention_mask, query_positions, position_scale, operation_ends=None,
                 position_ids=None) -> LoopBackend:
        """Check the inputs, embed the prompt and choose once how this batch's loop runs: on the local window
        (`window_path.WindowLoop`, under `loop_view="local"` with `runtime.local_window`) or on the whole prompt
        (`ReferenceLoop`). Either runs the prelude, e = P(x)."""
        attention_mask, query_positions, position_scale = check_inputs(
            self.config, input_ids, attention_mask, query_positions, position_scale
        )
        operation_ends = check_operation_ends(self.config, operation_ends, attention_mask, query_positions)
        hidden = self.model.embed_tokens(input_ids)
        positions = (positions_from_mask(attention_mask) if position_ids is None
                     else check_position_ids(position_ids, input_ids))
        on_window = operation_ends is not None and self.config.loop_view == "local" and self.runtime.local_window
        backend = WindowLoop if on_window else ReferenceLoop
        return backend.prepare(self, hidden, attention_mask, query_positions, positions, position_scale,
                               operation_ends)

    def _full_view_mask(self, attention_mask: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """The full view's mask, or None for sdpa's causal kernel (`loop_views.full_view_mask`)."""
        return full_view_mask(self.config, self.runtime.causal_fast_path, attention_mask, hidden)

    # ----------------------------------------------------------------------------------------------- the core update
    @staticmethod
    def _run_layers(layers, hidden, mask, cos, sin) -> torch.Tensor:
        for layer in layers:
            out = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin))
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def compile_core(self, **compile_kwargs) -> ParLoopedQwenForStateTracking:
        """`torch.compile` the loop's hot path: the core update, the window block, the coda and the prelude
        (`compile_support.compile_parts`, where the options, recompiles and CPU advice are told). `compile_kwargs` go
        to `torch.compile`; `compile_core(disable=True)` returns to eager. Same result up to kernel rounding."""
        self.compiled = None if compile_kwargs.pop("disable", False) else compile_parts(self, **compile_kwargs)
        return self

    @property
    def parts(self) -> LoopParts:
        """The loop's hot functions: compiled after `compile_core`, else eager (`compile_support.eager_parts`)."""
        return self.compiled if self.compiled is not None else eager_parts(self)

    # The adapter W [e ; s] = W_e e + W_s s, split at its input so W_e e is computed once per batch (`split_adapter`).
    def _adapter_halves(self) -> AdapterHalves | None:
        return adapter_halves(self)

    def adapter_e_half(self, e: torch.Tensor) -> torch.Tensor:
        """W_e e, computed once per batch since e does not change across iterations (e itself, adapter called whole)."""
        return adapter_e_half(self, e)

    def adapter_input(self, e_half: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """W [e ; s], from e's half (`adapter_e_half`)."""
        return adapter_input(self, e_half, s)

    def _core_block(self, e_half, s, mask, cos, sin, token_valid=None):
        """C(W [e ; s]) — one pass of the shared core (`_core_layers`), from e's half of the adapter
        (`adapter_e_half`)."""
        return self._core_layers(self.adapter_input(e_half, s), mask, cos, sin, token_valid)

    def _core_layers(self, hidden, mask, cos, sin, token_valid=None):
        """C(u) on the adapter's output u = W [e ; s]: the core layers; with `config.core_conv_kernel`, every core
        layer's input goes through its own `causal_depthwise_mix` first, padding (`token_valid` (b, t) 0) read as
        zeros."""
        if self.core_conv is None:
            return self._run_layers(self._stack("core"), hidden, mask, cos, sin)
        valid = None if token_valid is None else token_valid[..., None].to(hidden.dtype)
        for conv, layer in zip(self.core_conv, self._stack("core")):  # each core layer reads its convolved input
            mixed = causal_depthwise_mix(hidden if valid is None else hidden * valid, conv.weight)
            hidden = self._run_layers([layer], mixed, mask, cos, sin)
        return hidden

    def _prelude_block(self, hidden, mask, cos, sin):
        """e = P(x): the prelude layers on the embedded prompt."""
        return self._run_layers(self._stack("prelude"), hidden, mask, cos, sin)

    def _coda_block(self, hidden, mask, cos, sin):
        """Q(s): the coda layers, then the final norm."""
        return self.model.norm(self._run_layers(self._stack("coda"), hidden, mask, cos, sin))

    def core_update(self, e_half, x, mask, cos, sin, reference_rms, token_valid=None) -> CoreUpdate:
        """s_k = anchor(C(W [e ; s_{k−1}])): the core block, then `anchor_state_norm` against rms(s_1) =
        `reference_rms` (iteration 1, `reference_rms` None, is not anchored); `e_half` is W_e e (`adapter_e_half`).
        In training with `config.loop_state_noise` σ > 0, `perturb_loop_state` then adds σ · rms(s_1) · ε.
        One unit, so `compile_core` fuses it whole. Returns s_k and rms(s_k) before anchoring (detached). `token_valid`
        (b, t): the real tokens, read by the core's convolution (`config.core_conv_kernel`) only."""
        new_state = self._core_block(e_half, x, mask, cos, sin, token_valid)
        rms = state_rms(new_state)  # (b, t, 1), computed once: the trace's (detached) and the anchoring's
        if self.config.norm_anchoring and reference_rms is not None:
            new_state = anchor_state_norm(new_state, reference_rms, rms)
        if self.training and self.config.loop_state_noise > 0:  # rms(s_1): the reference, or at iteration 1 its own
            scale = (rms if reference_rms is None else reference_rms).detach()
            new_state = perturb_loop_state(new_state, scale, self.config.loop_state_noise)
        return CoreUpdate(new_state, rms.detach())

    def run_core(self, update, *args):
        """`update(*args)` (a core update), under activation checkpointing with `config.checkpoint_core` in training."""
        if self.config.checkpoint_core and self.training and torch.is_grad_enabled():
            return checkpoint(update, *args, use_reentrant=False)
        return update(*args)

    def loop_step(self, iteration: int, update: CoreUpdate, reference_rms, readout,
                  computed: Readout | None = None) -> LoopStep:
        """Iteration k as a `LoopStep`; iteration 1 sets the anchoring reference rms(s_1) (with `norm_anchoring`)."""
        if self.config.norm_anchoring and reference_rms is None:
            reference_rms = update.raw_rms
        return LoopStep(iteration, update.state, update.raw_rms, reference_rms, readout, computed)

    def feed_back(self, e: torch.Tensor, readout: Readout, columns: torch.Tensor,
                  state: torch.Tensor | None = None) -> torch.Tensor:
        """`answer_feedback_state` of iteration k's readout: e with the soft answers written at `columns`; under
        `answer_feedback_rows="queries"` (`state` s_k given) s_k with those rows restarted so (`feedback_base`)."""
        if self.config.answer_feedback_rows == "queries":
            e = feedback_base(e, state, columns)
        rows = self._candidate_rows(self.model.embed_tokens.weight.device)
        return answer_feedback_state(e, readout.answer_logits, columns, self.model.embed_tokens.weight[rows.answers])

    # ------------------------------------------------------------------------------------------------------- readout
    def readout(self, inputs: list[ReadoutInput], weights: CandidateWeights | None = None) -> list[Readout]:
        """y_k = Q(s_k) of one or more iterations in one coda call: their inputs (same shapes) stacked along the batch,
        which computes per row exactly what separate calls compute (tested). The coda and final norm on each input's
        rows with its view, then the LM-head rows of the candidates at its readout columns: answer logits
        (b, q, candidates) and halt logits (b, 2) of (Yes, No) at the last query, or None without halt ids.
        `weights`: those rows as a loop indexed them once per batch (`candidate_weights`); default indexed here."""
        first = inputs[0]
        if len(inputs) == 1:
            x, mask, cos, sin, columns = first
        else:
            x, cos, sin, columns = (torch.cat([item[n] for item in inputs]) for n in (0, 2, 3, 4))
            mask = None if first.mask is None else torch.cat([item.mask for item in inputs])
        coda = self._coda_block if self.compiled is None else self.compiled.coda  # `parts.coda`, without building parts
        hidden = coda(x, mask, cos, sin)
        at_queries = hidden.gather(1, columns[..., None].expand(-1, -1, hidden.shape[-1]))  # (n·b, q, h)
        weights = self.candidate_weights() if weights is None else weights
        answers = F.linear(at_queries, weights.answers)
        answers = (answers,) if len(inputs) == 1 else answers.chunk(len(inputs))
        if weights.halts is None:
            return [Readout(a, None) for a in answers]
        halts = F.linear(at_queries[:, -1], weights.halts)
        halts = (halts,) if len(inputs) == 1 else halts.chunk(len(inputs))
        return [Readout(a, h) for a, h in zip(answers, halts)]

    def candidate_weights(self) -> CandidateWeights:
        """The LM-head rows of the answer candidates and of (Yes, No), and the candidates' input embeddings, indexed
        from the current weights (under the current grad mode): what `readout` and answer feedback read."""
        rows = self._candidate_rows(self.lm_head.weight.device)
        embeddings = self.model.embed_tokens.weight
        return CandidateWeights(self.lm_head.weight[rows.answers],
                                None if rows.halts is None else self.lm_head.weight[rows.halts],
                                embeddings[rows.answers.to(embeddings.device)])

    def _candidate_rows(self, device: torch.device) -> CandidateRows:
        """LM-head rows of the answer candidates and of (Yes, No), built once per (ids, device), not per readout."""
        key = (tuple(self.config.answer_token_ids), self.config.halt_token_ids and tuple(self.config.halt_token_ids),
               device)
        if self._candidate_rows_cache is None or self._candidate_rows_cache.key != key:
            with torch.inference_mode(False):  # built under an evaluator's inference_mode, it still indexes in training
                halts = None if key[1] is None else torch.tensor(key[1], device=device)
                self._candidate_rows_cache = CandidateRows(key, torch.tensor(key[0], device=device), halts)
        return self._candidate_rows_cache

    def state_logits(self, state: torch.Tensor, token_positions: torch.Tensor) -> torch.Tensor:
        """The state head (`config.prefix_state_queries`) at `token_positions` (b, n) of a loop state s_k (b, t, h):
        (b, n, Q, candidates) logits (`prefix_state.prefix_state_logits`)."""
        if self.state_head is None:
            raise ValueError("state_logits needs ParLoopedQwenConfig.prefix_state_queries > 0 (a state head).")
        return prefix_state_logits(state, token_positions, self.state_head.weight, self.config.prefix_state_queries)

    # ---------------------------------------------------------------------------------------------- forward, predict
    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                query_positions: torch.LongTensor | None = None, num_iterations: int | None = None,
                readout_iterations: list[int] | None = None, position_scale: float | torch.Tensor | None = None,
                output_loop_states: bool = False, operation_ends: torch.LongTensor | None = None,
                position_ids: torch.Tensor | None = None, output_prelude_states: bool = False) -> ParLoopedOutput:
        """Run the prelude once, the core `num_iterations` = R times (default 1) and the coda at the
        `readout_iterations` (default: [R]). Core iterations before the last `config.grad_window` run without grad
        (truncated backprop); a readout of such an iteration still carries gradient into the coda and LM head. On the
        local window, no-grad iterations between readouts run `runtime.block_iterations` at a time.

        input_ids, attention_mask: (b, t), left or right padding. query_positions: (b, q); default the last real
        token. position_scale: positional stretch, a float or (b,) in [1, max_position_scale].
        operation_ends: (b, D+1) last token index of the preamble and of each operation (−1 past d); needed by
        `loop_view` "prefix"/"local" and `progress_positions` (accepted and unused otherwise). position_ids: (b, t)
        positions to use instead of the ordinary ones (e.g. randomized sorted positions during training).
        output_prelude_states: return e = P(x) as `prelude_states` (an auxiliary loss on the prelude reads it).
        """
        num_iterations = check_iterations(self.config, 1 if num_iterations is None else num_iterations)
        reads = check_readout_iterations(readout_iterations, num_iterations)
        backend = self._backend(input_ids, attention_mask, query_positions, position_scale, operation_ends,
                                position_ids)
        grad_from = grad_window_iterations(num_iterations, self.config.grad_window)[0]
        grad_allowed = torch.is_grad_enabled()
        current, read_set = LoopState(0, backend.initial_state(), None), set(reads)  # s_0 = e
        readouts, pending, rms_trace, states = [], [], [], []
        while current.iteration < num_iterations:
            k = current.iteration
            # the next iteration that must be seen on its own: the next readout, or the last before the window
            last = min([r for r in reads if r > k] + [grad_from - 1 if grad_allowed else num_iterations])
            with torch.set_grad_enabled(grad_allowed and k + 1 >= grad_from):
                steps = backend.advance(current, last)
            for step in steps:
                if (step.iteration in read_set and step.computed is not None
                        and (step.iteration >= grad_from or not grad_allowed)):  # read in this grad mode already
                    readouts += backend.readouts(pending) if pending else []  # the earlier reads first, in order
                    readouts.append(step.computed)
                    pending = []
                elif step.iteration in read_set:  # a readout before the window still trains the coda
                    pending.append(step.readout)
                    if len(pending) == self.runtime.readout_batch_iterations or step.iteration == reads[-1]:
                        readouts += backend.readouts(pending)  # one coda call for up to `readout_batch_iterations`
                        pending = []
                rms_trace.append(step.raw_rms)
                if output_loop_states:
                    states.append(step.state)
            current = steps[-1].loop_state()

        valid = backend.state_valid()
        return ParLoopedOutput(
            answer_logits=torch.stack([r.answer_logits for r in readouts]),
            halt_logits=torch.stack([r.halt_logits for r in readouts]) if readouts[0].halt_logits is not None else None,
            readout_iterations=torch.tensor(reads, device=input_ids.device),
            state_rms=(torch.stack(rms_trace)[..., 0] * valid).sum(-1) / valid.sum(-1),
            loop_states=tuple(states) if output_loop_states else None,
            prelude_states=backend.prelude_out if output_prelude_states else None,
        )

    @torch.no_grad()
    def predict(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                query_positions: torch.LongTensor | None = None, num_iterations: int | torch.Tensor | None = None,
                halting: bool = False, max_iterations: int | None = None,
                position_scale: float | torch.Tensor | None = None,
                operation_ends: torch.LongTensor | None = None,
                position_ids: torch.Tensor | None = None) -> ParPrediction:
        """Answer each sample with per-sample early exit: a finished sample leaves the batch.

        Forced depth (`num_iterations` = R, an int or a (b,) tensor): read iteration R of each sample.
        Learned halting (`halting=True`, no iteration count given): read the first iteration R confirmed by
        `halt_confirmed` over R..R+m−1, so a sample runs R + m − 1 iterations. One never confirmed by
        `max_iterations` (default `config.max_iterations`) returns its last readout with `halted=False`. On the local
        window, forced depth runs `runtime.block_iterations` iterations at a time up to the nearest depth, and halting
        runs them that many at a time with their readouts in one coda call (a sample that halts inside a block leaves
        the batch at its end: the same answers, up to K − 1 iterations computed and not read).

        Under the local view the depth is not hidden from the loop: `operation_ends` marks every operation, and
        iteration k > d reads an empty window, which is what a model trained with `halt_label_offset=1` learns to
        halt on (at R = d + 1). Halting there means "stop where the given operations end", not the paper's
        "depth unknown"; under the full view the queries must infer it from the prompt. `position_ids` (b, t): positions
        instead of the ordinary ones, as in `forward` (e.g. the evaluator's test-time interpolation).
        """
        batch, device = input_ids.shape[0], input_ids.device
        limit, target = check_predict_depth(self.config, batch, device, num_iterations, halting, max_iterations)
        backend = self._backend(input_ids, attention_mask, query_positions, position_scale, operation_ends,
                                position_ids)
        sizes = (batch, backend.num_queries, len(self.config.answer_token_ids))
        record = PredictionRecord.empty(*sizes, device)
        window = HaltingWindow.empty(self.config.halt_window, *sizes, device) if halting else None
        current, active = LoopState(0, backend.initial_state(), None), torch.arange(batch, device=device)
        while current.iteration < limit:
            # halting reads every iteration (a block's readouts in one coda call, in order); forced depth runs up to
            # the nearest depth and reads only the samples whose depth it is
            steps = backend.advance(current, limit if halting else int(target[active].min()))
            current = steps[-1].loop_state()
            if halting:
                done = self._read_halting(backend, steps, active, window, record, limit)
            else:
                done = target[active] == current.iteration
                if done.any():
                    final = steps[-1]
                    readout = (final.computed.select(done) if final.computed is not None
                               else backend.readouts([final.readout.select(done)])[0])
                    record.finish(active[done], readout.answer_logits, current.iteration, halted=True)
            if done.any():  # finished samples leave the batch
                active, backend, current = active[~done], backend.select(~done), current.select(~done)
            if active.numel() == 0:
                break
        return record.prediction()

    def _read_halting(self, backend: LoopBackend, steps: list[LoopStep], active: torch.Tensor, window: HaltingWindow,
                      record: PredictionRecord, limit: int) -> torch.Tensor:
        """Learned halting over iterations `steps` of the samples `active` (original indices): their readouts (one
        coda call) go into `window`; a sample whose window R..k (k = R + m − 1) `halt_confirmed` finishes with
        iteration R's answer; one never confirmed by `limit` with its last, halted=False. Returns which of `active`
        halted (they leave the batch)."""
        m, live = self.config.halt_window, torch.ones(active.shape[0], dtype=torch.bool, device=active.device)
        computed = [s.computed for s in steps]
        readouts = computed if None not in computed else backend.readouts([s.readout for s in steps])
        for step, readout in zip(steps, readouts):
            k = step.iteration
            window.push(k, active, readout)
            if k >= m:  # the window R..k with R = k − m + 1 is complete
                done = live & halt_confirmed(window.p_yes_from(k - m + 1, active), self.config.halt_threshold,
                                             self.config.halt_confirm)
                record.finish(active[done], window.answers_at(k - m + 1, active[done]), k - m + 1, halted=True)
                live = live & ~done
            if k == limit:  # never confirmed: flagged, last readout returned
                record.finish(active[live], readout.answer_logits[live], k, halted=False)
        return ~live


ParLoopedQwenConfig.register_for_auto_class()
ParLoopedQwenForStateTracking.register_for_auto_class("AutoModel")

__all__ = ["ParLoopedQwenPreTrainedModel", "ParLoopedQwenForStateTracking", "ParLoopedOutput", "ParPrediction",
           "ParRuntimeOptions", "IterationView", "LoopState", "LoopStep", "Readout", "ReadoutInput", "ReferenceLoop",
           "anchor_state_norm", "adapter_identity_init", "answer_feedback_state", "feedback_base",
           "causal_depthwise_mix",
           "default_compile_options", "grad_window_iterations", "halt_confirmed", "halt_iteration", "loop_view_mask",
           "operations_read",
           "padded_causal_mask", "par_eager_attention", "perturb_loop_state", "progress_shift", "token_segments",
           "positions_from_mask",
           "small_block_attention", "state_rms", "stretch_positions", "StateStream", "StreamAnswer"]
