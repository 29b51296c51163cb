"""Learning from recorded data: state-tracking records read from CSV / JSON Lines / Parquet files or the Hub.

A record is a sequence of operations (opaque strings), the state observed at the end, and optionally the state
after every operation and an initial state; a state is one label or a mapping query -> label (labels keep their
string form). Reading a file goes in three steps, each over Arrow tables in batches (`datasets.Dataset.map`), never
as Python lists of the whole file:

    files --load_record_files--> normalized records --discover_format (training files)--> RecordFormat
          --encode_records--> the training columns of `state_tracking.data` (input_ids, query_positions,
                              operation_ends, step_labels, depth, ops)

Unknown labels are `LABEL_PAD_ID` (-100) in `step_labels`: z_0 without an initial state, and every intermediate
state of a final-states-only record; the PAR loss supervises what is known (`trainers.objectives.answer_loss`).
A bad record (empty sequence, step states that do not match its operations, a label or operation the training files
never held, a value that does not parse) raises one `RecordError` naming the file, the record and the field;
``skip_bad_records=True`` drops such records instead and reports how many (never silently).

Today's tasks are one producer of records: :func:`task_records` writes a task's problems in this format
(``examples/make_dataset.py``), and training from such a file sees the same problems as training from the generator.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value, concatenate_datasets, load_dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from modeling_par.record_format import (
    RecordFormat,
    candidate_token,
    label_string,
    normalize_operation,
    query_token,
)

from .data import LABEL_PAD_ID
from .prompts import BOS_TOKEN, NO_TOKEN, PAD_TOKEN, UNK_TOKEN, YES_TOKEN

EXTENSIONS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SCALAR_QUERY = "state"  # the query name of a scalar state
# Conventional column names: a column left unnamed is found by these when exactly one of them is present.
COLUMN_NAMES = {
    "operations": ("operations", "ops", "sequence", "events", "actions", "input", "inputs", "tokens"),
    "state": ("state", "final_state", "label", "answer", "target", "output"),
    "step_states": ("step_states", "states", "trajectory", "step_labels"),
    "initial_state": ("initial_state", "initial", "start_state"),
}
NORMALIZED = Features({
    "operations": List(Value("string")),
    "labels": List(List(Value("string"))),  # (d, Q): the state after op 1..d; "" = not recorded
    "initial": List(Value("string")),  # (Q,) or empty
    "source": Value("int32"),  # which file (index into LoadedRecords.sources)
    "record": Value("int64"),  # the record's index in that file (0-based), for error messages
})


class RecordError(ValueError):
    """A record that cannot be read (names the file, the record and the field)."""


@dataclass(frozen=True)
class RecordColumns:
    """Which columns hold what (None: found by name where exactly one conventional name fits), and the regex that
    splits a string of operations or of step states (None: whitespace)."""

    operations: str | None = None
    state: str | None = None
    step_states: str | None = None
    initial_state: str | None = None
    delimiter: str | None = None

    def __post_init__(self):
        if self.delimiter is not None:
            check_delimiter(self.delimiter)


def check_delimiter(delimiter: str, flag: str = "--operation_delimiter") -> re.Pattern:
    """The compiled delimiter regex; one error for a regex that does not compile, matches the empty string, or has a
    capturing group (re.split would keep what the group matched as pieces: `(;|,)` would make every ';' an operation
    and a step-state label)."""
    if not isinstance(delimiter, str) or not delimiter:
        raise RecordError(f"{flag} must be a non-empty regular expression; got {delimiter!r}.")
    try:
        pattern = re.compile(delimiter)
    except re.error as error:
        raise RecordError(f"{flag} {delimiter!r} is not a valid regular expression ({error}).") from None
    if pattern.groups:
        suggestion = re.sub(r"(?<!\\)\((?!\?)", "(?:", delimiter)
        raise RecordError(f"{flag} {delimiter!r} has a capturing group, whose matches re.split would keep as "
                          f"operations and labels; write the group non-capturing, e.g. {suggestion!r}.")
    if pattern.fullmatch(""):
        raise RecordError(f"{flag} {delimiter!r} matches the empty string, so it splits nothing apart; give a "
                          "delimiter that matches at least one character.")
    return pattern


# ---------------------------------------------------------------------------------------------------------- files
def resolve_files(spec: str | Sequence[str]) -> list[str]:
    """A path, a glob, or a comma-separated list of them -> the files, each with a known extension."""
    parts = [p.strip() for p in (spec.split(",") if isinstance(spec, str) else spec) if str(p).strip()]
    if not parts:
        raise RecordError(f"no file given (got {spec!r}).")
    files = []
    for part in parts:
        matches = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
        if not matches:
            raise RecordError(f"the pattern {part!r} matches no file.")
        for path in matches:
            if not os.path.isfile(path):
                raise RecordError(f"file {path!r} does not exist.")
            if _extension(path) not in EXTENSIONS:
                raise RecordError(f"file {path!r}: unknown extension; allowed: {sorted(EXTENSIONS)} (CSV, JSON Lines, "
                                  "Parquet).")
            files.append(path)
    return files


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def read_file(path: str) -> Dataset:
    """One file as a `datasets.Dataset` (Arrow, memory-mapped), or a `RecordError` naming it when it does not parse."""
    builder = EXTENSIONS[_extension(path)]
    kwargs = {"delimiter": "\t"} if _extension(path) == ".tsv" else {}
    try:
        return load_dataset(builder, data_files=os.path.abspath(path), split="train", **kwargs)
    except Exception as error:  # datasets wraps parser errors in its own types; name the file either way
        cause = error.__cause__ or error
        raise RecordError(f"file {path!r} does not parse as {builder}: {type(cause).__name__}: {cause}") from None


def resolve_columns(found: Sequence[str], columns: RecordColumns, source: str) -> RecordColumns:
    """Fill in the unnamed columns: a named column must exist; an unnamed one is taken where exactly one conventional
    name of its role is present. Needs the operations and a final or step states column."""
    found = list(found)

    def fail(message):
        raise RecordError(f"{source}: {message}; the columns found are {found}.")

    chosen = {}
    for role in ("operations", "state", "step_states", "initial_state"):
        name = getattr(columns, role)
        if name is not None:
            if name not in found:
                fail(f"--{role}_column {name!r} is not a column")
            chosen[role] = name
            continue
        fits = [c for c in COLUMN_NAMES[role] if c in found and c not in chosen.values()]
        if len(fits) > 1:
            fail(f"several columns could hold the {role.replace('_', ' ')} ({fits}): name one with --{role}_column")
        chosen[role] = fits[0] if fits else None
    if chosen["operations"] is None:
        fail("no operations column: name it with --operations_column")
    if chosen["state"] is None and chosen["step_states"] is None:
        fail("no state column: name the final state with --state_column or the per-step states with "
             "--step_states_column")
    return RecordColumns(**chosen, delimiter=columns.delimiter)


# ---------------------------------------------------------------------------------------------------------- parsing
def _parse_state(value: Any, where: str) -> dict[str, str] | str:
    """A cell holding one state: a mapping (or its JSON text) -> {query: label}; anything else -> one label."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise RecordError(f"{where}: {value!r} is not a valid JSON mapping ({error}).") from None
    if isinstance(value, dict):
        if not value:
            raise RecordError(f"{where}: the state mapping is empty.")
        out = {}
        for query, label in value.items():
            if label is None or (isinstance(label, str) and not label.strip()):
                raise RecordError(f"{where}: the label of {query!r} is missing.")
            out[str(query)] = label_string(label)
        return out
    if value is None or (isinstance(value, float) and np.isnan(value)) or (isinstance(value, str) and not value.strip()):
        raise RecordError(f"{where}: the state is missing.")
    if isinstance(value, (list, tuple)):
        raise RecordError(f"{where}: a state must be a label or a mapping query -> label; got a list {value!r}.")
    return label_string(value)


