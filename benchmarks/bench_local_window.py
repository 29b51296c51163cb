"""Evaluation speed of the local loop view: the fast window (each iteration on its operation tokens + the query
region) against the masked full-prompt computation, on the shipped checkpoint, one CPU thread.

    python benchmarks/bench_local_window.py [--depths 64,512] [--n 256] [--model checkpoints/par-swap-s5-small]
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoTokenizer  # noqa: E402

from modeling_par import ParLoopedQwenForStateTracking  # noqa: E402
from state_tracking import evaluate_length_generalization, load_task_from_dir  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="checkpoints/par-swap-s5-small")
    parser.add_argument("--depths", default="64,512")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--masked_max_depth", "--masked-max-depth", type=int, default=64,
                        help="skip the slow masked path above this depth")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = ParLoopedQwenForStateTracking.from_pretrained(args.model, dtype=torch.float32).eval()
    if model.config.loop_view != "local":
        raise SystemExit(f"{args.model} has loop_view={model.config.loop_view!r}; this benchmark needs 'local'.")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    task = load_task_from_dir(args.model)
    model.config.max_iterations = max(model.config.max_iterations, max(int(d) for d in args.depths.split(",")))
    print(f"{args.model}, {args.n} sequences per depth, forced depth, 1 thread")
    for depth in (int(d) for d in args.depths.split(",")):
        for window in (True, False):
            if not window and depth > args.masked_max_depth:
                continue
            model.runtime.local_window = window
            started = time.perf_counter()
            result = evaluate_length_generalization(model, tokenizer, task, [depth], n_per_depth=args.n,
                                                    progress=False)
            seconds = time.perf_counter() - started
            print(f"d = {depth:4d}  {'window' if window else 'masked'}: {seconds:6.1f} s "
                  f"({args.n / seconds:7.1f} sequences/s), accuracy {result['accuracy'][0]:.4f}")


if __name__ == "__main__":
    main()
