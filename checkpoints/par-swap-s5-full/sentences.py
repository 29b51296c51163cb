"""How raw text is cut into sentences, the one rule a checkpoint reads prompts by (`PromptFormat.units`).

A sentence ends
- at '.', '!' or '?' followed by whitespace or the end of the text, closing quotes or brackets after the mark
  belonging to the sentence ('He said "swap 1 3." Then …' ends after the quote);
- at a full-width '。', '！' or '？' (no space follows them in Chinese or Japanese text);
- at a line break: a log written one operation per line needs no periods;
- not at the period of a known abbreviation (`ABBREVIATIONS`: "approx. 5 min.") when a lowercase letter or a digit
  follows it, which continues the sentence.
A lone mark is a sentence of its own (an empty one, which a prompt refuses by name).

Beside the rule: the one whitespace rule (`collapse_whitespace`) and the nearest known sentence a refusal names
(`nearest_sentence`). `merged_sentences` finds a unit that is several known sentences with their sentence ends
missing ("swap 1 3 swap 2 4."): read as one new sentence it would silently shorten the prompt, so the reader refuses
it by name.
Imports only the standard library (remote code).
"""

from __future__ import annotations

import difflib
import re

ENDS = ".!?"
FULL_WIDTH_ENDS = "。！？"
CLOSERS = "\"'”’»)]"
# abbreviations whose period does not end a sentence when a lowercase letter or a digit follows (lower case, no dot)
ABBREVIATIONS = frozenset({"approx", "ca", "cf", "e.g", "eg", "etc", "fig", "hr", "hrs", "i.e", "ie", "incl", "max",
                           "min", "mins", "resp", "sec", "secs", "vs", "dr", "mr", "mrs", "ms", "st"})


NEAREST_CUTOFF = 0.6  # difflib similarity under which a refusal names no nearest known sentence


def collapse_whitespace(text) -> str:
    """The one whitespace rule: surrounding whitespace stripped, every inner run collapsed to one space (what every
    sentence, operation and label is compared by)."""
    return " ".join(str(text).split())


def nearest_sentence(text: str, known, cutoff: float = NEAREST_CUTOFF) -> str | None:
    """The known sentence nearest to `text` (difflib's ratio on whitespace-collapsed text), or None under `cutoff`
    (0: always the nearest one)."""
    near = difflib.get_close_matches(collapse_whitespace(text), list(known), n=1, cutoff=cutoff)
    return near[0] if near else None


def delimiter_problem(delimiter, splits: bool = True) -> str | None:
    """Why `delimiter` cannot split operations apart, or None when it can: the one rule for every place a delimiter
    is given (`PromptFormat`, `RecordFormat`, the records reader's ``--operation_delimiter``). It must be a non-empty
    regex that compiles and matches no empty string; where it *splits* (``re.split``: `RecordFormat`, the records
    reader) it must have no capturing group, whose matches ``re.split`` would keep as pieces (``(;|,)`` would make
    every ';' an operation and a label)."""
    if not isinstance(delimiter, str) or not delimiter:
        return "must be a non-empty regular expression"
    try:
        pattern = re.compile(delimiter)
    except re.error as error:
        return f"is not a valid regular expression ({error})"
    if pattern.fullmatch(""):
        return "matches the empty string, so it splits nothing apart; give one that matches at least one character"
    if splits and pattern.groups:
        suggestion = re.sub(r"(?<!\\)\((?!\?)", "(?:", delimiter)
        return (f"has a capturing group, whose matches re.split would keep as operations and labels; write the group "
                f"non-capturing, e.g. {suggestion!r}")
    return None


def _abbreviation_ends_at(text: str, start: int, mark: int) -> bool:
    """Whether the word before the period at `mark` is a known abbreviation (`ABBREVIATIONS`)."""
    words = text[start:mark].split()
    return bool(words) and words[-1].lstrip("(\"'").lower() in ABBREVIATIONS


def _continues(text: str, at: int) -> bool:
    """Whether the text after position `at` goes on with a lowercase letter or a digit (the same sentence)."""
    rest = text[at:].lstrip(" \t")
    return bool(rest) and (rest[0].islower() or rest[0].isdigit())


def _sentence_end(text: str, start: int) -> int:
    """The end (exclusive, before trailing whitespace is trimmed) of the sentence that starts at `start`."""
    n, j = len(text), start
    while j < n:
        c = text[j]
        if c == "\n":
            return j
        if c in FULL_WIDTH_ENDS:
            return j + 1
        if c in ENDS:
            k = j + 1
            while k < n and text[k] in CLOSERS:
                k += 1
            if k == n or text[k].isspace():
                if not (c == "." and _abbreviation_ends_at(text, start, j) and _continues(text, k)):
                    return k
            j = k
            continue
        j += 1
    return n


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every sentence of `text`, surrounding whitespace trimmed, by the rule of the module docstring."""
    spans, i, n = [], 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            break
        end = _sentence_end(text, i)
        trimmed = end
        while trimmed > i and text[trimmed - 1].isspace():
            trimmed -= 1
        spans.append((i, trimmed))
        i = end
    return spans


OPENERS = "\"'“‘«("


def unquoted(sentence: str) -> str:
    """A sentence without the quotes or brackets around it: '"Stop."' -> 'Stop.' (only a pair that encloses it)."""
    while len(sentence) >= 2 and sentence[0] in OPENERS and sentence[-1] in CLOSERS:
        sentence = sentence[1:-1].strip()
    return sentence


def _words(sentence: str) -> tuple[str, ...]:
    return tuple(sentence.rstrip(ENDS + FULL_WIDTH_ENDS).split())


def merged_sentences(unit: str, known) -> list[str] | None:
    """The known sentences (at least two) whose words, sentence ends dropped, make up `unit`'s words in order, or None
    if none do: "swap 1 3 swap 2 4." is "swap 1 3." and "swap 2 4." with an end missing. The fewest pieces."""
    by_words = {}
    for sentence in known:
        by_words.setdefault(_words(sentence), sentence)
    by_words.pop((), None)
    words = _words(unit)
    best: list[list[str] | None] = [None] * (len(words) + 1)  # best[i]: the fewest pieces covering words[:i]
    best[0] = []
    for i in range(len(words)):
        if best[i] is None:
            continue
        for piece, sentence in by_words.items():
            j = i + len(piece)
            if words[i:j] == piece and (best[j] is None or len(best[i]) + 1 < len(best[j])):
                best[j] = best[i] + [sentence]
    return best[-1] if best[-1] is not None and len(best[-1]) >= 2 else None


__all__ = ["ABBREVIATIONS", "NEAREST_CUTOFF", "collapse_whitespace", "delimiter_problem", "merged_sentences",
           "nearest_sentence", "sentence_spans", "unquoted"]
