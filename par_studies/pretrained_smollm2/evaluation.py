"""The study's test of a trained row: one phrasing at a time under the stop rule, the task a row is tested on (the
study's own file), evaluations kept in the run folder for other processes to read back, and the row's parameters
trained."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

from .rows import AUGMENTED, PHRASINGS, REPO, ROWS, TASK_FILE, TRAIN_MAX_DEPTH
from .training import run_path, scrub


def evaluate_phrasing(model, tokenizer, task, depths: list[int], n: int, seed: int, phrasing: str,
                      label: str, random_initial: bool = False) -> tuple[dict, dict]:
    """One phrasing of the study's test (forced depth, `n` prompts per depth of the row's `seed`; idle start, or
    random start states stated in the prompt with `random_initial`), printed under `label`: ({"depths", "accuracy",
    "seconds"}, the evaluator's environment). The stop rule of every study: after two depths under 2% the longer ones
    are not run (counted as 0)."""
    from state_tracking import evaluate_until_failed

    started = time.time()
    result = evaluate_until_failed(model, tokenizer, task, depths, mode="forced", n_per_depth=n, seed=seed,
                                   rendering="text", phrasing=phrasing, train_max_depth=TRAIN_MAX_DEPTH,
                                   random_initial=random_initial, progress=False)
    print(f"{label} {phrasing}: " + " ".join(
        f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
    return ({"depths": result["depths"], "accuracy": result["accuracy"], "seconds": round(time.time() - started, 1)},
            result["environment"])


def same_machine(a, b) -> bool:
    """Whether two tasks are one state machine (states, operations, transitions), whatever their wordings."""
    return (a.candidate_names, a.op_names, a.transitions.tolist()) == (b.candidate_names, b.op_names,
                                                                         b.transitions.tolist())


def test_task(row: str, trained):
    """The task a row is tested on: the study's task file (the same test prompts for every row), which must be the
    machine the row was trained on (a row trained on an augmented copy of its wordings is tested on the original)."""
    from state_tracking import load_task

    task = load_task(REPO / TASK_FILE)
    if not same_machine(trained, task):
        raise SystemExit(f"row {row} was trained on another machine than {TASK_FILE}")
    return task


def kept_evaluation(cache: Path, depths: list[int], n: int, label: str, run) -> tuple[dict, dict]:
    """`run()`'s (evaluation, environment), kept in `cache` for that grid and prompt count: read back when the file
    holds the same grid and n (another process or an earlier call evaluated it), else evaluated and written."""
    cached = json.loads(cache.read_text()) if cache.is_file() else None
    if cached is not None and cached["grid"] == depths and cached["n_per_depth"] == n:
        print(f"{label}: read from {cache.name}", flush=True)
        return cached["evaluation"], cached["environment"]
    evaluation, environment = run()
    cache.write_text(json.dumps({"grid": depths, "n_per_depth": n, "evaluation": evaluation,
                                 "environment": environment}, indent=1))
    return evaluation, environment


def evaluate(row: str, seed: int, segments: list[dict], depths: list[int], n: int,
             phrasings: list[str] | None = None) -> dict:
    import torch

    from par_studies import load_run, row_train_seconds

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, trained = load_run(folder, max(depths))
    task = test_task(row, trained) if ROWS[row].flags.get("--task_file") in AUGMENTED else trained
    evaluation = {}
    for phrasing in phrasings or PHRASINGS:
        # written by an earlier (or a parallel --phrasings) evaluation
        evaluation[phrasing], environment = kept_evaluation(
            folder / f"eval_{phrasing}.json", depths, n, f"{row} s{seed} {phrasing}",
            partial(evaluate_phrasing, model, tokenizer, task, depths, n, seed, phrasing, f"{row} s{seed}"))
    segments = [dict(s, command=scrub(s["command"])) for s in segments]
    trained = row_train_seconds(segments)
    return dict(row=row, label=ROWS[row].label, seed=seed, task=task.name,
                command=f"python examples/reproduce/pretrained_smollm2.py --row {row} --seed {seed}",
                train_commands=[s["command"] for s in segments], segments=segments, steps=summary["steps"],
                samples_seen=summary["samples_seen"], train_seconds=trained,
                seconds_per_step=round(trained / max(1, summary["steps"]), 3), curve=summary.get("curve"),
                probe=summary.get("probe"), evaluation=evaluation, n_per_depth=n, environment=environment,
                parameters=sum(p.numel() for p in model.parameters()),
                trainable_parameters=trainable_count(folder, row))


def trainable_count(folder: Path, row: str) -> int:
    """Parameters the row trained: all but the embeddings and prelude under --freeze_prelude; under --peft lora those
    of the adapter file (the LoRA factors and the loop's adapter W)."""
    from safetensors.torch import load_file

    flags = ROWS[row].flags
    if flags.get("--peft") == "lora":
        return sum(v.numel() for v in load_file(str(folder / "lora_adapter" / "adapter_model.safetensors")).values())
    weights = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    prelude = config["prelude_layers"]  # a two-stage row's comes from its stage 1
    tied = config.get("tie_word_embeddings", True)  # an untied LM head trains with the embeddings frozen
    frozen = flags.get("--freeze_prelude") == "true"
    frozen_embeddings = frozen or flags.get("--freeze_embeddings") == "true"

    def is_frozen(name: str) -> bool:
        if name.startswith("model.embed_tokens") or (name == "lm_head.weight" and tied):
            return frozen_embeddings
        if not frozen:
            return False
        parts = name.split(".")
        return parts[:2] == ["model", "layers"] and int(parts[2]) < prelude

    return int(sum(t.numel() for k, t in weights.items() if not is_frozen(k)))