def _split(value: Any, splitter: re.Pattern, where: str, what: str) -> list[Any]:
    """A list cell as it is; a string cell split at the delimiter (a JSON list text parsed)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        text = value.strip()
        # a JSON list written into a text cell (CSV): its items, for operations and step states alike (an operations
        # cell that only starts with "[", a log line such as "[INFO] start; stop", is split at the delimiter)
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as error:
                if what == "step states" or text.endswith("]"):
                    raise RecordError(f"{where}: {value!r} is not a valid JSON list ({error}).") from None
                parsed = None
            if isinstance(parsed, list):
                return parsed
        return [piece for piece in splitter.split(text) if piece.strip()] if text else []
    if value is None:
        return []
    raise RecordError(f"{where}: the {what} must be a list or a delimited string; got {type(value).__name__} {value!r}.")


class _Normalizer:
    """Turns raw rows into normalized records (see `NORMALIZED`), checking each; queries come from the first state."""

    def __init__(self, columns: RecordColumns, source: str, source_index: int, query_names: list[str] | None,
                 skip_bad: bool):
        self.columns, self.source, self.query_names, self.skip_bad = columns, source, query_names, skip_bad
        self.source_index = source_index
        self.splitter = check_delimiter(columns.delimiter) if columns.delimiter else re.compile(r"\s+")
        self.skipped: list[str] = []

    def states(self, state, where) -> list[str]:
        """One parsed state -> labels in query order (fixing the queries at the first state seen)."""
        if self.query_names is None:
            self.query_names = sorted(state) if isinstance(state, dict) else [SCALAR_QUERY]
        if isinstance(state, dict):
            if sorted(state) != sorted(self.query_names):
                raise RecordError(f"{where}: the state names the queries {sorted(state)}; every state must name "
                                  f"{sorted(self.query_names)}.")
            return [state[q] for q in self.query_names]
        if self.query_names != [SCALAR_QUERY]:
            raise RecordError(f"{where}: a single label {state!r} where the states map queries {self.query_names} to "
                              "labels.")
        return [state]

    def record(self, row: dict, index: int) -> dict:
        c = self.columns
        at = f"{self.source}, record {index}"
        raw_ops = _split(row[c.operations], self.splitter, f"{at}, field {c.operations!r}", "operations")
        ops = []
        for k, op in enumerate(raw_ops):
            if op is None or isinstance(op, (dict, list)):
                raise RecordError(f"{at}, field {c.operations!r}: operation {k + 1} must be a string or a number; got "
                                  f"{op!r}.")
            text = normalize_operation(label_string(op) if not isinstance(op, str) else op)
            if not text:
                raise RecordError(f"{at}, field {c.operations!r}: operation {k + 1} is empty.")
            ops.append(text)
        if not ops:
            raise RecordError(f"{at}, field {c.operations!r}: the sequence of operations is empty.")
        final = None
        if c.state is not None:
            final = self.states(_parse_state(row[c.state], f"{at}, field {c.state!r}"), f"{at}, field {c.state!r}")
        labels = [[""] * len(final)] * (len(ops) - 1) + [final] if final is not None else None
        if c.step_states is not None:
            where = f"{at}, field {c.step_states!r}"
            steps = _split(row[c.step_states], self.splitter, where, "step states")
            if len(steps) != len(ops):
                raise RecordError(f"{where}: {len(steps)} step states for {len(ops)} operations (one state after each "
                                  "operation).")
            labels = [self.states(_parse_state(s, f"{where}, step {k + 1}"), f"{where}, step {k + 1}")
                      for k, s in enumerate(steps)]
            if final is not None and labels[-1] != final:
                raise RecordError(f"{at}: the last step state {labels[-1]} differs from the final state {final} "
                                  f"(field {c.state!r}).")
        initial = []
        if c.initial_state is not None:
            where = f"{at}, field {c.initial_state!r}"
            initial = self.states(_parse_state(row[c.initial_state], where), where)
        return {"operations": ops, "labels": labels, "initial": initial, "source": self.source_index, "record": index}

    def __call__(self, table: pa.Table, indices: list[int]) -> pa.Table | dict:
        """One batch (an Arrow table): with Arrow compute where every value is plain (`_plain_batch`), else record by
        record in Python, which names the first bad record (or skips it)."""
        fast = self._plain_batch(table, indices[0]) if len(indices) else None
        if fast is not None:
            return fast
        out = {k: [] for k in NORMALIZED}
        batch = table.to_pydict()
        keys = list(batch)
        for i, index in enumerate(indices):
            row = {k: batch[k][i] for k in keys}
            try:
                record = self.record(row, index)
            except RecordError as error:
                if not self.skip_bad:
                    raise
                self.skipped.append(str(error))
                continue
            for k in out:
                out[k].append(record[k])
        return out

    def _plain_batch(self, table: pa.Table, first: int) -> pa.Table | None:
        """The batch normalized with Arrow compute, or None unless every value is plain: whitespace-delimited strings
        or lists of strings / integers for the operations and step states, scalar string / integer / boolean labels,
        nothing missing or empty, step counts matching, the last step state equal to the final state. None sends the
        batch to the record-by-record path (the same result, and the error naming the record where one is bad)."""
        c = self.columns
        if c.delimiter is not None or self.query_names not in (None, [SCALAR_QUERY]):
            return None
        ops = _plain_lists(table.column(c.operations), operations=True)
        if ops is None:
            return None
        n = table.num_rows
        depth = pc.list_value_length(ops).to_numpy(zero_copy_only=False).astype(np.int64)
        flat_ops = pc.list_flatten(ops)
        if (depth == 0).any() or not _all_plain(flat_ops):
            return None
        offsets = np.concatenate([[0], np.cumsum(depth)])
        last = offsets[1:] - 1  # each record's last operation
        final = _plain_labels(table.column(c.state)) if c.state is not None else None
        if c.state is not None and final is None:
            return None
        if c.step_states is not None:
            steps = _plain_lists(table.column(c.step_states), operations=False)
            if steps is None or (pc.list_value_length(steps).to_numpy(zero_copy_only=False) != depth).any():
                return None
            labels = pc.list_flatten(steps)
            if not _all_plain(labels) or (final is not None and not pc.all(
                    pc.equal(pc.take(labels, pa.array(last)), final)).as_py()):
                return None
        else:
            is_last = np.zeros(offsets[-1], dtype=bool)
            is_last[last] = True
            labels = pc.if_else(pa.array(is_last), pc.take(final, pa.array(np.repeat(np.arange(n), depth))), "")
        if c.initial_state is not None:
            initial = _plain_labels(table.column(c.initial_state))
            if initial is None:
                return None
            initial = pa.ListArray.from_arrays(pa.array(np.arange(n + 1), pa.int32()), initial)
        else:
            initial = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1), pa.int32()), pa.array([], pa.string()))
        self.query_names = [SCALAR_QUERY]
        op_offsets = pa.array(offsets, pa.int32())
        columns = [pa.ListArray.from_arrays(op_offsets, flat_ops),
                   pa.ListArray.from_arrays(op_offsets, pa.ListArray.from_arrays(
                       pa.array(np.arange(len(labels) + 1), pa.int32()), labels)),
                   initial, pa.array(np.full(n, self.source_index), pa.int32()),
                   pa.array(np.arange(first, first + n), pa.int64())]
        return pa.Table.from_arrays(columns, schema=NORMALIZED.arrow_schema)


def _plain_lists(column, operations: bool) -> pa.ListArray | None:
    """A column of whitespace-delimited strings or of lists of strings / integers as lists of stripped strings (an
    operation's inner whitespace collapsed), or None where it is anything else."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if column.null_count:
        return None
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = pc.utf8_trim_whitespace(column)
        if pc.any(pc.starts_with(text, "[")).as_py() or pc.any(pc.starts_with(text, "{")).as_py():
            return None
        split = pc.utf8_split_whitespace(text)
        # a step-state piece such as "{b" is JSON-parsed (and refused) record by record: leave it to that path, so
        # that whether a record is accepted never depends on the other records of its batch
        if not operations and len(split) and pc.any(pc.starts_with(pc.list_flatten(split), "{")).as_py():
            return None
        return split
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return None
    flat = column.flatten()
    if pa.types.is_integer(flat.type):
        flat = pc.cast(flat, pa.string())
    elif not (pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type)) or flat.null_count:
        return None
    flat = pc.utf8_trim_whitespace(flat)
    if operations:
        flat = pc.replace_substring_regex(flat, r"\s+", " ")
    elif pc.any(pc.starts_with(flat, "{")).as_py():
        return None
    return pa.ListArray.from_arrays(pa.array(column.offsets, pa.int32()), flat.cast(pa.string()))


