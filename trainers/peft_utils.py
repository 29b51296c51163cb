"""LoRA through peft on the shared core (or on every layer); the adapter W is trained in full (`modules_to_save`)."""

from __future__ import annotations

from peft import LoraConfig, get_peft_model

CORE_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


LORA_LAYERS = ("core", "all")


def core_lora_config(config, r: int = 16, alpha: int = 32, dropout: float = 0.0, layers: str = "core") -> LoraConfig:
    """A LoraConfig whose targets are exactly the projections of the core layers (`layers="core"`) or of every layer,
    prelude, core and coda (`"all"`: the pretrained parent kept whole under low-rank updates), as a regex over Qwen2's
    names; embeddings and head stay frozen either way."""
    if r < 1:
        raise ValueError(f"LoRA rank r must be ≥ 1; got {r!r}.")
    if layers not in LORA_LAYERS:
        raise ValueError(f"--lora_layers must be one of {', '.join(LORA_LAYERS)}; got {layers!r}.")
    first, count = (config.prelude_layers, config.core_layers) if layers == "core" else (0, config.num_hidden_layers)
    indices = "|".join(str(i) for i in range(first, first + count))
    projections = "|".join(p.replace(".", r"\.") for p in CORE_PROJECTIONS)
    return LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout,
        target_modules=rf"model\.layers\.({indices})\.({projections})",
        modules_to_save=["adapter"],
    )


def apply_core_lora(model, r: int = 16, alpha: int = 32, dropout: float = 0.0, layers: str = "core"):
    """Wrap a PAR model with LoRA on its core (prelude, coda and embeddings frozen; adapter trained), or on every layer
    (`layers="all"`; embeddings frozen)."""
    return get_peft_model(model, core_lora_config(model.config, r, alpha, dropout, layers))
