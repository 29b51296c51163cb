"""State-tracking tasks for PAR: group word problems and user state machines, their prompts,
tokenizers, datasets, and the length-generalization evaluator."""

from .accuracy import overall_state_accuracy, per_query_accuracy
from .data import (
    StateTrackingCollator,
    build_dataset,
    derive_seed,
    parse_depths,
    truncate_to_prefix,
)
from .diagnostics import (
    format_profile,
    identity_operation,
    padded_operations,
    plot_progress_profile,
    progress_profile,
)
from .evaluation import (
    STATE_ACCURACY_METRIC_PATH,
    STOP_BELOW,
    evaluate_length_generalization,
    evaluate_until_failed,
    extrapolation_factor,
    load_results,
    longest_accurate_depth,
    plot_accuracy_vs_depth,
    save_results,
)
from .prompts import RENDERINGS, prompt_format_of, symbolic_tokens, text_prompt
from .tasks import (
    GROUP_TASK_NAMES,
    TASK_FILE_NAME,
    GroupTask,
    StateMachineTask,
    Task,
    get_task,
    load_task,
    load_task_from_dir,
    save_task,
)
from .tokenization import build_tokenizer, encode_batch, model_token_ids

__all__ = [
    "GROUP_TASK_NAMES",
    "RENDERINGS",
    "STATE_ACCURACY_METRIC_PATH",
    "STOP_BELOW",
    "TASK_FILE_NAME",
    "GroupTask",
    "StateMachineTask",
    "StateTrackingCollator",
    "Task",
    "build_dataset",
    "build_tokenizer",
    "derive_seed",
    "encode_batch",
    "evaluate_length_generalization",
    "evaluate_until_failed",
    "extrapolation_factor",
    "format_profile",
    "identity_operation",
    "padded_operations",
    "plot_progress_profile",
    "progress_profile",
    "get_task",
    "load_results",
    "load_task",
    "load_task_from_dir",
    "longest_accurate_depth",
    "model_token_ids",
    "overall_state_accuracy",
    "parse_depths",
    "per_query_accuracy",
    "plot_accuracy_vs_depth",
    "save_results",
    "save_task",
    "symbolic_tokens",
    "text_prompt",
    "prompt_format_of",
    "truncate_to_prefix",
]
