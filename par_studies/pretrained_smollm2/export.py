"""A trained row as a pipeline-ready checkpoint (`--export`): its card and config quote the row's measured test, and
its folder alone answers raw strings through the pipeline in a fresh process with the package blocked."""

from __future__ import annotations

import json
from pathlib import Path

from .. import save_record
from .report import accuracy_at
from .rows import DEPTHS, PHRASINGS, QWEN, ROWS, RUN_DIR, TASK_FILE, TRAIN_MAX_DEPTH
from .training import record_path, run_path

EXPORT = RUN_DIR / "export"  # <name>/ per exported row (240 MB-1 GB): rebuilt from the weights, never committed


def parent_of(row: str) -> tuple[str, str]:
    """(a short name for the export's folder and repo id, what the row was retrofitted from), from its flags; a
    two-stage row (`init_from`) from its first stage's, with what its second stage froze."""
    stage1 = ROWS[row].init_from
    if stage1 is not None:
        short, parent = parent_of(stage1)
        second = ("prelude and embeddings" if ROWS[row].flags.get("--freeze_prelude") == "true" else "embeddings")
        return short, f"{parent}; then a second stage with the {second} frozen"
    flags = ROWS[row].flags
    layers = "{} + {} + {}".format(*(flags.get(f"--{part}_layers", "1") for part in ("prelude", "core", "coda")))
    frozen = ", embeddings frozen" if flags.get("--freeze_embeddings") == "true" else ""
    if flags.get("--init_from_qwen2") == QWEN:
        return "qwen2.5-coder-0.5b", f"Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, its first layers as {layers}{frozen})"
    return "smollm2", f"SmolLM2-135M-Instruct (Q4_1 GGUF, its first layers as {layers}{frozen})"


PIPELINE_CHECK = """
    import numpy as np
    import torch
    from transformers import pipeline
    torch.set_num_threads(1)
    tracker = pipeline("state-tracking", model=sys.argv[1], trust_remote_code=True)
    assert type(tracker).__module__.startswith("transformers_modules"), type(tracker).__module__
    cases = json.loads(open(sys.argv[3]).read())
    out = {}
    for phrasing, case in cases.items():
        refused = 0
        try:
            tracker(case["prompts"][0])
        except ValueError as e:
            refused, message = 1, str(e)
        results = tracker(case["prompts"], batch_size=32, allow_untrained=True)
        answers = [r["answers"]["state"] for r in results]
        out[phrasing] = {"accuracy": float(np.mean([a == t for a, t in zip(answers, case["targets"])])),
                         "n": len(answers), "refused_by_default": bool(refused),
                         "refusal": message if refused else None}
    print(json.dumps(out))
"""


def steps_text(record: dict) -> str:
    """A record's training steps in words: "300 + 200 steps (two stages)" for a two-stage row, "700 steps" else."""
    stage1 = record.get("stage1")
    return (f"{record['steps']} steps" if stage1 is None
            else f"{stage1['steps']} + {record['steps']} steps (two stages)")


def export(row: str, seed: int, target: Path | None = None, depth: int = 64, n: int = 256) -> Path:
    """The trained row as a pipeline-ready checkpoint (card, remote code, the pretrained BPE tokenizer) whose
    `prompt_format.trained` records the measured held-out-phrasing accuracy at d = 64, then `n` raw strings per
    phrasing through its pipeline in a fresh process with the package blocked: refused by default when untrained,
    answered with allow_untrained=True."""
    import shutil

    from par_studies import blocked_pipeline_check, repo_module
    from state_tracking import load_task_from_dir

    hub = repo_module("examples.push_to_hub")
    short, parent = parent_of(row)
    repo_id = f"par-{short}-batch-process"
    target = target or EXPORT / repo_id
    record = json.loads(record_path(row, seed).read_text())
    folder = run_path(row, seed)
    quoted = accuracy_at(record, "held_out", depth)
    if quoted is None:  # a checkpoint quoting nothing measured would not load (prompt_format validates it)
        raise SystemExit(f"--export: {record_path(row, seed)} has no held-out accuracy at d = {depth} (tested: "
                         f"{record['evaluation'].get('held_out', {}).get('depths')}); evaluate the row there first")
    if target.exists():
        shutil.rmtree(target)
    rows = {f"forced ({p.replace('_', '-')} phrasing)": record["evaluation"][p]["accuracy"] for p in PHRASINGS}
    n_tested = record["n_per_depth"]
    intro = (f"Overall state accuracy (%) on {n_tested:,} fresh prompts per depth (idle start, seed {seed}; trained "
             f"on d ≤ {TRAIN_MAX_DEPTH}, random start states), seen phrasings (drawn among those training used) and "
             f"held-out ones (the phrasing of every sentence kept out of training). `{record['command']}`.")
    measured = {"depths": DEPTHS, "rows": rows, "train_max_depth": TRAIN_MAX_DEPTH, "n_sequences": n_tested}
    hub.export_for_hub(folder, target, repo_id=repo_id, measured=measured, rendering="text",
                       learned_halting=False,
                       training_data=(f"{record['samples_seen']:,} random text problems of {TASK_FILE} (d ≤ "
                                      f"{TRAIN_MAX_DEPTH}), {steps_text(record)}, seed {seed}; retrofitted from "
                                      f"{parent}."),
                       limits="CPU scale: a truncated parent, one task, one seed; forced depth (no halting head).")
    card = (target / "README.md").read_text().replace(
        "No results were attached to this export.", hub.results_section(intro, DEPTHS, rows, curve=record.get("curve")))
    (target / "README.md").write_text(card)
    config = json.loads((target / "config.json").read_text())
    config["prompt_format"]["trained"]["untrained_accuracy"] = {
        "accuracy": quoted, "depth": depth, "n": n_tested,
        "source": f"results/pretrained_cpu/runs/{row}_s{seed}.json"}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    check = blocked_pipeline_check(target, load_task_from_dir(folder), PIPELINE_CHECK, PHRASINGS, depth, n, seed)
    result = check["by_phrasing"]
    record["pipeline_check"] = {**check, "command": f"python examples/reproduce/pretrained_smollm2.py --export {row} "
                                                    f"--seed {seed}"}
    save_record(record, record_path(row, seed))
    print(json.dumps(result, indent=1))
    return target
