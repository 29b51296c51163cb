"""Few-shot reading (issue 69, item 3): a user's own example wordings join the sentence reader's known sentences
(`example_sentences`, `add_sentence_reader.py --examples`); the loop still reads only trained wordings, the one of the
meaning read that is nearest the sentence (`Reading.replacement`). The tiny random encoder and the shipped text
checkpoint of tests/test_sentence_reader.py; every expectation derived from the reader's own numbers."""

import json
import shutil

import pytest
import torch
from transformers import pipeline

from modeling_par.record_format import load_prompt_format
from modeling_par.sentence_reader import encode_sentences, example_sentences
from tests.test_sentence_reader import (
    KNOWN_OPS,
    NEW_OP,
    SOURCE,
    add_reader,
    checkpoint_with_reader,
    prompt,
    tiny_encoder,
)

EXAMPLE = "Go button pushed now."  # a user's wording of the operation start (no task file lists it)
EXAMPLES = {"operations": {"start": [EXAMPLE]}, "initial": ["Shift start: the reactor is {state} again."]}


@pytest.fixture(scope="module")
def fmt():
    return load_prompt_format(json.loads((SOURCE / "config.json").read_text())["prompt_format"])


@pytest.fixture(scope="module")
def with_examples(tmp_path_factory):
    """A copy of the text checkpoint with the tiny reader, the examples and no threshold (no new wording answered)."""
    ckpt, settings = checkpoint_with_reader(tmp_path_factory.mktemp("examples"), examples=EXAMPLES)
    return ckpt, settings, pipeline("state-tracking", model=str(ckpt), trust_remote_code=True)


def test_example_wordings_are_refused_by_field(fmt):
    trained_start = next(w for w in fmt.trained["operations"]["start"])
    cases = [({"phrasings": []}, "examples must be a dict with the keys"),
             ({"operations": {"launch": ["Go."]}}, r"examples\['operations'\] must map operations of this checkpoint"),
             ({"operations": {"start": "Go."}}, r"examples\['operations.start'\] must be a list of non-empty strings"),
             ({"initial": ["The reactor is ready."]}, r"has no \{state\}"),
             ({"operations": {"start": ["Go now. Then wait."]}}, "is not one sentence of this format"),
             ({"operations": {"abort": [trained_start]}}, "is given as operation 'abort' but training used it for "
                                                          "operation 'start'")]
    for examples, message in cases:
        with pytest.raises(ValueError, match=message):
            example_sentences(fmt, examples)
    given = example_sentences(fmt, EXAMPLES)
    assert [(k.role, k.name, k.trained) for k in given[-1:]] == [("operation", "start", False)]
    assert sorted(k.name for k in given if k.role == "start") == sorted(fmt.candidates)  # every state filled in


def test_an_example_wording_is_known_and_the_loop_reads_a_trained_one(with_examples):
    ckpt, settings, tracker = with_examples
    assert settings["examples"] == 1 + len(tracker.prompt_format.candidates) and settings["threshold"] is None
    stored = json.loads((ckpt / "reader" / "known_sentences.json").read_text())
    assert [k["text"] for k in stored if not k["trained"]][-1] == EXAMPLE
    out = tracker(prompt(EXAMPLE, KNOWN_OPS[1]), return_readings=True, halting=False)
    reading = out["readings"][1]
    trained_start = tracker.prompt_format.trained["operations"]["start"]
    assert out["confident"] is True  # no threshold, yet an example wording is answered: the user said what it means
    assert reading["known"] and reading["read_as"] == "start" and reading["confidence"] == 1.0
    assert reading["nearest_known"] == EXAMPLE and reading["replacement"] in trained_start
    plain = pipeline("state-tracking", model=str(SOURCE), trust_remote_code=True)
    assert out["answers"] == plain(prompt(reading["replacement"], KNOWN_OPS[1]), halting=False)["answers"]


def test_a_new_wording_is_scored_against_the_examples_too(with_examples):
    reader = with_examples[2].sentence_reader
    (reading,) = reader.read([NEW_OP])
    vector = encode_sentences(reader.encoder, reader.tokenizer, [NEW_OP])[0]
    texts = [k.text for k in reader.known]
    cos = {t: float(vector @ e) for t, e in zip(texts, reader.known_encodings)}
    of_meaning = [k for k in reader.known if (k.role, k.slot, k.name) == (reading.role, reading.slot, reading.read_as)]
    assert reading.similarity == pytest.approx(max(cos[k.text] for k in of_meaning), abs=1e-5)
    assert reading.nearest_known == max(of_meaning, key=lambda k: cos[k.text]).text
    assert reading.replacement == max((k for k in of_meaning if k.trained), key=lambda k: cos[k.text]).text
    # the stored encoding was computed in a batch with the other known sentences: equal up to the rounding that a
    # batch's padding and shape give the matrix products (bit-equality held on one install and not on another)
    torch.testing.assert_close(reader.known_encodings[-1],
                               encode_sentences(reader.encoder, reader.tokenizer, [EXAMPLE])[0], rtol=1e-5, atol=1e-6)


def test_the_command_line_reads_an_examples_file(tmp_path):
    ckpt, _ = checkpoint_with_reader(tmp_path, threshold=0.5)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match="--examples .*bad.json: not a readable JSON file"):
        add_reader.main(["--checkpoint", str(ckpt), "--threshold", "0.5", "--examples", str(bad)])
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"operations": {"launch": ["Go."]}}))
    with pytest.raises(SystemExit, match=r"--examples: examples\['operations'\] must map"):
        add_reader.main(["--checkpoint", str(ckpt), "--reader_folder", str(tmp_path / "encoder"), "--threshold",
                         "0.5", "--examples", str(wrong)])


def test_one_wording_given_for_two_meanings_is_refused(fmt):
    """An example written the same (as the format compares units) for two meanings would be read, known and with
    confidence 1.0, as whichever came first: refused, naming both."""
    with pytest.raises(ValueError, match=r"examples: 'Do it' is given as operation 'abort' and as operation 'start'"):
        example_sentences(fmt, {"operations": {"start": ["Do it."], "abort": ["Do it"]}})
    with pytest.raises(ValueError, match=r"examples: 'Reactor idle\.' is given as operation 'start' and as start "
                                         r"'idle'"):
        example_sentences(fmt, {"initial": ["Reactor {state}."], "operations": {"start": ["Reactor idle."]}})
    again = example_sentences(fmt, {"operations": {"start": ["Do it.", "Do it"]}})  # one meaning twice: harmless
    assert [k.text for k in again] == ["Do it.", "Do it"]


def test_a_question_example_may_keep_its_question_mark(fmt):
    """A question stem written with its '?' is the same example as the stem alone (not 'not one sentence')."""
    with_mark = example_sentences(fmt, {"query": ["Which state is the reactor in?"]})
    without = example_sentences(fmt, {"query": ["Which state is the reactor in"]})
    assert [k.text for k in with_mark] == [k.text for k in without] == ["Which state is the reactor in ?"]


def test_refused_examples_leave_the_checkpoint_untouched(tmp_path):
    """--examples is checked before anything is written into the checkpoint (its reader/ folder and config)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(SOURCE, ckpt)
    config = (ckpt / "config.json").read_text()
    with pytest.raises(SystemExit, match=r"--examples: examples\['operations'\] must map"):
        add_reader.add_sentence_reader(ckpt, tiny_encoder(tmp_path), "tiny random BERT",
                                       examples={"operations": {"launch": ["Go."]}})
    assert not (ckpt / "reader").exists() and (ckpt / "config.json").read_text() == config
