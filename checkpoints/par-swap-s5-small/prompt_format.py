"""How a checkpoint reads a raw prompt: the rule that splits it into preamble, operations and queries.

A local-view model needs `operation_ends` — the token index where the preamble and every operation end — and
`query_positions`. This module turns a prompt written the way the task renders it into both, and refuses, with one
clear `PromptFormatError`, any prompt the task's sentences cannot produce. The rule is saved in the checkpoint's
config (`ParLoopedQwenConfig.prompt_format`, a JSON dict), so the folder alone can read raw text;
`state_tracking.encode_batch` builds our own prompts through it too (one way to segment).

A prompt is a sequence of *units*: by default sentences (a unit ends at ".", "!" or "?" followed by whitespace or
the end), or the pieces between matches of `delimiter` (a regex, e.g. "\\n" for one log line per operation):

    text:      [preamble units] [operation units]* [query units]
               "The batch reactor is idle. The operator presses start. The reactor is now ?"
    symbolic:  [Q candidate tokens, only for a random start] [op tokens]* <q1> ... <qQ>    (units = tokens)

Each preamble unit, operation unit and query unit must be one of the sentences the format lists for it (any of
its alternatives under varied phrasing), compared with runs of whitespace collapsed. A query unit is its question
words followed by "?"; the readout token is the one holding the last character of the words.

What training wrote (`trained`, saved in the same dict): a format lists every phrasing a task has, held-out ones
included, but a checkpoint answers reliably only in the sentences its training data used (the batch-process text
checkpoint: 100% in trained phrasings, ~41% in held-out ones). `trained` records them, per slot:

    operations  op name -> the sentences of that op training used (an op training never drew: absent)
    preamble    text: per preamble unit, the start sentences used, candidate filled in ("The batch reactor is idle.");
                symbolic: per query, the candidate tokens training wrote as a start, or [] (training wrote no start)
    queries     text: per query, the question words used
    source      how the record was made (free text, e.g. the build_dataset call it replays)
    untrained_accuracy  optional, what the checkpoint was measured to do on phrasings training never used:
                {"accuracy": in [0, 1], "depth": d, "n": prompts, "source": where it was measured}; the refusal
                quotes it, and from RELIABLE_UNTRAINED_ACCURACY on says that allow_untrained=True is the way to use
                the checkpoint on new wordings (a pretrained parent's retrofit can be; a word-level model is not)

`segment` lists every unit outside that record in `Segments.untrained` (None when the format has no record: nothing
is known, and a prompt is read as before); the pipeline refuses such a prompt with `untrained_error` unless asked to
answer anyway (`allow_untrained=True`). `state_tracking.data.trained_phrasings` makes the record from the data;
`trained_record.checked_trained` checks it against the format.

New wordings (`segment(prompt, allow_untrained=True)`, text rendering): a unit the format does not list at all is
read from its own words instead of refused. The units still come from the delimiter (sentence ends, or `delimiter`):
the first len(preamble) units are the start, the last Q units the questions, every unit between them one operation
(its name None), so the local view's boundaries are the units' ends whatever their words. Such a unit is listed in
`Segments.untrained` like a held-out phrasing (nearest trained sentence, or nearest listed one when nothing is
recorded). A new question wording is read only when the task asks one question: with several, which query a new
wording asks is not known (the readout is named by position), so each must be one the format lists (the error names
them). What cannot be segmented stays an error: an empty prompt, fewer units than start + questions, a last unit
without its '?', a unit with no word, a '?' unit among the operations. The symbolic rendering's units are tokens of a
fixed vocabulary and stay strict.

Remote code: imports only the standard library; `state_tracking.prompt_format_of` builds the format of a task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .sentences import (
    ENDS,
    FULL_WIDTH_ENDS,
    collapse_whitespace,
    delimiter_problem,
    merged_sentences,
    nearest_sentence,
    sentence_spans,
    unquoted,
)
from .trained_record import checked_trained

RENDERINGS = ("text", "symbolic")
CANDIDATE = "{candidate}"
QUESTION_MARK = "?"
_TOKEN = re.compile(r"\S+")


# From this measured accuracy on phrasings training never used, a refusal says that allow_untrained=True is the way to
# use a checkpoint on new wordings (`PromptFormat.trained["untrained_accuracy"]`).
RELIABLE_UNTRAINED_ACCURACY = 0.95


class PromptFormatError(ValueError):
    """A prompt the checkpoint's format cannot segment, or one in sentences its training never used (names what is
    wrong; never answered)."""


def require_prompt_text(prompt) -> None:
    """A prompt is a non-empty string, or one `PromptFormatError` saying which it is not."""
    if not isinstance(prompt, str):
        raise PromptFormatError(f"a prompt must be a string; got {type(prompt).__name__}.")
    if not prompt.strip():
        raise PromptFormatError("the prompt is empty.")


@dataclass(frozen=True)
class Segments:
    """One segmented prompt, as character offsets into it (end = one past the last character).

    preamble_end: where the preamble ends (None: the symbolic rendering with the default start, whose preamble is
    the tokenizer's <bos> alone). operation_ends: (d,) where each operation ends. query_ends: (Q,) where each
    query's question words end. operations: the d operation names, in order (None: a wording the format does not
    list, read under allow_untrained). untrained: every unit training never used, and every unit the format does not
    list, as {"unit": "operation 2", "sentence": ..., "nearest_trained": ... or None}, in prompt order; None when
    the format records nothing about training and every unit is one it lists."""

    preamble_end: int | None
    operation_ends: tuple[int, ...]
    query_ends: tuple[int, ...]
    operations: tuple[str, ...]
    untrained: tuple[dict, ...] | None = None

    @property
    def depth(self) -> int:
        return len(self.operations)


@dataclass(frozen=True)
class PromptFormat:
    """The segmentation rule of a checkpoint (see the module docstring).

    rendering: "text" or "symbolic". query_names: one per query (answers are keyed by them). candidates: the answer
    names, in `answer_token_ids` order. operations: op name -> accepted units (sentences, or the op token).
    preamble: per preamble unit, accepted templates where "{candidate}" stands for any candidate (text; symbolic:
    empty, the optional start is Q candidate tokens). queries: per query, accepted question words. delimiter: a
    regex between units instead of sentence ends (text only), or None. trained: the sentences training used (see the
    module docstring), or None (not recorded)."""

    rendering: str
    query_names: tuple[str, ...]
    candidates: tuple[str, ...]
    operations: dict[str, tuple[str, ...]]
    preamble: tuple[tuple[str, ...], ...] = ()
    queries: tuple[tuple[str, ...], ...] = ()
    delimiter: str | None = None
    task_name: str = "task"
    trained: dict | None = None
    _lookup: dict = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        self._validate()
        key = self._key
        op_of = {}
        for name, units in self.operations.items():
            for unit in units:
                op_of[key(unit)] = name
        preamble = []
        for templates in self.preamble:
            accepted = set()
            for template in templates:
                accepted |= {key(template.replace(CANDIDATE, c)) for c in self.candidates}
            preamble.append(accepted)
        queries = [{collapse_whitespace(words) for words in alternatives} for alternatives in self.queries]
        object.__setattr__(self, "_lookup", {"op": op_of, "preamble": preamble, "query": queries,
                                            "delimiter": re.compile(self.delimiter) if self.delimiter else None})
        # the format's own sentences, shaped like the training record: what a new wording's nearest is drawn from when
        # nothing about training is recorded
        self._lookup["listed"] = {
            "op": {name: {key(u): u for u in units} for name, units in self.operations.items()},
            "preamble": [{key(t.replace(CANDIDATE, c)): t.replace(CANDIDATE, c) for t in templates
                          for c in self.candidates} for templates in self.preamble],
            "query": [{collapse_whitespace(w): w for w in words} for words in self.queries]}
        if self.trained is not None:
            object.__setattr__(self, "trained", checked_trained(self, self.trained))
            trained = self.trained
            self._lookup["trained"] = {
                "op": {name: {key(u): u for u in units} for name, units in trained["operations"].items()},
                "preamble": [{key(u): u for u in units} for units in trained["preamble"]],
                "query": [{collapse_whitespace(w): w for w in words} for words in trained["queries"]]}

    def _key(self, unit: str) -> str:
        """What a unit is compared by: whitespace runs collapsed; under a delimiter, a closing '.' or '!' is optional
        (log lines often have none); between sentence ends, a sentence in quotes reads as itself, and a unit without
        an end (a line of its own) as the statement it writes ("swap 1 3" as "swap 1 3.")."""
        text = collapse_whitespace(unit)
        if self.delimiter is not None:
            return text.rstrip(".!").rstrip() if not text.endswith(QUESTION_MARK) else text
        if self.rendering == "text":
            text = unquoted(text)
            if text and text[-1] not in ENDS + FULL_WIDTH_ENDS:
                return text + "."
        return text

    # ------------------------------------------------------------------------------------ validation, (de)serialisation
    def _validate(self) -> None:
        def fail(name, allowed, value):
            raise ValueError(f"prompt_format.{name} must be {allowed}; got {value!r}.")

        if self.rendering not in RENDERINGS:
            fail("rendering", f"one of {list(RENDERINGS)}", self.rendering)
        for name in ("query_names", "candidates"):
            value = getattr(self, name)
            if not value or not all(isinstance(v, str) and v for v in value) or len(set(value)) != len(value):
                fail(name, "a non-empty list of distinct non-empty strings", value)
        if not isinstance(self.operations, dict) or not self.operations:
            fail("operations", "a non-empty mapping op name -> list of accepted sentences", self.operations)
        seen = {}
        for name, units in self.operations.items():
            if not isinstance(units, tuple) or not units or not all(
                    isinstance(u, str) and collapse_whitespace(u) for u in units):
                fail(f"operations[{name!r}]", "a non-empty list of non-empty strings", units)
            for unit in units:
                other = seen.setdefault(collapse_whitespace(unit), name)
                if other != name:
                    fail(f"operations[{name!r}]", f"sentences no other operation uses ({other!r} uses {unit!r})", units)
        if self.rendering == "text":
            if len(self.queries) != len(self.query_names):
                fail("queries", f"one list of question words per query ({len(self.query_names)})", self.queries)
            for alternatives in (*self.preamble, *self.queries):
                if not isinstance(alternatives, tuple) or not alternatives or not all(
                        isinstance(a, str) and collapse_whitespace(a) for a in alternatives):
                    fail("preamble / queries", "non-empty lists of non-empty strings", alternatives)
            if not self.preamble:
                fail("preamble", "at least one preamble sentence (the text rendering always states the start)",
                     self.preamble)
        elif self.preamble or self.queries or self.delimiter:
            fail("rendering", "'text' to use preamble, queries or delimiter (the symbolic rendering has fixed tokens)",
                 self.rendering)
        if self.rendering == "text" and self.delimiter is None:  # one unit per sentence: each must be one sentence
            named = [(f"operations[{n!r}]", u) for n, units in self.operations.items() for u in units]
            named += [("preamble", t) for templates in self.preamble for t in templates]
            for name, unit in named:
                if len(sentence_spans(unit)) != 1 or unit.rstrip()[-1] not in ".!?":
                    fail(name, "one sentence ending with '.', '!' or '?' (one operation per sentence; or give a "
                         "delimiter)", unit)
            for words in (w for alternatives in self.queries for w in alternatives):
                if len(sentence_spans(words + " " + QUESTION_MARK)) != 1:
                    fail("queries", "question words with no sentence end inside (their '?' ends the question)", words)
        problem = None if self.delimiter is None else delimiter_problem(self.delimiter, splits=False)
        if problem:
            fail("delimiter", f"None or a regex that can split units apart (this one {problem})", self.delimiter)

    def to_dict(self) -> dict:
        spec = {"rendering": self.rendering, "task_name": self.task_name, "query_names": list(self.query_names),
                "candidates": list(self.candidates),
                "operations": {name: list(units) for name, units in self.operations.items()},
                "preamble": [list(t) for t in self.preamble], "queries": [list(q) for q in self.queries],
                "delimiter": self.delimiter}
        if self.trained is not None:
            t = self.trained
            spec["trained"] = {"operations": {name: list(units) for name, units in t["operations"].items()},
                               "preamble": [list(p) for p in t["preamble"]], "queries": [list(w) for w in t["queries"]],
                               "source": t["source"]}
            if "untrained_accuracy" in t:
                spec["trained"]["untrained_accuracy"] = dict(t["untrained_accuracy"])
        return spec

    def with_trained(self, trained: dict | None) -> PromptFormat:
        """The same format with the record of what training used (see the module docstring)."""
        spec = self.to_dict()
        spec["trained"] = trained
        return PromptFormat.from_dict(spec)

    @classmethod
    def from_dict(cls, spec: dict) -> PromptFormat:
        if not isinstance(spec, dict):
            raise ValueError(f"prompt_format must be a dict (PromptFormat.to_dict()); got {type(spec).__name__}.")
        allowed = {"rendering", "task_name", "query_names", "candidates", "operations", "preamble", "queries",
                   "delimiter", "trained"}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(f"prompt_format has unknown key(s) {unknown}; allowed: {sorted(allowed)}.")
        missing = sorted({"rendering", "query_names", "candidates", "operations"} - set(spec))
        if missing:
            raise ValueError(f"prompt_format is missing {missing}.")
        operations = spec["operations"]
        if not isinstance(operations, dict):
            raise ValueError(f"prompt_format.operations must be a mapping; got {operations!r}.")

        def tuples(value, name):
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"prompt_format.{name} must be a list; got {value!r}.")
            return tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in value)

        return cls(rendering=spec["rendering"], task_name=spec.get("task_name", "task"),
                   query_names=tuple(spec["query_names"]), candidates=tuple(spec["candidates"]),
                   operations={k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in operations.items()},
                   preamble=tuples(spec.get("preamble", []), "preamble"),
                   queries=tuples(spec.get("queries", []), "queries"), delimiter=spec.get("delimiter"),
                   trained=spec.get("trained"))

    def example(self, operations: list[str] | None = None) -> str:
        """A prompt written the way this format reads one: the first phrasing of every sentence (the first trained one
        where `trained` is recorded), the first candidate as the start (text), and `operations` (names; default the
        first two operations)."""
        names = list(self.operations)[:2] if operations is None else operations
        unknown = [n for n in names if n not in self.operations]
        if unknown:
            raise ValueError(f"example: unknown operation(s) {unknown}; known: {list(self.operations)[:8]}...")
        trained = self.trained
        if trained is None:
            ops = [self.operations[n][0] for n in names]
        else:  # trained sentences only (an op training never drew keeps its first form)
            ops = [(trained["operations"].get(n) or self.operations[n])[0] for n in names]
        if self.rendering == "symbolic":
            return " ".join(ops + [f"<q{j + 1}>" for j in range(len(self.query_names))])
        if trained is None:
            start = [templates[0].replace(CANDIDATE, self.candidates[0]) for templates in self.preamble]
            queries = [words[0] for words in self.queries]
        else:
            start, queries = [p[0] for p in trained["preamble"]], [w[0] for w in trained["queries"]]
        return " ".join(start + ops + [f"{words} {QUESTION_MARK}" for words in queries])

    def with_delimiter(self, delimiter: str | None) -> PromptFormat:
        """The same format with units split at `delimiter` (a regex) instead of sentence ends."""
        spec = self.to_dict()
        spec["delimiter"] = delimiter
        return PromptFormat.from_dict(spec)

    # ------------------------------------------------------------------------------------------------------ segmenting
    def units(self, prompt: str) -> list[tuple[int, int]]:
        """(start, end) of every unit of `prompt`, whitespace trimmed; an empty unit between delimiters is an error."""
        if self.rendering == "symbolic":
            return [m.span() for m in _TOKEN.finditer(prompt)]
        delimiter = self._lookup["delimiter"]
        if delimiter is None:
            return sentence_spans(prompt)  # the one sentence rule (`sentences.py`)
        pieces, start = [], 0
        for match in [*delimiter.finditer(prompt), None]:
            end = len(prompt) if match is None else match.start()
            piece = prompt[start:end]
            lead = len(piece) - len(piece.lstrip())
            pieces.append((start + lead, start + len(piece.rstrip())) if piece.strip() else (start, None))
            if match is not None:
                start = match.end()
        while pieces and pieces[0][1] is None:  # text before the first / after the last delimiter may be empty
            pieces.pop(0)
        while pieces and pieces[-1][1] is None:
            pieces.pop()
        for a, b in pieces:
            if b is None:
                raise PromptFormatError(
                    f"empty unit between two delimiters at character {a} of the prompt (delimiter "
                    f"{self.delimiter!r}): an empty operation is never answered.")
        spans = pieces
        return spans

    def segment(self, prompt: str, allow_untrained: bool = False) -> Segments:
        """Split one raw prompt into preamble, operations and queries (character offsets); `PromptFormatError`
        naming the first unit that does not fit. `allow_untrained` (text): a unit the format does not list is read
        from its words and listed in `Segments.untrained` (see "New wordings" in the module docstring)."""
        require_prompt_text(prompt)
        spans = self.units(prompt)
        texts = [self._key(prompt[a:b]) for a, b in spans]
        q = len(self.query_names)
        if self.rendering == "symbolic":
            return self._segment_symbolic(prompt, spans, texts, q)
        p = len(self.preamble)
        if len(spans) < p + q:
            raise PromptFormatError(
                f"the prompt has {len(spans)} unit(s) "
                f"({'sentences' if self.delimiter is None else 'delimited pieces'});"
                f" a {self.task_name} prompt needs {p} start sentence(s), then the operations, then {q} question(s) "
                f"({self._query_example()}).")
        new = self._read_start(prompt, spans, texts, allow_untrained)
        query_ends = self._read_queries(prompt, spans, texts, allow_untrained, new)
        operations = self._read_operations(prompt, spans, texts, allow_untrained, new)
        op_ends = tuple(b for _, b in spans[p:len(spans) - q])
        return Segments(spans[p - 1][1], op_ends, tuple(query_ends), tuple(operations),
                        self._untrained_units(prompt, spans, texts, operations, new))

    def _read_start(self, prompt, spans, texts, allow_untrained) -> set[int]:
        """`segment`'s start sentences (text), the first len(preamble) units: the indices of those the format does not
        list (read from their words under allow_untrained); a refusal otherwise."""
        p = len(self.preamble)
        new = set()  # indices of the units the format does not list (read from their words: allow_untrained)
        for j in range(p):
            if texts[j] not in self._lookup["preamble"][j]:
                if texts[j] in self._lookup["op"]:  # read as a new start sentence, it would shorten the prompt
                    raise PromptFormatError(
                        f"start sentence {j + 1} {prompt[slice(*spans[j])]!r} is a wording of operation "
                        f"{self._lookup['op'][texts[j]]!r}: a {self.task_name} prompt opens with {p} start "
                        f"sentence(s) (e.g. {self.preamble[j][0].replace(CANDIDATE, self.candidates[0])!r}), then the "
                        "operations.")
                if not allow_untrained:
                    raise PromptFormatError(
                        f"start sentence {j + 1} {prompt[slice(*spans[j])]!r} is not one the task states its start "
                        f"with (e.g. {self.preamble[j][0].replace(CANDIDATE, self.candidates[0])!r}). "
                        + self._read_anyway())
                self._check_words(prompt, spans[j], f"start sentence {j + 1}")
                new.add(j)
        return new

    def _read_queries(self, prompt, spans, texts, allow_untrained, new: set[int]) -> list[int]:
        """`segment`'s questions (text), the last Q units: where each one's question words end; a question the format
        does not list is added to `new` (one question, allow_untrained) or refused."""
        q = len(self.query_names)
        query_ends = []
        for j in range(q):
            i = len(spans) - q + j
            text = texts[i]
            words = text[:-1].rstrip() if text.endswith(QUESTION_MARK) else None
            if words not in self._lookup["query"][j]:
                got = prompt[slice(*spans[i])]
                readable = words is not None and any(ch.isalnum() for ch in words)
                if not (allow_untrained and readable):
                    raise PromptFormatError(
                        f"the query is cut off or wrong: question {j + 1} of {q} should be "
                        f"{self.queries[j][0] + ' ?'!r} (the last {q} unit(s) of the prompt are its questions, each "
                        f"ending with '?'); got {got!r}." + (" " + self._read_anyway() if readable and q == 1 else ""))
                if q > 1:
                    raise PromptFormatError(
                        f"question {j + 1} {got!r} is not a question wording of task {self.task_name!r}, which asks "
                        f"{q} questions {list(self.query_names)}: which one a new wording asks cannot be known, so "
                        f"even with allow_untrained=True each must be one the task lists (question {j + 1}, "
                        f"{self.query_names[j]!r}: {[w + ' ?' for w in self.queries[j]]}).")
                new.add(i)
            a, b = spans[i]
            raw = prompt[a:b]
            query_ends.append(a + len(raw[:raw.rindex(QUESTION_MARK)].rstrip()))
        return query_ends

    def _read_operations(self, prompt, spans, texts, allow_untrained, new: set[int]) -> list[str | None]:
        """`segment`'s operations (text), the units between the start and the questions: each one's name (None: a
        wording the format does not list, added to `new` under allow_untrained); a refusal otherwise."""
        p, q = len(self.preamble), len(self.query_names)
        operations = []
        for i in range(p, len(spans) - q):
            k = i - p + 1
            self._check_words(prompt, spans[i], f"operation {k}")
            name = self._lookup["op"].get(texts[i])
            if name is None:
                merged = merged_sentences(texts[i], self._lookup["op"]) if self.delimiter is None else None
                if merged:
                    raise PromptFormatError(
                        f"operation {k} {prompt[slice(*spans[i])]!r} is {len(merged)} operations with their sentence "
                        f"ends missing ({', '.join(map(repr, merged))}): end each with '.' (or a line break).")
                if not allow_untrained:
                    self._unknown_operation(prompt, spans[i], texts[i], k)
                if texts[i].endswith(QUESTION_MARK):
                    raise PromptFormatError(
                        f"operation {k} {prompt[slice(*spans[i])]!r} ends with '?': only the last {q} unit(s) of a "
                        f"{self.task_name} prompt are questions; write the operations as statements.")
                new.add(i)
            operations.append(name)
        return operations

    def _untrained_units(self, prompt, spans, texts, operations, new) -> tuple[dict, ...] | None:
        """`Segments.untrained` of a text prompt: every unit outside the training record, and every unit the format
        does not list (`new`, unit indices), in prompt order; None when nothing is recorded and every unit is listed."""
        if self.trained is None and not new:
            return None
        record = self._lookup["trained" if self.trained is not None else "listed"]
        every_op = {k: u for ops in record["op"].values() for k, u in ops.items()}
        p, q = len(self.preamble), len(self.query_names)
        units = [(f"start sentence {j + 1}", j, record["preamble"][j]) for j in range(p)]
        # an op training never drew, or one the format does not list: nearest among every trained op
        units += [(f"operation {k + 1}" + (f" ({name})" if name else ""), p + k, record["op"].get(name) or every_op)
                  for k, name in enumerate(operations)]
        units += [(f"question {j + 1}", len(spans) - q + j, record["query"][j]) for j in range(q)]
        untrained = []
        for unit, i, known in units:
            text = collapse_whitespace(texts[i][:-1]) if unit.startswith("question") else texts[i]
            if i in new or (self.trained is not None and text not in known):
                untrained.append(self._untrained(unit, prompt[slice(*spans[i])], known))
        return tuple(untrained)

    def _check_words(self, prompt: str, span: tuple[int, int], unit: str) -> None:
        """A unit with no word (a lone '.') is never read."""
        if not any(ch.isalnum() for ch in prompt[slice(*span)]):
            raise PromptFormatError(f"{unit} {prompt[slice(*span)]!r} (characters {span[0]}–{span[1]}) is empty: "
                                    "a unit with no word is never answered.")

    def _read_anyway(self) -> str:
        """The strict refusal's last sentence: how to have a new wording read anyway, and what that is worth."""
        quoted = self._measured()
        return ("Not answered by default" + (f" ({quoted})" if quoted else "") + "; pass allow_untrained=True to have "
                "the model read a new wording from its words anyway.")

    def _measured(self) -> str | None:
        """The measured accuracy on phrasings training never used, in words, or None when not measured."""
        measured = (self.trained or {}).get("untrained_accuracy")
        if measured is None:
            return None
        return (f"this checkpoint was measured at {100 * measured['accuracy']:.1f}% on phrasings its training never "
                f"used ({measured['n']} prompts of {measured['depth']} operations; {measured['source']})")

    def _segment_symbolic(self, prompt, spans, texts, q) -> Segments:
        queries = [f"<q{j + 1}>" for j in range(q)]
        if len(texts) < q or texts[-q:] != queries:
            raise PromptFormatError(
                f"the query is cut off or wrong: a symbolic {self.task_name} prompt ends with {' '.join(queries)!r}; "
                f"got {' '.join(texts[-q:])!r}.")
        body = texts[:-q]
        start = q if len(body) >= q and all(t in self.candidates for t in body[:q]) else 0
        operations = []
        for i in range(start, len(body)):
            name = self._lookup["op"].get(body[i])
            if name is None:
                self._unknown_operation(prompt, spans[i], body[i], i - start + 1)
            operations.append(name)
        untrained = None
        if self.trained is not None:
            trained = self._lookup["trained"]
            untrained = []
            if start and not trained["preamble"]:
                untrained.append({"unit": "start", "sentence": " ".join(body[:q]), "nearest_trained": None})
            elif start:
                untrained += [self._untrained(f"start token {j + 1}", body[j], trained["preamble"][j])
                              for j in range(q) if body[j] not in trained["preamble"][j]]
            every_op = {k: u for ops in trained["op"].values() for k, u in ops.items()}
            untrained += [self._untrained(f"operation {k + 1}", body[start + k], every_op)
                          for k in range(len(operations)) if body[start + k] not in every_op]
        return Segments(spans[start - 1][1] if start else None, tuple(b for _, b in spans[start:len(body)]),
                        tuple(spans[len(body) + j][1] for j in range(q)), tuple(operations),
                        None if untrained is None else tuple(untrained))

    def _untrained(self, unit: str, sentence: str, known: dict) -> dict:
        """One untrained unit with the trained sentence nearest to it (difflib) among `known` (key -> sentence)."""
        near = nearest_sentence(self._key(sentence), known, cutoff=0.0)
        return {"unit": unit, "sentence": sentence, "nearest_trained": None if near is None else known[near]}

    def untrained_error(self, segments: Segments) -> PromptFormatError:
        """The one error for a prompt with sentences training never used: the first of them, its nearest trained
        sentence, how many more there are, and how to answer anyway."""
        first, more = segments.untrained[0], len(segments.untrained) - 1
        if first["unit"] == "start":
            what = (f"the prompt starts with a start state ({first['sentence']!r}) but training never wrote one (the "
                    "default start only)")
        else:
            near = "none" if first["nearest_trained"] is None else repr(first["nearest_trained"])
            what = (f"{first['unit']} {first['sentence']!r} never occurs in this checkpoint's training data (nearest "
                    f"trained: {near})")
        more = f"; {more} more untrained unit(s) in this prompt" if more else ""
        quoted = self._measured()
        if quoted is None:
            why = ("A checkpoint answers what its training never showed it unreliably (a word-level model trained from "
                   "scratch: far below trained phrasings), so this prompt is not answered")
        else:
            why = (f"Refused by default: {quoted}" + (
                "; allow_untrained=True is the way to use it on new wordings" if self.trained["untrained_accuracy"][
                    "accuracy"] >= RELIABLE_UNTRAINED_ACCURACY else ", so this prompt is not answered"))
        return PromptFormatError(
            f"{what}{more}. {why}; write it the way training did, or pass allow_untrained=True to answer anyway (the "
            f"result then lists the untrained units under 'untrained').")

    def _unknown_operation(self, prompt, span, text, k):
        known = list(self._lookup["op"])
        near = nearest_sentence(text, known)
        hint = f"; nearest known: {near!r}" if near else ""
        what = "sentence" if self.rendering == "text" else "token"
        after = (self._read_anyway() if self.rendering == "text" else
                 "An unknown operation is never answered (symbolic operations are tokens of a fixed vocabulary).")
        raise PromptFormatError(
            f"operation {k} {prompt[slice(*span)]!r} (characters {span[0]}–{span[1]}) is not an operation {what} "
            f"of task {self.task_name!r} ({len(known)} known){hint}. {after}")

    def _query_example(self) -> str:
        return (" ".join(f"{alternatives[0]} ?" for alternatives in self.queries[:2])
                + (" ..." if len(self.queries) > 2 else ""))


__all__ = ["CANDIDATE", "PromptFormat", "PromptFormatError", "Segments", "delimiter_problem", "require_prompt_text"]
