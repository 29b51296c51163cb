"""LoRA on the shared core through peft; the adapter W is trained in full (`modules_to_save`)."""

from __future__ import annotations

from peft import LoraConfig, get_peft_model

CORE_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def core_lora_config(config, r: int = 16, alpha: int = 32, dropout: float = 0.0) -> LoraConfig:
    """A LoraConfig whose targets are exactly the core layers' projections (a regex over Qwen2's names)."""
    if r < 1:
        raise ValueError(f"LoRA rank r must be ≥ 1; got {r!r}.")
    first = config.prelude_layers
    layers = "|".join(str(i) for i in range(first, first + config.core_layers))
    projections = "|".join(p.replace(".", r"\.") for p in CORE_PROJECTIONS)
    return LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout,
        target_modules=rf"model\.layers\.({layers})\.({projections})",
        modules_to_save=["adapter"],
    )


def apply_core_lora(model, r: int = 16, alpha: int = 32, dropout: float = 0.0):
    """Wrap a PAR model with LoRA on its core (prelude, coda and embeddings frozen; adapter trained)."""
    return get_peft_model(model, core_lora_config(model.config, r, alpha, dropout))
