"""How a checkpoint trained on recorded data reads a sequence of operations: the vocabulary it learned from the files.

A *record* is a sequence of operations (opaque strings: a token, a word, a sentence, a log line), optionally an
initial state, and the state observed after it (one label per query; a scalar state is one query). A checkpoint
trained on records keeps what it learned from the training files here, saved in its config as `prompt_format`
with ``"rendering": "records"``:

    operations   every distinct operation string of the training data (whitespace runs collapsed)
    query_names  the queries a state answers ("state" for a scalar state column, else the mapping's keys)
    candidates   every label seen in training (in `answer_token_ids` order)
    delimiter    the regex that splits a string of operations (None: whitespace)
    initial_state   whether a prompt starts with an initial state (the data had an initial-state column)

The model reads one record as token ids

    <bos> [initial: one candidate token per query] words(op_1) ... words(op_d) <q1> ... <qQ>

where words(op) are the tokenizer's tokens of the operation string, `operation_ends` marks each operation's last
token (and the preamble's) and the readout is taken at <q_j>. `layout` is that layout, written once: `encode` (the
pipeline) and the records reader that training uses (`state_tracking.records.encode`) both go through it. An
operation or a label the training data never held is refused with `PromptFormatError`, never guessed.

This format is itself the record of what training used (`PromptFormat.trained` for a task's format): its operations
and candidates are discovered from the training records alone (`state_tracking.records.discover_format`; validation
and test files add nothing). `allow_untrained=True` (`encode`, the pipeline) reads an operation training never held
from its words instead, when the tokenizer knows every one of them; a label training never held has no token and is
always refused.

Remote code: imports only the standard library and its sibling `prompt_format`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .prompt_format import PromptFormatError, delimiter_problem
from .sentences import collapse_whitespace, nearest_sentence

RECORDS = "records"
COLUMN_ROLES = ("operations", "state", "step_states", "initial_state")
QUERY_TOKEN = "<q{}>"  # 1-based, as the symbolic rendering's
CANDIDATE_TOKEN = "<={}>"  # a label's own token (only ever placed by id: never produced from text)


def normalize_operation(text: str) -> str:
    """The key an operation is known by: surrounding whitespace stripped, inner runs collapsed to one space
    (`sentences.collapse_whitespace`)."""
    return collapse_whitespace(text)


def query_token(j: int) -> str:
    """The token asking query j (0-based): ``<q1>``, ``<q2>``, ..."""
    return QUERY_TOKEN.format(j + 1)


def candidate_token(label: str) -> str:
    """The vocabulary entry of one answer label (a label keeps its string form: ``true``, ``42``, ``heating``)."""
    return CANDIDATE_TOKEN.format(label)


@dataclass(frozen=True)
class RecordFormat:
    """What a records checkpoint learned from its training files (see the module docstring)."""

    query_names: tuple[str, ...]
    candidates: tuple[str, ...]
    operations: tuple[str, ...]
    delimiter: str | None = None
    initial_state: bool = False
    task_name: str = "records"
    rendering: str = RECORDS
    columns: tuple = ()  # ((role, the training file's column), ...): what evaluate_par and the pipeline read by default
    _lookup: dict = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        def fail(name, allowed, value):
            raise ValueError(f"prompt_format.{name} must be {allowed}; got {value!r}.")

        if self.rendering != RECORDS:
            fail("rendering", f"{RECORDS!r} for a RecordFormat", self.rendering)
        for name in ("query_names", "candidates", "operations"):
            value = getattr(self, name)
            if not value or not all(isinstance(v, str) and v.strip() for v in value) or len(set(value)) != len(value):
                fail(name, "a non-empty list of distinct non-empty strings", value)
        unnormalized = [op for op in self.operations if op != normalize_operation(op)]
        if unnormalized:
            fail("operations", "strings with single inner spaces and no surrounding whitespace", unnormalized[:3])
        if not isinstance(self.initial_state, bool):
            fail("initial_state", "a bool", self.initial_state)
        if isinstance(self.columns, dict):
            object.__setattr__(self, "columns", tuple(sorted(self.columns.items())))
        if not isinstance(self.columns, tuple) or any(
                not isinstance(item, tuple) or len(item) != 2 or item[0] not in COLUMN_ROLES
                or not (item[1] is None or isinstance(item[1], str) and item[1]) for item in self.columns):
            fail("columns", f"a mapping of {list(COLUMN_ROLES)} to column names (or null)", self.columns)
        problem = None if self.delimiter is None else delimiter_problem(self.delimiter)
        if problem:
            fail("delimiter", f"None (whitespace) or a regex that splits operations apart (this one {problem})",
                 self.delimiter)
        splitter = re.compile(self.delimiter) if self.delimiter is not None else re.compile(r"\s+")
        object.__setattr__(self, "_lookup", {
            "op": {op: i for i, op in enumerate(self.operations)},
            "candidate": {c: i for i, c in enumerate(self.candidates)},
            "splitter": splitter,
            "tokens": {},
            "special": {},
        })

    # ------------------------------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        spec = {"rendering": RECORDS, "task_name": self.task_name, "query_names": list(self.query_names),
                "candidates": list(self.candidates), "operations": list(self.operations),
                "delimiter": self.delimiter, "initial_state": self.initial_state}
        if self.columns:
            spec["columns"] = dict(self.columns)
        return spec

    def column(self, role: str) -> str | None:
        """The training file's column of `role` ('operations', 'state', 'step_states', 'initial_state'), or None."""
        return dict(self.columns).get(role)

    @property
    def answer_names(self) -> tuple[str, ...]:
        """The keys an answer is given under: the mapping's queries, or for a scalar state the training file's state
        column (its step-states column where it had no final one)."""
        if self.query_names == ("state",):
            return (self.column("state") or self.column("step_states") or "state",)
        return self.query_names

    @classmethod
    def from_dict(cls, spec: dict) -> RecordFormat:
        if not isinstance(spec, dict):
            raise ValueError(f"prompt_format must be a dict (RecordFormat.to_dict()); got {type(spec).__name__}.")
        allowed = {"rendering", "task_name", "query_names", "candidates", "operations", "delimiter", "initial_state",
                   "columns"}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(f"prompt_format has unknown key(s) {unknown}; allowed: {sorted(allowed)}.")
        missing = sorted({"query_names", "candidates", "operations"} - set(spec))
        if missing:
            raise ValueError(f"prompt_format is missing {missing}.")
        lists = {}
        for name in ("query_names", "candidates", "operations"):
            if not isinstance(spec[name], (list, tuple)):
                raise ValueError(f"prompt_format.{name} must be a list; got {spec[name]!r}.")
            lists[name] = tuple(spec[name])
        columns = spec.get("columns") or {}
        if not isinstance(columns, dict):
            raise ValueError(f"prompt_format.columns must be a mapping of roles to column names; got {columns!r}.")
        return cls(**lists, delimiter=spec.get("delimiter"), initial_state=spec.get("initial_state", False),
                   task_name=spec.get("task_name", "records"), rendering=spec.get("rendering", RECORDS),
                   columns=tuple(sorted(columns.items())))

    def with_delimiter(self, delimiter: str | None) -> RecordFormat:
        spec = self.to_dict()
        spec["delimiter"] = delimiter
        return RecordFormat.from_dict(spec)

    def example(self, operations: list[str] | None = None) -> list[str]:
        """A record's operations the way the pipeline takes them (default: the first two operations)."""
        ops = list(self.operations[:2]) if operations is None else list(operations)
        self.operation_indices(ops)
        return ops

    # ------------------------------------------------------------------------------------------ reading operations
    def split(self, text: str) -> list[str]:
        """A string of operations -> the operations (split at `delimiter`; whitespace by default). Empty pieces at
        the ends are dropped; an empty piece between two delimiters is an error (an empty operation is never
        answered)."""
        if not isinstance(text, str):
            raise PromptFormatError(f"operations must be a string or a list of strings; got {type(text).__name__}.")
        pieces = self._lookup["splitter"].split(text)
        while pieces and not pieces[0].strip():
            pieces.pop(0)
        while pieces and not pieces[-1].strip():
            pieces.pop()
        for k, piece in enumerate(pieces):
            if not piece.strip():
                raise PromptFormatError(f"operation {k + 1} is empty (two delimiters {self.delimiter!r} in a row): an "
                                        "empty operation is never answered.")
        if not pieces:
            raise PromptFormatError("the sequence of operations is empty.")
        return pieces

    def operation_indices(self, operations: list[str], allow_untrained: bool = False) -> list[int | str]:
        """Each operation's index in `operations`; `PromptFormatError` naming the first one training never saw
        (`allow_untrained`: such an operation is kept as its normalized string instead)."""
        if isinstance(operations, str):
            operations = self.split(operations)
        if not operations:
            raise PromptFormatError("the sequence of operations is empty.")
        lookup = self._lookup["op"]
        indices = []
        for k, op in enumerate(operations):
            if not isinstance(op, str):
                raise PromptFormatError(f"operation {k + 1} must be a string; got {op!r}.")
            key = normalize_operation(op)
            if key not in lookup:
                if allow_untrained and key:
                    indices.append(key)
                    continue
                near = self.nearest_operation(key)
                hint = f"; nearest known: {near!r}" if near else ""
                raise PromptFormatError(
                    f"operation {k + 1} {op!r} never occurs in the training data of {self.task_name!r} "
                    f"({len(lookup)} operations known{hint}). An unseen operation is never answered (pass "
                    "allow_untrained=True to read it from its words anyway).")
            indices.append(lookup[key])
        return indices

    def nearest_operation(self, op: str, cutoff: float = 0.6) -> str | None:
        """The trained operation nearest to `op` (difflib), or None under `cutoff`."""
        return nearest_sentence(op, self._lookup["op"], cutoff)

    def untrained(self, operations) -> list[dict]:
        """The operations training never held, as {"unit": "operation k", "sentence": op, "nearest_trained": ...}."""
        if isinstance(operations, str):
            operations = self.split(operations)
        return [{"unit": f"operation {k + 1}", "sentence": op, "nearest_trained": self.nearest_operation(op, 0.0)}
                for k, op in enumerate(operations) if normalize_operation(op) not in self._lookup["op"]]

    def candidate_indices(self, state, what: str = "initial state") -> list[int]:
        """A state (a label, or a mapping query -> label) as candidate indices, one per query."""
        if isinstance(state, dict):
            missing = [q for q in self.query_names if q not in state]
            extra = sorted(set(state) - set(self.query_names))
            if missing or extra:
                raise PromptFormatError(f"the {what} must name the queries {list(self.query_names)}; "
                                        f"missing {missing}, unknown {extra}.")
            labels = [state[q] for q in self.query_names]
        elif len(self.query_names) == 1:
            labels = [state]
        else:
            raise PromptFormatError(f"the {what} must map each query {list(self.query_names)} to a label; got "
                                    f"{state!r}.")
        out = []
        for query, label in zip(self.query_names, labels):
            key = label_string(label)
            if key not in self._lookup["candidate"]:
                raise PromptFormatError(f"the {what}'s label {key!r} for {query!r} never occurs in the training data "
                                        f"({len(self.candidates)} labels known: {list(self.candidates[:8])}...).")
            out.append(self._lookup["candidate"][key])
        return out

    # ------------------------------------------------------------------------------------------ token ids
    def operation_tokens(self, tokenizer, index: int | str) -> list[int]:
        """The token ids of operation `index`'s words (cached per tokenizer; a string: an untrained operation's own
        words, not cached)."""
        cache = {} if isinstance(index, str) else self._lookup["tokens"].setdefault(id(tokenizer), {})
        if index not in cache:
            text = index if isinstance(index, str) else self.operations[index]
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if not ids or (tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids):
                raise PromptFormatError(f"operation {text!r} has a word this tokenizer does not know"
                                        + ("; an untrained operation can be read only from words of trained ones."
                                           if isinstance(index, str) else "; use the checkpoint's own tokenizer."))
            cache[index] = list(ids)
        return cache[index]

    def special_ids(self, tokenizer) -> dict:
        """{"bos": id, "queries": [id per query], "candidates": [id per candidate]} from the tokenizer's vocabulary
        (cached per tokenizer)."""
        cached = self._lookup["special"].get(id(tokenizer))
        if cached is not None:
            return cached
        vocab = tokenizer.get_vocab()
        names = ["<bos>", *(query_token(j) for j in range(len(self.query_names))),
                 *(candidate_token(c) for c in self.candidates)]
        missing = [n for n in names if n not in vocab]
        if missing:
            raise ValueError(f"the tokenizer lacks the records tokens {missing[:5]}; use the checkpoint's own "
                             "tokenizer (state_tracking.records.build_record_tokenizer).")
        q = len(self.query_names)
        ids = [vocab[n] for n in names]
        special = {"bos": ids[0], "queries": ids[1:1 + q], "candidates": ids[1 + q:]}
        self._lookup["special"][id(tokenizer)] = special
        return special

    def encode(self, tokenizer, operations, initial_state=None,
               allow_untrained: bool = False) -> tuple[list[int], list[int], list[int]]:
        """One record -> (input_ids, operation_ends (d + 1), query_positions (Q)); see the module docstring
        (`allow_untrained`: an operation training never held is read from its words)."""
        indices = self.operation_indices(operations, allow_untrained)
        if self.initial_state and initial_state is None:
            raise PromptFormatError("this checkpoint was trained with an initial state before the operations; "
                                    "pass initial_state.")
        if not self.initial_state and initial_state is not None:
            raise PromptFormatError("this checkpoint was trained without initial states; it cannot take one.")
        initial = self.candidate_indices(initial_state) if self.initial_state else None
        return self.layout(self.special_ids(tokenizer), [self.operation_tokens(tokenizer, i) for i in indices], initial)

    def layout(self, special: dict, operation_ids, initial=None) -> tuple[list[int], list[int], list[int]]:
        """The prompt layout, the one place it is written: `special_ids`, each operation's token ids and, where the
        format has one, the initial state's candidate indices -> (input_ids, operation_ends (d + 1),
        query_positions (Q)) of

            <bos> [initial: one candidate token per query] words(op_1) ... words(op_d) <q1> ... <qQ>

        `encode` checks its input and calls this; the records reader training uses (`state_tracking.records.encode`)
        calls it per record on operations and labels it has checked in bulk."""
        ids = [special["bos"]]
        if initial is not None:
            candidates = special["candidates"]
            ids += [candidates[c] for c in initial]
        ends = [len(ids) - 1]
        for tokens in operation_ids:
            ids += tokens
            ends.append(len(ids) - 1)
        queries = list(range(len(ids), len(ids) + len(self.query_names)))
        ids += special["queries"]
        return ids, ends, queries


def label_string(label) -> str:
    """A label's string form, its candidate name: booleans as ``true`` / ``false``, integral numbers without a
    decimal point, strings stripped."""
    if isinstance(label, bool):
        return "true" if label else "false"
    if isinstance(label, float) and label.is_integer():
        return str(int(label))
    if label is None:
        raise PromptFormatError("a label is missing (None).")
    return str(label).strip()


def load_prompt_format(spec: dict):
    """`config.prompt_format` as its reader: a `RecordFormat` for ``"rendering": "records"``, else a `PromptFormat`."""
    from .prompt_format import PromptFormat

    if isinstance(spec, dict) and spec.get("rendering") == RECORDS:
        return RecordFormat.from_dict(spec)
    return PromptFormat.from_dict(spec)


__all__ = ["RECORDS", "RecordFormat", "candidate_token", "label_string", "load_prompt_format", "normalize_operation",
           "query_token"]
