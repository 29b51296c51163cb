"""Which command-line flags apply to which data mode, for every script that has both: one table, so that a flag with
no effect in the mode a command runs in is refused by name instead of silently ignored.

A script runs on *generated* problems (a task: `--task`, `--task_file`) or on *records* (files or a `datasets` name:
`--train_file`, `--test_file`, `--dataset_name`). `check_flags(script, records=..., given=...)` raises one
`ValueError` naming every given flag of the other mode and what it needs.
"""

from __future__ import annotations

from collections.abc import Iterable

# the names this module held before the CLI pieces moved out (run_cli to .cli, true_or_false / none_or to
# .flag_values, accept_none to .hf_parser), for the scripts that still import them from here
from .cli import run_cli  # noqa: F401
from .flag_values import NONE_VALUES, none_or, true_or_false  # noqa: F401
from .hf_parser import accept_none  # noqa: F401

# the records' reading flags, the same in every script that reads records
_READ_RECORDS = ("dataset_config_name", "operations_column", "state_column", "step_states_column",
                 "initial_state_column", "operation_delimiter", "skip_bad_records")
# how a training script's record tokenizer reads an operation (evaluate_par.py reads the checkpoint's own)
_TOKENIZE_RECORDS = ("operation_tokens",)
# how train_par.py reads its record splits (DataArguments)
_READ_SPLITS = ("max_eval_samples", "validation_split_percentage", "preprocessing_num_workers", "overwrite_cache",
                "cache_dir", "dataset_revision", "token", "trust_remote_code")

# script -> (flags that apply only to generated problems, flags that apply only to records)
FLAG_MODES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "train_par.py": (
        ("task", "task_file", "rendering", "random_initial", "train_size", "eval_depths", "probe_depth", "probe_seed",
         "probe_stop_accuracy", "probe_phrasing"),
        ("validation_file", "test_file", *_READ_RECORDS, "max_train_samples", "data_name", *_READ_SPLITS,
         *_TOKENIZE_RECORDS, "stop_when_validation_exact", "restore_best_probe", "stop_when_learning_nothing_after",
         "baselines", "recipe"),
    ),
    "evaluate_par.py": (
        ("task", "depths", "rendering", "random_initial", "phrasing", "seed", "step_size", "fixed_iterations",
         "padding_control", "compile"),
        (*_READ_RECORDS, "split"),
    ),
    "rnn.py": (
        ("task", "train_size", "eval_depths", "eval_n"),
        ("validation_file", "test_file", *_READ_RECORDS, "max_train_samples", "validation_split_percentage",
         *_TOKENIZE_RECORDS, "stop_when_validation_exact", "probe_n", "probe_every_steps", "probe_stop_patience"),
    ),
}


def given_flags(argv: Iterable[str], fields: Iterable[str] = ()) -> set[str]:
    """The flag names a command line gives (`--name value`, `--name=value`, hyphen aliases read as underscores).
    `--no_name`, HfArgumentParser's negation of a bool field `name` that defaults to True, counts as `name` given
    when `name` is among `fields` (the parser's field names) and `no_name` is not."""
    fields = set(fields)
    names = {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if isinstance(a, str) and a.startswith("--")}
    return {n[3:] if n.startswith("no_") and n not in fields and n[3:] in fields else n for n in names}


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
