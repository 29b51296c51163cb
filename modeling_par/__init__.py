"""PAR looped Qwen2: configuration, model, and their registration with the transformers Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

from . import modeling_par as _modeling
from .configuration_par import ParLoopedQwenConfig
from .modeling_par import *  # noqa: F401,F403  (its __all__: the model, outputs and PAR functions)
from .modeling_par import ParLoopedQwenForStateTracking

AutoConfig.register(ParLoopedQwenConfig.model_type, ParLoopedQwenConfig, exist_ok=True)
AutoModel.register(ParLoopedQwenConfig, ParLoopedQwenForStateTracking, exist_ok=True)
# The readout classifies the tokens at the query positions over the candidate answers.
AutoModelForTokenClassification.register(ParLoopedQwenConfig, ParLoopedQwenForStateTracking, exist_ok=True)

__all__ = ["ParLoopedQwenConfig", *_modeling.__all__]
