"""Learning from recorded data: state-tracking records read from CSV / JSON Lines / Parquet files or the Hub.

A record is a sequence of operations (opaque strings), the state observed at the end, and optionally the state
after every operation and an initial state; a state is one label or a mapping query -> label (labels keep their
string form: a CSV / TSV cell is read as the text written in it; a JSON number is its value's text, see `normalize`).
Reading goes in steps, each a module, each over Arrow tables in batches (`datasets.Dataset.map` with pure functions,
so `datasets`' cache and ``num_proc`` work), never as Python lists of the whole file:

    io         files / load_dataset --> raw columns; which column holds what (`resolve_columns`, once)
    normalize  raw rows --> normalized records (one rule, `Normalizer.record`; an Arrow fast path tested equal)
    encode     training records --> RecordFormat + tokenizer (`discover_format`); records --> the training
               columns of `state_tracking.data` (the prompt laid out by `RecordFormat.layout` only)
    splits     train / validation / test read together (`read_record_splits`), lengths checked against the loop
    evaluate   accuracy per length and the progress profile on recorded step states

Unknown labels are `LABEL_PAD_ID` (-100) in `step_labels`: z_0 without an initial state, and every intermediate
state of a final-states-only record; the PAR loss supervises what is known (`trainers.objectives.answer_loss`).
A bad record (empty sequence, step states that do not match its operations, a label or operation the training files
never held, a value that does not parse) raises one `RecordError` naming the file, the record (0-based), the user's
column and its flag; ``skip_bad_records=True`` drops such records instead and reports how many (never silently).

Today's tasks are one producer of records: `task_records` writes a task's problems in this format
(``examples/make_dataset.py``), and training from such a file sees the same problems as training from the generator.
"""

from .encode import (
    ENCODED,
    OPERATION_TOKENS,
    Encoder,
    build_record_tokenizer,
    check_distinct_encodings,
    discover_format,
    encode_records,
    has_step_states,
    record_token_ids,
    reserved_tokens,
    whole_token_clashes,
)
from .evaluate import evaluate_records, records_progress_profile
from .io import (
    COLUMN_NAMES,
    EXTENSIONS,
    SCALAR_QUERY,
    RecordColumns,
    RecordError,
    check_delimiter,
    dataset_split_names,
    read_file,
    resolve_columns,
    resolve_files,
    task_records,
)
from .normalize import NORMALIZED, Normalizer, find_query_names, normalize
from .splits import (
    MIN_VALIDATION_RECORDS,
    LoadedRecords,
    ReadOptions,
    RecordSplits,
    check_record_lengths,
    load_record_files,
    longest_records,
    read_record_splits,
    records_across_lengths,
    reencode_record_splits,
    within_reach,
)

__all__ = [
    "COLUMN_NAMES", "ENCODED", "EXTENSIONS", "MIN_VALIDATION_RECORDS", "NORMALIZED", "OPERATION_TOKENS", "SCALAR_QUERY",
    "Encoder", "LoadedRecords", "Normalizer", "ReadOptions", "RecordColumns", "RecordError", "RecordSplits",
    "build_record_tokenizer", "check_delimiter", "check_distinct_encodings", "check_record_lengths",
    "dataset_split_names", "discover_format", "encode_records", "evaluate_records", "find_query_names",
    "has_step_states", "load_record_files", "longest_records", "normalize", "read_file", "read_record_splits",
    "records_across_lengths",
    "reencode_record_splits",
    "record_token_ids", "reserved_tokens", "whole_token_clashes",
    "records_progress_profile", "resolve_columns", "resolve_files", "task_records", "within_reach",
]
