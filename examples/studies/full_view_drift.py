"""Issue 68: inside the full view's loop past the iterations trained — does the carried state drift step by step, or
does one step break? For each finished row of `examples/reproduce/full_view_positions.py` (its run folder under
`runs/full_view_positions/`), `state_tracking.diagnostics.readout_margins` at 2× and 4× the training depth: per
iteration k, the share read right, the readout margin (median and 10th percentile of the smallest query margin), and
the state's norm before anchoring over iteration 1's.

    python examples/studies/full_view_drift.py [--rows pose_conv_s0 pose_conv_s1 pose_conv_d12_s0] [--n 128]

Writes results/full_view_positions/drift.json (each row's figures, the command, the environment).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from par_studies.runs import finished_par_runs  # noqa: E402
from par_studies.tables import save_record  # noqa: E402

RUN_DIR = REPO / "runs" / "full_view_positions"
OUT = REPO / "results" / "full_view_positions" / "drift.json"
TASK_FILE = "examples/tasks/swap_s5_short.json"


def row_drift(row: str, model, train_depth: int, n: int) -> dict:
    """readout_margins of a finished run at 2x and 4x its training depth."""
    from state_tracking import build_tokenizer, load_task
    from state_tracking.diagnostics import readout_margins

    task = load_task(TASK_FILE)
    tokenizer = build_tokenizer(task, "text")
    return {"run": row, "train_max_depth": train_depth,
            "by_depth": [readout_margins(model, tokenizer, task, k * train_depth, n=n) for k in (2, 4)]}


def main(argv=None) -> dict:
    import torch

    from state_tracking.evaluation import environment_info

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rows", nargs="+", default=["pose_conv_s0", "pose_conv_s1", "pose_conv_d12_s0"])
    parser.add_argument("--n", type=int, default=128, help="problems per depth")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()
    record = {"command": "python examples/studies/full_view_drift.py " + " ".join(argv or sys.argv[1:]),
              "rows": [row_drift(*run, args.n) for run in finished_par_runs(RUN_DIR, args.rows)],
              "environment": environment_info()}
    record["seconds"] = round(time.time() - started, 1)
    save_record(record, OUT)
    for row in record["rows"]:
        for result in row["by_depth"]:
            print(f"{row['run']} d={result['depth']}: margin median "
                  + " ".join(f"{m:.1f}" for m in result["margin_median"]))
    return record


if __name__ == "__main__":
    main()
