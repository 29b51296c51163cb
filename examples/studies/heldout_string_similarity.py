"""Issue 69: can string similarity tell which operation a new sentence means? (A baseline for the confidence of a
reading: the issue measured a sentence encoder, all-MiniLM-L6-v2, at 83.3% on the same sentences.)

    python examples/studies/heldout_string_similarity.py

Each of the second held-out set's 48 operation sentences (`examples/tasks/batch_process_heldout2.json`, every wording
after the canonical first) is given the operation of its nearest trained sentence
(`examples/tasks/batch_process_phrasings.json`'s 32), by difflib's ratio (`modeling_par.sentences.nearest_sentence`'s
measure, lower-cased) and by word Jaccard; printed: the share read as the right operation, over all and over the 80%
with the largest margin between the best and the second-best operation.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
HELD_OUT = REPO / "examples" / "tasks" / "batch_process_heldout2.json"
TRAINED = REPO / "examples" / "tasks" / "batch_process_phrasings.json"


def words(sentence: str) -> set[str]:
    return set(re.findall(r"\w+", sentence.lower()))


MEASURES = {
    "difflib ratio": lambda a, b: difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio(),
    "word Jaccard": lambda a, b: len(words(a) & words(b)) / max(1, len(words(a) | words(b))),
}


def main() -> dict:
    trained = [(op, s) for op, units in json.loads(TRAINED.read_text())["text"]["operations"].items() for s in units]
    held = [(op, s) for op, units in json.loads(HELD_OUT.read_text())["text"]["operations"].items() for s in units[1:]]
    out = {"held_out_sentences": len(held), "trained_sentences": len(trained)}
    for name, similarity in MEASURES.items():
        right, margins = [], []
        for op, sentence in held:
            best: dict[str, float] = {}
            for known_op, known in trained:
                best[known_op] = max(best.get(known_op, 0.0), similarity(sentence, known))
            ranked = sorted(best.items(), key=lambda item: -item[1])
            right.append(ranked[0][0] == op)
            margins.append(ranked[0][1] - ranked[1][1])
        right, margins = np.array(right), np.array(margins)
        top = margins >= np.quantile(margins, 0.2)
        out[name] = {"right": round(float(right.mean()), 3), "right_top80": round(float(right[top].mean()), 3)}
        print(f"{name}: {100 * right.mean():.1f}% read as the right operation; {100 * right[top].mean():.1f}% on the "
              f"80% with the largest margin ({len(held)} sentences)")
    return out


if __name__ == "__main__":
    main()
