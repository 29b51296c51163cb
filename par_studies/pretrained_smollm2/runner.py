"""A row run end to end (`--row`: train or resume, evaluate, write its record, keeping what an earlier record of the
same model held), a two-stage row's first-stage cost, and the parity check of the retrofit against its parent
(`--parity`)."""

from __future__ import annotations

import json

from .. import peak_rss_gb, save_record
from .evaluation import evaluate
from .rows import DEPTHS, EVALUATION, OUT, PHRASINGS, ROWS, N
from .training import parent_folder, record_path, run_path, scrub, train


def stage1_of(row: str, seed: int) -> dict:
    """What a two-stage row's first stage cost (its own segments): row, steps, train seconds, commands. The row's
    `train_seconds` counts its second stage only; the two together are what a seed costs."""
    from par_studies import row_train_seconds

    stage1 = ROWS[row].init_from
    folder = run_path(stage1, seed)
    segments = [dict(s, command=scrub(s["command"])) for s in json.loads((folder / "segments.json").read_text())]
    return {"row": stage1, "steps": json.loads((folder / "summary.json").read_text())["steps"],
            "train_seconds": row_train_seconds(segments), "train_commands": [s["command"] for s in segments],
            "peak_rss_gb": peak_rss_gb(segments)}


def run_row(row: str, seed: int, only: list[str] | None = None) -> dict | None:
    """Train (or resume) and evaluate a row; its record under results/pretrained_cpu/runs/. `only`: evaluate just
    these phrasings (each kept in the run folder as eval_<phrasing>.json, which a later full run reads instead of
    evaluating again: two processes can share a row's evaluation), and write no record."""
    segments = train(row, seed)
    is_pilot = row.startswith("pilot_")
    phrasings, depths, n = EVALUATION.get(row, (PHRASINGS, [4], 256) if is_pilot else (PHRASINGS, DEPTHS, N))
    if only is not None:
        unknown = sorted(set(only) - set(phrasings))
        if unknown:
            raise SystemExit(f"--phrasings: {', '.join(unknown)} not evaluated for row {row} (its: {phrasings})")
        evaluate(row, seed, segments, depths, n, only)
        return None
    record = evaluate(row, seed, segments, depths, n, phrasings)
    record["peak_rss_gb"] = peak_rss_gb(segments)
    if ROWS[row].init_from is not None:
        record["stage1"] = stage1_of(row, seed)
    path = record_path(row, seed)
    if path.is_file():
        record = carry_over(json.loads(path.read_text()), record)
    save_record(record, path)
    return record


def carry_over(old: dict, new: dict) -> dict:
    """`new`, a row's test rerun (e.g. on more prompts), keeping what the `old` record of the same trained model held
    besides its test: the diagnostics that later commands added (--sentences, --random_start, --export's pipeline
    check, ...), and the old test itself under `earlier_tests` where it was another test (another prompt count or
    grid). A record of another training (other commands) is replaced whole."""
    if old.get("train_commands") != new["train_commands"]:
        return new
    merged = {**{k: v for k, v in old.items() if k not in new}, **new}
    if (old["n_per_depth"], old["evaluation"]) != (new["n_per_depth"], new["evaluation"]):
        merged["earlier_tests"] = old.get("earlier_tests", []) + [
            {"n_per_depth": old["n_per_depth"], "evaluation": old["evaluation"]}]
    return merged


def run_parity() -> dict:
    """results/pretrained_cpu/parity.json: the conversion and R = 1 on the real weights, for the whole 30-layer parent
    (the paper's thirds, 10 + 10 + 10) and for the study's truncated 3 + 3 + 3."""
    import torch

    from par_studies.smollm2 import parity

    torch.set_num_threads(1)
    folder = parent_folder()
    record = {"command": "python examples/reproduce/pretrained_smollm2.py --parity",
              "cases": [parity(folder, layers=(10, 10, 10)), parity(folder, layers=(3, 3, 3), truncate=True)]}
    from state_tracking.evaluation import environment_info

    record["environment"] = environment_info(torch.device("cpu"))
    save_record(record, OUT / "parity.json")
    for case in record["cases"]:
        print(f"split {case['split']} truncated_to {case['truncated_to']}: conversion max|d| "
              f"{case['conversion_max_abs_diff']:.3g}, R = 1 max|d| {case['r1_max_abs_diff']:.3g}")
    return record
