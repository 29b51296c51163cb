"""The model a training run trains (`examples/train_par.py`): from scratch, retrofitted from a pretrained parent, or
fine-tuned from a PAR checkpoint; its tokenizer; its loop view, attention implementation, torch.compile and LoRA.

`model_args` is train_par.py's `ModelArguments` (any object with its fields); `train_args` its training arguments.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable

import torch
from transformers import AutoTokenizer

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking
from state_tracking import build_tokenizer
from state_tracking.evaluation import check_attn_implementation, default_attn_implementation

from .peft_utils import apply_core_lora

logger = logging.getLogger(__name__)

# --compile_core auto compiles from this many steps on: compiling costs ~1-2 min on a cold inductor cache (seconds once
# cached), a d = 32 step of the default model saves ~0.25 s (results/speed_cpu)
AUTO_COMPILE_MIN_STEPS = 500
AUTO_COMPILE_MIN_SECONDS = 600  # ... and not under a shorter --max_train_seconds budget

RECIPE_VIEW = dict(loop_view="local", progress_positions=True, bidirectional_queries=True)  # from scratch
PAPER_VIEW = dict(loop_view="full", progress_positions=False, bidirectional_queries=False)  # retrofit


def check_freeze_prelude_from_step(model_args) -> None:
    """--freeze_prelude_from_step N: an integer >= 1, not with --freeze_prelude (frozen from step 0) nor --peft (whose
    factors, not the prelude's weights, are what trains). train_par's check_arguments calls it before anything loads."""
    step = model_args.freeze_prelude_from_step
    if step is None:
        return
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"--freeze_prelude_from_step must be an integer >= 1 (optimizer steps); got {step!r}.")
    if model_args.freeze_prelude:
        raise ValueError("--freeze_prelude_from_step and --freeze_prelude: give one (--freeze_prelude freezes it "
                         "from step 0).")
    if model_args.peft:
        raise ValueError("--freeze_prelude_from_step trains the prelude's own weights; it does not combine with "
                         f"--peft {model_args.peft}.")


def resolve_view(model_args) -> dict:
    """The loop-view fields: given flags win; unset ones take the from-scratch recipe, or the paper's full view when
    retrofitting a pretrained parent (whose causal attention the options would change)."""
    defaults = PAPER_VIEW if model_args.init_from_parent else RECIPE_VIEW
    return {k: v if (v := getattr(model_args, k)) is not None else defaults[k] for k in defaults}


def speed_options(model_args, train_args, loop_view: str) -> tuple[str, bool]:
    """(attention implementation, compile?) for this run: given values win, "auto" follows the measured defaults."""
    check_attn_implementation(model_args.attn_implementation, "--attn_implementation")
    if model_args.compile_core not in ("auto", "true", "false"):
        raise ValueError(f"--compile_core must be auto, true or false; got {model_args.compile_core!r}.")
    if model_args.block_iterations < 1:
        raise ValueError(f"--block_iterations must be an integer >= 1; got {model_args.block_iterations!r}.")
    device = train_args.device if train_args is not None else torch.device("cpu")
    attn = model_args.attn_implementation
    if attn == "auto":
        attn = default_attn_implementation(loop_view, device)
    compile_core = model_args.compile_core == "true"
    if model_args.compile_core == "auto":
        budget = getattr(train_args, "max_train_seconds", None)
        compile_core = (device.type == "cpu" and loop_view == "local" and train_args is not None
                        and train_args.max_steps >= AUTO_COMPILE_MIN_STEPS
                        and (budget is None or budget >= AUTO_COMPILE_MIN_SECONDS) and inductor_can_compile_for_cpu())
    return attn, compile_core


def inductor_can_compile_for_cpu() -> bool:
    """Whether `--compile_core auto` may compile here: torch.compile's CPU backend builds C++ kernels, tested on Linux
    with a C++ compiler on PATH (elsewhere auto stays eager and says so; `--compile_core true` still forces it)."""
    compiler = os.environ.get("CXX") or "c++"
    if sys.platform.startswith("linux") and (shutil.which(compiler) or shutil.which("g++") or shutil.which("clang++")):
        return True
    logger.warning("--compile_core auto: no C++ compiler on PATH or not Linux; training eager "
                   "(set --compile_core true to force torch.compile).")
    return False


def build_model(model_args, token_ids: dict, train_args=None, num_queries: int | None = None):
    """The model: a PAR checkpoint (--init_from_par), a retrofit of a pretrained parent (--init_from_parent), or a
    fresh one of the size flags; then freezing, the speed options and LoRA (--peft lora). With
    --prefix_state_weight > 0 a new model gets a state head over the task's `num_queries` queries."""
    model = initial_model(model_args, token_ids, par_fields(model_args, train_args, num_queries))
    return set_up_for_training(model, model_args, train_args)


def par_fields(model_args, train_args=None, num_queries: int | None = None) -> dict:
    """The PAR config fields a new model (a retrofit or a fresh one) takes from the flags: the loop's options, the
    loop view (`resolve_view`) and, with --prefix_state_weight > 0, the state head's `num_queries` queries."""
    prefix_queries = 0
    if getattr(train_args, "prefix_state_weight", 0) > 0:
        if num_queries is None or num_queries < 1:
            raise ValueError("--prefix_state_weight > 0 needs the task's number of queries for the state head.")
        prefix_queries = num_queries
    return dict(prefix_state_queries=prefix_queries,
        step_size=model_args.step_size, norm_anchoring=model_args.norm_anchoring, grad_window=model_args.grad_window,
        max_iterations=model_args.max_iterations, checkpoint_core=model_args.checkpoint_core,
        answer_feedback=model_args.answer_feedback, answer_feedback_rows=model_args.answer_feedback_rows,
        position_encoding=model_args.position_encoding,
        core_conv_kernel=model_args.core_conv_kernel, loop_state_noise=model_args.loop_state_noise,
        **resolve_view(model_args),
    )


def initial_model(model_args, token_ids: dict, fields: dict):
    """The model before training's options: a PAR checkpoint (--init_from_par, its answer tokens checked against the
    task's), a retrofit of a pretrained parent (--init_from_parent), or a fresh one of the size flags; `fields` are
    `par_fields` (not applied to a PAR checkpoint, which keeps its own config)."""
    if model_args.init_from_par:
        model = ParLoopedQwenForStateTracking.from_pretrained(model_args.init_from_par, dtype=torch.float32)
        if list(model.config.answer_token_ids) != token_ids["answer_token_ids"]:
            raise ValueError(f"--init_from_par: the checkpoint's answer_token_ids {model.config.answer_token_ids} do "
                             f"not match the task's tokenizer ({token_ids['answer_token_ids']}).")
        if model_args.loop_state_noise:  # a training-only option, so a fine-tune may add it to the checkpoint's config
            model.config.loop_state_noise = model_args.loop_state_noise
            model.config.validate_par()
        return model
    if model_args.init_from_parent:
        # fp32 master weights whatever the parent was saved in: Qwen2.5 ships bf16, from_pretrained's dtype="auto" would
        # keep it, and AdamW's lr-2e-5 steps then mostly round away; --bf16 autocasts the compute
        return ParLoopedQwenForStateTracking.from_pretrained_parent(
            model_args.init_from_parent, model_args.prelude_layers, model_args.core_layers, model_args.coda_layers,
            answer_token_ids=token_ids["answer_token_ids"], halt_token_ids=token_ids["halt_token_ids"],
            dtype=torch.float32, gguf_file=model_args.gguf_file, truncate=model_args.truncate_parent, **fields,
        )
    config = ParLoopedQwenConfig(
        vocab_size=token_ids["vocab_size"], pad_token_id=token_ids["pad_token_id"],
        hidden_size=model_args.hidden_size, intermediate_size=model_args.intermediate_size,
        num_attention_heads=model_args.num_attention_heads, num_key_value_heads=model_args.num_key_value_heads,
        prelude_layers=model_args.prelude_layers, core_layers=model_args.core_layers,
        coda_layers=model_args.coda_layers, max_position_embeddings=4096,
        answer_token_ids=token_ids["answer_token_ids"], halt_token_ids=token_ids["halt_token_ids"],
        **fields,
    )
    return ParLoopedQwenForStateTracking(config)


def set_up_for_training(model, model_args, train_args=None):
    """`model` as the run trains it: the parent's weights drawn afresh (--parent_weights random), the prelude or
    embeddings frozen, the speed options (`speed_options`) and LoRA (--peft lora); returns the model (LoRA wraps it)."""
    if model_args.parent_weights not in ("pretrained", "random"):
        raise ValueError(f"--parent_weights must be pretrained or random; got {model_args.parent_weights!r}.")
    if model_args.parent_weights == "random":
        if not model_args.init_from_parent:
            raise ValueError("--parent_weights random draws a parent's weights afresh: it needs --init_from_parent.")
        model.reinitialize_weights(seed=train_args.seed if train_args is not None else 0)
    if model_args.freeze_prelude:
        model.freeze_prelude()
    if model_args.freeze_embeddings:
        model.freeze_embeddings()
    model.runtime.causal_fast_path = model_args.causal_fast_path
    attn, compile_core = speed_options(model_args, train_args, model.config.loop_view)
    model.runtime.block_iterations = model_args.block_iterations
    if model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)
    if compile_core:
        model.compile_core()
    if model_args.peft is None and model_args.lora_layers != "core":
        raise ValueError(f"--lora_layers {model_args.lora_layers} chooses where --peft lora goes: give --peft lora "
                         "with it.")
    if model_args.peft is not None:
        if model_args.peft != "lora":
            raise ValueError(f"--peft must be 'lora' or unset; got {model_args.peft!r}.")
        model = apply_core_lora(model, r=model_args.lora_r, alpha=model_args.lora_alpha, layers=model_args.lora_layers)
    return model


