"""Wordings no task file lists (issue 49, item 0): with `allow_untrained=True` the state-tracking pipeline reads every
unit the delimiter cuts out — a new start, operation or question — from its words and lists it under "untrained";
without it the refusal is unchanged; what cannot be segmented stays an error. The sentences are written here, not
taken from any task file; the model is the shipped text checkpoint (word-level vocabulary: the new sentences use its
words)."""

import json
from pathlib import Path

import pytest
import torch
from transformers import pipeline

from modeling_par import PromptFormatError
from state_tracking import get_task, load_task, prompt_format_of

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "checkpoints" / "par-batch-process-text"
MACHINE = load_task(REPO / "examples" / "tasks" / "batch_process.json")

# written for this test: none of them is a sentence of batch_process.json (checked below)
NEW_START = "The reactor is idle."
NEW_START_OPERATION = "The reactor is started by the operator."
NEW_FULL_OPERATION = "The tank reports full."
NEW_QUESTION = "At this point the reactor state is now ?"
TRAINED_START, TRAINED_START_OPERATION, TRAINED_QUESTION = ("The batch reactor is idle.", "The operator presses start.",
                                                           "The reactor is now ?")


@pytest.fixture(scope="module")
def tracker():
    return pipeline("state-tracking", model=str(CHECKPOINT), trust_remote_code=True)


def model_reads(tracker, prompt: str, halting: bool) -> str:
    """The model fed the prompt's tokens directly, its boundaries found by hand: each sentence ends at its '.' token
    (the first one ends the start), the readout is the token before '?'."""
    vocab = tracker.tokenizer.get_vocab()
    ids = tracker.tokenizer(prompt)["input_ids"]
    ends = [t for t, i in enumerate(ids) if i == vocab["."]]
    query = ids.index(vocab["?"]) - 1
    kw = dict(halting=True) if halting else dict(num_iterations=len(ends) - 1)  # step_size 1: R = d
    with torch.no_grad():
        prediction = tracker.model.predict(torch.tensor([ids]), query_positions=torch.tensor([[query]]),
                                           operation_ends=torch.tensor([ends]), **kw)
    return tracker.prompt_format.candidates[int(prediction.answers[0, 0])]


def test_the_format_reads_the_new_sentences_as_new_and_the_trained_ones_as_listed():
    fmt = prompt_format_of(MACHINE, "text")
    new = fmt.segment(" ".join([NEW_START, NEW_START_OPERATION, NEW_FULL_OPERATION, NEW_QUESTION]),
                      allow_untrained=True)
    assert [u["sentence"] for u in new.untrained] == [NEW_START, NEW_START_OPERATION, NEW_FULL_OPERATION,
                                                      NEW_QUESTION]
    assert new.operations == (None, None)
    known = fmt.segment(" ".join([TRAINED_START, TRAINED_START_OPERATION, TRAINED_QUESTION]))
    assert known.untrained is None and known.operations == ("start",)
    with pytest.raises(PromptFormatError, match="start sentence 1 'The reactor is idle.' is not one the task"):
        fmt.segment(" ".join([NEW_START, TRAINED_START_OPERATION, TRAINED_QUESTION]))


@pytest.mark.parametrize("halting", [False, True])
def test_new_start_operations_and_question_are_answered_as_the_model_reads_their_tokens(tracker, halting):
    prompt = " ".join([NEW_START, NEW_START_OPERATION, NEW_FULL_OPERATION, "An alarm trips.", NEW_QUESTION])
    out = tracker(prompt, allow_untrained=True, halting=halting)
    assert out["depth"] == 3
    assert out["answers"] == {"state": model_reads(tracker, prompt, halting)}
    assert [(u["unit"], u["sentence"]) for u in out["untrained"]] == [
        ("start sentence 1", NEW_START), ("operation 1", NEW_START_OPERATION), ("operation 2", NEW_FULL_OPERATION),
        ("question 1", NEW_QUESTION)]  # 'An alarm trips.' is a trained sentence: not listed
    assert all(isinstance(u["nearest_trained"], str) for u in out["untrained"])
    trained = json.loads((CHECKPOINT / "config.json").read_text())["prompt_format"]["trained"]
    assert out["untrained"][1]["nearest_trained"] in {s for units in trained["operations"].values() for s in units}


