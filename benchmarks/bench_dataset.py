"""Time build_dataset: by default 400k swap-S5 problems, depth uniform in 1..32, symbolic.

    python benchmarks/bench_dataset.py [--task swap_s5 --n 400000 --max-depth 32 --rendering symbolic]
"""

import argparse
import time

from state_tracking import build_dataset, build_tokenizer, get_task

parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
parser.add_argument("--task", default="swap_s5")
parser.add_argument("--n", type=int, default=400_000)
parser.add_argument("--max_depth", "--max-depth", type=int, default=32)
parser.add_argument("--rendering", default="symbolic", choices=("symbolic", "text"))
parser.add_argument("--random_initial", "--random-initial", action="store_true")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

task = get_task(args.task)
tokenizer = build_tokenizer(task, args.rendering)
start = time.perf_counter()
dataset = build_dataset(
    task, tokenizer, args.rendering, n=args.n, depths=(1, args.max_depth), seed=args.seed,
    random_initial=args.random_initial,
)
seconds = time.perf_counter() - start
print(dataset)
print(
    f"built {len(dataset):,} {args.task} problems (d uniform in 1..{args.max_depth}, {args.rendering}) "
    f"in {seconds:.2f} s ({len(dataset) / seconds:,.0f} problems/s)"
)