def use_tokenizer_special_tokens(config, tokenizer) -> None:
    """The model is built for this tokenizer: its config takes the tokenizer's pad / bos / eos ids wherever the
    tokenizer defines one (an eos list that already holds the tokenizer's eos stays). This is what the Trainer would
    otherwise do itself at the start of training, with a warning that the config was changed behind the user's back."""
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        token_id = getattr(tokenizer, name, None)
        current = getattr(config, name, None)
        if token_id is None or current == token_id or (isinstance(current, list) and token_id in current):
            continue
        setattr(config, name, int(token_id))


def build_tokenizer_for(task, task_args, model_args):
    """The parent's tokenizer (a retrofit reads words: --rendering text), the PAR checkpoint's, or the task's own."""
    if model_args.init_from_parent:
        if task_args.rendering != "text":
            raise ValueError("--init_from_parent needs --rendering text (the pretrained tokenizer reads words).")
        kwargs = {} if model_args.gguf_file is None else {"gguf_file": model_args.gguf_file}
        tokenizer = AutoTokenizer.from_pretrained(model_args.init_from_parent, **kwargs)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    if model_args.init_from_par:
        return AutoTokenizer.from_pretrained(model_args.init_from_par, trust_remote_code=True)
    return build_tokenizer(task, task_args.rendering)


