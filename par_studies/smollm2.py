"""SmolLM2-135M-Instruct, the first pretrained parent this package fetched: now one entry of `par_studies.parents`
(`python -m par_studies.parents fetch smollm2-135m`). This module keeps the names the batch-process study and its
tests use, delegating to it.

    python -m par_studies.smollm2          # the same as: python -m par_studies.parents fetch smollm2-135m
"""

from __future__ import annotations

from pathlib import Path

from .parents import get_parent
from .parents import parity as parent_parity

PARENT = get_parent("smollm2-135m")
GGUF_FILE = PARENT.gguf_file
SHA256 = PARENT.sha256
PARENT_NAME = PARENT.label
BATCH_PROCESS_TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "batch_process_phrasings.json"


def cache_folder() -> Path:
    return PARENT.cache_folder


def local_gguf() -> Path | None:
    return PARENT.local_gguf()


def ensure(quiet: bool = False) -> Path:
    return PARENT.ensure(quiet=quiet)


def parity(folder: str | None = None, gguf_file: str = GGUF_FILE, layers: tuple[int, int, int] = (10, 10, 10),
           truncate: bool = False, batch: int = 2, seq: int = 40, seed: int = 0) -> dict:
    """`par_studies.parents.parity` of SmolLM2 with the batch-process study's candidates (`folder` and `gguf_file`
    are the cache's: kept for the callers that pass them)."""
    return parent_parity("smollm2-135m", tuple(layers), truncate=truncate, batch=batch, seq=seq, seed=seed,
                         task=str(BATCH_PROCESS_TASK))


def main(argv=None) -> None:
    from .parents import main as parents_main

    parents_main(["fetch", "smollm2-135m", *(argv or [])])


if __name__ == "__main__":
    main()
