"""The flags that say which records to read and how, defined once: `RecordFlags`.

train_par.py's `DataArguments` extends it (parsed by `HfArgumentParser`); the baselines (examples/baselines/rnn.py,
automata.py) add the same flags to their argparse parsers from it (`add_record_flags`), and train_par.py's
`--baselines` hands them its parsed `RecordFlags` (`record_flags_of`) instead of writing them into a command line
for them to parse again (a value such as ``->`` reads as a flag there).
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import dataclass, field, fields

from .flag_values import true_or_false


@dataclass
class RecordFlags:
    """Which records to read, from which columns, and how the validation split is made (`state_tracking.records`)."""

    train_file: str | None = field(default=None, metadata={
        "help": "training records: a path, a glob, or a comma-separated list (.csv, .tsv, .jsonl, .json, .parquet)"})
    validation_file: str | None = field(default=None, metadata={
        "help": "records evaluated after training (as test); default: --validation_split_percentage of the training "
                "file"})
    test_file: str | None = field(default=None, metadata={"help": "records evaluated after training: accuracy per "
                                                                  "sequence length present"})
    dataset_name: str | None = field(default=None, metadata={"help": "a datasets.load_dataset name or folder"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "its configuration"})
    operations_column: str | None = field(default=None, metadata={
        "help": "the operations: a list of strings, or a string split by --operation_delimiter (default: the one "
                "column with a conventional name: operations, ops, sequence, events, actions, input(s), tokens)"})
    state_column: str | None = field(default=None, metadata={
        "help": "the final state: a label or a mapping query -> label (JSON text in CSV)"})
    step_states_column: str | None = field(default=None, metadata={
        "help": "the state after each operation: a list, or a string split by --operation_delimiter"})
    initial_state_column: str | None = field(default=None, metadata={"help": "the state before the operations"})
    operation_delimiter: str | None = field(default=None, metadata={
        "help": "regex splitting a string of operations (and of step states); default whitespace"})
    skip_bad_records: bool = field(default=False, metadata={
        "help": "drop records that cannot be read and report how many (default: the first one is an error)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training records"})
    validation_split_percentage: float = field(default=5, metadata={
        "help": "with no --validation_file (and no validation split in --dataset_name): this percent of the training "
                "records, chosen at random with --seed, is held out as the validation split (0: none)"})


RECORD_FLAG_NAMES = tuple(f.name for f in fields(RecordFlags))


def _value_type(name: str) -> type:
    """The type a flag's value parses to: its annotation without the None (`str | None` -> str)."""
    hint = typing.get_type_hints(RecordFlags)[name]
    return next(t for t in typing.get_args(hint) if t is not type(None)) if typing.get_args(hint) else hint


def add_record_flags(parser, names=RECORD_FLAG_NAMES) -> None:
    """`RecordFlags`' flags `names` on an argparse parser (or argument group), each with its help and the default
    None, so the script can tell which were given; `record_flags_of` fills the defaults in."""
    by_name = {f.name: f for f in fields(RecordFlags)}
    for name in names:
        f = by_name[name]
        help_ = f"{f.metadata['help']} (default: {f.default})"
        kind = _value_type(name)
        if kind is bool:
            parser.add_argument(f"--{name}", type=true_or_false, nargs="?", const=True, default=None, help=help_)
        else:
            parser.add_argument(f"--{name}", type=kind, default=None, help=help_)


def record_flags_of(source) -> RecordFlags:
    """The `RecordFlags` of a parsed object (train_par's `DataArguments`, an argparse namespace): each field it holds
    and has set (not None), the default otherwise."""
    values = {}
    for f in fields(RecordFlags):
        value = getattr(source, f.name, None)
        if value is not None:
            values[f.name] = value
    return RecordFlags(**values)


def with_record_flags(args: argparse.Namespace, flags: RecordFlags | None) -> argparse.Namespace:
    """A baseline's parsed arguments with every record flag set: the `flags` handed over by train_par.py's
    `--baselines` (where given: they win over the command line), else the namespace's own, defaults filled in."""
    chosen = record_flags_of(args) if flags is None else flags
    for f in fields(RecordFlags):
        setattr(args, f.name, getattr(chosen, f.name))
    return args


__all__ = ["RECORD_FLAG_NAMES", "RecordFlags", "add_record_flags", "record_flags_of", "with_record_flags"]
