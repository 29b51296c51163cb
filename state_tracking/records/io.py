"""Files and column roles: which files, read how (`datasets.load_dataset`), and which column holds what.

Also the producer side: `task_records` writes a task's problems as records (``examples/make_dataset.py``).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from datasets import Dataset, Features, Value, load_dataset

from modeling_par.prompt_format import delimiter_problem

# extension -> the `datasets` builder; a compressed file (.gz / .bz2 / .zst / .xz) is read by the builder of the
# extension before it (`datasets` decompresses it)
EXTENSIONS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
COMPRESSIONS = (".gz", ".bz2", ".zst", ".xz")
SCALAR_QUERY = "state"  # the query name of a scalar state
ROLES = ("operations", "state", "step_states", "initial_state")
# Conventional column names: a column left unnamed is found by these when exactly one of them is present.
COLUMN_NAMES = {
    "operations": ("operations", "ops", "sequence", "events", "actions", "input", "inputs", "tokens"),
    "state": ("state", "final_state", "label", "answer", "target", "output"),
    "step_states": ("step_states", "states", "trajectory", "step_labels"),
    "initial_state": ("initial_state", "initial", "start_state"),
}


class RecordError(ValueError):
    """A record that cannot be read (names the file, the record and the field)."""


def check_delimiter(delimiter: str, flag: str = "--operation_delimiter") -> re.Pattern:
    """The compiled delimiter regex, or one `RecordError` naming `flag` (the rule: `delimiter_problem`)."""
    problem = delimiter_problem(delimiter)
    if problem:
        raise RecordError(f"{flag} {delimiter!r} {problem}.")
    return re.compile(delimiter)


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

    def field(self, role: str) -> str:
        """How an error names a role: the user's column and the flag that names it (``'target'
        (--step_states_column)``); the labels of a record are its step states where it has them."""
        if role == "labels":
            role = "step_states" if self.step_states else "state"
        if role == "initial":
            role = "initial_state"
        name = getattr(self, role)
        return f"{name!r} (--{role}_column)" if name else role.replace("_", " ")


# ---------------------------------------------------------------------------------------------------------- files
def _extension(path: str) -> tuple[str, str | None]:
    """(the data extension, the compression extension or None): 'a.csv.gz' -> ('.csv', '.gz')."""
    stem, ext = os.path.splitext(path.lower())
    if ext in COMPRESSIONS:
        return os.path.splitext(stem)[1], ext
    return ext, None


def file_stem(path: str) -> str:
    """A file's name without its extensions ('logs/orders.csv.gz' -> 'orders')."""
    name = os.path.basename(path)
    ext, compression = _extension(name)
    return name[:len(name) - len(ext) - len(compression or "")] or name


def resolve_files(spec: str | Sequence[str], flag: str = "--train_file") -> list[str]:
    """A path, a glob, or a comma-separated list of them -> the files, each with a known extension (optionally
    compressed). A folder is refused with the flag that reads one (``--dataset_name``)."""
    parts = [p.strip() for p in (spec.split(",") if isinstance(spec, str) else spec) if str(p).strip()]
    if not parts:
        raise RecordError(f"{flag}: no file given (got {spec!r}).")
    allowed = sorted(EXTENSIONS) + [f"{e}{c}" for e in (".csv", ".jsonl") for c in COMPRESSIONS]
    files = []
    for part in parts:
        matches = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
        if not matches:
            raise RecordError(f"{flag}: the pattern {part!r} matches no file.")
        for path in matches:
            if os.path.isdir(path):
                raise RecordError(f"{flag} {path!r} is a folder, not a file: give its files ({path}/*.csv, a glob) "
                                  f"or read the folder as a dataset with --dataset_name {path}.")
            if not os.path.isfile(path):
                raise RecordError(f"{flag}: file {path!r} does not exist.")
            if _extension(path)[0] not in EXTENSIONS:
                raise RecordError(f"{flag}: file {path!r} has an unknown extension; allowed: {allowed} (CSV, JSON "
                                  "Lines, Parquet; CSV and JSON Lines also compressed).")
            files.append(path)
    return files


def read_file(path: str, cache_dir: str | None = None) -> Dataset:
    """One file as a `datasets.Dataset` (Arrow, memory-mapped), or a `RecordError` naming it when it does not parse
    or holds no record (a header-only CSV, an empty JSON Lines file). A CSV / TSV cell is read as the text written in
    it (`csv_as_text`); JSON Lines and Parquet values keep the types their format gives them."""
    ext, _ = _extension(path)
    builder = EXTENSIONS[ext]
    kwargs = {"delimiter": "\t"} if ext == ".tsv" else {}
    if _is_empty(path):
        raise RecordError(f"file {path!r} holds no record "
                          f"(it is empty{', or only a header' if builder == 'csv' else ''}).")
    if _extension(path)[1] == ".zst":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise RecordError(f"file {path!r}: reading .zst files needs the zstandard package (pip install "
                              "zstandard); .gz and .bz2 need nothing more.") from None
    try:
        if builder == "csv":
            kwargs.update(csv_as_text(path, kwargs.get("delimiter", ",")))
        data = load_dataset(builder, data_files=os.path.abspath(path), split="train", cache_dir=cache_dir, **kwargs)
    except Exception as error:  # datasets wraps parser errors in its own types; name the file either way
        cause = error.__cause__ or error
        if _is_empty(path) or "corresponds to no data" in str(error) or type(cause).__name__ == "EmptyDataError":
            raise RecordError(f"file {path!r} holds no record (it is empty, or only a header).") from None
        raise RecordError(f"file {path!r} does not parse as {builder}: {type(cause).__name__}: {cause}") from None
    if len(data) == 0:
        raise RecordError(f"file {path!r} holds no record "
                          f"(it is empty{', or only a header' if builder == 'csv' else ''}).")
    return data