def _plain_labels(column) -> pa.Array | None:
    """One scalar label per record as its string form (`label_string`), or None for anything else (mappings, floats,
    missing values)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if column.null_count:
        return None
    if pa.types.is_boolean(column.type) or pa.types.is_integer(column.type):
        return pc.cast(column, pa.string())
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return None
    text = pc.utf8_trim_whitespace(column)
    if pc.any(pc.starts_with(text, "{")).as_py() or not _all_plain(text):
        return None
    return text.cast(pa.string())


def _all_plain(strings: pa.Array) -> bool:
    """No missing and no empty string."""
    return strings.null_count == 0 and (len(strings) == 0 or pc.min(pc.utf8_length(strings)).as_py() > 0)


@dataclass
class LoadedRecords:
    """Normalized records of one split, with what was skipped (``skip_bad_records``) and where they came from."""

    dataset: Dataset
    columns: RecordColumns
    sources: list[str]
    skipped: list[str]
    query_names: list[str]


def load_record_files(files: str | Sequence[str] | None = None, columns: RecordColumns = RecordColumns(),
                      dataset_name: str | None = None, dataset_config_name: str | None = None, split: str = "train",
                      query_names: list[str] | None = None, skip_bad_records: bool = False,
                      max_records: int | None = None) -> LoadedRecords:
    """Read and check records from files (a path, glob or comma-separated list; CSV / JSON Lines / Parquet by
    extension) or from `datasets.load_dataset(dataset_name, dataset_config_name, split=split)`.

    Returns normalized records: ``operations`` (d strings), ``labels`` (d rows of Q labels, "" where not recorded),
    ``initial`` (Q labels or empty). `query_names` (e.g. from the training split) fixes the queries; otherwise the
    first state sets them.
    """
    if (files is None) == (dataset_name is None):
        raise RecordError("give either files or dataset_name (not both).")
    if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int)
                                    or max_records < 1):
        raise RecordError(f"--max_train_samples must be an integer >= 1 (the first N training records) or unset; got "
                          f"{max_records!r}.")
    if files is not None:
        sources = resolve_files(files)
        raw = [(path, read_file(path)) for path in sources]
    else:
        try:
            data = load_dataset(dataset_name, dataset_config_name, split=split)
        except Exception as error:
            raise RecordError(f"dataset {dataset_name!r} ({dataset_config_name}, split {split!r}) does not load: "
                              f"{type(error).__name__}: {error}") from None
        sources = [f"{dataset_name}[{split}]"]
        raw = [(sources[0], data)]
    parts, skipped, resolved = [], [], None
    for source_index, (source, data) in enumerate(raw):
        cols = resolve_columns(data.column_names, columns, source)
        if resolved is not None and cols != resolved:
            raise RecordError(f"{source}: its columns resolve to {cols} but the first file's to {resolved}; name the "
                              "columns with the --*_column flags.")
        resolved = cols
        if max_records is not None:
            remaining = max_records - sum(len(p) for p in parts)
            if remaining <= 0:
                break
            data = data.select(range(min(remaining, len(data))))
        normalizer = _Normalizer(cols, source, source_index, query_names, skip_bad_records)
        used = [c for c in (cols.operations, cols.state, cols.step_states, cols.initial_state) if c is not None]
        normalized = data.select_columns(used).with_format("arrow").map(
            normalizer, batched=True, batch_size=2000, with_indices=True, remove_columns=used, features=NORMALIZED,
            load_from_cache_file=False, desc=f"reading {os.path.basename(source)}").with_format(None)
        query_names = normalizer.query_names
        skipped += normalizer.skipped
        parts.append(normalized)
    dataset = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    if len(dataset) == 0:
        raise RecordError(f"no record left to read in {sources}" + (f" ({len(skipped)} skipped)" if skipped else "") + ".")
    return LoadedRecords(dataset, resolved, sources, skipped, list(query_names))


# ---------------------------------------------------------------------------------------------------------- vocabulary
def _natural_key(label: str):
    return (0, int(label), label) if re.fullmatch(r"-?\d+", label) else (1, 0, label)


def discover_format(train: LoadedRecords, name: str = "records") -> RecordFormat:
    """What the training records teach: every operation (first appearance order), every label (numbers in numeric
    order, then the rest sorted), the queries, the delimiter and whether prompts carry an initial state."""
    table = train.dataset.data.table
    operations = pc.unique(pc.list_flatten(table.column("operations"))).to_pylist()
    labels = pc.list_flatten(pc.list_flatten(table.column("labels")))
    initial = pc.list_flatten(table.column("initial"))
    values = set(pc.unique(labels).to_pylist()) | set(pc.unique(initial).to_pylist())
    values.discard("")
    candidates = sorted(values, key=_natural_key)
    has_initial = train.columns.initial_state is not None
    return RecordFormat(query_names=tuple(train.query_names), candidates=tuple(candidates),
                        operations=tuple(operations), delimiter=train.columns.delimiter, initial_state=has_initial,
                        task_name=name)


def build_record_tokenizer(record_format: RecordFormat) -> PreTrainedTokenizerFast:
    """A word-level tokenizer for a `RecordFormat`: ``<pad> <unk> <bos>``, the query tokens, ``Yes No``, one token
    per label (``<=label>``, placed by id only), then the words of the operations (whitespace and punctuation split,
    as `tokenizers`' Whitespace pre-tokenizer) in order of first appearance."""
    queries = [query_token(j) for j in range(len(record_format.query_names))]
    labels = [candidate_token(c) for c in record_format.candidates]
    vocab = [PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, *queries, YES_TOKEN, NO_TOKEN, *labels]
    pre_tokenizer = Whitespace()
    for op in record_format.operations:
        vocab += [word for word, _ in pre_tokenizer.pre_tokenize_str(op)]
    vocab = list(dict.fromkeys(vocab))
    backend = Tokenizer(WordLevel({token: i for i, token in enumerate(vocab)}, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizer
    backend.add_special_tokens([PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, *queries, *labels])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS_TOKEN, pad_token=PAD_TOKEN,
                                   unk_token=UNK_TOKEN, extra_special_tokens=queries, padding_side="right",
                                   model_max_length=1_000_000)


def check_distinct_encodings(record_format: RecordFormat, tokenizer, column: str | None = None) -> None:
    """Operations the model could not tell apart are one error: distinct operation strings whose token ids are the
    same ('a-b', 'a - b' and 'a -b' are the words a, -, b alike) would be trained as one operation."""
    seen: dict[tuple, str] = {}
    for i, op in enumerate(record_format.operations):
        ids = tuple(record_format.operation_tokens(tokenizer, i))
        if ids in seen:
            raise RecordError(f"operations {seen[ids]!r} and {op!r} (column {column!r}) encode to the same tokens "
                              f"{tokenizer.convert_ids_to_tokens(list(ids))}: the model could not tell them apart; "
                              "write them the same way in the data, or with different words.")
        seen[ids] = op


def record_token_ids(tokenizer, record_format: RecordFormat) -> dict:
    """The ids the model config needs (as `state_tracking.model_token_ids` for a task)."""
    special = record_format.special_ids(tokenizer)
    vocab = tokenizer.get_vocab()
    return {"answer_token_ids": special["candidates"], "halt_token_ids": (vocab[YES_TOKEN], vocab[NO_TOKEN]),
            "pad_token_id": int(tokenizer.pad_token_id), "vocab_size": len(tokenizer)}


# ---------------------------------------------------------------------------------------------------------- encoding
ENCODED = Features({
    "input_ids": List(Value("int32")),
    "query_positions": List(Value("int32")),
    "operation_ends": List(Value("int32")),
    "step_labels": List(List(Value("int32"))),
    "depth": Value("int32"),
    "ops": List(Value("int32")),
})


class _Encoder:
    """Normalized records -> training columns, vectorised per batch (checked against `RecordFormat.encode`)."""

    def __init__(self, record_format: RecordFormat, tokenizer, sources: list[str], skip_bad: bool,
                 columns: RecordColumns | None = None):
        self.format, self.sources, self.skip_bad = record_format, sources, skip_bad
        # what the errors call each normalized field: the user's column (and its flag), not the internal name
        c = columns or RecordColumns()
        labels = c.step_states or c.state
        self.field_names = {
            "operations": f"{c.operations!r} (--operations_column)" if c.operations else "operations",
            "labels": (f"{labels!r} ({'--step_states_column' if c.step_states else '--state_column'})" if labels
                       else "state"),
            "initial": f"{c.initial_state!r} (--initial_state_column)" if c.initial_state else "initial state"}
        tokens = [record_format.operation_tokens(tokenizer, i) for i in range(len(record_format.operations))]
        self.token_lengths = np.array([len(t) for t in tokens], dtype=np.int64)
        self.token_starts = np.concatenate([[0], np.cumsum(self.token_lengths)[:-1]]).astype(np.int64)
        self.token_table = np.array([t for row in tokens for t in row], dtype=np.int64)
        special = record_format.special_ids(tokenizer)
        self.bos, self.query_ids = special["bos"], np.array(special["queries"], dtype=np.int64)
        self.candidate_ids = np.array(special["candidates"], dtype=np.int64)
        self.op_values = pa.array(list(record_format.operations), pa.string())
        self.label_values = pa.array(list(record_format.candidates), pa.string())
        self.skipped: list[str] = []

    def _unknown(self, indices, rows_of, values, what, field_name):
        bad = np.flatnonzero(indices == -1)
        problems = []
        for position in bad:
            problems.append((int(rows_of[position]), f"column {self.field_names[field_name]}: {what} "
                             f"{values[position]!r} never occurs in the training data"))
        return problems

    def __call__(self, table: pa.Table) -> dict:
        """A batch of normalized records as an Arrow table (the dataset is mapped in ``arrow`` format)."""
        ops_col, labels_col, initial_col = table.column("operations"), table.column("labels"), table.column("initial")
        n = table.num_rows
        depth = pc.list_value_length(ops_col).to_numpy(zero_copy_only=False).astype(np.int64)
        flat_ops = pc.list_flatten(ops_col)
        op_index = pc.index_in(flat_ops, value_set=self.op_values).fill_null(-1).to_numpy(zero_copy_only=False)
        op_rows = np.repeat(np.arange(n), depth)
        q = len(self.format.query_names)
        flat_labels = pc.list_flatten(pc.list_flatten(labels_col))
        label_index = pc.index_in(flat_labels, value_set=self.label_values).fill_null(-1).to_numpy(zero_copy_only=False)
        unrecorded = pc.equal(flat_labels, "").to_numpy(zero_copy_only=False)
        label_index = np.where(unrecorded, LABEL_PAD_ID, label_index)
        label_rows = np.repeat(np.arange(n), depth * q)
        flat_initial = pc.list_flatten(initial_col)
        initial_index = pc.index_in(flat_initial, value_set=self.label_values).fill_null(-1).to_numpy(
            zero_copy_only=False)
        initial_len = pc.list_value_length(initial_col).to_numpy(zero_copy_only=False).astype(np.int64)
        initial_rows = np.repeat(np.arange(n), initial_len)
        if self.format.initial_state and (initial_len != q).any():
            row = int(np.flatnonzero(initial_len != q)[0])
            problems = [(row, "no initial state, but the training records have one")]
        elif not self.format.initial_state and initial_len.any():
            row = int(np.flatnonzero(initial_len)[0])
            problems = [(row, "an initial state, but the training records had none (the model never read one)")]
        else:
            problems = []
        problems += self._unknown(op_index, op_rows, flat_ops.to_pylist() if (op_index < 0).any() else None,
                                  "operation", "operations")
        problems += self._unknown(label_index, label_rows, flat_labels.to_pylist() if (label_index < 0).any() else None,
                                  "label", "labels")
        problems += self._unknown(initial_index, initial_rows,
                                  flat_initial.to_pylist() if (initial_index < 0).any() else None, "label", "initial")
        keep = np.ones(n, dtype=bool)
        for row, message in problems:
            message = (f"{self.sources[table.column('source')[row].as_py()]}, record "
                       f"{table.column('record')[row].as_py()}, {message}")
            if not self.skip_bad:
                raise RecordError(message + ".")
            if keep[row]:
                self.skipped.append(message)
            keep[row] = False
        return self._columns(keep, depth, op_index, label_index, initial_index, initial_len)

    def _columns(self, keep, depth, op_index, label_index, initial_index, initial_len) -> pa.Table:
        """The kept records' training columns, built as flat arrays for the whole batch (no per-record loop):
        ``<bos> [initial] words(op_1) … words(op_d) <q1> … <qQ>`` and z_0 (or unrecorded) followed by the labels."""
        q, n = len(self.format.query_names), len(depth)
        kept = np.cumsum(keep) - 1  # old record -> new index
        rows = np.flatnonzero(keep)
        op_record = np.repeat(np.arange(n), depth)
        kept_op = keep[op_record]
        ops, op_rec = op_index[kept_op], kept[op_record[kept_op]]  # (o,): the kept ops and their new record
        d = depth[rows]
        m, o = len(rows), len(ops)
        op_starts = np.concatenate([[0], np.cumsum(d)])  # (m + 1,)
        head = 1 + (q if self.format.initial_state else 0)
        lens = self.token_lengths[ops]  # tokens per op
        cum = np.cumsum(lens)
        body_len = np.bincount(op_rec, weights=lens, minlength=m).astype(np.int64)
        id_offsets = np.concatenate([[0], np.cumsum(head + body_len + q)])
        ids = np.empty(id_offsets[-1], dtype=np.int64)
        ids[id_offsets[:-1]] = self.bos
        initial = np.full((n, q), LABEL_PAD_ID, dtype=np.int64)  # z_0 per old record
        has_initial = initial_len == q
        initial[has_initial] = initial_index.reshape(-1, q)[np.cumsum(has_initial)[has_initial] - 1] \
            if has_initial.any() else initial[has_initial]
        initial = initial[rows]
        if self.format.initial_state:
            ids[id_offsets[:-1, None] + 1 + np.arange(q)] = self.candidate_ids[initial]
        # the body: every kept op's tokens, placed after its record's head
        gather = np.repeat(self.token_starts[ops] - (cum - lens), lens) + np.arange(int(cum[-1]) if o else 0)
        token_record = np.repeat(op_rec, lens)
        body_offsets = np.concatenate([[0], np.cumsum(body_len)])
        ids[id_offsets[token_record] + head + np.arange(len(gather)) - body_offsets[token_record]] = \
            self.token_table[gather]
        ids[id_offsets[1:, None] - q + np.arange(q)] = self.query_ids
        queries = (id_offsets[1:, None] - id_offsets[:-1, None]) - q + np.arange(q)  # (m, Q) within each record
        # operation_ends and step_labels: d + 1 rows per record (the preamble / z_0, then each op)
        row_offsets = np.concatenate([[0], np.cumsum(d + 1)])
        op_rows = row_offsets[op_rec] + 1 + np.arange(o) - op_starts[op_rec]
        ends = np.empty(row_offsets[-1], dtype=np.int64)
        ends[row_offsets[:-1]] = head - 1
        ends[op_rows] = head - 1 + cum - np.concatenate([[0], cum])[op_starts[op_rec]]
        labels = np.empty((row_offsets[-1], q), dtype=np.int64)
        labels[row_offsets[:-1]] = initial
        labels[op_rows] = label_index.reshape(-1, q)[kept_op]

        def ragged(offsets, values):
            return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))

        columns = [ragged(id_offsets, ids), ragged(np.arange(m + 1) * q, queries.reshape(-1)),
                   ragged(row_offsets, ends),
                   pa.ListArray.from_arrays(pa.array(row_offsets, pa.int32()),
                                            ragged(np.arange(len(labels) + 1) * q, labels.reshape(-1))),
                   pa.array(d, pa.int32()), ragged(op_starts, ops)]
        return pa.Table.from_arrays(columns, schema=ENCODED.arrow_schema)


