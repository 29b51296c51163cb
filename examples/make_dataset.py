"""Write a built-in or JSON task's problems as a records file (CSV, JSON Lines or Parquet, by extension): the format
`train_par.py --train_file` reads, so a user sees it, and training from the file can be checked against training
from the generator.

    python examples/make_dataset.py --task swap_s5 --depths 1-16 --n 16000 --out data/swap_train.csv
    python examples/make_dataset.py --task swap_s5 --depths 16,64,256 --n_per_depth 1024 --out data/swap_test.csv
    python examples/make_dataset.py --task machine.json --depths 1-16 --n 4000 --final_only --out data/m.jsonl
    python examples/make_dataset.py --task s5 --state_ids --depths 1-16 --n 4000 --out data/s5_ids.parquet

Columns: ``operations`` (the op names, whitespace-joined in CSV, a list in JSON Lines / Parquet), ``step_states`` (the
state after each operation; omitted with ``--final_only``), ``state`` (the final state), and ``initial_state`` with
``--random_initial``. A state is a label (one query) or a mapping query -> label (JSON text in CSV); ``--state_ids``
writes a group task's state as one label, its permutation's index among the 120 (S5's states as ids: what a user's
tagging file holds, with no factorisation into boxes).

`--depths lo-hi --n N` draws like `build_dataset(task, ..., n=N, depths=(lo, hi), seed)` (the same problems as the
generator trains on); `--depths a,b,c --n_per_depth M` draws M problems per depth like the evaluator
(`evaluation.draw_test_problems`: the same problems as `evaluate_par.py` scores).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from par_cli.cli import require_task, run_cli  # noqa: E402
from par_cli.flag_values import true_or_false  # noqa: E402
from state_tracking import GROUP_TASK_NAMES, build_dataset, build_tokenizer  # noqa: E402
from state_tracking.evaluation import draw_test_problems  # noqa: E402
from state_tracking.records import EXTENSIONS, task_records  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help=f"a preset {list(GROUP_TASK_NAMES)} or a task JSON file")
    parser.add_argument("--depths", required=True,
                        help="lo-hi (uniform, with --n) or a comma list (with --n_per_depth)")
    parser.add_argument("--n", type=int, default=None, help="records drawn over a lo-hi range")
    parser.add_argument("--n_per_depth", type=int, default=None, help="records per depth of a comma list")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the file to write (.csv, .tsv, .jsonl, .json, .parquet)")
    parser.add_argument("--final_only", type=true_or_false, nargs="?", const=True, default=False,
                        help="no step_states column (final states only)")
    parser.add_argument("--random_initial", type=true_or_false, nargs="?", const=True, default=False,
                        help="random start states, written to initial_state")
    parser.add_argument("--state_ids", type=true_or_false, nargs="?", const=True, default=False,
                        help="a group task's state as one label: its index")
    parser.add_argument("--text", type=true_or_false, nargs="?", const=True, default=False,
                        help="operations as the task's English sentences")
    args = parser.parse_args(argv)
    ext = os.path.splitext(args.out)[1].lower()
    if ext not in EXTENSIONS:
        parser.error(f"--out must end with one of {sorted(EXTENSIONS)}; got {args.out!r}")
    if args.text and ext in (".csv", ".tsv"):
        parser.error("--text writes sentences, which a whitespace-split CSV cell cannot hold: use .jsonl or .parquet")
    if "-" in args.depths:
        lo, hi = (int(x) for x in args.depths.split("-", 1))
        if args.n is None or args.n_per_depth is not None or not 1 <= lo <= hi:
            parser.error("--depths lo-hi needs --n (and 1 <= lo <= hi), not --n_per_depth")
        args.range = (lo, hi)
    else:
        args.range = None
        args.depth_list = [int(d) for d in args.depths.split(",")]
        if args.n_per_depth is None or args.n is not None or min(args.depth_list) < 1:
            parser.error("--depths a,b,c needs --n_per_depth (and depths >= 1), not --n")
    return args


def draw(task, args) -> list[tuple[np.ndarray, np.ndarray | None, np.ndarray]]:
    """The problems as (ops (m, d), initial (m, Q) or None, their row numbers) groups of one depth each."""
    if args.range is not None:
        data = build_dataset(task, build_tokenizer(task), n=args.n, depths=args.range, seed=args.seed,
                             random_initial=args.random_initial)
        depth, ops, labels = np.array(data["depth"]), data["ops"], data["step_labels"]
        groups = []
        for d in np.unique(depth):
            rows = np.flatnonzero(depth == d)
            initial = np.array([labels[r][0] for r in rows]) if args.random_initial else None
            groups.append((np.array([ops[r] for r in rows], dtype=np.int64).reshape(len(rows), int(d)), initial, rows))
        return groups
    m = args.n_per_depth
    return [(*draw_test_problems(task, d, m, args.seed, args.random_initial), np.arange(i * m, (i + 1) * m))
            for i, d in enumerate(args.depth_list)]


def state_ids(task, records: list[dict]) -> list[dict]:
    """Replace every state (a box -> item mapping) by its index among the permutations of the items."""
    if task.name not in GROUP_TASK_NAMES:
        raise ValueError("--state_ids is for the group tasks (a state is a permutation of the items)")
    ranks = {perm: i for i, perm in enumerate(itertools.permutations(task.candidate_names))}

    def rank(state):
        return ranks[tuple(state[q] for q in task.query_names)]

    for record in records:
        for key in ("state", "initial_state"):
            if key in record:
                record[key] = rank(record[key])
        if "step_states" in record:
            record["step_states"] = [rank(s) for s in record["step_states"]]
    return records


def write(records: list[dict], path: str) -> None:
    ext = os.path.splitext(path)[1].lower()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if ext in (".jsonl", ".json"):
        with open(path, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    elif ext == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        def cell(value):  # a mapping state as JSON text (Parquet columns keep one type)
            return json.dumps(value) if isinstance(value, dict) else value

        columns = {k: [cell(r[k]) if k != "step_states" else [cell(s) for s in r[k]] for r in records]
                   for k in records[0]}
        pq.write_table(pa.table(columns), path)
    else:
        delimiter = "\t" if ext == ".tsv" else ","

        def text(key, value):
            if key in ("operations", "step_states"):
                if any(isinstance(v, dict) for v in value):
                    return json.dumps(value)
                return " ".join(str(v) for v in value)
            return json.dumps(value) if isinstance(value, dict) else value

        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]), delimiter=delimiter)
            writer.writeheader()
            for record in records:
                writer.writerow({k: text(k, v) for k, v in record.items()})


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    task = require_task("--task", args.task)
    groups = draw(task, args)
    records = [None] * sum(len(rows) for _, _, rows in groups)
    for ops, initial, rows in groups:  # in the generator's row order
        for row, record in zip(rows, task_records(task, ops, initial, text=args.text)):
            records[row] = record
    if args.final_only:
        for record in records:
            del record["step_states"]
    if args.state_ids:
        records = state_ids(task, records)
    write(records, args.out)
    print(f"wrote {len(records)} records of {task.name} to {args.out}")
    return records


if __name__ == "__main__":
    run_cli(main)