def csv_as_text(path: str, delimiter: str) -> dict:
    """`load_dataset("csv", ...)` options that read every cell as the text written in it: each column a string (no
    type inference: ``01`` and ``007`` stay themselves, ``1.50`` is not ``1.5``) and no value taken for missing
    (``NA``, ``null``, ``nan`` are labels; an empty cell is the empty string, which a record refuses by name). The
    column names come from the header, read by pandas as `datasets` reads it (compression by extension)."""
    import pandas as pd

    names = pd.read_csv(path, sep=delimiter, nrows=0, dtype=str).columns
    return {"features": Features({str(name): Value("string") for name in names}), "keep_default_na": False,
            "na_filter": False}


def _is_empty(path: str) -> bool:
    """Whether an uncompressed CSV / JSON Lines file has no record: no line, or (CSV) only its header line."""
    ext, compression = _extension(path)
    if compression is not None or ext == ".parquet":
        return False
    lines = 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                lines += 1
                if lines > (1 if ext in (".csv", ".tsv") else 0):
                    return False
    return True


def load_raw(files=None, dataset_name: str | None = None, dataset_config_name: str | None = None,
             split: str = "train", flag: str = "--train_file", cache_dir: str | None = None,
             revision: str | None = None, token: str | bool | None = None,
             trust_remote_code: bool = False) -> list[tuple[str, Dataset]]:
    """[(source name, raw Dataset)]: each file (`resolve_files`, `read_file`), or one split of
    `datasets.load_dataset(dataset_name, dataset_config_name, ...)`."""
    if (files is None) == (dataset_name is None):
        raise RecordError("give either files or dataset_name (not both).")
    if files is not None:
        return [(path, read_file(path, cache_dir)) for path in resolve_files(files, flag)]
    kwargs = {"cache_dir": cache_dir, "revision": revision, "token": token}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    try:
        data = load_dataset(dataset_name, dataset_config_name, split=split, **kwargs)
    except Exception as error:
        raise RecordError(f"--dataset_name {dataset_name!r} (--dataset_config_name {dataset_config_name!r}, split "
                          f"{split!r}) does not load: {type(error).__name__}: {error}") from None
    return [(f"{dataset_name}[{split}]", data)]


def dataset_split_names(dataset_name: str, dataset_config_name: str | None, **kwargs) -> list[str]:
    """The splits of a `datasets.load_dataset` name. A name whose splits cannot be listed is one error saying why
    (the evaluation splits would otherwise be skipped without a word)."""
    from datasets import get_dataset_split_names

    kwargs = {k: v for k, v in kwargs.items() if v is not None and v is not False}
    try:
        return get_dataset_split_names(dataset_name, dataset_config_name, **kwargs)
    except Exception as error:  # datasets raises many kinds (missing config, offline hub, bad builder)
        raise RecordError(f"--dataset_name {dataset_name!r} (--dataset_config_name {dataset_config_name!r}): its "
                          f"splits cannot be listed, so its validation / test splits cannot be found: "
                          f"{type(error).__name__}: {error}") from None


# ---------------------------------------------------------------------------------------------------------- columns
def resolve_columns(found: Sequence[str], columns: RecordColumns, source: str,
                    remembered: dict | None = None) -> RecordColumns:
    """Each role's column, resolved once: the named columns first (each must exist, and no column may be named for
    two roles), then each unnamed role by the column a checkpoint remembers from its training file (`remembered`,
    where this file has it), else by its conventional names among the columns not yet taken (several fitting is an
    error). A step-states column is also the final state (its last element) unless --state_column names another.
    Needs the operations and a final or step states column."""
    found = list(found)

    def fail(message):
        raise RecordError(f"{source}: {message}; the columns found are {found}.")

    chosen = {role: getattr(columns, role) for role in ROLES}
    for role, name in chosen.items():
        if name is not None and name not in found:
            fail(f"--{role}_column {name!r} is not a column")
    named = [(role, name) for role, name in chosen.items() if name is not None]
    for i, (role, name) in enumerate(named):
        for other, other_name in named[i + 1:]:
            if name == other_name:
                fail(f"--{role}_column and --{other}_column both name the column {name!r}; a column takes one role "
                     "(a step-states column is already the final state: its last element)")
    for role in ROLES:
        if chosen[role] is not None:
            continue
        if role == "state" and columns.step_states is not None:
            continue  # the named step states give the final state; a conventional name never adds a second one
        known = (remembered or {}).get(role)
        if known is not None and known in found and known not in chosen.values():
            chosen[role] = known
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
