"""One rule for reading a record's cells: raw rows -> normalized records (`NORMALIZED`).

A record is a sequence of operations (opaque strings; whitespace runs collapsed: `normalize_operation`, whitespace
being Unicode's, `WHITESPACE`), the state after each of them where recorded ("" where not), and optionally an initial
state; a state is one label or a mapping query -> label. A label is the text written in the file, stripped: a CSV /
TSV cell is read as text (`io.csv_as_text`: ``007`` stays ``007``, ``NA`` is a label); a JSON / Parquet number or
boolean is its value's text (`label_string`: ``2``, ``2.0`` and ``"2"`` are one label "2", ``1.50`` is "1.5",
``true`` is "true"), as the pipeline reads an answer given as a number; write a label as a JSON string to keep
another form (``"1.50"``). `Normalizer.record` is the rule; `plain_batch` is an optimisation over Arrow for batches
where every value is plain, tested equal to the rule on adversarial pieces, and any batch it cannot prove plain goes
record by record.

`Normalizer` is a pure function of its batch (its queries are fixed before the map: `find_query_names`): a bad
record raises `RecordError`, or with ``skip_bad`` becomes an empty row whose ``error`` names it, counted and dropped
after the map (`normalize`). So `datasets`' cache and ``num_proc`` work.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value

from modeling_par.record_format import label_string, normalize_operation

from .io import SCALAR_QUERY, RecordColumns, RecordError, check_delimiter

NORMALIZED = Features({
    "operations": List(Value("string")),
    "labels": List(List(Value("string"))),  # (d, Q): the state after op 1..d; "" = not recorded
    "initial": List(Value("string")),  # (Q,) or empty
    "source": Value("int32"),  # which file (index into LoadedRecords.sources)
    "record": Value("int64"),  # the record's index in that file (0-based), for error messages
    "error": Value("string"),  # "" or why the record was skipped (dropped after the map)
})
# part of every Normalizer's state, so datasets' cache of a map never outlives a change of this rule
CODE_VERSION = hashlib.sha1(open(__file__, "rb").read()).hexdigest()
LIKELY_DELIMITERS = {";": ";", ",": ",", "|": r"\|", "\t": r"\t"}
# The one whitespace rule of both paths (`Normalizer.record` and the Arrow fast path, `Normalizer.plain_batch`): the
# characters Python's str.split() / str.strip() and re's \s take for whitespace, which `normalize_operation` collapses
# (so a checkpoint reads an operation as training did): space, \t \n \v \f \r, \x1c-\x1f, \x85, NBSP \xa0, \u1680,
# \u2000-\u200a, \u2028, \u2029, \u202f, \u205f, \u3000. Spelled out for Arrow, whose regex engine (RE2) takes \s
# for ASCII only (and without \v).
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
              + "\u2028\u2029\u202f\u205f\u3000")
WHITESPACE_RUN = f"[{WHITESPACE}]+"  # one pattern for Python's re and RE2 alike (literal characters in a class)


def json_in_text(text: str) -> Any:
    """JSON written inside a text cell (a CSV cell, a string value), its numbers kept as the text written there.

    The one typing rule of labels: a label is what its cell holds. A text cell's label is its text as written — `2.0`
    stays "2.0", `007` stays "007" — and so is a number written inside JSON text in a text cell (a step-state list
    ``[1.0, 2.0]``, a mapping ``{"x": 2.0}``): "1.0", "2.0", the same labels as the plain cells beside it. A value the
    file's format types as a number (JSON Lines, Parquet) is named by `label_string` (integral without the point:
    2.0 -> "2") wherever it stands, in a list or a mapping alike."""
    return json.loads(text, parse_float=str, parse_int=str)


def parse_state(value: Any, where: str) -> dict[str, str] | str:
    """A cell holding one state: a mapping (or its JSON text) -> {query: label}; anything else -> one label."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json_in_text(value)
        except json.JSONDecodeError as error:
            raise RecordError(f"{where}: {value!r} is not a valid JSON mapping ({error}).") from None
    if isinstance(value, dict):
        if not value:
            raise RecordError(f"{where}: the state mapping is empty.")
        out = {}
        for query, label in value.items():
            if not str(query).strip():
                raise RecordError(f"{where}: the state mapping has an empty query name {query!r}; name every query.")
            if label is None or (isinstance(label, str) and not label.strip()):
                raise RecordError(f"{where}: the label of {query!r} is missing.")
            if isinstance(label, (dict, list)):
                raise RecordError(f"{where}: the label of {query!r} must be a string, number or boolean; "
                                  f"got {label!r}.")
            out[str(query)] = label_string(label)
        return out
    if (value is None or (isinstance(value, float) and np.isnan(value))
            or (isinstance(value, str) and not value.strip())):
        raise RecordError(f"{where}: the state is missing.")
    if isinstance(value, (list, tuple)):
        raise RecordError(f"{where}: a state must be a label or a mapping query -> label; got a list {value!r}.")
    return label_string(value)