def test_each_kind_of_new_sentence_alone_and_batched_with_known_ones(tracker):
    prompts = [" ".join([NEW_START, TRAINED_START_OPERATION, TRAINED_QUESTION]),
               " ".join([TRAINED_START, NEW_START_OPERATION, TRAINED_QUESTION]),
               " ".join([TRAINED_START, TRAINED_START_OPERATION, NEW_QUESTION]),
               " ".join([TRAINED_START, TRAINED_START_OPERATION, TRAINED_QUESTION])]
    out = tracker(prompts, allow_untrained=True, halting=False, batch_size=4)
    assert [[u["sentence"] for u in r["untrained"]] for r in out] == [[NEW_START], [NEW_START_OPERATION],
                                                                      [NEW_QUESTION], []]
    assert [r["answers"]["state"] for r in out] == [model_reads(tracker, p, False) for p in prompts]


def test_the_default_still_refuses_and_known_phrasings_are_unchanged(tracker):
    known = " ".join([TRAINED_START, TRAINED_START_OPERATION, "The tank is full.", TRAINED_QUESTION])
    assert tracker(known) == {"answers": {"state": "heating"}, "iterations": 3, "halted": True,
                              "mode": "learned halting", "depth": 2}
    allowed = tracker(known, allow_untrained=True)
    assert allowed.pop("untrained") == [] and allowed == tracker(known)
    held_out = known.replace("The tank is full.", "The level switch signals full.")  # the task file's held-out one
    assert [u["unit"] for u in tracker(held_out, allow_untrained=True)["untrained"]] == ["operation 2 (level_ok)"]
    for new, unit in ((known.replace(TRAINED_START, NEW_START), "start sentence 1 'The reactor is idle.' is not one"),
                      (known.replace("The tank is full.", NEW_FULL_OPERATION), "operation 2 'The tank reports full.'"),
                      (known.replace(TRAINED_QUESTION, NEW_QUESTION), "the query is cut off or wrong")):
        with pytest.raises(ValueError, match=unit) as error:  # the checkpoint's own (remote code) PromptFormatError
            tracker(new)
        assert type(error.value).__name__ == "PromptFormatError"
        assert "pass allow_untrained=True to have the model read a new wording" in str(error.value)


def test_the_issues_wordings_segment_at_sentence_ends():
    """The wordings of the issue (a BPE parent reads them; this word-level vocabulary does not): the boundaries are the
    sentence ends, each new unit listed; on the word-level checkpoint an unknown word is the one error."""
    fmt = prompt_format_of(MACHINE, "text")
    prompt = "Shift start: the reactor is idle. Batch start command given. Fill complete. So the reactor ends up ?"
    segments = fmt.segment(prompt, allow_untrained=True)
    assert segments.operations == (None, None)
    assert [prompt[:e] for e in (segments.preamble_end, *segments.operation_ends, *segments.query_ends)] == [
        "Shift start: the reactor is idle.", "Shift start: the reactor is idle. Batch start command given.",
        "Shift start: the reactor is idle. Batch start command given. Fill complete.", prompt[:-2]]
    assert [u["unit"] for u in segments.untrained] == ["start sentence 1", "operation 1", "operation 2", "question 1"]
    # no training record: the sentences the format lists are not flagged, the new ones are (nearest: a listed one)
    assert segments.untrained[2]["nearest_trained"] in fmt.operations["drained"]
    assert fmt.segment(TRAINED_START + " " + NEW_FULL_OPERATION + " " + TRAINED_QUESTION,
                       allow_untrained=True).untrained[0]["unit"] == "operation 1"
    assert fmt.segment(TRAINED_START + " " + TRAINED_QUESTION, allow_untrained=True).untrained is None
    log = "\n".join(["Shift start: the reactor is idle", "Batch start command given", "Fill complete",
                     "So the reactor ends up ?"])
    lines = fmt.with_delimiter(r"\n").segment(log, allow_untrained=True)
    assert [log[:e].rsplit("\n", 1)[-1] for e in lines.operation_ends] == ["Batch start command given",
                                                                          "Fill complete"]


