"""Pretrained parents for the retrofit: a Qwen2 causal LM as is, a Llama-architecture one converted exactly into
Qwen2, optionally cut to its first layers. A model passed in is read, never changed: what is asked of it (another
dtype, fewer layers, Qwen2's layout) comes back as a new model.

Llama's decoder layer is Qwen2's without the q/k/v biases: a `Qwen2ForCausalLM` with the same sizes, rope and norm
settings, the same weights and zero q/k/v biases computes the same logits (`qwen2_from_llama`). A config that Qwen2
cannot express (attention or MLP biases, a head_dim other than hidden_size / num_attention_heads, a rope type
transformers does not know) is refused, naming the field. A folder may hold safetensors or, with `gguf_file`, a GGUF
file (transformers dequantizes it to fp32 on load; it needs the `gguf` package).

    parent = load_parent("path/to/SmolLM2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", num_layers=9)
    # -> Qwen2ForCausalLM with the first 9 of SmolLM2's 30 layers, the final norm and the tied head

`retrofit` is the body of `ParLoopedQwenForStateTracking.from_pretrained_parent`. The model file imports this module
only inside that classmethod, so a checkpoint's remote code (what inference loads) does not carry it.
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn
from transformers import AutoConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Llama config fields Qwen2Config has under the same name and meaning (everything a LlamaConfig sets that a Qwen2
# layer reads); the rest are checked in `check_llama_config` or are bookkeeping.
SHARED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps",
                 "rope_parameters", "tie_word_embeddings", "attention_dropout", "bos_token_id", "eos_token_id",
                 "pad_token_id")
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the dtypes a parent may be loaded in by name (or "auto": as saved)


def check_llama_config(config) -> None:
    """Refuse, naming the field, a Llama config that a Qwen2 decoder cannot compute exactly."""
    name = type(config).__name__
    if getattr(config, "attention_bias", False):
        raise ValueError(f"{name}.attention_bias = True: Qwen2's o_proj has no bias, so this parent cannot be "
                         "converted into Qwen2 exactly (allowed: attention_bias = False).")
    if getattr(config, "mlp_bias", False):
        raise ValueError(f"{name}.mlp_bias = True: Qwen2's MLP has no biases (allowed: mlp_bias = False).")
    head_dim = getattr(config, "head_dim", None)
    natural = config.hidden_size // config.num_attention_heads
    if head_dim is not None and head_dim != natural:
        raise ValueError(f"{name}.head_dim = {head_dim}: the retrofit's Qwen2 layers need head_dim = hidden_size / "
                         f"num_attention_heads = {natural}.")
    rope = getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"{name}.rope_parameters['rope_type'] = {rope_type!r} is not a rope type Qwen2's rotary "
                         f"embedding knows (allowed: 'default', {', '.join(map(repr, sorted(ROPE_INIT_FUNCTIONS)))}).")


def qwen2_config_from_llama(config) -> Qwen2Config:
    """The `Qwen2Config` that computes what this Llama config computes (no sliding window, every layer full
    attention); `check_llama_config` first."""
    check_llama_config(config)
    fields = {k: getattr(config, k) for k in SHARED_FIELDS if getattr(config, k, None) is not None}
    qwen2 = Qwen2Config(**fields, use_sliding_window=False, sliding_window=None,
                        layer_types=["full_attention"] * config.num_hidden_layers)
    qwen2._attn_implementation = config._attn_implementation
    return qwen2


def parent_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str | None:
    """`dtype` as `from_pretrained` takes it: None (transformers' default), "auto" (as saved), or a floating
    `torch.dtype`, also given by name ("float32", "bfloat16", "float16"); anything else is a ValueError."""
    if dtype is None or dtype == "auto":
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPE_NAMES:
        dtype = getattr(torch, dtype.removeprefix("torch."))
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, one of {list(DTYPE_NAMES)} or 'auto'; got {dtype!r}.")
    return dtype


@torch.no_grad()
def _qwen2_holding(config: Qwen2Config, weights: dict, like: nn.Module,
                   dtype: torch.dtype | None = None) -> Qwen2ForCausalLM:
    """A new `Qwen2ForCausalLM` of `config` holding copies of `weights` (q/k/v biases they lack: zero), on `like`'s
    device, in `dtype` (default: `like`'s) and in `like`'s train / eval mode."""
    weight = next(like.parameters())
    with torch.device("meta"):
        qwen2 = Qwen2ForCausalLM(config)
    qwen2 = qwen2.to_empty(device=weight.device).to(dtype or weight.dtype)
    missing, unexpected = qwen2.load_state_dict(weights, strict=False)
    biases = {k for k in missing if k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))}
    if qwen2.config.tie_word_embeddings:
        qwen2.lm_head.weight = qwen2.model.embed_tokens.weight
        missing = [k for k in missing if k != "lm_head.weight"]
    if unexpected or set(missing) - biases:
        raise ValueError(f"the parent's weights do not map onto Qwen2's: missing {sorted(set(missing) - biases)}, "
                         f"unexpected {sorted(unexpected)}.")
    for key in biases:
        qwen2.get_parameter(key).zero_()
    # the rotary embedding's buffers are not weights: built on meta, they are computed again where the weights are
    qwen2.model.rotary_emb = type(qwen2.model.rotary_emb)(qwen2.config).to(weight.device)
    return qwen2.train(like.training)


def qwen2_from_llama(llama: LlamaForCausalLM, dtype: torch.dtype | None = None) -> Qwen2ForCausalLM:
    """A `Qwen2ForCausalLM` computing exactly what `llama` computes: its weights under the same names, zero q/k/v
    biases (Llama's attention has none), the same device and dtype (or `dtype`); `llama` is not changed."""
    if not isinstance(llama, LlamaForCausalLM):
        raise ValueError(f"qwen2_from_llama: expected a LlamaForCausalLM, got {type(llama).__name__}.")
    return _qwen2_holding(qwen2_config_from_llama(llama.config), llama.state_dict(), llama, dtype)


def _check_num_layers(num_layers, total: int) -> None:
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be an integer in [1, {total}] (the parent's num_hidden_layers); "
                         f"got {num_layers!r}.")


def first_layers(model: Qwen2ForCausalLM, num_layers: int) -> Qwen2ForCausalLM:
    """The parent cut to its first `num_layers` decoder layers (then its final norm and LM head), in place: a
    truncated parent, for retrofits whose whole stack does not fit the compute at hand (`load_parent(num_layers=)`
    cuts a copy of a model passed in)."""
    _check_num_layers(num_layers, model.config.num_hidden_layers)
    model.model.layers = nn.ModuleList(list(model.model.layers)[:num_layers])
    model.config.num_hidden_layers = num_layers
    if getattr(model.config, "layer_types", None) is not None:
        model.config.layer_types = list(model.config.layer_types)[:num_layers]
    return model


def qwen2_copy(model: Qwen2ForCausalLM, dtype: torch.dtype | None = None,
               num_layers: int | None = None) -> Qwen2ForCausalLM:
    """A copy of `model` in `dtype` (default: its own) with its first `num_layers` decoder layers (default: all),
    then its final norm and LM head; only the layers kept are copied, and `model` is not changed."""
    _check_num_layers(model.config.num_hidden_layers if num_layers is None else num_layers,
                      model.config.num_hidden_layers)
    config = copy.deepcopy(model.config)
    if num_layers is not None:
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = list(config.layer_types)[:num_layers]
    weights = {k: v for k, v in model.state_dict().items()
               if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= config.num_hidden_layers)}
    return _qwen2_holding(config, weights, model, dtype)


def _check_source(path: str | os.PathLike, gguf_file: str | None) -> None:
    """A ValueError naming the path for a parent `from_pretrained` cannot read: a local path that does not exist (and
    is no Hub id), a folder without config.json (unless a GGUF file is named) or without the GGUF file named."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    path = os.fspath(path)
    if os.path.isdir(path):
        if gguf_file is not None and not os.path.isfile(os.path.join(path, gguf_file)):
            there = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
            raise ValueError(f"gguf_file {gguf_file!r}: no such file in the parent's folder {path} (GGUF files there: "
                             f"{there or 'none'}).")
        if gguf_file is None and not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"parent {path}: the folder has no config.json (a save_pretrained folder has one; for a "
                             "GGUF file in it, give gguf_file).")
        return
    if os.path.exists(path):
        raise ValueError(f"parent {path}: a file; give the folder that holds the model (and gguf_file for a GGUF "
                         "file in it) or a Hub id.")
    try:
        validate_repo_id(path)
    except HFValidationError:
        raise ValueError(f"parent {path}: no such folder, and not a Hub id (owner/name).") from None


def load_parent(model_or_path, gguf_file: str | None = None, dtype: torch.dtype | str | None = None,
                num_layers: int | None = None) -> Qwen2ForCausalLM:
    """The retrofit's parent as a `Qwen2ForCausalLM`: a Hub id or folder (with `gguf_file`: a GGUF file in it) loaded
    by its config's model_type, a Llama converted (`qwen2_from_llama`), a Qwen2 model passed in as is. `dtype` (a
    `torch.dtype`, its name, or "auto": as saved) loads or casts it; `num_layers` keeps only the first layers.

    A model passed in is never changed: cast, cut or converted, the parent is a new model (`qwen2_copy`); passed in
    with nothing to change (a Qwen2 in `dtype`, all its layers), it is returned itself."""
    dtype = parent_dtype(dtype)
    if isinstance(model_or_path, (str, os.PathLike)):
        _check_source(model_or_path, gguf_file)
        kwargs = {} if gguf_file is None else {"gguf_file": gguf_file}
        model_type = AutoConfig.from_pretrained(model_or_path, **kwargs).model_type
        if dtype is not None:
            kwargs["dtype"] = dtype
        if model_type == "qwen2":
            parent = Qwen2ForCausalLM.from_pretrained(model_or_path, **kwargs)
        elif model_type == "llama":
            parent = LlamaForCausalLM.from_pretrained(model_or_path, **kwargs)
        else:
            raise ValueError(f"parent {model_or_path}: model_type {model_type!r}; the retrofit takes a Qwen2 parent "
                             "or a Llama-architecture one (model_type 'qwen2' or 'llama').")
        if isinstance(parent, LlamaForCausalLM):
            parent = qwen2_from_llama(parent)
        return parent if num_layers is None else first_layers(parent, num_layers)  # our own copy: cut in place
    if gguf_file is not None:
        raise ValueError("gguf_file names a file inside a folder: give the folder as model_or_path, not a model.")
    cast = dtype if isinstance(dtype, torch.dtype) else None  # "auto" / None: a model passed in keeps its dtype
    if isinstance(model_or_path, LlamaForCausalLM):
        parent = qwen2_from_llama(model_or_path, cast)
        return parent if num_layers is None else first_layers(parent, num_layers)
    if not isinstance(model_or_path, Qwen2ForCausalLM):
        raise ValueError("the parent must be a Hub id, a local folder, a Qwen2ForCausalLM or a LlamaForCausalLM; "
                         f"got {type(model_or_path).__name__}.")
    total = model_or_path.config.num_hidden_layers
    if num_layers is not None:
        _check_num_layers(num_layers, total)
    if (cast is None or cast == model_or_path.dtype) and num_layers in (None, total):
        return model_or_path
    return qwen2_copy(model_or_path, cast, num_layers)


def retrofit(model_class, model_or_path, prelude_layers: int, core_layers: int, coda_layers: int,
             answer_token_ids: list[int], halt_token_ids: tuple[int, int] | None = None,
             dtype: torch.dtype | str | None = None, gguf_file: str | None = None, truncate: bool = False,
             **par_kwargs):
    """A new `model_class` (`ParLoopedQwenForStateTracking`) from a pretrained parent: see its
    `from_pretrained_parent`, whose body this is. The parent is `load_parent`'s (a Llama converted exactly into Qwen2);
    its layers [0, P) become the prelude, [P, P+C) the core, the rest the coda, every weight copied unchanged and the
    adapter new (W = [0 | I], from `_init_weights`). `par_kwargs` go to the PAR config."""
    name = "from_pretrained_parent"
    if not isinstance(model_or_path, (str, os.PathLike, Qwen2ForCausalLM, LlamaForCausalLM)):
        raise ValueError(
            f"{name}: model_or_path must be a Hub id, a local path, a Qwen2ForCausalLM or a LlamaForCausalLM; "
            f"got {type(model_or_path).__name__}."
        )
    dtype = parent_dtype(dtype)
    from_path = isinstance(model_or_path, (str, os.PathLike))
    # a model passed in is read as is (a Llama: converted into a new one); the copy below casts its weights
    parent = load_parent(model_or_path, gguf_file=gguf_file, dtype=dtype if from_path else None)
    layers = prelude_layers + core_layers + coda_layers
    if truncate and layers > parent.config.num_hidden_layers:
        raise ValueError(f"{name}(truncate=True): prelude_layers + core_layers + coda_layers = {layers} exceeds "
                         f"the parent's num_hidden_layers = {parent.config.num_hidden_layers}.")
    parent_config = parent.config.to_dict()
    for key in ("model_type", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype",
                "quantization_config"):
        parent_config.pop(key, None)
    if truncate:  # the first P + C + Q layers: cut the config and the weights read, never the caller's model
        parent_config["num_hidden_layers"] = layers
        if parent_config.get("layer_types") is not None:
            parent_config["layer_types"] = list(parent_config["layer_types"])[:layers]
    if parent_config.get("num_hidden_layers") != layers:
        raise ValueError(
            f"{name}: prelude_layers + core_layers + coda_layers = {layers} must equal the parent's "
            f"num_hidden_layers = {parent_config.get('num_hidden_layers')} (truncate=True keeps only the parent's "
            "first P + C + Q layers)."
        )
    config = model_class.config_class(prelude_layers=prelude_layers, core_layers=core_layers,
                                      coda_layers=coda_layers, answer_token_ids=answer_token_ids,
                                      halt_token_ids=halt_token_ids, **par_kwargs, **parent_config)
    config._attn_implementation = parent.config._attn_implementation
    weight = next(parent.parameters())
    model = model_class(config).to(dtype=dtype if isinstance(dtype, torch.dtype) else weight.dtype,
                                   device=weight.device)
    weights = {k: v for k, v in parent.state_dict().items()
               if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= layers)}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    new = ({"adapter.weight", "lm_head.weight", "state_head.weight"}
           | {f"core_conv.{i}.weight" for i in range(core_layers)})
    if unexpected or set(missing) - new:
        raise ValueError(f"{name}: parent weights do not match: missing {missing}, unexpected {unexpected}.")
    if "lm_head.weight" in missing:  # a parent whose state dict left out its tied head
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


__all__ = ["DTYPE_NAMES", "check_llama_config", "first_layers", "load_parent", "parent_dtype",
           "qwen2_config_from_llama", "qwen2_copy", "qwen2_from_llama", "retrofit"]
