"""The committed text checkpoint (checkpoints/par-batch-process-text): its remote code is the package's, and the
folder alone (package blocked) answers raw strings of the batch-process machine through the state-tracking pipeline
and refuses malformed ones."""

import json
from pathlib import Path

import numpy as np
import pytest

from scripts.sync_remote_code import remote_code_files
from state_tracking import load_task_from_dir
from state_tracking.prompts import text_prompt
from tests.conftest import fresh_process_job, fresh_process_result

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "checkpoints" / "par-batch-process-text"
REMOTE_CODE = [p.name for p in remote_code_files(CHECKPOINT)]  # the generator's list: what its config's modules import


@pytest.mark.parametrize("name", REMOTE_CODE)
def test_text_checkpoint_remote_code_is_the_package_code(name):
    assert (CHECKPOINT / name).read_text() == (REPO / "modeling_par" / name).read_text(), \
        f"{CHECKPOINT.name}: {name} is stale; run python scripts/sync_remote_code.py checkpoints/*"


def test_text_checkpoint_holds_exactly_the_remote_code():
    """The folder holds the generator's list and nothing else: not the parent conversion, which inference never
    imports."""
    assert sorted(p.name for p in CHECKPOINT.glob("*.py")) == REMOTE_CODE
    assert "pipeline_par.py" in REMOTE_CODE and "parent_conversion.py" not in REMOTE_CODE


# The fresh package-blocked process (`fresh_process`) answers both tests' cases (the pipeline is loaded once).
ANSWER_FROM_THE_FOLDER = """
    from transformers import pipeline
    tracker = pipeline("state-tracking", model=sys.argv[1], trust_remote_code=True)
    assert type(tracker).__module__.startswith("transformers_modules")
    cases = json.loads(sys.argv[3])
    raw = cases["raw"]
    results = tracker(raw["prompts"], batch_size=8, return_trajectory=True)
    errors = []
    for bad in raw["bad"]:
        try:
            tracker(bad)
            errors.append(None)
        except ValueError as e:
            errors.append(type(e).__name__ + ": " + str(e))
    untrained = cases["untrained"]
    try:
        tracker(untrained["held_out"])
        error = None
    except ValueError as e:
        error = type(e).__name__ + ": " + str(e)
    print(json.dumps({"raw": {"results": results, "errors": errors},
                      "untrained": {"error": error, "trained": tracker(untrained["trained"]),
                                    "allowed": tracker(untrained["held_out"], allow_untrained=True)}}))
"""
# the same operations (start, level_ok, temp_ok, timer_done from idle: draining), in held-out and trained phrasings
HELD_OUT = ("Initially the batch reactor is idle. The operator starts the batch. The level switch signals full. "
            "The batch is at temperature. The hold timer ends. The reactor is now ?")
TRAINED = ("The batch reactor is idle. The batch is started by the operator. The tank is full. "
           "The set point temperature is reached. The hold time is over. The reactor is now ?")


def raw_cases():
    """16 prompts at 3x the training depth (seen phrasings) with their states, and three malformed strings."""
    task = load_task_from_dir(CHECKPOINT)
    rng = np.random.default_rng(5)
    ops = task.sample_ops(rng, 16, 24)  # 3x the training depth
    prompts = [text_prompt(task, o, None, "seen", rng)[0] for o in ops]
    states = task.prefix_states(ops)[..., 0]  # (n, d + 1)
    bad = ["", prompts[0].rsplit(" ", 2)[0], prompts[0].replace("The reactor", "The kettle", 1) if "The reactor" in
           prompts[0] else "The batch reactor is idle. The kettle boils. The reactor is now ?"]
    return task, states, {"prompts": prompts, "bad": bad}


@fresh_process_job("text_checkpoint_answers")
def text_checkpoint_cases(folder):
    """Both tests' cases for `fresh_process`, which answers them from the committed folder (`folder` unused)."""
    task, states, raw = raw_cases()
    cases = {"raw": raw, "untrained": {"held_out": HELD_OUT, "trained": TRAINED}}
    return dict(script=ANSWER_FROM_THE_FOLDER, folder=CHECKPOINT, args=[json.dumps(cases)], task=task, states=states)


@pytest.fixture(scope="module")
def answered(fresh_process):
    job = fresh_process_result(fresh_process, "text_checkpoint_answers")
    return job["task"], job["states"], job["output"]


def test_text_checkpoint_answers_raw_strings_from_its_folder_alone(answered):
    task, states, out = answered
    out = out["raw"]
    answers = [r["answers"]["state"] for r in out["results"]]
    assert answers == [task.candidate_names[s] for s in states[:, -1]]
    assert all(r["mode"] == "learned halting" and r["halted"] and r["iterations"] == 25 for r in out["results"])
    trajectory = [[step["answers"]["state"] for step in r["trajectory"]] for r in out["results"]]
    assert np.mean(np.array(trajectory) == np.array(task.candidate_names)[states[:, 1:]]) >= 0.99
    assert all(e and e.startswith("PromptFormatError") for e in out["errors"]), out["errors"]


def test_text_checkpoint_refuses_phrasings_it_never_trained_on(answered):
    """From the folder alone (package blocked): the held-out phrasings of four operations are refused with one
    PromptFormatError naming the first and its nearest trained sentence; trained phrasings of the same operations
    answer `draining`; `allow_untrained=True` answers the held-out prompt and lists all five untrained sentences."""
    out = answered[2]["untrained"]
    assert out["error"].startswith(
        "PromptFormatError: start sentence 1 'Initially the batch reactor is idle.' never occurs in this checkpoint's "
        "training data (nearest trained: 'The batch reactor is idle.'); 4 more untrained unit(s) in this prompt."), \
        out["error"]
    assert out["trained"]["answers"] == {"state": "draining"} and "untrained" not in out["trained"]
    allowed = out["allowed"]
    assert allowed["depth"] == 4 and allowed["answers"]["state"] in ("idle", "filling", "heating", "holding",
                                                                     "draining", "fault")
    assert [u["sentence"] for u in allowed["untrained"]] == [
        "Initially the batch reactor is idle.", "The operator starts the batch.", "The level switch signals full.",
        "The batch is at temperature.", "The hold timer ends."]
    assert [u["unit"] for u in allowed["untrained"]][1:] == [
        "operation 1 (start)", "operation 2 (level_ok)", "operation 3 (temp_ok)", "operation 4 (timer_done)"]


def test_shipped_records_of_training_sentences_are_recomputed_from_the_training_commands():
    """Both shipped configs carry `prompt_format.trained` exactly as examples/reproduce/trained_phrasings.py derives
    it from their recorded train_par.py commands (the data replayed with the same task, seed and size): every seen
    phrasing and, from random starts, every start state; no held-out phrasing."""
    from tests.conftest import load_example

    script = load_example("examples/reproduce/trained_phrasings.py")
    assert script.main(["--check"]) == 0
    trained = json.loads((CHECKPOINT / "config.json").read_text())["prompt_format"]["trained"]
    task = load_task_from_dir(CHECKPOINT)
    assert trained["operations"] == {name: options[:-1] for name, options in zip(task.op_names, task.op_phrasings)}
    assert len(trained["preamble"][0]) == 2 * task.num_candidates
    assert trained["queries"] == [task.query_phrasings[0][:-1]]
