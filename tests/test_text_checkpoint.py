"""The committed text checkpoint (checkpoints/par-batch-process-text): its remote code is the package's, and the
folder alone (package blocked) answers raw strings of the batch-process machine through the state-tracking pipeline
and refuses malformed ones."""

import json
from pathlib import Path

import numpy as np
import pytest

from state_tracking import load_task_from_dir
from state_tracking.prompts import text_prompt
from tests.test_modeling_par import run_blocked

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "checkpoints" / "par-batch-process-text"
REMOTE_CODE = sorted(p.name for p in (REPO / "modeling_par").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("name", REMOTE_CODE)
def test_text_checkpoint_remote_code_is_the_package_code(name):
    assert (CHECKPOINT / name).read_text() == (REPO / "modeling_par" / name).read_text(), \
        f"re-export {CHECKPOINT.name} (examples/reproduce/batch_process_text.py --export random_start): {name} is stale"


ANSWER_RAW_TEXT = """
    from transformers import pipeline
    tracker = pipeline("state-tracking", model=sys.argv[1], trust_remote_code=True)
    assert type(tracker).__module__.startswith("transformers_modules")
    cases = json.loads(sys.argv[3])
    results = tracker(cases["prompts"], batch_size=8, return_trajectory=True)
    errors = []
    for bad in cases["bad"]:
        try:
            tracker(bad)
            errors.append(None)
        except ValueError as e:
            errors.append(type(e).__name__ + ": " + str(e))
    print(json.dumps({"results": results, "errors": errors}))
"""


def test_text_checkpoint_answers_raw_strings_from_its_folder_alone():
    task = load_task_from_dir(CHECKPOINT)
    rng = np.random.default_rng(5)
    ops = task.sample_ops(rng, 16, 24)  # 3x the training depth
    prompts = [text_prompt(task, o, None, "seen", rng)[0] for o in ops]
    states = task.prefix_states(ops)[..., 0]  # (n, d + 1)
    bad = ["", prompts[0].rsplit(" ", 2)[0], prompts[0].replace("The reactor", "The kettle", 1) if "The reactor" in
           prompts[0] else "The batch reactor is idle. The kettle boils. The reactor is now ?"]
    out = json.loads(run_blocked(ANSWER_RAW_TEXT, CHECKPOINT, json.dumps({"prompts": prompts, "bad": bad})))
    answers = [r["answers"]["state"] for r in out["results"]]
    assert answers == [task.candidate_names[s] for s in states[:, -1]]
    assert all(r["mode"] == "learned halting" and r["halted"] and r["iterations"] == 25 for r in out["results"])
    trajectory = [[step["answers"]["state"] for step in r["trajectory"]] for r in out["results"]]
    assert np.mean(np.array(trajectory) == np.array(task.candidate_names)[states[:, 1:]]) >= 0.99
    assert all(e and e.startswith("PromptFormatError") for e in out["errors"]), out["errors"]