def json_cell(text: str) -> Any:
    """One cell of a column `datasets` read as JSON text (a JSON Lines column whose cells mix types) -> its value.
    `datasets` keeps a string cell's text as it is where its (lenient) JSON parser reads the text, and writes every
    other value as JSON: so a text that is not strict JSON (``007``) or that writes a number otherwise than `datasets`
    writes that number (``1.50``, ``1e3``) was a string and stays that string; a number's text such as ``2`` is read
    as the number, the same label as the string "2"."""
    from datasets.utils.json import ujson_dumps

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(value, (int, float)) and not isinstance(value, bool) and ujson_dumps(value) != text:
        return text
    return value


def split_cell(value: Any, splitter: re.Pattern, where: str, what: str) -> list[Any]:
    """A list cell as it is; a string cell split at the delimiter (a JSON list text parsed)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        text = value.strip()
        # a JSON list written into a text cell (CSV): its items, for operations and step states alike (an operations
        # cell that only starts with "[", a log line such as "[INFO] start; stop", is split at the delimiter)
        if text.startswith("["):
            try:
                parsed = json_in_text(text)
            except json.JSONDecodeError as error:
                if what == "step states" or text.endswith("]"):
                    raise RecordError(f"{where}: {value!r} is not a valid JSON list ({error}).") from None
                parsed = None
            if isinstance(parsed, list):
                return parsed
        return [piece for piece in splitter.split(text) if piece.strip()] if text else []
    if value is None:
        return []
    raise RecordError(f"{where}: the {what} must be a list or a delimited string; "
                      f"got {type(value).__name__} {value!r}.")


def _kinds(items: list) -> set[str]:
    """The kinds of a list's items, as an error names them."""
    return {"string" if isinstance(i, str) else "number" if isinstance(i, (int, float)) and not isinstance(i, bool)
            else type(i).__name__ for i in items}


def splitter_of(columns: RecordColumns) -> re.Pattern:
    return check_delimiter(columns.delimiter) if columns.delimiter else re.compile(WHITESPACE_RUN)


def find_query_names(data: Dataset, columns: RecordColumns, limit: int = 1000) -> list[str]:
    """The queries a split's states name, from the first record (of the first `limit`) whose state parses: the
    mapping's keys (sorted), or [SCALAR_QUERY] for a label. Fixed before the map, so the map stays pure; a later
    state naming other queries is that record's error."""
    splitter = splitter_of(columns)
    role = columns.state or columns.step_states
    for value in data.select_columns([role]).select(range(min(limit, len(data))))[role]:
        try:
            if columns.state is None:
                pieces = split_cell(value, splitter, "", "step states")
                if not pieces:
                    continue
                value = pieces[0]
            state = parse_state(value, "")
        except RecordError:
            continue
        return sorted(state) if isinstance(state, dict) else [SCALAR_QUERY]
    return [SCALAR_QUERY]


