"""Configuration of a PAR (Progress-Aligned Recurrence) looped, retrofitted Qwen2 model.

A Qwen2 stack of ``num_hidden_layers`` decoder layers is split into a prelude P (run once), a weight-shared
core C (run R times) and a coda Q (read after any iteration):

    e = P(x),  s_0 = e,  s_k = anchor(C(W [e ; s_{k-1}])),  y_k = Q(s_k)        (k = 1..R)

where the anchoring (``norm_anchoring``, `anchor_state_norm` in `modeling_par.py`) rescales each token's state to the
RMS of its own iteration-1 state, anchor(u) = u · rms(s_1) / rms(u) for k ≥ 2 (rms(s_1) detached; iteration 1 sets
it and is not rescaled; without ``norm_anchoring``, anchor is the identity).

Every other field is Qwen2's own, so any Qwen2 / Qwen2.5 config is a valid starting point.
"""

from transformers import Qwen2Config

from .record_format import load_prompt_format

LOOP_VIEWS = ("full", "prefix", "local")
POSITION_ENCODINGS = ("rope", "nope")
FEEDBACK_ROWS = ("all", "queries")  # answer_feedback_rows
# Every checkpoint names its pipeline: pipeline("state-tracking", model=DIR, trust_remote_code=True)
CUSTOM_PIPELINES = {"state-tracking": {"impl": "pipeline_par.StateTrackingPipeline", "pt": ["AutoModel"], "tf": [],
                                       "type": "text"}}