def is_compiler_error(error: BaseException) -> bool:
    """Whether `error` is torch.compile failing to compile a graph (inductor / a dynamo backend), not the model."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InductorError

    return isinstance(error, (BackendCompilerFailed, InductorError))


def eager_if_compile_fails(model, evaluate: Callable[[], dict]) -> dict:
    """`evaluate()`, and once more eagerly (the same computation) when the model's compiled graphs fail to compile on
    the evaluation's shapes: the trained model is saved by then, and a compiler failure should not end the run."""
    try:
        return evaluate()
    except Exception as error:
        if getattr(model, "compiled", None) is None or not is_compiler_error(error):
            raise
        logger.warning("evaluation: torch.compile failed on the evaluation's shapes (%s: %s); evaluating eagerly "
                       "(the same computation).", type(error).__name__, str(error).splitlines()[0][:200])
        model.compile_core(disable=True)
        return evaluate()


__all__ = [
    "AUTO_COMPILE_MIN_SECONDS", "AUTO_COMPILE_MIN_STEPS", "PAPER_VIEW", "RECIPE_VIEW", "build_model",
    "build_tokenizer_for", "eager_if_compile_fails", "inductor_can_compile_for_cpu", "initial_model",
    "is_compiler_error", "par_fields", "resolve_view", "set_up_for_training", "speed_options",
    "use_tokenizer_special_tokens",
]
