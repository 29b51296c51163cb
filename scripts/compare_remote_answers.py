"""Do two checkpoint folders give identical answers when each is loaded as remote code, package blocked?

    python scripts/compare_remote_answers.py OLD_DIR NEW_DIR [--depths 2,8,32,64] [--n 64]

Used to show that re-exporting a checkpoint with new remote code (same weights) changes no answer: each folder is
loaded in a fresh process that cannot import this repository's packages (`transformers_modules` only), and runs
`predict` at forced depth and with learned halting on the same symbolic prompts (built here, from the folder's task).
Prints the largest logit difference and whether answers, iterations and halting flags agree; exit status 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RUN_BLOCKED = r"""
import importlib.abc, sys
sys.path[:] = [p for p in sys.path if p not in ("", ".", sys.argv[3])]
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("modeling_par", "state_tracking", "trainers"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import torch
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True, dtype=torch.float32).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
batches = torch.load(sys.argv[2])
out = {}
for depth, b in batches.items():
    kw = dict(attention_mask=b["attention_mask"], query_positions=b["query_positions"],
              operation_ends=b["operation_ends"])
    forced = model.predict(b["input_ids"], num_iterations=depth, **kw)
    halting = model.predict(b["input_ids"], halting=True, **kw)
    out[depth] = {"forced": forced.answer_logits, "halting": halting.answer_logits,
                  "iterations": halting.iterations, "halted": halting.halted}
torch.save(out, sys.argv[2] + ".out")
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--depths", default="2,8,32,64")
    parser.add_argument("--n", type=int, default=64)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from state_tracking import StateTrackingCollator, encode_batch, load_task_from_dir

    task = load_task_from_dir(args.new)
    tokenizer = AutoTokenizer.from_pretrained(args.new, trust_remote_code=True)
    batches = {}
    for depth in (int(d) for d in args.depths.split(",")):
        ops = task.sample_ops(np.random.default_rng(1000 + depth), args.n, depth)
        batches[depth] = StateTrackingCollator(tokenizer.pad_token_id)(encode_batch(task, tokenizer, "symbolic", ops))
    results = []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        for i, folder in enumerate((args.old, args.new)):
            path = os.path.join(tmp, f"batches{i}.pt")
            torch.save(batches, path)
            subprocess.run([sys.executable, "-c", RUN_BLOCKED, os.path.abspath(folder), path, str(REPO)],
                           check=True, cwd=tmp, env=env)
            results.append(torch.load(path + ".out"))
    report, same = {}, True
    for depth in batches:
        old, new = results[0][depth], results[1][depth]
        row = {"max_abs_logit_diff": max(float((old[k] - new[k]).abs().max()) for k in ("forced", "halting")),
               "answers_equal": all(torch.equal(old[k].argmax(-1), new[k].argmax(-1)) for k in ("forced", "halting")),
               "iterations_equal": torch.equal(old["iterations"], new["iterations"]),
               "halted_equal": torch.equal(old["halted"], new["halted"])}
        same &= row["answers_equal"] and row["iterations_equal"] and row["halted_equal"]
        report[depth] = row
    print(json.dumps({"old": args.old, "new": args.new, "n_per_depth": args.n, "identical": same, "depths": report},
                     indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