def _fail(field, allowed, value):
    raise ValueError(f"ParLoopedQwenConfig.{field} must be {allowed}; got {value!r}.")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class ParLoopedQwenConfig(Qwen2Config):
    r"""
    Args (on top of [`Qwen2Config`]):
        prelude_layers (`int`): decoder layers in the prelude P (run once). ≥ 1.
        core_layers (`int`): decoder layers in the shared core C (looped). ≥ 1.
        coda_layers (`int`): decoder layers in the coda Q (readout). ≥ 1.
            `prelude_layers + core_layers + coda_layers` must equal `num_hidden_layers`.
        step_size (`int`, defaults to 1): `c`, operations per iteration; iteration k targets z_min(c·k, d).
        norm_anchoring (`bool`, defaults to `True`): rescale each token's loop state to the RMS of its own
            iteration-1 state after every iteration, `s_k ← s_k · rms(s_1) / rms(s_k)`.
        grad_window (`int`, defaults to 8): only the last `grad_window` iterations carry gradient.
        answer_token_ids (`list[int]`): vocabulary ids of the answer candidates; the readout is a
            classification over these LM-head rows.
        halt_token_ids (`tuple[int, int]` or `None`): ids of ("Yes", "No") for learned halting.
        halt_threshold (`float`, defaults to 0.5): τ, P(Yes) must exceed it.
        halt_confirm (`int`, defaults to 6): k, confirmations needed inside the window.
        halt_window (`int`, defaults to 8): m, the window R..R+m−1 that must confirm a halt.
        max_iterations (`int`, defaults to 1024): the most core iterations a forward may run.
        max_position_scale (`float`, defaults to 8.0): s_max of the positional-stretch phase.
        checkpoint_core (`bool`, defaults to `False`): activation checkpointing of each core iteration.
        loop_view (`str`, defaults to `"full"`): what the query region (the tokens after the last operation) sees
            at iteration k, in the prelude (k = 0), the core and the coda. `"full"`: ordinary causal attention (the
            paper). `"prefix"`: the preamble, operations 1..min(c·k, d) and the query region. `"local"`: only the
            operations read at iteration k, c·(k−1)+1..min(c·k, d) (the preamble at k = 0), and the query region;
            every other token sees only its own operation (or the preamble) and is not iterated (its loop state is
            reset to the prelude output e before each iteration), so every iteration computes the same map of
            (query states, operations k). `"prefix"` and `"local"` need `operation_ends` as input.
        progress_positions (`bool`, defaults to `False`): progress-coupled positions: at iteration k the query region
            is moved to sit right after operation min(c·k, d) (ordinary positions from iteration ⌈d/c⌉ on); needs
            `operation_ends`.
        bidirectional_queries (`bool`, defaults to `False`): the query region attends to itself in both directions
            (otherwise causally), so every query can read every other query's state within one iteration.
        prompt_format (`dict` or `None`): the segmentation rule that turns a raw prompt into preamble / operations /
            queries and builds `operation_ends` (`PromptFormat.to_dict()`, see `prompt_format.py`), or for a checkpoint
            trained on recorded data the vocabulary it learned (`RecordFormat.to_dict()`, ``"rendering": "records"``,
            see `record_format.py`); what the `state-tracking` pipeline reads its input with. Its candidates are the
            answers, in `answer_token_ids` order. Its optional `trained` entry records the sentences the training data
            used (`PromptFormat.trained`; a records format is itself the training vocabulary): the pipeline refuses any
            other, and any sentence the format does not list, unless called with `allow_untrained=True` (then read
            from its words); without it (older checkpoints) no listed sentence is refused for having been unseen.
        answer_feedback (`bool`, defaults to `False`): the loop state is the answer: after each iteration the readout
            runs and the next iteration restarts from the prelude output e with each query's soft answer (softmax over
            the candidates times their input embeddings) added at its row, so only a distribution over the answers
            passes between iterations (`answer_feedback_state` in `modeling_par.py`; a finite-state bottleneck for a
            state that the answers name whole). Off: the paper's loop, whose state is the core's output.
        answer_feedback_rows (`str`, defaults to `"all"`): with `answer_feedback`, which rows restart from e. `"all"`:
            every row (above). `"queries"`: only the query rows restart, s_k ← s_k with row col_q replaced by
            e_q + softmax(y_{k,q}) E (`answer_feedback_state` on `feedback_base`): the answer passes through the
            bottleneck while the other rows keep the core's output, so the full view, which has no operation window
            to say which operation comes next, can keep its place in the prompt there. Only with `loop_view="full"`.
        position_encoding (`str`, defaults to `"rope"`): how attention sees token order. `"rope"`: Qwen2's rotary
            embedding of the (possibly stretched / randomized / progress-shifted) positions. `"nope"`: no positional
            encoding (NoPE, Kazemnejad et al. 2023; FPRM): queries and keys are not rotated (`nope_positions`: every
            position read as 0, cos = 1, sin = 0), so order comes only from the causal mask and `core_conv_kernel`. A
            retrofit with `"nope"` drops its parent's rotary: R = 1 no longer equals the parent.
        core_conv_kernel (`int`, defaults to 0): K > 0 puts a causal depthwise convolution over the tokens before
            every core layer (FPRM's `conv1d` before attention), u ← u + Σ_{j<K} w_j ⊙ u_{t−j}
            (`causal_depthwise_mix` in `modeling_par.py`; one filter per layer, w initialised to 0, so R = 1 still
            equals the parent; padding reads as zeros): one iteration reaches core_layers · (K − 1) tokens back
            without attention. 0: off. Only with `loop_view="full"`.
        prefix_state_queries (`int`, defaults to 0): Q > 0 adds a linear state head (`state_head`, Q · candidates × h,
            no bias) that reads the loop state at any token as the Q queries' answers
            (`prefix_state.prefix_state_logits`): the auxiliary readout that dense prefix targets train
            (`--prefix_state_weight`; each operation's last token reads the state after that operation, FPRM-style).
            Unused at inference. 0: none. Only with `loop_view="full"`.
        loop_state_noise (`float`, defaults to 0.0): σ ≥ 0, in training only (like dropout): after each iteration's
            anchoring every token's state is perturbed, s_k ← s_k + σ · rms(s_1) · ε with ε ~ N(0, I)
            (`perturb_loop_state` in `modeling_par.py`), so the step map must bring a perturbed state back to its
            trajectory instead of letting per-iteration errors accumulate. No effect at evaluation. 0: off. Only with
            `loop_view="full"`.
        learned_halting (`bool`, defaults to `False`): the halting readout was trained (`halting_loss_weight` > 0), so
            the pipeline halts by it; otherwise it runs forced depth from the segmentation.
    """

    model_type = "par_looped_qwen2"

    def __init__(
        self,
        prelude_layers: int = 1,
        core_layers: int = 1,
        coda_layers: int = 1,
        step_size: int = 1,
        norm_anchoring: bool = True,
        grad_window: int = 8,
        answer_token_ids: list[int] | None = None,
        halt_token_ids: tuple[int, int] | list[int] | None = None,
        halt_threshold: float = 0.5,
        halt_confirm: int = 6,
        halt_window: int = 8,
        max_iterations: int = 1024,
        max_position_scale: float = 8.0,
        checkpoint_core: bool = False,
        loop_view: str = "full",
        progress_positions: bool = False,
        bidirectional_queries: bool = False,
        prompt_format: dict | None = None,
        learned_halting: bool = False,
        answer_feedback: bool = False,
        answer_feedback_rows: str = "all",
        position_encoding: str = "rope",
        core_conv_kernel: int = 0,
        prefix_state_queries: int = 0,
        loop_state_noise: float = 0.0,
        **kwargs,
    ):
        self.prelude_layers = prelude_layers
        self.core_layers = core_layers
        self.coda_layers = coda_layers
        self.step_size = step_size
        self.norm_anchoring = norm_anchoring
        self.grad_window = grad_window
        self.answer_token_ids = list(answer_token_ids) if answer_token_ids is not None else []
        self.halt_token_ids = list(halt_token_ids) if halt_token_ids is not None else None
        self.halt_threshold = halt_threshold
        self.halt_confirm = halt_confirm
        self.halt_window = halt_window
        self.max_iterations = max_iterations
        self.max_position_scale = max_position_scale
        self.checkpoint_core = checkpoint_core
        self.loop_view = loop_view
        self.progress_positions = progress_positions
        self.bidirectional_queries = bidirectional_queries
        self.prompt_format = prompt_format
        self.learned_halting = learned_halting
        self.answer_feedback = answer_feedback
        self.answer_feedback_rows = answer_feedback_rows
        self.position_encoding = position_encoding
        self.core_conv_kernel = core_conv_kernel
        self.prefix_state_queries = prefix_state_queries
        self.loop_state_noise = loop_state_noise
        kwargs.setdefault("custom_pipelines", {k: dict(v) for k, v in CUSTOM_PIPELINES.items()})
        kwargs.setdefault("num_hidden_layers", prelude_layers + core_layers + coda_layers)
        self._check_layer_split(kwargs["num_hidden_layers"])  # before Qwen2's own layer_types check
        super().__init__(**kwargs)
        self.validate_par()

    def _check_layer_split(self, num_hidden_layers) -> None:
        for field in ("prelude_layers", "core_layers", "coda_layers"):
            value = getattr(self, field)
            if not _is_int(value) or value < 1:
                _fail(field, "an integer ≥ 1", value)
        total = self.prelude_layers + self.core_layers + self.coda_layers
        if total != num_hidden_layers:
            _fail("num_hidden_layers", f"prelude_layers + core_layers + coda_layers = {total}", num_hidden_layers)

    def validate_par(self, require_answers: bool = False) -> None:
        """Raise one `ValueError` naming the first invalid PAR field and what is allowed.

        `answer_token_ids` may be empty in a bare config (transformers builds one to diff against defaults);
        a model requires it (`require_answers=True`).
        """

        self._check_layer_split(self.num_hidden_layers)
        self._check_counts_and_flags()
        self._check_loop_options()
        self._check_halting_and_scale()
        self._check_token_ids(require_answers)
        self._check_prompt_format()

    def _check_counts_and_flags(self) -> None:
        """The iteration and halting counts (integers ≥ 1), `loop_view`, and the bool fields."""
        for field in ("step_size", "grad_window", "max_iterations", "halt_confirm", "halt_window"):
            value = getattr(self, field)
            if not _is_int(value) or value < 1:
                _fail(field, "an integer ≥ 1", value)
        if self.loop_view not in LOOP_VIEWS:
            _fail("loop_view", f"one of {LOOP_VIEWS}", self.loop_view)
        for field in ("norm_anchoring", "checkpoint_core", "progress_positions", "bidirectional_queries",
                      "learned_halting", "answer_feedback"):
            if not isinstance(getattr(self, field), bool):
                _fail(field, "a bool", getattr(self, field))

    def _check_loop_options(self) -> None:
        """The loop's options and the views they need: `bidirectional_queries`, `answer_feedback_rows`,
        `position_encoding`, `core_conv_kernel`, `prefix_state_queries`, `loop_state_noise`."""
        fail = _fail
        if self.bidirectional_queries and self.loop_view == "full" and not self.progress_positions:
            fail("bidirectional_queries", "False with loop_view='full' and progress_positions=False (the full view "
                 "with ordinary positions reads no query region, so it would change nothing); use loop_view "
                 "'prefix'/'local' or progress_positions=True", self.bidirectional_queries)
        if self.answer_feedback_rows not in FEEDBACK_ROWS:
            fail("answer_feedback_rows", f"one of {FEEDBACK_ROWS}", self.answer_feedback_rows)
        if self.answer_feedback_rows == "queries" and not (self.answer_feedback and self.loop_view == "full"):
            fail("answer_feedback_rows", "'all' unless answer_feedback=True and loop_view='full' (only the full "
                 "view's other rows iterate)", self.answer_feedback_rows)
        if self.position_encoding not in POSITION_ENCODINGS:
            fail("position_encoding", f"one of {POSITION_ENCODINGS}", self.position_encoding)
        if not _is_int(self.core_conv_kernel) or self.core_conv_kernel < 0:
            fail("core_conv_kernel", "an integer ≥ 0 (0: no convolution)", self.core_conv_kernel)
        if self.core_conv_kernel > 0 and self.loop_view != "full":
            fail("core_conv_kernel", f"0 with loop_view={self.loop_view!r} (the convolution is built for the full "
                 "view)", self.core_conv_kernel)
        if not _is_int(self.prefix_state_queries) or self.prefix_state_queries < 0:
            fail("prefix_state_queries", "an integer ≥ 0 (0: no state head)", self.prefix_state_queries)
        if self.prefix_state_queries > 0 and self.loop_view != "full":
            fail("prefix_state_queries", f"0 with loop_view={self.loop_view!r} (the state head reads the full view's "
                 "tokens)", self.prefix_state_queries)
        noise = self.loop_state_noise
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0.0 <= noise < float("inf"):
            fail("loop_state_noise", "a finite number ≥ 0 (0: off)", noise)
        if noise > 0 and self.loop_view != "full":
            fail("loop_state_noise", f"0 with loop_view={self.loop_view!r} (the noise is built for the full view's "
                 "loop)", noise)

    def _check_halting_and_scale(self) -> None:
        """`halt_confirm` ≤ `halt_window`, `halt_threshold` in (0, 1), `max_position_scale` ≥ 1."""
        if self.halt_confirm > self.halt_window:
            _fail("halt_confirm", f"≤ halt_window ({self.halt_window})", self.halt_confirm)
        if not isinstance(self.halt_threshold, (int, float)) or not 0.0 < self.halt_threshold < 1.0:
            _fail("halt_threshold", "a probability strictly between 0 and 1", self.halt_threshold)
        if not isinstance(self.max_position_scale, (int, float)) or self.max_position_scale < 1.0:
            _fail("max_position_scale", "a number ≥ 1.0", self.max_position_scale)

    def _check_token_ids(self, require_answers: bool) -> None:
        """`answer_token_ids` (distinct vocabulary ids, non-empty with `require_answers`), `halt_token_ids`, and
        `learned_halting` only with a halting readout."""
        fail, is_int = _fail, _is_int
        vocab = self.vocab_size
        ids = self.answer_token_ids
        if require_answers and not ids:
            fail("answer_token_ids", "a non-empty list of vocabulary ids", ids)
        if any(not is_int(i) or not 0 <= i < vocab for i in ids):
            fail("answer_token_ids", f"ids in [0, vocab_size={vocab})", ids)
        if len(set(ids)) != len(ids):
            fail("answer_token_ids", "distinct ids", ids)
        halt = self.halt_token_ids
        if halt is not None:
            if len(halt) != 2 or any(not is_int(i) or not 0 <= i < vocab for i in halt) or halt[0] == halt[1]:
                fail("halt_token_ids", f"None or two distinct ids (Yes, No) in [0, vocab_size={vocab})", halt)
        if self.learned_halting and halt is None:
            fail("learned_halting", "False without halt_token_ids (there is no halting readout)", True)

    def _check_prompt_format(self) -> None:
        """`prompt_format`: None, or a valid format with one candidate per `answer_token_ids` entry."""
        ids = self.answer_token_ids
        if self.prompt_format is not None:
            try:
                candidates = load_prompt_format(self.prompt_format).candidates
            except ValueError as error:
                _fail("prompt_format", f"a valid PromptFormat.to_dict() or RecordFormat.to_dict() ({error})", "…")
            if ids and len(candidates) != len(ids):
                _fail("prompt_format", f"a format with one candidate per answer_token_ids entry ({len(ids)}); it "
                      f"lists {len(candidates)}", "…")

__all__ = ["CUSTOM_PIPELINES", "FEEDBACK_ROWS", "LOOP_VIEWS", "POSITION_ENCODINGS", "ParLoopedQwenConfig"]
