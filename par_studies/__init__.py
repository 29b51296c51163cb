"""What the study scripts (examples/reproduce/, examples/studies/) share: the row declaration and its presets
(`rows`), running a row and reading its run back (`runs`), and the --collect tables (`tables`).

Each study script declares its rows from these presets and keeps only its own logic; results are told in the study's
results README, not in the script.
"""

from .rows import (
    FULL,
    HALTING,
    HOLD_TAIL,
    KINDS,
    LOCAL,
    MASTERY,
    SELF_DISTILL,
    Preset,
    Row,
    argv,
    combine,
    halting,
    hold_tail,
    parse_argv,
    rows_by_name,
)
from .runs import (
    REPO,
    blocked_pipeline_check,
    curriculum_growth,
    latest_checkpoint,
    load_run,
    load_train_par,
    peak_rss_gb,
    repo_module,
    row_train_seconds,
    run_logged,
    thread_env,
    train_segment,
    write_shipped_summary,
)
from .tables import load_records, mean_sd, save_record, seeds_cell, splice_table

__all__ = [
    "FULL", "HALTING", "HOLD_TAIL", "KINDS", "LOCAL", "MASTERY", "REPO", "SELF_DISTILL", "Preset", "Row", "argv",
    "blocked_pipeline_check", "combine", "curriculum_growth", "halting", "hold_tail", "latest_checkpoint",
    "load_records", "load_run", "load_train_par", "mean_sd", "parse_argv", "peak_rss_gb", "repo_module",
    "row_train_seconds", "rows_by_name", "run_logged", "save_record", "seeds_cell", "splice_table", "thread_env",
    "train_segment", "write_shipped_summary",
]