class Normalizer:
    """Raw rows -> normalized records (see `NORMALIZED`), checking each (the one rule: `record`)."""

    def __init__(self, columns: RecordColumns, source: str, source_index: int, query_names: list[str],
                 skip_bad: bool, json_columns: tuple[str, ...] = ()):
        self.columns, self.source, self.query_names, self.skip_bad = columns, source, list(query_names), skip_bad
        self.source_index = source_index
        self.splitter = splitter_of(columns)
        self.code_version = CODE_VERSION
        # columns datasets read as JSON text (a JSON Lines column whose cells mix types: lists and strings, say)
        self.json_columns = tuple(json_columns)

    def states(self, state, where) -> list[str]:
        """One parsed state -> labels in query order."""
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
        """The rule: one raw row -> one normalized record, or `RecordError` naming the file, the record (0-based),
        the user's column and its flag."""
        c = self.columns
        at = f"{self.source}, record {index} (0-based)"
        where_ops = f"{at}, column {c.field('operations')}"
        raw_ops = split_cell(row[c.operations], self.splitter, where_ops, "operations")
        kinds = _kinds(raw_ops)
        if len(kinds) > 1:
            raise RecordError(f"{where_ops}: the operations mix {' and '.join(sorted(kinds))} items ({raw_ops!r}); "
                              "write every operation of a record the same way (all strings, or all numbers).")
        ops = []
        for k, op in enumerate(raw_ops):
            if op is None or isinstance(op, (dict, list)):
                raise RecordError(f"{where_ops}: operation {k + 1} must be a string or a number; got {op!r}.")
            text = normalize_operation(label_string(op) if not isinstance(op, str) else op)
            if not text:
                raise RecordError(f"{where_ops}: operation {k + 1} is empty.")
            ops.append(text)
        if not ops:
            raise RecordError(f"{where_ops}: the sequence of operations is empty.")
        final = None
        if c.state is not None:
            where = f"{at}, column {c.field('state')}"
            final = self.states(parse_state(row[c.state], where), where)
        labels = [[""] * len(final)] * (len(ops) - 1) + [final] if final is not None else None
        if c.step_states is not None:
            where = f"{at}, column {c.field('step_states')}"
            steps = split_cell(row[c.step_states], self.splitter, where, "step states")
            if len(steps) != len(ops):
                raise RecordError(f"{where}: {len(steps)} step states for {len(ops)} operations (one state after each "
                                  "operation).")
            labels = [self.states(parse_state(s, f"{where}, step {k + 1}"), f"{where}, step {k + 1}")
                      for k, s in enumerate(steps)]
            if final is not None and labels[-1] != final:
                raise RecordError(f"{at}: the last step state {labels[-1]} (column {c.field('step_states')}) differs "
                                  f"from the final state {final} (column {c.field('state')}).")
        initial = []
        if c.initial_state is not None:
            where = f"{at}, column {c.field('initial_state')}"
            initial = self.states(parse_state(row[c.initial_state], where), where)
        return {"operations": ops, "labels": labels, "initial": initial, "source": self.source_index, "record": index,
                "error": ""}

    def __call__(self, table: pa.Table, indices: list[int]) -> pa.Table | dict:
        """One batch (an Arrow table) -> its normalized records, one row per raw row (a skipped record: an empty
        row whose ``error`` says why). Arrow compute where every value is plain (`plain_batch`), else the rule
        record by record."""
        fast = self.plain_batch(table, indices[0]) if len(indices) and not self.json_columns else None
        if fast is not None:
            return fast
        out = {k: [] for k in NORMALIZED}
        batch = table.to_pydict()
        for name in self.json_columns:
            # each JSON text cell decoded back to its own value: "cancel" is the operation cancel, never '"cancel"'
            batch[name] = [None if v is None else json_cell(v) for v in batch[name]]
        keys = list(batch)
        for i, index in enumerate(indices):
            row = {k: batch[k][i] for k in keys}
            try:
                record = self.record(row, index)
            except RecordError as error:
                if not self.skip_bad:
                    raise
                record = {"operations": [], "labels": [], "initial": [], "source": self.source_index,
                          "record": index, "error": str(error)}
            for k in out:
                out[k].append(record[k])
        return out

    def plain_batch(self, table: pa.Table, first: int) -> pa.Table | None:
        """The batch normalized with Arrow compute, or None unless every value is plain: whitespace-delimited strings
        or lists of strings / integers for the operations and step states, scalar string / integer / boolean labels,
        nothing missing or empty, step counts matching, the last step state equal to the final state. None sends the
        batch to `record` (the same result, and the error naming the record where one is bad)."""
        c = self.columns
        if c.delimiter is not None or self.query_names != [SCALAR_QUERY]:
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
        op_offsets = pa.array(offsets, pa.int32())
        columns = [pa.ListArray.from_arrays(op_offsets, flat_ops),
                   pa.ListArray.from_arrays(op_offsets, pa.ListArray.from_arrays(
                       pa.array(np.arange(len(labels) + 1), pa.int32()), labels)),
                   initial, pa.array(np.full(n, self.source_index), pa.int32()),
                   pa.array(np.arange(first, first + n), pa.int64()), pa.array([""] * n, pa.string())]
        return pa.Table.from_arrays(columns, schema=NORMALIZED.arrow_schema)


