"""Training wordings with one word deleted: EDA-style random deletion (Wei & Zou 2019, "EDA: Easy Data Augmentation
Techniques for Boosting Performance on Text Classification"), made exhaustive and rule-bound, on a task file's
trained operation sentences (issue 49).

    python examples/reproduce/deletion_variants.py          # writes the two files below

Why: read one sentence at a time (`pretrained_smollm2.py --sentences ROW`), the two-stage Qwen recipe's seeds 1 and 2
read the unseen "An abort is issued." as the alarm ("An alarm trips." is the only trained operation sentence that
begins with "An"): a word that does not name the operation decides the answer. Every trained operation sentence gains
each variant with one such word deleted, so that no word of that kind is needed to read a sentence: the determiners
("The", "A", "An") and every word that the trained wordings of two or more operations use ("operator", "is", "batch",
"alarm", ...). A word that only one operation's wordings use ("aborts", "trips") is never deleted. The first
remaining word is capitalised. A variant of fewer than two words, one that two operations would share, one already
listed, or one equal to a held-out wording (of either held-out set) is dropped. Nothing else changes: the start and
question sentences, and the held-out wording of every sentence, which stays last in its list.

Writes examples/tasks/batch_process_deletions.json and its record examples/tasks/batch_process_deletions.record.json
(command, date, the deletable words, every variant added, how many were dropped).
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from determiner_variants import HELDOUT2, REPO, SOURCE, augment, held_out_wordings, split_wordings  # noqa: E402

TARGET = "examples/tasks/batch_process_deletions.json"
RECORD = "examples/tasks/batch_process_deletions.record.json"
DETERMINERS = ("the", "a", "an")
PUNCTUATION = ".,;:!?"


def words(sentence: str) -> list[str]:
    """The sentence's words, lower-cased, without punctuation."""
    return re.findall(r"[a-z0-9']+", sentence.lower())


def deletable_words(spec: dict) -> set[str]:
    """Words that do not name an operation: the determiners and every word the trained wordings of two or more
    operations use."""
    n = spec["text"].get("held_out_phrasings", 0)
    uses = Counter(w for options in spec["text"]["operations"].values()
                   for w in {w for sentence in split_wordings(options, n)[0] for w in words(sentence)})
    return set(DETERMINERS) | {w for w, count in uses.items() if count >= 2}


def deletion_variants(sentence: str, deletable: set[str]) -> list[str]:
    """`sentence` without one of its `deletable` words, one variant per such word (in order), the first remaining word
    capitalised and the final punctuation kept; none that is left with fewer than two words."""
    tokens = sentence.split()
    out = []
    for i, token in enumerate(tokens):
        if token.strip(PUNCTUATION).lower() not in deletable:
            continue
        rest = tokens[:i] + tokens[i + 1:]
        if i == len(tokens) - 1:  # the last word carries the sentence's final punctuation
            rest[-1] += token[len(token.rstrip(PUNCTUATION)):]
        if len(rest) < 2:
            continue
        rest[0] = rest[0][0].upper() + rest[0][1:]
        variant = " ".join(rest)
        if variant not in out:
            out.append(variant)
    return out


def ambiguous_variants(spec: dict, deletable: set[str]) -> set[str]:
    """Variants that the trained wordings of two operations would both produce, or that equal a wording listed for
    another operation: neither operation may train on them."""
    n = spec["text"].get("held_out_phrasings", 0)
    listed = {op: set(options) for op, options in spec["text"]["operations"].items()}
    made = {op: {v for sentence in split_wordings(options, n)[0] for v in deletion_variants(sentence, deletable)}
            for op, options in spec["text"]["operations"].items()}
    return {v for op, variants in made.items() for v in variants
            if any(v in made[other] or v in listed[other] for other in made if other != op)}


def main(argv=None) -> None:
    if argv if argv is not None else sys.argv[1:]:
        raise SystemExit("deletion_variants.py takes no arguments; it writes " + TARGET)
    spec = json.loads((REPO / SOURCE).read_text())
    deletable = deletable_words(spec)
    forbidden = (held_out_wordings(spec) | held_out_wordings(json.loads((REPO / HELDOUT2).read_text()))
                 | ambiguous_variants(spec, deletable))
    out, added, dropped = augment(spec, forbidden, lambda sentence: deletion_variants(sentence, deletable))
    (REPO / TARGET).write_text(json.dumps(out, indent=2) + "\n")
    record = {"command": "python examples/reproduce/deletion_variants.py", "source": SOURCE, "target": TARGET,
              "date": datetime.date.today().isoformat(), "deletable_words": sorted(deletable), "added": added,
              "added_total": sum(map(len, added.values())),
              "dropped_as_held_out_ambiguous_or_listed": dropped}
    (REPO / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
