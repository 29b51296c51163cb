"""The second held-out set (`--heldout2`): the chosen recipe's seeds on wordings no training file lists, read once."""

from __future__ import annotations

import json
from functools import partial

from .. import save_record
from .evaluation import evaluate_phrasing, kept_evaluation, same_machine
from .rows import DEPTHS, OUT, REPO, ROWS, N
from .training import record_path, run_path

HELDOUT2 = "examples/tasks/batch_process_heldout2.json"  # written before the search; read once, at the end
HELDOUT2_OUT = OUT / "heldout2.json"


def heldout2(row: str, seeds: list[int], write_record: bool = True) -> dict | None:
    """The chosen recipe's accuracy on the second held-out set (issue 49, item 3): every trained seed of `row` on
    1,024 fresh prompts per depth (idle start, the seed's test draw), d = 8 and 64, whose sentences are drawn only
    among the six wordings of examples/tasks/batch_process_heldout2.json that no training file lists. Read once: the
    file refuses to be overwritten. Each seed's test is kept in its run folder (`eval_heldout2.json`, keyed by grid and
    prompts), so seeds can be tested in parallel processes with `write_record=False` (`--cache_only`) and the record
    then written from those files by one call over every seed."""
    import numpy as np
    import torch

    from par_studies import load_run
    from state_tracking import load_task

    if HELDOUT2_OUT.exists():
        raise SystemExit(f"{HELDOUT2_OUT} exists: the second held-out set is read once")
    torch.set_num_threads(1)
    task = load_task(REPO / HELDOUT2)
    per_seed = {}
    def test_seed(seed: int) -> tuple[dict, dict]:
        model, tokenizer, trained = load_run(run_path(row, seed), max(DEPTHS))
        if not same_machine(trained, task):
            raise SystemExit(f"{HELDOUT2} is not the machine row {row} was trained on")
        return evaluate_phrasing(model, tokenizer, task, DEPTHS, N, seed, "held_out", f"{row} s{seed} heldout2")

    for seed in seeds:
        per_seed[str(seed)], environment = kept_evaluation(run_path(row, seed) / "eval_heldout2.json", DEPTHS, N,
                                                           f"{row} s{seed} heldout2", partial(test_seed, seed))
    if not write_record:
        return None
    trained_on = {str(seed): json.loads(record_path(row, seed).read_text())["evaluation"]["held_out"]["accuracy"]
                  for seed in seeds}
    by_depth = {str(d): [per_seed[str(s)]["accuracy"][i] if i < len(per_seed[str(s)]["accuracy"]) else 0.0
                         for s in seeds] for i, d in enumerate(DEPTHS)}
    record = {
        "row": row, "label": ROWS[row].label, "seeds": seeds, "task_file": HELDOUT2, "n_per_depth": N,
        "command": f"python examples/reproduce/pretrained_smollm2.py --heldout2 {row} --seeds "
                   + ",".join(str(s) for s in seeds),
        "per_seed": per_seed,
        "mean": {d: float(np.mean(v)) for d, v in by_depth.items()},
        "sd": {d: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for d, v in by_depth.items()},
        "first_held_out_set": trained_on, "environment": environment,
    }
    save_record(record, HELDOUT2_OUT)
    return record
