"""Where a row's run and record live, its train_par.py flags (the parents' cache folders filled in), and training it
(a two-stage row trains its first stage first)."""

from __future__ import annotations

from pathlib import Path

from .. import REPO, combine, train_segment
from .rows import COMMON, OUT, PLACEHOLDERS, ROWS, RUN_DIR


def run_path(row: str, seed: int) -> Path:
    return RUN_DIR / f"{row}_s{seed}"


def parent_folder(name: str = "smollm2-135m") -> str:
    """The cache folder holding parent `name`'s GGUF (par_studies.parents), fetched first if the cache lacks it."""
    from par_studies.parents import get_parent

    return str(get_parent(name).ensure())


def row_flags(row: str, seed: int = 0) -> dict:
    """The row's train_par.py flags with the parent's cache folder filled in; a two-stage row (`init_from`) starts
    from the same seed's trained stage-1 row (`--init_from_par`)."""
    flags = {**COMMON, **ROWS[row].flags}
    if flags.get("--init_from_qwen2") in PLACEHOLDERS:
        flags["--init_from_qwen2"] = parent_folder(PLACEHOLDERS[flags["--init_from_qwen2"]])
    stage1 = ROWS[row].init_from
    start = {} if stage1 is None else {"--init_from_par": str(run_path(stage1, seed).relative_to(REPO))}
    return combine(row, flags, start)


def train(row: str, seed: int) -> list[dict]:
    """Train (or resume) a row; a two-stage row trains its stage-1 row first where that has not finished (no
    summary.json), without evaluating it. Returns the row's segments."""
    stage1 = ROWS[row].init_from
    if stage1 is not None and not (run_path(stage1, seed) / "summary.json").is_file():
        print(f"{row} fine-tunes {stage1} seed {seed}: training that first", flush=True)
        train(stage1, seed)
    return train_segment(run_path(row, seed), seed, row_flags(row, seed), row)


def scrub(text: str) -> str:
    """A recorded command with the machine's cache folders written as their placeholders (<smollm2>, ...)."""
    from par_studies.parents import get_parent

    for placeholder, name in PLACEHOLDERS.items():
        text = text.replace(str(get_parent(name).cache_folder), placeholder)
    return text


def record_path(row: str, seed: int) -> Path:
    return OUT / "runs" / f"{row}_s{seed}.json"