def encode_records(records: LoadedRecords, record_format: RecordFormat, tokenizer,
                   skip_bad_records: bool = False) -> tuple[Dataset, list[str]]:
    """Normalized records -> the training columns (batched over Arrow), and the records skipped (an operation or
    label the format does not know, a missing initial state) when ``skip_bad_records``; otherwise the first such
    record raises `RecordError`."""
    if list(records.query_names) != list(record_format.query_names):
        raise RecordError(f"{records.sources}: the states name the queries {records.query_names}, the training data "
                          f"{list(record_format.query_names)}.")
    encoder = _Encoder(record_format, tokenizer, records.sources, skip_bad_records, records.columns)
    encoded = records.dataset.with_format("arrow").map(encoder, batched=True, batch_size=2000,
                                  remove_columns=records.dataset.column_names, features=ENCODED,
                                  load_from_cache_file=False, desc="encoding records").with_format(None)
    if len(encoded) == 0:
        raise RecordError(f"no record of {records.sources} is left to use ({len(encoder.skipped)} skipped: "
                          f"{encoder.skipped[:1]}).")
    return encoded, encoder.skipped


def has_step_states(records: LoadedRecords) -> bool:
    """Whether any record carries an intermediate state (a label recorded before its last operation): every record
    has its final state, so more recorded labels than records × queries means step states."""
    table = records.dataset.data.table
    labels = pc.list_flatten(pc.list_flatten(table.column("labels")))
    recorded = int(pc.sum(pc.not_equal(labels, "")).as_py() or 0)
    return recorded > table.num_rows * len(records.query_names)


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

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray(self.encoded.data.table.column("depth").to_numpy(), dtype=np.int64)

    def summary(self) -> str:
        lengths = self.lengths
        return (f"{len(self.encoded)} training records ({len(self.record_format.operations)} operations, "
                f"{len(self.record_format.candidates)} labels, {len(self.record_format.query_names)} queries) of "
                f"lengths {lengths.min()}..{lengths.max()}, prepared in {self.seconds:.1f} s "
                f"({self.seconds * 1e5 / len(self.encoded):.1f} s per 100k); evaluation splits: "
                f"{list(self.splits) or 'none'}")


