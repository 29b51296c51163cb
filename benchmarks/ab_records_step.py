"""Before / after on the records step, in one process: the `modeling_par` of two checkouts side by side.

    git worktree add ../before <commit>      # the code before the change
    python benchmarks/ab_records_step.py --before ../before [--after .] [--lengths 8,16] [--rounds 10] [--repeats 5] \
        [--models "answer feedback"] [--out ab.json]

Each checkout's `modeling_par` folder is imported under its own name (`modeling_par_before`, `modeling_par_after`:
its imports are relative), and each `bench_records_step.MODELS` PAR row is built from both, from the same seed, on the
same records batch as `bench_records_step.py`. Per model and length: the tensor operations one step dispatches
(`bench_records_step.count_ops`; load-independent), the median seconds per step of each (per round `--repeats` steps
of one, then of the other, the order alternating between rounds, so both see the machine's drift alike; median over
rounds; `--clock cpu`: the thread's CPU time, steadier on a busy machine), and whether both models' parameters are
still bit-identical after all those steps (the same numerics: every step's gradients equal). Nothing is asserted: a
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def import_checkout(tree: Path, label: str, folder: Path):
    """`tree`'s modeling_par, copied into `folder` as `modeling_par_<label>` and imported under that name. Its
    "par_eager" attention is registered again as "par_eager_<label>" (transformers' registry is one global table,
    where the checkout imported last would win the name)."""
    from transformers import AttentionInterface

    name = f"modeling_par_{label}"
    shutil.copytree(tree / "modeling_par", folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    package = importlib.import_module(name)
    attention = importlib.import_module(f"{name}.par_attention").par_eager_attention
    AttentionInterface.register(f"par_eager_{label}", attention)
    return package


def steps_per_checkout(bench, packages: dict, spec: dict, token_ids: dict, batch: dict, depth: int) -> dict:
    """label -> (model, its step closure), each model built from that checkout's package with seed 0, warmed up."""
    import torch

    out = {}
    for label, package in packages.items():
        torch.manual_seed(0)
        model = bench.par_model(token_ids, **spec, attn=f"par_eager_{label}", package=package)  # its own "par_eager"
        step = bench.step_function("par", model, batch, depth, fused=True)  # as the Trainer steps
        for _ in range(3):
            step()
        out[label] = (model, step)
    return out


def timed_rounds(steps: dict, rounds: int, repeats: int, clock) -> dict:
    """label -> the median seconds per step of each round on `clock` (`repeats` steps per round, the order
    alternating between rounds)."""
    medians = {label: [] for label in steps}
    for r in range(rounds):
        for label in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            times = []
            for _ in range(repeats):
                started = clock()
                steps[label][1]()
                times.append(clock() - started)
            medians[label].append(statistics.median(times))
    return medians


def same_parameters(models: list) -> bool:
    """Whether the models' parameters are bit-identical."""
    import torch

    first, second = (dict(m.named_parameters()) for m in models)
    return first.keys() == second.keys() and all(torch.equal(first[n], second[n]) for n in first)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before the change")
    parser.add_argument("--after", type=Path, default=REPO, help="checkout of the code after it (default: this one)")
    parser.add_argument("--lengths", default="8,16")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per checkout and round (median)")
    parser.add_argument("--models", default="answer feedback", help="the PAR rows of bench_records_step.MODELS "
                        "whose name contains one of these comma-separated words (default: the recipe's model)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall: time.perf_counter; cpu: "
                        "this thread's CPU time (time.thread_time), which leaves out the time the thread waits for "
                        "a core on a busy machine (cache and memory contention still count)")
    parser.add_argument("--out", default=None)
    return parser


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    import bench_records_step as bench
    import numpy as np
    import torch

    from state_tracking import StateTrackingCollator
    from state_tracking.records import record_token_ids

    torch.set_num_threads(1)
    records = bench.read_records()
    token_ids = record_token_ids(records.tokenizer, records.record_format)
    depths = np.asarray(records.encoded["depth"])
    collate = StateTrackingCollator(records.tokenizer.pad_token_id, padding_side="right")
    words = [w.strip() for w in args.models.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        packages = {label: import_checkout(tree.resolve(), label, Path(folder))
                    for label, tree in (("before", args.before), ("after", args.after))}
        for name, (kind, spec) in bench.MODELS.items():
            if kind != "par" or not any(w in name for w in words):
                continue
            for depth in (int(d) for d in args.lengths.split(",")):
                batch = collate([records.encoded[int(i)] for i in np.flatnonzero(depths == depth)[:args.batch_size]])
                steps = steps_per_checkout(bench, packages, spec, token_ids, batch, depth)
                ops = {label: bench.count_ops(step) for label, (_, step) in steps.items()}
                clock = time.perf_counter if args.clock == "wall" else time.thread_time
                medians = timed_rounds(steps, args.rounds, args.repeats, clock)
                seconds = {label: statistics.median(m) for label, m in medians.items()}
                rows.append({"model": name, "depth": depth, "ops_per_step": ops,
                             "seconds_per_step": {k: round(v, 5) for k, v in seconds.items()},
                             "after_over_before_seconds": round(seconds["after"] / seconds["before"], 3),
                             "after_over_before_per_round": [round(a / b, 3) for a, b in zip(medians["after"],
                                                                                              medians["before"])],
                             "parameters_bit_identical": same_parameters([m for m, _ in steps.values()])})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/ab_records_step.py " + " ".join(
            argv or sys.argv[1:]), "rounds": args.rounds, "repeats": args.repeats, "clock": args.clock, "threads": 1,
            "rows": rows,
            "torch": torch.__version__}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
