"""Which command-line flags apply to which data mode, for every script that has both: one table, so that a flag with
no effect in the mode a command runs in is refused by name instead of silently ignored.

A script runs on *generated* problems (a task: `--task`, `--task_file`) or on *records* (files or a `datasets` name:
`--train_file`, `--test_file`, `--dataset_name`). `check_flags(script, records=..., given=...)` raises one
`ValueError` naming every given flag of the other mode and what it needs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

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
         "probe_stop_accuracy"),
        ("validation_file", "test_file", *_READ_RECORDS, "max_train_samples", "data_name", *_READ_SPLITS,
         *_TOKENIZE_RECORDS, "stop_when_validation_exact", "restore_best_probe"),
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


def true_or_false(value: str) -> bool:
    """A boolean flag's value, the one style of every script (as HfArgumentParser, train_par.py, takes it):
    ``--flag``, ``--flag true`` / ``false`` (also yes / no, 1 / 0). Add one with ``type=true_or_false, nargs="?",
    const=True, default=False``."""
    if value.lower() in ("true", "yes", "t", "y", "1"):
        return True
    if value.lower() in ("false", "no", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def run_cli(main, argv: list[str] | None = None) -> None:
    """Run a script's `main(argv)` as its command line: a bad input (a `ValueError`: `RecordError`,
    `PromptFormatError`, a refused flag or value) prints ``error: <message>`` on stderr and exits 2, as argparse does
    for a bad flag; ``--debug`` (taken out of argv) or ``PAR_DEBUG=1`` shows the traceback instead."""
    import os
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("PAR_DEBUG", "").lower() in ("1", "true", "yes")
    argv = [a for a in argv if a != "--debug"]
    try:
        main(argv)
    except ValueError as error:
        if debug:
            raise
        print(f"error: {error}\n(the traceback: run again with --debug or PAR_DEBUG=1)", file=sys.stderr)
        raise SystemExit(2) from None


NONE_VALUES = ("none", "None", "null")


def none_or(convert):
    """An argparse `type` that reads ``none`` (also ``None``, ``null``) as None and any other value with `convert`."""
    def parse(value: str):
        return None if value in NONE_VALUES else convert(value)
    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names it in "invalid <name> value"
    return parse


def accept_none(parser: argparse.ArgumentParser, dataclass_types: Iterable[type]) -> None:
    """Let every optional number field of `dataclass_types` (a ``float | None`` or ``int | None`` whose None means
    "off", such as ``curriculum_advance_accuracy``) take ``none`` (also ``None``, ``null``) on the command line, as a
    YAML / JSON config's ``null`` does: `HfArgumentParser` types such a flag as the number alone, so without this a
    default that is set can never be unset from the command line. Other values parse as before."""
    import dataclasses
    import types
    import typing

    optional = set()
    for cls in dataclass_types:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints.get(f.name))
            if (typing.get_origin(hints.get(f.name)) in (typing.Union, types.UnionType) and type(None) in args
                    and {a for a in args if a is not type(None)} <= {int, float}):
                optional.add(f.name)

    for action in parser._actions:
        if action.dest in optional and action.type is not None:
            action.type = none_or(action.type)
            action.help = f"{action.help or ''} (none: unset)".strip()


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


__all__ = ["FLAG_MODES", "NONE_VALUES", "accept_none", "check_flags", "given_flags", "none_or", "run_cli", "true_or_false"]