def check_record_lengths(records: RecordSplits, max_iterations: int, step_size: int = 1, skip: bool = False) -> None:
    """Every record of every split within the loop's reach, before training: a record of d operations needs ⌈d / c⌉
    iterations, at most `max_iterations` (a longer one would crash training when the curriculum reaches it, or the
    evaluation after training). A longer record is one error naming its split, file, record (0-based) and length,
    and the flag; with `skip` (--skip_bad_records) it is dropped and counted with the split's skipped records."""
    longest = max_iterations * step_size
    parts = [("train", records.train, records.encoded)] + [(name, loaded, enc)
                                                           for name, (loaded, enc) in records.splits.items()]
    for split, loaded, encoded in parts:
        lengths = pc.list_value_length(loaded.dataset.data.table.column("operations")).to_numpy(zero_copy_only=False)
        over = np.flatnonzero(lengths > longest)
        if not len(over):
            continue
        bad = loaded.dataset.select(over)
        named = [f"{loaded.sources[src]}, record {rec} (0-based) has {int(n)} operations"
                 for src, rec, n in zip(bad["source"], bad["record"], lengths[over])]
        if not skip:
            raise RecordError(f"{split} split: {named[0]}, more than the {longest} the loop can run (--max_iterations "
                              f"{max_iterations} x --step_size {step_size}); raise --max_iterations, or pass "
                              f"--skip_bad_records true to drop such records ({len(over)} in this split).")
        depth = np.asarray(encoded.data.table.column("depth").to_numpy(), dtype=np.int64)
        kept = encoded.select(np.flatnonzero(depth <= longest))
        loaded.dataset = loaded.dataset.select(np.flatnonzero(lengths <= longest))
        if split == "train":
            records.encoded = kept
        else:
            records.splits[split] = (loaded, kept)
        records.skipped.setdefault(split, []).extend(
            f"{n}: more than --max_iterations {max_iterations} allows" for n in named)
        if split == "train" and not len(kept):
            raise RecordError(f"every training record is longer than --max_iterations {max_iterations} allows.")


