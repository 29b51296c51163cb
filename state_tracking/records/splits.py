"""The splits a training run reads: training records (read, learned, encoded), and the validation / test splits
encoded with the training vocabulary (`read_record_splits`); every record's length checked against the loop.

A validation split is the file given, else the dataset's own, else `validation_split_percentage` percent of the
training file (a seeded random choice; its records are not trained on), as transformers' example scripts do. One of
fewer than `MIN_VALIDATION_RECORDS` records is probed and evaluated but cannot stop training
(`RecordSplits.stop_rule_off` says why; a 5% split of a 40-record file is 2 records, and two exact probes of 2 records
are luck as often as learning).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow.compute as pc
from datasets import Dataset, concatenate_datasets

from modeling_par.record_format import RecordFormat

from .encode import (
    build_record_tokenizer,
    check_distinct_encodings,
    check_operation_tokens,
    discover_format,
    encode_records,
)
from .io import RecordColumns, RecordError, dataset_split_names, file_stem, load_raw, resolve_columns
from .normalize import check_likely_delimiter, find_query_names, keep_rows, normalize

MIN_VALIDATION_RECORDS = 32  # the fewest validation records the stop rule (--stop_when_validation_exact) stops on


@dataclass
class LoadedRecords:
    """Normalized records of one split, with what was skipped (``skip_bad_records``) and where they came from."""

    dataset: Dataset
    columns: RecordColumns
    sources: list[str]
    skipped: list[str]
    query_names: list[str]


@dataclass(frozen=True)
class ReadOptions:
    """How files are read (`DataArguments` of train_par.py): ``load_dataset``'s cache and Hub options, the workers
    of the maps (``--preprocessing_num_workers``) and whether their cache is reused (``--overwrite_cache``)."""

    num_proc: int | None = None
    overwrite_cache: bool = False
    cache_dir: str | None = None
    revision: str | None = None
    token: str | bool | None = None
    trust_remote_code: bool = False

    def hub(self) -> dict:
        return {"cache_dir": self.cache_dir, "revision": self.revision, "token": self.token,
                "trust_remote_code": self.trust_remote_code}


def _check_count(value, flag: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise RecordError(f"{flag} must be an integer >= 1 (the first N records) or unset; got {value!r}.")


def load_record_files(files: str | Sequence[str] | None = None, columns: RecordColumns | None = None,
                      dataset_name: str | None = None, dataset_config_name: str | None = None, split: str = "train",
                      query_names: list[str] | None = None, skip_bad_records: bool = False,
                      max_records: int | None = None, options: ReadOptions = ReadOptions(),
                      flag: str = "--train_file", max_records_flag: str = "--max_train_samples",
                      remembered: dict | None = None) -> LoadedRecords:
    """Read and check records from files (a path, glob or comma-separated list; CSV / JSON Lines / Parquet by
    extension, CSV / JSON Lines also compressed) or from `datasets.load_dataset(dataset_name, dataset_config_name,
    split=split)`.

    Returns normalized records: ``operations`` (d strings), ``labels`` (d rows of Q labels, "" where not recorded),
    ``initial`` (Q labels or empty). `query_names` (e.g. from the training split) fixes the queries; otherwise the
    first state that parses sets them; `remembered` (a checkpoint's `RecordFormat.columns`) names the columns a
    flag leaves unnamed, where the file has them.
    """
    _check_count(max_records, max_records_flag)
    columns = columns or RecordColumns()
    raw = load_raw(files, dataset_name, dataset_config_name, split, flag, **options.hub())
    sources = [source for source, _ in raw]
    parts, skipped, resolved = [], [], None
    for source_index, (source, data) in enumerate(raw):
        cols = resolve_columns(data.column_names, columns, source, remembered)
        if resolved is not None and cols != resolved:
            raise RecordError(f"{source}: its columns resolve to {cols} but the first file's to {resolved}; name the "
                              "columns with the --*_column flags.")
        resolved = cols
        if max_records is not None:
            remaining = max_records - sum(len(p) for p in parts)
            if remaining <= 0:
                break
            data = data.select(range(min(remaining, len(data)))).flatten_indices()
        if query_names is None:
            query_names = find_query_names(data, cols)
        normalized, bad = normalize(data, cols, source, source_index, query_names, skip_bad_records,
                                    options.num_proc, load_from_cache_file=not options.overwrite_cache)
        check_likely_delimiter(normalized, cols, data, source)
        skipped += bad
        parts.append(normalized)
    dataset = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    if len(dataset) == 0:
        raise RecordError(f"no record left to read in {sources}"
                          + (f" ({len(skipped)} skipped)" if skipped else "") + ".")
    return LoadedRecords(dataset, resolved, sources, skipped, list(query_names))


@dataclass
class RecordSplits:
    """Training records read, learned and encoded, with the evaluation splits (name -> (LoadedRecords, encoded)) and
    the records skipped per split (``skip_bad_records``)."""

    train: LoadedRecords
    encoded: Dataset
    record_format: RecordFormat
    tokenizer: Any
    splits: dict
    skipped: dict
    seconds: float
    mode: str | None = None  # the training mode a trainer chose for these records, and why
    notes: list = field(default_factory=list)  # what reading decided (a validation split made, ...), for the log
    validation_from: str = ""  # where the validation split came from, as `stop_rule_off` names it
    operation_tokens: str = "words"  # how the encodings read an operation (`build_record_tokenizer`)

    @property
    def stop_rule_off(self) -> str | None:
        """Why the validation split cannot stop training (``--stop_when_validation_exact``), or None where it can: it
        holds fewer than `MIN_VALIDATION_RECORDS` records, too few for exact probes to mean that the records were
        learned. Such a split is still probed and evaluated; the run trains to its step cap."""
        if "validation" not in self.splits or len(self.splits["validation"][1]) >= MIN_VALIDATION_RECORDS:
            return None
        n = len(self.splits["validation"][1])
        return (f"the validation split ({self.validation_from}) holds {n} record{'s' if n != 1 else ''}, fewer than "
                f"{MIN_VALIDATION_RECORDS}: too few for --stop_when_validation_exact to tell learned records from "
                "luck, so training does not stop on it (it is still probed and evaluated); to stop on validation, "
                f"give a --validation_file of at least {MIN_VALIDATION_RECORDS} records or a larger "
                "--validation_split_percentage")

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray(self.encoded.data.table.column("depth").to_numpy(), dtype=np.int64)

    def summary(self) -> str:
        lengths = self.lengths
        return (f"{len(self.encoded)} training records ({len(self.record_format.operations)} operations, "
                f"{len(self.record_format.candidates)} labels, {len(self.record_format.query_names)} queries) of "
                f"lengths {lengths.min()}..{lengths.max()}, prepared in {self.seconds:.1f} s "
                f"({self.seconds * 1e5 / len(self.encoded):.1f} s per 100k); evaluation splits: "
                + (", ".join(f"{name} ({len(enc)})" for name, (_, enc) in self.splits.items()) or "none"))


def longest_records(encoded: Dataset, n: int) -> Dataset:
    """The `n` longest records of an encoded split (the earlier of equals first, kept in file order): what the
    validation probe scores. Length generalization fails first on the longest records, so a probe of them is the
    stricter test that training may stop (a probe of the first 256 of lengths 6..21 was exact twice while the test
    split's 21-statement records were 98.8% right: results/own_data_cpu/README.md)."""
    import numpy as np

    depth = np.asarray(encoded["depth"], dtype=np.int64)
    chosen = np.sort(np.argsort(-depth, kind="stable")[:n])
    return encoded.select(chosen.tolist()).flatten_indices()  # its own table: readers of .data see only these rows


def records_across_lengths(encoded: Dataset, n: int) -> Dataset:
    """`n` records of an encoded split spread evenly over its lengths (every record when it holds no more than `n`):
    ordered by length, every (len / n)-th, kept in file order. What the recipe race scores: early in training the
    longest records are wrong under every candidate, and the shorter ones tell the candidates apart."""
    import numpy as np

    depth = np.asarray(encoded["depth"], dtype=np.int64)
    order = np.argsort(depth, kind="stable")
    if len(order) > n:
        order = order[np.linspace(0, len(order) - 1, n).round().astype(np.int64)]
    return encoded.select(np.sort(order).tolist()).flatten_indices()


def within_reach(split: str, loaded: LoadedRecords, encoded: Dataset, longest: int, why: str,
                 skip: bool) -> tuple[Dataset, list[str]]:
    """`encoded` without the records of more than `longest` operations (and `loaded.dataset` likewise), with what
    was dropped (split, file, record (0-based), length, `why`); without `skip` the first such record is one
    `RecordError` naming it and the way out."""
    lengths = pc.list_value_length(loaded.dataset.data.table.column("operations")).to_numpy(zero_copy_only=False)
    over = np.flatnonzero(lengths > longest)
    if not len(over):
        return encoded, []
    bad = loaded.dataset.select(over)
    named = [f"{loaded.sources[src]}, record {rec} (0-based) has {int(n)} operations"
             for src, rec, n in zip(bad["source"], bad["record"], lengths[over])]
    if not skip:
        raise RecordError(f"{split} split: {named[0]}, more than the {longest} {why}, or pass --skip_bad_records "
                          f"true to drop such records ({len(over)} in this split).")
    depth = np.asarray(encoded.data.table.column("depth").to_numpy(), dtype=np.int64)
    loaded.dataset = keep_rows(loaded.dataset, lengths <= longest)
    return keep_rows(encoded, depth <= longest), [f"{n}: more than {longest} operations" for n in named]


def check_record_lengths(records: RecordSplits, max_iterations: int, step_size: int = 1, skip: bool = False) -> None:
    """Every record of every split within the loop's reach, before training: a record of d operations needs ⌈d / c⌉
    iterations, at most `max_iterations` (a longer one would crash training when the curriculum reaches it, or the
    evaluation after training). A longer record is one error naming its split, file, record (0-based) and length,
    and the flag; with `skip` (--skip_bad_records) it is dropped and counted with the split's skipped records."""
    longest = max_iterations * step_size
    why = (f"the loop can run (--max_iterations {max_iterations} x --step_size {step_size}); raise "
           "--max_iterations")
    kept, dropped = within_reach("train", records.train, records.encoded, longest, why, skip)
    if dropped and not len(kept):
        raise RecordError(f"every training record is longer than --max_iterations {max_iterations} allows.")
    records.encoded = kept
    records.skipped.setdefault("train", []).extend(dropped)
    for split, (loaded, encoded) in list(records.splits.items()):
        kept, dropped = within_reach(split, loaded, encoded, longest, why, skip)
        records.splits[split] = (loaded, kept)
        records.skipped.setdefault(split, []).extend(dropped)


def _split_off(train: LoadedRecords, percentage: float, seed: int) -> tuple[LoadedRecords, LoadedRecords]:
    """`percentage` percent of the training records (a seeded random choice, at least one) as a validation split;
    the rest stay for training."""
    n = len(train.dataset)
    count = max(1, int(round(n * percentage / 100)))
    if count >= n:
        raise RecordError(f"--validation_split_percentage {percentage} leaves no training record of {n}.")
    chosen = np.zeros(n, dtype=bool)
    chosen[np.random.default_rng(seed).choice(n, size=count, replace=False)] = True
    validation = LoadedRecords(keep_rows(train.dataset, chosen), train.columns, train.sources, [], train.query_names)
    train.dataset = keep_rows(train.dataset, ~chosen)
    return train, validation


def _tokenizer_for(record_format: RecordFormat, operation_tokens: str, columns: RecordColumns):
    """The records' tokenizer (`build_record_tokenizer`), checked to keep distinct operations apart."""
    tokenizer = build_record_tokenizer(record_format, operation_tokens)
    check_distinct_encodings(record_format, tokenizer, columns)
    return tokenizer


def _encode_split(loaded: LoadedRecords, record_format: RecordFormat, tokenizer, skip_bad_records: bool,
                  options: ReadOptions, held_out: bool = False) -> tuple[Dataset, list]:
    """One split encoded (`encode_records`) and its skipped records. A validation split cut from the training file
    (`held_out`) may hold an operation or label only it has: dropped and counted, never an error (its reading skipped
    nothing of its own: the training file's skips are the train split's)."""
    encoded, bad = encode_records(loaded, record_format, tokenizer, held_out or skip_bad_records, options.num_proc,
                                  not options.overwrite_cache)
    return encoded, bad if held_out else loaded.skipped + bad


def reencode_record_splits(records: RecordSplits, operation_tokens: str, skip_bad_records: bool = False,
                           options: ReadOptions = ReadOptions()) -> RecordSplits:
    """The same records with another reading of an operation (`build_record_tokenizer`'s `operation_tokens`): only the
    tokenizer and the encodings change; nothing is read again (the files, the splits, the vocabulary are the ones
    `read_record_splits` read). The validation split cut from the training file drops, never refuses, an operation
    only it holds, as there."""
    started = time.time()
    check_operation_tokens(operation_tokens)
    record_format = records.record_format
    tokenizer = _tokenizer_for(record_format, operation_tokens, records.train.columns)
    skipped, splits = {}, {}
    encoded, skipped["train"] = _encode_split(records.train, record_format, tokenizer, skip_bad_records, options)
    cut = records.validation_from.startswith("--validation_split_percentage")
    for split, (loaded, _) in records.splits.items():
        split_encoded, skipped[split] = _encode_split(loaded, record_format, tokenizer, skip_bad_records, options,
                                                      held_out=split == "validation" and cut)
        splits[split] = (loaded, split_encoded)
    return replace(records, encoded=encoded, tokenizer=tokenizer, splits=splits, skipped=skipped,
                   seconds=records.seconds + time.time() - started, operation_tokens=operation_tokens,
                   notes=list(records.notes))


def _check_split_arguments(operation_tokens: str, max_eval_samples: int | None,
                           validation_split_percentage: float | None, max_train_samples: int | None) -> None:
    """The first bad argument of `read_record_splits`, refused: `operation_tokens`, --max_eval_samples,
    --validation_split_percentage, --max_train_samples."""
    check_operation_tokens(operation_tokens)
    _check_count(max_eval_samples, "--max_eval_samples")
    if validation_split_percentage is not None and (isinstance(validation_split_percentage, bool) or not isinstance(
            validation_split_percentage, (int, float)) or not 0 <= validation_split_percentage < 100):
        raise RecordError(f"--validation_split_percentage must be a number in [0, 100) (0: no validation split made "
                          f"from the training file); got {validation_split_percentage!r}.")
    _check_count(max_train_samples, "--max_train_samples")


def _cut_validation(train: LoadedRecords, percentage: float, seed: int, max_train_samples: int | None,
                    max_eval_samples: int | None) -> tuple[LoadedRecords, LoadedRecords, str, str]:
    """--validation_split_percentage: `percentage` percent of the training records held out (`_split_off`), then
    each part truncated (--max_train_samples, --max_eval_samples). Returns the training part, the held-out part, the
    run's note on it and where the validation records came from."""
    total = len(train.dataset)
    train, held_out = _split_off(train, percentage, seed)
    if max_train_samples is not None:
        train.dataset = keep_rows(train.dataset, np.arange(len(train.dataset)) < max_train_samples)
    if max_eval_samples is not None:
        held_out.dataset = keep_rows(held_out.dataset, np.arange(len(held_out.dataset)) < max_eval_samples)
    note = (f"validation split: {len(held_out.dataset)} records ({percentage}%) of the training file, not trained on "
            f"(--validation_split_percentage; seed {seed})")
    return train, held_out, note, f"--validation_split_percentage {percentage:g} of {total} training records"


def read_record_splits(columns: RecordColumns, train_file=None, validation_file=None, test_file=None,
                       dataset_name: str | None = None, dataset_config_name: str | None = None,
                       skip_bad_records: bool = False, max_train_samples: int | None = None,
                       name: str | None = None, max_eval_samples: int | None = None,
                       validation_split_percentage: float | None = None, seed: int = 0,
                       options: ReadOptions = ReadOptions(), operation_tokens: str = "words") -> RecordSplits:
    """What `train_par.py --train_file` and the RNN baseline read: the training records (files or the train split of
    `dataset_name`), their vocabulary (`discover_format`, named `name` or the first file's stem) and tokenizer, and
    the validation / test splits (the files given, else the dataset's own splits where it has them, else for
    validation `validation_split_percentage` percent of the training records) encoded with that vocabulary;
    `max_eval_samples` keeps the first N validation records; `operation_tokens` how the tokenizer reads an operation
    (`build_record_tokenizer`: its words, or one token per distinct operation)."""
    started = time.time()
    _check_split_arguments(operation_tokens, max_eval_samples, validation_split_percentage, max_train_samples)
    hub_splits = (dataset_split_names(dataset_name, dataset_config_name, **options.hub())
                  if dataset_name and (validation_file is None or test_file is None) else [])
    split_off = validation_file is None and "validation" not in hub_splits and bool(validation_split_percentage)
    # as transformers' example scripts: the validation split is cut from the whole training file, then the training
    # part is truncated to --max_train_samples
    train = load_record_files(train_file, columns, dataset_name, dataset_config_name, "train",
                              skip_bad_records=skip_bad_records, max_records=None if split_off else max_train_samples,
                              options=options)
    notes, held_out = [], None
    if split_off:
        train, held_out, note, validation_from = _cut_validation(train, validation_split_percentage, seed,
                                                                 max_train_samples, max_eval_samples)
        notes.append(note)
    else:
        validation_from = "--validation_file" if validation_file else f"{dataset_name}'s validation split"
    name = name or (file_stem(train.sources[0]) if train_file else dataset_name)
    record_format = discover_format(train, name=name.replace("/", "_"))
    tokenizer = _tokenizer_for(record_format, operation_tokens, train.columns)
    skipped, splits = {}, {}
    encoded, skipped["train"] = _encode_split(train, record_format, tokenizer, skip_bad_records, options)
    if held_out is not None:
        split_encoded, skipped["validation"] = _encode_split(held_out, record_format, tokenizer, skip_bad_records,
                                                             options, held_out=True)
        splits["validation"] = (held_out, split_encoded)
    for split, files in (("validation", validation_file), ("test", test_file)):
        if split in splits or (files is None and split not in hub_splits):
            continue
        loaded = load_record_files(files, columns if files else train.columns, None if files else dataset_name,
                                   dataset_config_name, split, query_names=train.query_names,
                                   skip_bad_records=skip_bad_records, options=options,
                                   max_records=max_eval_samples if split == "validation" else None,
                                   flag=f"--{split}_file", max_records_flag="--max_eval_samples")
        split_encoded, skipped[split] = _encode_split(loaded, record_format, tokenizer, skip_bad_records, options)
        splits[split] = (loaded, split_encoded)
    records = RecordSplits(train, encoded, record_format, tokenizer, splits, skipped, time.time() - started,
                           notes=notes, validation_from=validation_from, operation_tokens=operation_tokens)
    if records.stop_rule_off:
        notes.append(records.stop_rule_off)
    return records
