"""Trainer subclasses for PAR: the progress-aligned loss, halting, depth schedules, prefix self-distillation."""

from .arguments import ParTrainingArguments
from .callbacks import (
    FreezePreludeCallback,
    ProbeCallback,
    RecordsProbeCallback,
    StateAccuracyProbeCallback,
    TimeBudgetCallback,
    checkpoint_complete,
    freeze_prelude_weights,
    last_complete_checkpoint,
    probe_stop,
    require_complete_checkpoint,
    trained_seconds,
)
from .distributed import teardown_distributed, teardown_distributed_at_exit
from .objectives import (
    OBJECTIVES,
    additive_hold_iterations,
    answer_loss,
    balanced_halt_loss,
    final_targets,
    halt_labels,
    hold_iterations,
    iterations_for_depth,
    operation_encodings,
    phrasing_alignment_loss,
    prefix_state_targets,
    progress_flag_logits,
    progress_flag_loss,
    progress_targets,
    readout_accuracy,
    waiting_row_change,
    within_operation_variance_ratio,
)
from .par_trainer import (
    ParTrainer,
    StepPlan,
    is_adapter_parameter,
    pose_positions,
    random_sorted_positions,
)
from .peft_utils import apply_core_lora, core_lora_config
from .schedules import (
    DepthBatchSampler,
    MasteryCurriculum,
    curriculum_done,
    curriculum_max_depth,
    curriculum_steps_needed,
    fixed_pace_levels,
    mastery_levels,
    mastery_max_depth,
    stretch_max_scale,
)
from .self_distillation import (
    PrefixSelfDistillationTrainer,
    SelfDistillationArguments,
    distillation_kl,
    ema_update,
    prefix_position_ids,
)

__all__ = [
    "OBJECTIVES", "additive_hold_iterations", "answer_loss", "apply_core_lora", "balanced_halt_loss",
    "checkpoint_complete", "core_lora_config", "curriculum_done", "curriculum_max_depth", "curriculum_steps_needed",
    "DepthBatchSampler", "fixed_pace_levels",
    "distillation_kl", "ema_update", "final_targets", "halt_labels", "hold_iterations", "is_adapter_parameter",
    "iterations_for_depth", "last_complete_checkpoint", "mastery_levels", "mastery_max_depth", "MasteryCurriculum",
    "operation_encodings", "ParTrainer", "ParTrainingArguments", "phrasing_alignment_loss",
    "pose_positions", "prefix_position_ids", "prefix_state_targets", "random_sorted_positions",
    "PrefixSelfDistillationTrainer",
    "ProbeCallback", "probe_stop", "progress_targets",
    "readout_accuracy", "require_complete_checkpoint", "FreezePreludeCallback", "freeze_prelude_weights",
    "SelfDistillationArguments", "RecordsProbeCallback", "StateAccuracyProbeCallback", "StepPlan",
    "stretch_max_scale", "teardown_distributed", "teardown_distributed_at_exit", "TimeBudgetCallback",
    "trained_seconds", "waiting_row_change", "progress_flag_loss", "progress_flag_logits",
    "within_operation_variance_ratio",
]
