"""What the training records teach (`discover_format`: the vocabulary, `build_record_tokenizer`) and normalized
records -> the training columns of `state_tracking.data` (`encode_records`).

The prompt of a record is laid out by `RecordFormat.layout` only (the pipeline's `RecordFormat.encode` goes through
it too); this module checks operations and labels in bulk over Arrow and builds the label columns:
``input_ids``, ``query_positions``, ``operation_ends`` (the layout), ``step_labels`` ((d + 1) × Q candidate indices:
z_0, then the state after each operation; `LABEL_PAD_ID` where not recorded), ``depth`` and ``ops``.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

import modeling_par.record_format as record_format_module
from modeling_par.record_format import RecordFormat, candidate_token, query_token

from ..data import LABEL_PAD_ID
from ..prompts import BOS_TOKEN, NO_TOKEN, PAD_TOKEN, UNK_TOKEN, YES_TOKEN
from .io import RecordColumns, RecordError
from .normalize import errors_of, keep_rows

# part of every Encoder's state, so datasets' cache of a map never outlives a change of the encoding or the layout
CODE_VERSION = hashlib.sha1(open(__file__, "rb").read() + open(record_format_module.__file__, "rb").read()).hexdigest()
ENCODED = Features({
    "input_ids": List(Value("int32")),
    "query_positions": List(Value("int32")),
    "operation_ends": List(Value("int32")),
    "step_labels": List(List(Value("int32"))),
    "depth": Value("int32"),
    "ops": List(Value("int32")),
    "error": Value("string"),  # "" or why the record was skipped (dropped after the map)
})


# ---------------------------------------------------------------------------------------------------------- vocabulary
def _natural_key(label: str):
    return (0, int(label), label) if re.fullmatch(r"-?\d+", label) else (1, 0, label)


def discover_format(train, name: str = "records") -> RecordFormat:
    """What the training records (`LoadedRecords`) teach: every operation (first appearance order), every label
    (numbers in numeric order, then the rest sorted), the queries, the delimiter and whether prompts carry an
    initial state."""
    table = train.dataset.data.table
    operations = pc.unique(pc.list_flatten(table.column("operations"))).to_pylist()
    labels = pc.list_flatten(pc.list_flatten(table.column("labels")))
    initial = pc.list_flatten(table.column("initial"))
    values = set(pc.unique(labels).to_pylist()) | set(pc.unique(initial).to_pylist())
    values.discard("")
    candidates = sorted(values, key=_natural_key)
    c = train.columns
    has_initial = c.initial_state is not None
    columns = {role: getattr(c, role) for role in ("operations", "state", "step_states", "initial_state")}
    return RecordFormat(query_names=tuple(train.query_names), candidates=tuple(candidates),
                        operations=tuple(operations), delimiter=c.delimiter, initial_state=has_initial,
                        task_name=name, columns=tuple(sorted(columns.items())))


OPERATION_TOKENS = ("words", "whole")  # how a record tokenizer reads an operation (`build_record_tokenizer`)


def check_operation_tokens(value) -> None:
    """`--operation_tokens` is one of `OPERATION_TOKENS`, or one error naming the flag."""
    if value not in OPERATION_TOKENS:
        raise RecordError(f"--operation_tokens must be one of {list(OPERATION_TOKENS)} (words: an operation's words; "
                          f"whole: one token per distinct operation); got {value!r}.")


def reserved_tokens(record_format: RecordFormat) -> list[str]:
    """The tokens a record tokenizer holds before any operation: ``<pad> <unk> <bos>``, the query tokens, ``Yes No``
    (the halting readout), one token per label."""
    return [PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, *(query_token(j) for j in range(len(record_format.query_names))),
            YES_TOKEN, NO_TOKEN, *(candidate_token(c) for c in record_format.candidates)]


def whole_token_clashes(record_format: RecordFormat) -> list[str]:
    """The operations `--operation_tokens whole` cannot give a token of their own: those written as a token the
    tokenizer already reserves (`reserved_tokens`: an operation named "Yes" or "No", say). Empty: whole tokens work."""
    return sorted(set(record_format.operations) & set(reserved_tokens(record_format)))


def build_record_tokenizer(record_format: RecordFormat, operation_tokens: str = "words") -> PreTrainedTokenizerFast:
    """A word-level tokenizer for a `RecordFormat`: ``<pad> <unk> <bos>``, the query tokens, ``Yes No``, one token
    per label (``<=label>``, placed by id only), then

    - ``operation_tokens="words"``: the words of the operations (whitespace and punctuation split, as `tokenizers`'
      Whitespace pre-tokenizer) in order of first appearance: ``x2, x4 = x4, x2`` is 7 tokens, and an operation
      training never held can be read from the words of trained ones;
    - ``"whole"``: one token per distinct operation (its whole text, an added token), as an RNN's embedding table
      reads a symbol: one token per operation whatever its wording (fewer tokens per record, so cheaper steps), and no
      untrained operation can be read."""
    check_operation_tokens(operation_tokens)
    queries = [query_token(j) for j in range(len(record_format.query_names))]
    labels = [candidate_token(c) for c in record_format.candidates]
    vocab = reserved_tokens(record_format)
    pre_tokenizer = Whitespace()
    if operation_tokens == "whole":
        clash = whole_token_clashes(record_format)
        if clash:
            raise RecordError(f"--operation_tokens whole: operations {clash[:3]} are written as the records tokens "
                              "of the same name; rename them in the data, or use --operation_tokens words.")
        vocab += list(record_format.operations)
    else:
        for op in record_format.operations:
            vocab += [word for word, _ in pre_tokenizer.pre_tokenize_str(op)]
    vocab = list(dict.fromkeys(vocab))
    backend = Tokenizer(WordLevel({token: i for i, token in enumerate(vocab)}, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizer
    backend.add_special_tokens([PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, *queries, *labels])
    if operation_tokens == "whole":  # matched on an operation's whole (normalized) text, longest first
        backend.add_tokens([AddedToken(op, normalized=False) for op in record_format.operations])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS_TOKEN, pad_token=PAD_TOKEN,
                                   unk_token=UNK_TOKEN, extra_special_tokens=queries, padding_side="right",
                                   model_max_length=1_000_000)


def check_distinct_encodings(record_format: RecordFormat, tokenizer, columns: RecordColumns | None = None) -> None:
    """Operations the model could not tell apart are one error: distinct operation strings whose token ids are the
    same ('a-b', 'a - b' and 'a -b' are the words a, -, b alike) would be trained as one operation."""
    seen: dict[tuple, str] = {}
    where = (columns or RecordColumns()).field("operations")
    for i, op in enumerate(record_format.operations):
        ids = tuple(record_format.operation_tokens(tokenizer, i))
        if ids in seen:
            raise RecordError(f"operations {seen[ids]!r} and {op!r} (column {where}) encode to the same tokens "
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
class Encoder:
    """Normalized records -> training columns. Checks every operation and label against the format in bulk
    (Arrow), lays each prompt out with `RecordFormat.layout`, and builds the label columns as flat arrays. Pure: a
    bad record raises `RecordError`, or with ``skip_bad`` becomes a row whose ``error`` says why (dropped after the
    map), so `datasets`' cache and ``num_proc`` work. Holds plain values only (its hash is stable)."""

    def __init__(self, record_format: RecordFormat, tokenizer, sources: list[str], skip_bad: bool,
                 columns: RecordColumns | None = None):
        self.format = RecordFormat.from_dict(record_format.to_dict())  # without the per-tokenizer caches
        self.sources, self.skip_bad = list(sources), skip_bad
        self.columns = columns or RecordColumns()
        self.special = record_format.special_ids(tokenizer)
        self.tokens = [list(record_format.operation_tokens(tokenizer, i))
                       for i in range(len(record_format.operations))]
        self.code_version = CODE_VERSION

    def _unknown(self, indices, rows_of, values, what, role):
        return [(int(rows_of[p]), f"column {self.columns.field(role)}: {what} {values[p]!r} never occurs in the "
                 "training data") for p in np.flatnonzero(indices == -1)]

    def __call__(self, table: pa.Table) -> pa.Table:
        """A batch of normalized records as an Arrow table (the dataset is mapped in ``arrow`` format)."""
        ops_col, labels_col, initial_col = table.column("operations"), table.column("labels"), table.column("initial")
        n = table.num_rows
        depth = pc.list_value_length(ops_col).to_numpy(zero_copy_only=False).astype(np.int64)
        flat_ops = pc.list_flatten(ops_col)
        op_values, label_values = pa.array(self.format.operations), pa.array(self.format.candidates)
        op_index = pc.index_in(flat_ops, value_set=op_values).fill_null(-1).to_numpy(zero_copy_only=False)
        op_rows = np.repeat(np.arange(n), depth)
        q = len(self.format.query_names)
        flat_labels = pc.list_flatten(pc.list_flatten(labels_col))
        label_index = pc.index_in(flat_labels, value_set=label_values).fill_null(-1).to_numpy(zero_copy_only=False)
        unrecorded = pc.equal(flat_labels, "").to_numpy(zero_copy_only=False)
        label_index = np.where(unrecorded, LABEL_PAD_ID, label_index)
        label_rows = np.repeat(np.arange(n), depth * q)
        flat_initial = pc.list_flatten(initial_col)
        initial_index = pc.index_in(flat_initial, value_set=label_values).fill_null(-1).to_numpy(
            zero_copy_only=False)
        initial_len = pc.list_value_length(initial_col).to_numpy(zero_copy_only=False).astype(np.int64)
        initial_rows = np.repeat(np.arange(n), initial_len)
        if self.format.initial_state and (initial_len != q).any():
            row = int(np.flatnonzero(initial_len != q)[0])
            problems = [(row, f"no initial state (column {self.columns.field('initial_state')}), but the training "
                              "records have one")]
        elif not self.format.initial_state and initial_len.any():
            row = int(np.flatnonzero(initial_len)[0])
            problems = [(row, f"an initial state (column {self.columns.field('initial_state')}), but the training "
                              "records had none (the model never read one)")]
        else:
            problems = []
        problems += self._unknown(op_index, op_rows, flat_ops.to_pylist() if (op_index < 0).any() else None,
                                  "operation", "operations")
        problems += self._unknown(label_index, label_rows, flat_labels.to_pylist() if (label_index < 0).any() else None,
                                  "label", "labels")
        problems += self._unknown(initial_index, initial_rows,
                                  flat_initial.to_pylist() if (initial_index < 0).any() else None, "label", "initial")
        errors = [""] * n
        for row, message in problems:
            message = (f"{self.sources[table.column('source')[row].as_py()]}, record "
                       f"{table.column('record')[row].as_py()} (0-based), {message}")
            if not self.skip_bad:
                raise RecordError(message + ".")
            errors[row] = errors[row] or message
        return self._columns(np.array([not e for e in errors], dtype=bool), errors, depth, op_index, label_index,
                             initial_index, initial_len)

    def _columns(self, keep, errors, depth, op_index, label_index, initial_index, initial_len) -> pa.Table:
        """Every record's columns (a bad record's empty): the prompt by `RecordFormat.layout`, z_0 (or unrecorded)
        followed by the recorded labels as ``step_labels``."""
        q, n = len(self.format.query_names), len(depth)
        op_starts = np.concatenate([[0], np.cumsum(depth)])
        initial = np.full((n, q), LABEL_PAD_ID, dtype=np.int64)  # z_0 per record
        has_initial = initial_len == q
        if has_initial.any():
            initial[has_initial] = initial_index.reshape(-1, q)[np.cumsum(has_initial)[has_initial] - 1]
        layout, tokens, special = self.format.layout, self.tokens, self.special
        ops_list, initial_list = op_index.tolist(), initial.tolist()
        ids, ends, queries = [], [], []
        for r in range(n):
            if not keep[r]:
                ids.append([]), ends.append([]), queries.append([])
                continue
            row = layout(special, [tokens[i] for i in ops_list[op_starts[r]:op_starts[r + 1]]],
                         initial_list[r] if self.format.initial_state else None)
            ids.append(row[0]), ends.append(row[1]), queries.append(row[2])
        # step_labels: d + 1 rows of Q per record, z_0 then the state after each operation
        row_offsets = np.concatenate([[0], np.cumsum(depth + 1)])
        labels = np.empty((row_offsets[-1], q), dtype=np.int64)
        labels[row_offsets[:-1]] = initial
        op_rows = np.repeat(row_offsets[:-1] + 1, depth) + np.arange(len(op_index)) - np.repeat(op_starts[:-1], depth)
        labels[op_rows] = label_index.reshape(-1, q)
        step_labels = pa.ListArray.from_arrays(
            pa.array(row_offsets, pa.int32()),
            pa.ListArray.from_arrays(pa.array(np.arange(len(labels) + 1) * q, pa.int32()),
                                     pa.array(labels.reshape(-1), pa.int32())))
        ops = pa.ListArray.from_arrays(pa.array(op_starts, pa.int32()), pa.array(op_index, pa.int32()))
        lists = pa.list_(pa.int32())
        columns = [pa.array(ids, lists), pa.array(queries, lists), pa.array(ends, lists), step_labels,
                   pa.array(depth, pa.int32()), ops, pa.array(errors, pa.string())]
        return pa.Table.from_arrays(columns, schema=ENCODED.arrow_schema)


