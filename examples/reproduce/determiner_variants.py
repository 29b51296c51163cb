"""Training wordings with the leading determiner varied: a rule-based augmentation of a task file's trained
operation sentences (issue 49).

    python examples/reproduce/determiner_variants.py          # writes the two files below

Why: read one sentence at a time (`pretrained_smollm2.py --sentences ROW`), the retrofits that lost held-out accuracy
misread "An abort is issued." as the alarm: the only trained operation sentence that begins with "An" is "An alarm
trips.", so the leading determiner is a cue that predicts the alarm in training and misleads on an unseen wording.
The augmentation takes the cue away: every trained operation sentence that begins with a determiner ("The", "A",
"An") gains the same sentence with the other determiner ("The" -> "A"/"An" by the next word's first letter;
"A"/"An" -> "The"). Nothing else changes: the start and question sentences, and the held-out wording of every
sentence, which stays last in its list (so `held_out_phrasings` still keeps it out of training). A variant that
equals a held-out wording (of either held-out set) is dropped, so that no unseen wording becomes a trained one.

Writes examples/tasks/batch_process_determiners.json and its record
examples/tasks/batch_process_determiners.record.json (command, date, every variant added, how many were dropped).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = "examples/tasks/batch_process_phrasings.json"
HELDOUT2 = "examples/tasks/batch_process_heldout2.json"  # only to keep its wordings out of training (never printed)
TARGET = "examples/tasks/batch_process_determiners.json"
RECORD = "examples/tasks/batch_process_determiners.record.json"
VOWELS = "aeiouAEIOU"


def determiner_variant(sentence: str) -> str | None:
    """`sentence` with its leading determiner swapped: "The X" -> "A X" or "An X" (by X's first letter), "A X" /
    "An X" -> "The X"; None for a sentence that does not begin with one of them."""
    first, _, rest = sentence.partition(" ")
    if not rest:
        return None
    if first == "The":
        return ("An " if rest[0] in VOWELS else "A ") + rest
    if first in ("A", "An"):
        return "The " + rest
    return None


def split_wordings(options: list[str], n: int) -> tuple[list[str], list[str]]:
    """(trained, held out) of one sentence's wordings: the last `n` are held out where the list is longer than `n`
    (the task format's `held_out_phrasings` rule); a list of `n` or fewer is all trained."""
    return (options[:len(options) - n], options[len(options) - n:]) if len(options) > n else (options, [])


def held_out_wordings(spec: dict) -> set[str]:
    """Every held-out operation wording of a task spec."""
    n = spec["text"].get("held_out_phrasings", 0)
    return {w for options in spec["text"]["operations"].values() for w in split_wordings(options, n)[1]}


def augment(spec: dict, forbidden: set[str],
            variants_of: Callable[[str], list[str]] | None = None) -> tuple[dict, dict, int]:
    """(the augmented spec, {operation: variants added}, variants dropped for being in `forbidden` or already listed).
    Each operation's list becomes its trained wordings, their variants, then its held-out wordings. `variants_of`: a
    trained sentence -> its variants (default: the determiner swap, :func:`determiner_variant`)."""
    if variants_of is None:
        def variants_of(sentence: str) -> list[str]:
            variant = determiner_variant(sentence)
            return [] if variant is None else [variant]
    n = spec["text"].get("held_out_phrasings", 0)
    out = json.loads(json.dumps(spec))
    added, dropped = {}, 0
    for op, options in spec["text"]["operations"].items():
        trained, held = split_wordings(options, n)
        variants = []
        for variant in (v for sentence in trained for v in variants_of(sentence)):
            if variant in forbidden or variant in options or variant in variants:
                dropped += 1
                continue
            variants.append(variant)
        out["text"]["operations"][op] = [*trained, *variants, *held]
        added[op] = variants
    return out, added, dropped


def main(argv=None) -> None:
    if argv if argv is not None else sys.argv[1:]:
        raise SystemExit("determiner_variants.py takes no arguments; it writes " + TARGET)
    spec = json.loads((REPO / SOURCE).read_text())
    forbidden = held_out_wordings(spec) | held_out_wordings(json.loads((REPO / HELDOUT2).read_text()))
    out, added, dropped = augment(spec, forbidden)  # the same name and machine: a checkpoint answers either file
    (REPO / TARGET).write_text(json.dumps(out, indent=2) + "\n")
    record = {"command": "python examples/reproduce/determiner_variants.py", "source": SOURCE, "target": TARGET,
              "date": datetime.date.today().isoformat(), "added": added,
              "dropped_as_held_out_or_listed": dropped}
    (REPO / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