def test_a_word_the_vocabulary_lacks_is_one_clear_error(tracker):
    with pytest.raises(ValueError, match="word 'Batch' of the prompt is unknown to the checkpoint's") as error:
        tracker("The batch reactor is idle. Batch start command given. The reactor is now ?", allow_untrained=True)
    assert type(error.value).__name__ == "PromptFormatError"


@pytest.mark.parametrize("prompt, message", [
    ("", "the prompt is empty"),
    ("The batch reactor is idle. The operator presses start. The reactor is now", "query is cut off"),
    ("The batch reactor is idle. The operator presses start. ?", "query is cut off"),
    ("The batch reactor is idle. Is the reactor full ? The reactor is now ?", "operation 1 .* ends with '\\?'"),
    ("The batch reactor is idle. The operator presses start. . The reactor is now ?", r"operation 2 '\.' .* is empty"),
    (". The operator presses start. The reactor is now ?", r"start sentence 1 '\.' .* is empty"),
    ("The reactor is now ?", "has 1 unit"),
])
def test_what_cannot_be_segmented_stays_an_error(prompt, message):
    with pytest.raises(PromptFormatError, match=message):
        prompt_format_of(MACHINE, "text").segment(prompt, allow_untrained=True)


def test_a_new_question_wording_needs_a_task_with_one_question():
    """swap_s5 asks five questions (one per box): which box a new wording asks cannot be known, so its questions must
    be the listed ones; its start and operations may still be new."""
    fmt = prompt_format_of(get_task("swap_s5"), "text")
    start = " ".join(t.replace("{candidate}", c) for (t,), c in zip(fmt.preamble, fmt.candidates))
    questions = " ".join(words[0] + " ?" for words in fmt.queries)
    new_op = "Two boxes trade places."
    segments = fmt.segment(" ".join([start, new_op, questions]), allow_untrained=True)
    assert segments.operations == (None,) and [u["sentence"] for u in segments.untrained] == [new_op]
    asked = questions.replace("Box 2 contains the ?", "What is inside box 2 ?")
    with pytest.raises(PromptFormatError, match=r"question 2 'What is inside box 2 \?' is not a question wording of "
                                                r"task 'swap_s5', which asks 5 questions \['box_1', .*\(question 2, "
                                                r"'box_2': \['Box 2 contains the \?'\]\)"):
        fmt.segment(" ".join([start, new_op, asked]), allow_untrained=True)


def test_the_refusal_of_a_new_wording_quotes_the_measured_accuracy():
    fmt = prompt_format_of(MACHINE, "text")
    spec = fmt.to_dict()
    spec["trained"] = {"operations": {"start": ["The operator presses start."]},
                       "preamble": [["The batch reactor is idle."]], "queries": [["The reactor is now"]],
                       "untrained_accuracy": {"accuracy": 0.973, "depth": 8, "n": 1024, "source": "a test"}}
    measured = type(fmt).from_dict(spec)
    with pytest.raises(PromptFormatError, match=r"Not answered by default \(this checkpoint was measured at 97.3% on "
                                                r"phrasings its training never used \(1024 prompts of 8 operations; a "
                                                r"test\)\); pass allow_untrained=True"):
        measured.segment(" ".join([TRAINED_START, NEW_START_OPERATION, TRAINED_QUESTION]))
    segments = measured.segment(" ".join([TRAINED_START, NEW_START_OPERATION, TRAINED_QUESTION]), allow_untrained=True)
    assert segments.untrained == ({"unit": "operation 1", "sentence": NEW_START_OPERATION,
                                   "nearest_trained": "The operator presses start."},)
