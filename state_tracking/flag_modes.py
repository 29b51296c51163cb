"""Which command-line flags apply to which data mode, for every script that has both: one table, so that a flag with
no effect in the mode a command runs in is refused by name instead of silently ignored.

A script runs on *generated* problems (a task: `--task`, `--task_file`) or on *records* (files or a `datasets` name:
`--train_file`, `--test_file`, `--dataset_name`). `check_flags(script, records=..., given=...)` raises one
`ValueError` naming every given flag of the other mode and what it needs.
"""

from __future__ import annotations

from collections.abc import Iterable

# the records' reading flags, the same in every script that reads records
_READ_RECORDS = ("dataset_config_name", "operations_column", "state_column", "step_states_column",
                 "initial_state_column", "operation_delimiter", "skip_bad_records")

# script -> (flags that apply only to generated problems, flags that apply only to records)
FLAG_MODES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "train_par.py": (
        ("task", "task_file", "rendering", "random_initial", "train_size", "eval_depths", "probe_depth"),
        ("validation_file", "test_file", *_READ_RECORDS, "max_train_samples", "data_name"),
    ),
    "evaluate_par.py": (
        ("task", "depths", "rendering", "random_initial", "phrasing", "seed", "step_size", "fixed_iterations",
         "padding_control", "compile"),
        (*_READ_RECORDS, "split"),
    ),
    "rnn.py": (
        ("task", "train_size", "eval_depths", "eval_n"),
        ("validation_file", "test_file", *_READ_RECORDS, "max_train_samples"),
    ),
}


def given_flags(argv: Iterable[str]) -> set[str]:
    """The flag names a command line gives (`--name value`, `--name=value`, hyphen aliases read as underscores)."""
    return {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if isinstance(a, str) and a.startswith("--")}


def check_flags(script: str, records: bool, given: Iterable[str]) -> None:
    """One error naming every flag in `given` that has no effect in this mode of `script` (see `FLAG_MODES`)."""
    if script not in FLAG_MODES:
        raise ValueError(f"check_flags: unknown script {script!r}; known: {sorted(FLAG_MODES)}")
    generated_only, records_only = FLAG_MODES[script]
    given = set(given)
    if records:
        wrong = [f"--{name}" for name in generated_only if name in given]
        if wrong:
            raise ValueError(f"{script}: {', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to generated "
                             "problems only; with --train_file / --test_file / --dataset_name the records are the data "
                             f"({'it has' if len(wrong) == 1 else 'they have'} no effect there).")
    else:
        wrong = [f"--{name}" for name in records_only if name in given]
        if wrong:
            raise ValueError(f"{script}: {', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to recorded "
                             "data only: give --train_file, --test_file or --dataset_name (without them the problems "
                             "are generated from the task).")


__all__ = ["FLAG_MODES", "check_flags", "given_flags"]
