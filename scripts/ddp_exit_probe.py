"""How often does a 2-rank gloo DDP run abort at exit, with and without the teardown ParTrainer registers?

    python scripts/ddp_exit_probe.py --variant none --runs 20      # no teardown (the code before the fix)
    python scripts/ddp_exit_probe.py --variant destroy --runs 20   # barrier + destroy_process_group() only
    python scripts/ddp_exit_probe.py --variant teardown --runs 20  # what ParTrainer does at exit (the fix)

Each run is the DDP test's training (tests/test_trainers.py: 4 steps, 2 ranks, gloo, torchrun --standalone) ending
right after `trainer.train()`. Reported per run: the exit status and, per rank, the process's thread count before the
teardown and after it (gloo's worker and loop threads are gone only when the process group is really destroyed).
A run is a failure when torchrun exits non-zero (a rank aborted: "terminate called without an active exception").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RUN = r"""
import atexit, gc, json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
import trainers.par_trainer as par_trainer
from tests.test_trainers import COLLATOR, DATASET, tiny_args, tiny_model

variant, out = sys.argv[3], sys.argv[2]
threads = lambda: len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1
record = {}

def report():  # registered first, so it runs last (after the trainer's own exit hook)
    record["threads_at_exit"] = threads()
    record["initialized_at_exit"] = torch.distributed.is_initialized()
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(record, f)

atexit.register(report)
if variant != "teardown":
    par_trainer.teardown_distributed_at_exit = lambda trainer: None  # the code before the fix
args = tiny_args(out, max_steps=4, per_device_train_batch_size=4, curriculum_start_depth=2, curriculum_every_steps=1,
                 depth_schedule="hold", ddp_backend="gloo")
trainer = par_trainer.ParTrainer(model=tiny_model(), args=args, train_dataset=DATASET, data_collator=COLLATOR)
trainer.train()
record["threads_after_train"] = threads()
if variant == "destroy":  # what most scripts do: barrier, destroy_process_group (the DDP wrapper still holds it)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    gc.collect()
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=["none", "destroy", "teardown"], required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", default=None, help="JSON report")
    args = parser.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    rows, started = [], time.time()
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "run.py"
            script.write_text(RUN)
            start = time.time()
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                   "--standalone", str(script), str(REPO), tmp, args.variant],
                                  capture_output=True, text=True, cwd=tmp, env=env, timeout=300)
            ranks = [json.loads(p.read_text()) if p.is_file() else None
                     for p in (Path(tmp) / "rank0.json", Path(tmp) / "rank1.json")]
            row = dict(run=i + 1, rc=proc.returncode, seconds=round(time.time() - start, 1), ranks=ranks,
                       aborted="terminate called without an active exception" in proc.stderr)
            rows.append(row)
            print(json.dumps(row), flush=True)
    failures = sum(r["rc"] != 0 for r in rows)
    summary = dict(variant=args.variant, runs=args.runs, failures=failures,
                   command="python scripts/ddp_exit_probe.py " + " ".join(sys.argv[1:] if argv is None else argv),
                   wall_seconds=round(time.time() - started, 1), rows=rows)
    print(f"{args.variant}: {failures} of {args.runs} runs failed")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
