"""Time the recipe's whole-state check (`par_cli.recipe.whole_state_check`) on the same number of operations
cut two ways: few long records and many short ones. Linear in the operations read, the two take about the same time
(issue 70.12: before, 1,000 records of ~2,000 operations took 20 CPU s against 3.7 s for 20,000 of ~100).

    python benchmarks/bench_whole_state_check.py [--operations 2000000 --seed 0]
"""

import argparse
import time

import numpy as np
from datasets import Dataset

from par_cli.recipe import whole_state_check

parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
parser.add_argument("--operations", type=int, default=2_000_000)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()


def counter_records(n: int, length: int, rng: np.random.Generator) -> Dataset:
    """n records of `length` operations of a counter mod 5 ("0".."2" add, "3" resets), half of them the first
    operations of an earlier record (the prefix lookups the check makes), final states only."""
    operations, labels = [], []
    for i in range(n):
        ops = [str(x) for x in rng.integers(0, 4, length)]
        if i and rng.random() < 0.5:
            ops = operations[int(rng.integers(i))][: int(rng.integers(1, length + 1))]
        state = 0
        for op in ops:
            state = 0 if op == "3" else (state + int(op)) % 5
        operations.append(ops)
        labels.append([[""]] * (len(ops) - 1) + [[str(state)]])
    return Dataset.from_dict({"operations": operations, "labels": labels, "initial": [["0"]] * n})


for n in (args.operations // 2000, args.operations // 100):
    length = args.operations // n
    dataset = counter_records(n, length, np.random.default_rng(args.seed))
    lengths = np.array([len(o) for o in dataset["operations"]])
    started = time.process_time()
    whole, checked, conflicts = whole_state_check(dataset, lengths, limit=n)
    seconds = time.process_time() - started
    print(f"{n:,} records of <= {length:,} operations ({int(lengths.sum()):,} in all): {seconds:.2f} CPU s; "
          f"whole={whole}, {checked:,} transitions checked, {conflicts} conflicts", flush=True)