def read_record_splits(columns: RecordColumns, train_file=None, validation_file=None, test_file=None,
                       dataset_name: str | None = None, dataset_config_name: str | None = None,
                       skip_bad_records: bool = False, max_train_samples: int | None = None,
                       name: str | None = None) -> RecordSplits:
    """What `train_par.py --train_file` and the RNN baseline read: the training records (files or the train split of
    `dataset_name`), their vocabulary (`discover_format`, named `name` or the first file's stem) and tokenizer, and
    the validation / test splits (the files given, else the dataset's own splits where it has them) encoded with
    that vocabulary."""
    import time

    started = time.time()
    train = load_record_files(train_file, columns, dataset_name, dataset_config_name, "train",
                              skip_bad_records=skip_bad_records, max_records=max_train_samples)
    name = name or (os.path.splitext(os.path.basename(train.sources[0]))[0] if train_file else dataset_name)
    record_format = discover_format(train, name=name.replace("/", "_"))
    tokenizer = build_record_tokenizer(record_format)
    check_distinct_encodings(record_format, tokenizer, train.columns.operations)
    encoded, bad = encode_records(train, record_format, tokenizer, skip_bad_records)
    skipped = {"train": train.skipped + bad}
    splits = {}
    for split, files in (("validation", validation_file), ("test", test_file)):
        if files is None and not (dataset_name and split in _dataset_splits(dataset_name, dataset_config_name)):
            continue
        loaded = load_record_files(files, columns if files else train.columns, None if files else dataset_name,
                                   dataset_config_name, split, query_names=train.query_names,
                                   skip_bad_records=skip_bad_records)
        split_encoded, bad = encode_records(loaded, record_format, tokenizer, skip_bad_records)
        splits[split] = (loaded, split_encoded)
        skipped[split] = loaded.skipped + bad
    return RecordSplits(train, encoded, record_format, tokenizer, splits, skipped, time.time() - started)


