"""PAR looped Qwen2: configuration, model, and their registration with the transformers Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

from .configuration_par import ParLoopedQwenConfig
from .modeling_par import (
    ParLoopedOutput,
    ParLoopedQwenForStateTracking,
    ParLoopedQwenPreTrainedModel,
    ParPrediction,
    adapter_identity_init,
    anchor_state_norm,
    grad_window_iterations,
    halt_confirmed,
    halt_iteration,
    padded_causal_mask,
    positions_from_mask,
    state_rms,
    stretch_positions,
)

AutoConfig.register(ParLoopedQwenConfig.model_type, ParLoopedQwenConfig, exist_ok=True)
AutoModel.register(ParLoopedQwenConfig, ParLoopedQwenForStateTracking, exist_ok=True)
# The readout classifies the tokens at the query positions over the candidate answers.
AutoModelForTokenClassification.register(ParLoopedQwenConfig, ParLoopedQwenForStateTracking, exist_ok=True)

__all__ = [
    "ParLoopedQwenConfig",
    "ParLoopedQwenForStateTracking",
    "ParLoopedQwenPreTrainedModel",
    "ParLoopedOutput",
    "ParPrediction",
    "adapter_identity_init",
    "anchor_state_norm",
    "grad_window_iterations",
    "halt_confirmed",
    "halt_iteration",
    "padded_causal_mask",
    "positions_from_mask",
    "state_rms",
    "stretch_positions",
]
