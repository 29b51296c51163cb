"""PAR looped Qwen2: configuration, model, and their registration with the transformers Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification
from transformers.pipelines import PIPELINE_REGISTRY

from . import modeling_par as _modeling
from .configuration_par import ParLoopedQwenConfig
from .modeling_par import *  # noqa: F401,F403  (its __all__: the model, outputs and PAR functions)
from .modeling_par import ParLoopedQwenForStateTracking
from .pipeline_par import PIPELINE_TASK, StateTrackingPipeline
from .prompt_format import PromptFormat, PromptFormatError

AutoConfig.register(ParLoopedQwenConfig.model_type, ParLoopedQwenConfig, exist_ok=True)
AutoModel.register(ParLoopedQwenConfig, ParLoopedQwenForStateTracking, exist_ok=True)
# The readout classifies the tokens at the query positions over the candidate answers.
AutoModelForTokenClassification.register(ParLoopedQwenConfig, ParLoopedQwenForStateTracking, exist_ok=True)
# pipeline("state-tracking", model=...) with the package installed; a checkpoint folder names it in custom_pipelines
PIPELINE_REGISTRY.register_pipeline(PIPELINE_TASK, pipeline_class=StateTrackingPipeline, pt_model=AutoModel)

__all__ = ["ParLoopedQwenConfig", "PromptFormat", "PromptFormatError", "StateTrackingPipeline", *_modeling.__all__]