def _dataset_splits(dataset_name: str, dataset_config_name: str | None) -> list[str]:
    """The splits of a `datasets.load_dataset` name. A name whose splits cannot be listed is one error saying why
    (the evaluation splits would otherwise be skipped without a word)."""
    from datasets import get_dataset_split_names

    try:
        return get_dataset_split_names(dataset_name, dataset_config_name)
    except Exception as error:  # datasets raises many kinds (missing config, offline hub, bad builder)
        raise RecordError(f"--dataset_name {dataset_name!r} (--dataset_config_name {dataset_config_name!r}): its "
                          f"splits cannot be listed, so its validation / test splits cannot be found: "
                          f"{type(error).__name__}: {error}") from None


# ---------------------------------------------------------------------------------------------------------- evaluation
def _rows_by_depth(encoded: Dataset) -> dict[int, np.ndarray]:
    depth = np.asarray(encoded.data.table.column("depth").to_numpy(), dtype=np.int64)
    return {int(d): np.flatnonzero(depth == d) for d in np.unique(depth)}


def _columns(encoded: Dataset, rows: np.ndarray) -> tuple[dict[str, list], list]:
    part = encoded.select(rows)
    return {k: part[k] for k in ("input_ids", "query_positions", "operation_ends")}, part["step_labels"]