def _plain_lists(column, operations: bool) -> pa.ListArray | None:
    """A column of whitespace-delimited strings or of lists of strings / integers as lists of stripped strings (an
    operation's inner whitespace collapsed), or None where it is anything else (whitespace: `WHITESPACE`)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if column.null_count:
        return None
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = _trim(column)
        if pc.any(pc.starts_with(text, "[")).as_py() or pc.any(pc.starts_with(text, "{")).as_py():
            return None
        split = pc.split_pattern_regex(text, WHITESPACE_RUN)
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
    flat = _trim(flat)
    if operations:
        flat = pc.replace_substring_regex(flat, WHITESPACE_RUN, " ")
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
    text = _trim(column)
    if pc.any(pc.starts_with(text, "{")).as_py() or not _all_plain(text):
        return None
    return text.cast(pa.string())


def _trim(strings: pa.Array) -> pa.Array:
    """Surrounding `WHITESPACE` stripped from each string (Python's str.strip())."""
    return pc.utf8_trim(strings, characters=WHITESPACE)


def _all_plain(strings: pa.Array) -> bool:
    """No missing and no empty string."""
    return strings.null_count == 0 and (len(strings) == 0 or pc.min(pc.utf8_length(strings)).as_py() > 0)


def keep_rows(dataset: Dataset, keep: np.ndarray) -> Dataset:
    """The rows where `keep` is true, as a flat table (no indices mapping: the readers use ``dataset.data.table``)."""
    if keep.all():
        return dataset
    return dataset.select(np.flatnonzero(keep)).flatten_indices()


def errors_of(dataset: Dataset) -> tuple[list[str], np.ndarray]:
    """(the skipped records' errors, the mask of rows kept) from a mapped dataset's ``error`` column."""
    errors = dataset.data.table.column("error")
    bad = pc.not_equal(errors, "").to_numpy(zero_copy_only=False)
    return [e for e in pc.filter(errors, pa.array(bad)).to_pylist()], ~bad


def check_likely_delimiter(dataset: Dataset, columns: RecordColumns, raw: Dataset, source: str) -> None:
    """A column read as one operation per record while every cell holds a likely delimiter (`LIKELY_DELIMITERS`)
    other than the one given was almost surely split wrongly: one error suggesting the flag (a log whose records are
    all one operation long is almost never what it means)."""
    lengths = pc.list_value_length(dataset.data.table.column("operations")).to_numpy(zero_copy_only=False)
    if len(lengths) < 2 or lengths.max() > 1:
        return
    cells = raw.select(range(min(len(raw), 200)))[columns.operations]
    if not all(isinstance(cell, str) and not cell.strip().startswith("[") for cell in cells):
        return
    given = re.compile(columns.delimiter) if columns.delimiter else None
    for symbol, regex in LIKELY_DELIMITERS.items():
        if given is not None and given.fullmatch(symbol):
            continue
        if all(symbol in cell.strip() for cell in cells):
            now = f"--operation_delimiter {columns.delimiter!r}" if columns.delimiter else "whitespace"
            raise RecordError(
                f"{source}: every record of column {columns.field('operations')} reads as one operation (split at "
                f"{now}), but every cell contains {symbol!r} (e.g. {cells[0]!r}): pass --operation_delimiter "
                f"{regex!r} to split them at it.")


def normalize(data: Dataset, columns: RecordColumns, source: str, source_index: int, query_names: list[str],
              skip_bad: bool, num_proc: int | None = None,
              load_from_cache_file: bool = True) -> tuple[Dataset, list[str]]:
    """One raw split -> (normalized records, the errors of the records skipped); see `Normalizer`."""
    used = [c for c in (columns.operations, columns.state, columns.step_states, columns.initial_state)
            if c is not None]
    json_columns = tuple(c for c in used if type(data.features[c]).__name__ == "Json")
    normalizer = Normalizer(columns, source, source_index, query_names, skip_bad, json_columns)
    kwargs = {"num_proc": num_proc} if num_proc and num_proc > 1 and len(data) >= 2 * num_proc else {}
    normalized = data.select_columns(used).with_format("arrow").map(
        normalizer, batched=True, batch_size=2000, with_indices=True, remove_columns=used, features=NORMALIZED,
        load_from_cache_file=load_from_cache_file, desc=f"reading {os.path.basename(source)}",
        **kwargs).with_format(None)
    errors, keep = errors_of(normalized)
    return keep_rows(normalized, keep).remove_columns("error"), errors
