"""What the studies' --collect share: their records, 'mean ± sd' cells, and a README whose table is regenerated in
place between two markers (the prose around it kept)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def load_records(folder: Path) -> list[dict]:
    """The JSON records of a folder (one per run), in file-name order."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def save_record(record: dict, path: Path, indent: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=indent))


def mean_sd(values: list[float], digits: int = 1, scale: float = 100.0) -> str:
    """'mean ± sd' of scale · values (sample sd), or the one value."""
    values = [scale * v for v in values]
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


def seeds_cell(group: list[dict], depth: int) -> str:
    """Accuracy (%) at one depth over a run's seeds (records with "depths" and "accuracy"): 'mean ± sd', the one
    value, or '–' if a seed stopped before that depth."""
    values = [dict(zip(r["depths"], r["accuracy"]))[depth] for r in group if depth in r["depths"]]
    if len(values) != len(group):
        return "–"
    return mean_sd(values)


def splice_table(readme: Path, start: str, end: str, body: str) -> bool:
    """Replace what lies between the `start` and `end` markers of `readme` with `body` (the rest of the file kept);
    False, and nothing written, when the README or its markers are missing."""
    text = readme.read_text() if readme.is_file() else ""
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    readme.write_text(head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1])
    return True