def evaluate_records(model: Any, encoded: Dataset, record_format: RecordFormat, mode: str = "forced",
                     batch_size: int = 256, train_max_depth: int | None = None, workers: int = 1,
                     device: Any = None, sources: Sequence[str] = (), progress: bool = True) -> dict[str, Any]:
    """Overall state accuracy (every query right) of the final answer, per sequence length present in `encoded`
    (`encode_records` output): the same JSON as `evaluate_length_generalization` (``per_depth`` entries with
    ``depth``, ``n``, ``accuracy``, ...), forced R = ⌈d / c⌉ or the learned halting rule."""
    import torch
    from tqdm.auto import tqdm

    from .data import StateTrackingCollator
    from .evaluation import (
        ACCURACY_THRESHOLD,
        MODES,
        _to_json,
        depth_result,
        environment_info,
        extrapolation_factor,
        longest_accurate_depth,
        predict_encoded,
    )

    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    device = torch.device(device) if device is not None else model.device
    c = int(model.config.step_size)
    collate = StateTrackingCollator(int(model.config.pad_token_id), padding_side="right")
    if hasattr(model, "eval"):
        model.eval()
    groups = _rows_by_depth(encoded)
    per_depth = []
    bar = tqdm(total=len(groups), desc=f"eval {record_format.task_name} ({mode})", disable=not progress)
    for depth, rows in groups.items():
        columns, labels = _columns(encoded, rows)
        targets = np.array([row[depth] for row in labels], dtype=np.int64)  # (n, Q): the final states
        num_iterations = math.ceil(depth / c) if mode == "forced" else None
        answers, iterations, halted = predict_encoded(model, columns, collate, mode, num_iterations, batch_size,
                                                      workers, device)
        per_depth.append(depth_result(depth, answers, targets, iterations, halted, num_iterations,
                                      record_format.query_names))
        bar.update(1)
        bar.set_postfix(depth=depth, accuracy=f"{per_depth[-1]['accuracy']:.3f}")
    bar.close()
    depths = [row["depth"] for row in per_depth]
    accuracies = [row["accuracy"] for row in per_depth]
    return {
        "task": record_format.task_name, "source": list(sources), "mode": mode, "rendering": "records",
        "n_records": len(encoded), "batch_size": batch_size, "workers": workers, "step_size": c,
        "train_max_depth": train_max_depth, "depths": depths, "accuracy": accuracies, "per_depth": per_depth,
        "d50": longest_accurate_depth(depths, accuracies),
        "extrapolation_factor": None if train_max_depth is None else extrapolation_factor(depths, accuracies,
                                                                                          train_max_depth),
        "extrapolation_factor_is_lower_bound": bool(min(accuracies) >= ACCURACY_THRESHOLD),
        "model_config": _to_json(model.config.to_dict()), "environment": environment_info(device),
    }


def records_progress_profile(model: Any, encoded: Dataset, batch_size: int = 256, device: Any = None,
                             max_records_per_depth: int | None = None) -> dict[str, Any]:
    """The progress profile on recorded step states: per length d, the accuracy of every iteration k's readout
    against the recorded state after min(c·k, d) operations (over the records that recorded it), k = 1..⌈d/c⌉.
    Same JSON as `state_tracking.progress_profile` (``depths``, ``profile``, ``final_accuracy``, ...)."""
    import torch

    from .data import StateTrackingCollator

    device = torch.device(device) if device is not None else model.device
    c = int(model.config.step_size)
    collate = StateTrackingCollator(int(model.config.pad_token_id), padding_side="right")
    model.eval()
    depths, profiles, finals, first_failure = [], [], [], []
    for depth, rows in _rows_by_depth(encoded).items():
        rows = rows[:max_records_per_depth]
        columns, labels = _columns(encoded, rows)
        num_iterations = math.ceil(depth / c)
        reads = list(range(1, num_iterations + 1))
        steps = np.minimum(c * np.arange(1, num_iterations + 1), depth)
        targets = np.array(labels, dtype=np.int64)[:, steps]  # (n, R, Q)
        answers = []
        for start in range(0, len(rows), batch_size):
            batch = collate({k: v[start:start + batch_size] for k, v in columns.items()})
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.inference_mode():
                out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                            num_iterations=num_iterations, readout_iterations=reads)
            answers.append(out.answer_logits.argmax(-1).cpu().numpy().transpose(1, 0, 2))  # (b, R, Q)
        answers = np.concatenate(answers)
        recorded = (targets != LABEL_PAD_ID).all(-1)  # (n, R)
        right = ((answers == targets).all(-1) & recorded).sum(0)
        accuracy = [float(r / m) if m else None for r, m in zip(right, recorded.sum(0))]
        depths.append(depth)
        profiles.append(accuracy)
        finals.append(accuracy[-1])
        below = [k + 1 for k, a in enumerate(accuracy) if a is not None and a < 0.5]
        first_failure.append(below[0] if below else None)
    return {"kind": "progress_profile", "padding_control_depth": None, "depths": depths, "profile": profiles,
            "final_accuracy": finals, "first_failure": first_failure, "step_size": c, "extra_iterations": 0,
            "n_per_depth": max_records_per_depth, "rendering": "records"}


# ---------------------------------------------------------------------------------------------------------- producers
def task_records(task, ops: np.ndarray, initial: np.ndarray | None = None, text: bool = False) -> list[dict]:
    """A task's problems as records: ``operations`` (op names, or the canonical sentences with ``text``),
    ``step_states`` (the state after each operation) and ``state`` (the final state), states as a label (one query)
    or a mapping query -> label; ``initial_state`` when `initial` is given."""
    states = task.prefix_states(ops, initial)  # (n, d + 1, Q)
    names = task.op_texts if text else task.op_names

    def state(row):
        labels = [task.candidate_names[int(c)] for c in row]
        return labels[0] if task.num_queries == 1 else dict(zip(task.query_names, labels))

    out = []
    for i in range(len(ops)):
        record = {"operations": [names[int(o)] for o in ops[i]],
                  "step_states": [state(s) for s in states[i, 1:]], "state": state(states[i, -1])}
        if initial is not None:
            record["initial_state"] = state(states[i, 0])
        out.append(record)
    return out


__all__ = ["COLUMN_NAMES", "LoadedRecords", "RecordColumns", "RecordError", "RecordSplits", "read_record_splits", "build_record_tokenizer",
           "discover_format", "encode_records", "evaluate_records", "has_step_states", "load_record_files", "read_file",
           "record_token_ids", "records_progress_profile", "resolve_columns", "resolve_files", "task_records"]