def encode_records(records, record_format: RecordFormat, tokenizer, skip_bad_records: bool = False,
                   num_proc: int | None = None, load_from_cache_file: bool = True) -> tuple[Dataset, list[str]]:
    """Normalized records (`LoadedRecords`) -> the training columns (batched over Arrow), and the records skipped
    (an operation or label the format does not know, a missing initial state) when ``skip_bad_records``; otherwise
    the first such record raises `RecordError`. A skipped record leaves ``records.dataset`` too, so that the
    normalized and the encoded records stay the same records, row for row (what a baseline scores from the one is
    what PAR scores from the other)."""
    if list(records.query_names) != list(record_format.query_names):
        raise RecordError(f"{records.sources}: the states name the queries {records.query_names}, the training data "
                          f"{list(record_format.query_names)}.")
    encoder = Encoder(record_format, tokenizer, records.sources, skip_bad_records, records.columns)
    data = records.dataset
    kwargs = {"num_proc": num_proc} if num_proc and num_proc > 1 and len(data) >= 2 * num_proc else {}
    encoded = data.with_format("arrow").map(
        encoder, batched=True, batch_size=2000, remove_columns=data.column_names, features=ENCODED,
        load_from_cache_file=load_from_cache_file, desc="encoding records", **kwargs).with_format(None)
    skipped, keep = errors_of(encoded)
    encoded = keep_rows(encoded, keep).remove_columns("error")
    records.dataset = keep_rows(data, keep)
    if len(encoded) == 0:
        raise RecordError(f"no record of {records.sources} is left to use ({len(skipped)} skipped: "
                          f"{skipped[:1]}).")
    return encoded, skipped


def has_step_states(records) -> bool:
    """Whether any record carries an intermediate state (a label recorded before its last operation): every record
    has its final state, so more recorded labels than records × queries means step states."""
    table = records.dataset.data.table
    labels = pc.list_flatten(pc.list_flatten(table.column("labels")))
    recorded = int(pc.sum(pc.not_equal(labels, "")).as_py() or 0)
    return recorded > table.num_rows * len(records.query_names)
