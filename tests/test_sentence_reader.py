"""The sentence reader (issue 69, items 1–2): per-sentence readings with a confidence, roles by content, selective
answering at a calibrated threshold, the reader's files in a checkpoint and their load from the folder alone.

The encoder is a tiny random BertModel with a word-level WordPiece vocabulary built here (no download); the loop is
the shipped text checkpoint, copied. With a random encoder the readings are arbitrary but deterministic: every test
derives what it expects from the reader's own numbers (the formulas are checked against a computation by hand)."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel, BertTokenizer, pipeline

from modeling_par.sentence_reader import (
    choose_threshold,
    encode_sentences,
    known_sentences,
    load_encodings,
    mean_pool,
    save_encodings,
)
from state_tracking import load_task, prompt_format_of
from tests.conftest import fresh_process_job, fresh_process_result, load_example

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "checkpoints" / "par-batch-process-text"
SYMBOLIC = REPO / "checkpoints" / "par-swap-s5-small"
CALIBRATION = REPO / "examples" / "tasks" / "batch_process_phrasings.json"  # the last wordings: never trained
add_reader = load_example("examples/add_sentence_reader.py")

START, QUESTION = "The batch reactor is idle.", "The reactor is now ?"
KNOWN_OPS = ["The operator presses start.", "The tank is full."]
NEW_OP = "The operator presses start now."  # written here: no task file lists it
NEW_QUESTION = "So where is the reactor now ?"


def words_of(sentences) -> list[str]:
    return sorted({w for s in sentences for w in re.findall(r"\w+|[^\w\s]", s.lower())})


def tiny_encoder(folder: Path) -> Path:
    """A random 1-layer BertModel (hidden 32) and a word-level tokenizer over every word the task files and these
    tests write, saved like a downloaded encoder."""
    texts = [NEW_OP, NEW_QUESTION, "Is the reactor heating ?"]
    spec = json.loads(CALIBRATION.read_text())  # every wording of the checkpoint's task
    texts += [s for units in spec["text"]["operations"].values() for s in units]
    texts += spec["text"]["initial"] + spec["text"]["query"] + spec["states"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words_of(texts)]
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64))
    out = folder / "encoder"
    encoder.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def checkpoint_with_reader(folder: Path, **kwargs) -> tuple[Path, dict]:
    """A copy of the shipped text checkpoint with the tiny reader added by examples/add_sentence_reader.py."""
    ckpt = folder / "ckpt"
    shutil.copytree(SOURCE, ckpt)
    settings = add_reader.add_sentence_reader(ckpt, tiny_encoder(folder), "tiny random BERT", **kwargs)
    return ckpt, settings


@pytest.fixture(scope="module")
def reader_checkpoint(tmp_path_factory):
    return checkpoint_with_reader(tmp_path_factory.mktemp("reader"), calibration_file=str(CALIBRATION))


@pytest.fixture(scope="module")
def tracker(reader_checkpoint):
    return pipeline("state-tracking", model=str(reader_checkpoint[0]), trust_remote_code=True)


@pytest.fixture(scope="module")
def plain():
    return pipeline("state-tracking", model=str(SOURCE), trust_remote_code=True)


@pytest.fixture
def reader(tracker):
    """The tracker's reader, its threshold restored after each test."""
    threshold = tracker.sentence_reader.threshold
    yield tracker.sentence_reader
    tracker.sentence_reader.threshold = threshold


def prompt(*sentences) -> str:
    return " ".join([START, *sentences, QUESTION])


# ---------------------------------------------------------------------------------------------------- the formulas
def test_mean_pool_and_the_calibration_rule_on_synthetic_numbers():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.equal(mean_pool(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))
    confidences, right = [0.1, 0.2, 0.3, 0.4, 0.5], [False, True, False, True, True]
    assert choose_threshold(confidences, right, 0.99) == 0.4  # {0.4, 0.5}: 2 / 2
    assert choose_threshold(confidences, right, 0.6) == 0.1  # all five: 3 / 5
    assert choose_threshold(confidences, right, 0.7) == 0.2  # {0.2 .. 0.5}: 3 / 4
    assert choose_threshold([0.3, 0.3, 0.5], [False, True, True], 0.99) == 0.5  # ties share one threshold
    assert choose_threshold([0.1, 0.2], [True, False], 0.99) is None  # the most confident one is wrong: none reaches it
    with pytest.raises(ValueError, match="target must be in"):
        choose_threshold(confidences, right, 0.0)
    with pytest.raises(ValueError, match="same length"):
        choose_threshold(confidences, right[:2], 0.9)


def test_known_sentences_are_what_training_used_by_role(tmp_path):
    fmt = prompt_format_of(load_task(CALIBRATION), "text")
    trained = json.loads((SOURCE / "config.json").read_text())["prompt_format"]["trained"]
    known = known_sentences(fmt.with_trained(trained))
    assert [k.role for k in known].count("start") == 12 and [k.role for k in known].count("question") == 2
    assert [k.text for k in known if k.role == "operation" and k.name == "level_ok"] == trained["operations"][
        "level_ok"]
    assert {k.name for k in known if k.role == "start"} == set(fmt.candidates)
    assert [k.text for k in known if k.role == "question"] == ["The reactor is now ?", "The reactor state is now ?"]
    assert len(known_sentences(fmt)) == 6 * 3 + 32 + 3  # nothing recorded: every listed wording
    encodings = torch.randn(5, 3)
    save_encodings(tmp_path / "e.safetensors", encodings)  # written by hand, read by the safetensors library too
    assert torch.equal(load_file(tmp_path / "e.safetensors")["encodings"], encodings)
    assert torch.equal(load_encodings(tmp_path / "e.safetensors"), encodings)


def test_a_reading_is_the_margin_over_the_next_meaning_computed_by_hand(reader):
    (reading,) = reader.read([NEW_OP])
    e = encode_sentences(reader.encoder, reader.tokenizer, [NEW_OP])[0]
    similarity = reader.known_encodings @ e
    best = {}
    for k, s in zip(reader.known, similarity.tolist()):
        best[k.meaning] = max(best.get(k.meaning, -2.0), s)
    allowed = {m: s for m, s in best.items() if m[0] == "operation"}  # NEW_OP names no state: no start meaning
    read = max(allowed, key=allowed.get)
    runner_up = max(s for m, s in allowed.items() if m != read)
    assert (reading.role, reading.slot, reading.read_as) == read and reading.known is False
    assert reading.confidence == pytest.approx(best[read] - runner_up, abs=1e-5)
    assert reading.similarity == pytest.approx(best[read], abs=1e-5)
    assert reading.nearest_known in [k.text for k in reader.known if k.meaning == read]


# -------------------------------------------------------------------------------------------- roles by content
def test_roles_come_from_content_not_position(reader, tracker):
    moved = " ".join([KNOWN_OPS[0], START, QUESTION])  # a known operation placed first
    readings = reader.read_prompt(moved, check_roles=False).readings
    assert [(r.role, r.read_as, r.known) for r in readings] == [("operation", "start", True), ("start", "idle", True),
                                                               ("question", "state", True)]
    with pytest.raises(ValueError, match=r"sentence 1 'The operator presses start.' reads as operation 'start' \(a "
                                         r"known wording.*where a start sentence belongs") as error:
        tracker(moved)
    assert type(error.value).__name__ == "PromptFormatError"
    (question,) = reader.read(["Is the reactor heating ?"])  # a '?' sentence is a question, whatever it is near
    assert question.role == "question" and question.read_as == "state" and not question.known
    with pytest.raises(ValueError, match="sentence 2 'The batch reactor is idle.' reads as start"):
        tracker(" ".join([START, START, QUESTION]))
    # a start sentence states its state by name: a sentence naming none is never read as one, one naming a state
    # only as that state's
    sentences = ["Heat-up finished.", "Initially the batch reactor is filling.", "The reactor is heating or idle."]
    assert [(r.role, r.read_as) for r in reader.read(sentences)][0][0] == "operation"
    for reading, named in zip(reader.read(sentences), [set(), {"filling"}, {"heating", "idle"}]):
        assert reading.role == "operation" or reading.read_as in named
        allowed = [m for m, ok in zip(reader.meanings, reader.allowed_meanings(reading.sentence).tolist()) if ok]
        assert {name for role, _, name in allowed if role == "start"} == named
        assert {name for role, _, name in allowed if role == "operation"} == set(tracker.prompt_format.operations)


def test_known_sentences_have_confidence_one_and_are_answered_as_without_a_reader(tracker, plain):
    known = prompt(*KNOWN_OPS)
    out = tracker(known, return_readings=True)
    assert [r["confidence"] for r in out["readings"]] == [1.0] * 4 and all(r["known"] for r in out["readings"])
    assert [r["nearest_known"] for r in out["readings"]] == [START, *KNOWN_OPS, QUESTION]
    assert out.pop("readings") and out.pop("confident") is True
    assert out == plain(known)
    assert "confident" not in plain(known)  # without a reader: the result as before


# -------------------------------------------------------------------------------------------- the threshold
def test_above_the_threshold_a_new_wording_is_read_as_its_nearest_known_one(reader, tracker, plain):
    (reading,) = reader.read([NEW_OP])
    assert reading.role == "operation" and not reading.known  # the seed's encoder reads it as an operation
    reader.threshold = reading.confidence  # ≥: answered
    out = tracker(prompt(NEW_OP, KNOWN_OPS[1]), return_readings=True, halting=False)
    canonical = prompt(reading.nearest_known, KNOWN_OPS[1])
    assert out["confident"] is True and out["depth"] == 2
    assert out["answers"] == tracker(canonical, halting=False)["answers"] == plain(canonical, halting=False)["answers"]
    assert out["readings"][1] == {"sentence": NEW_OP, "role": "operation", "read_as": reading.read_as,
                                  "nearest_known": reading.nearest_known, "confidence": reading.confidence,
                                  "known": False, "similarity": reading.similarity,
                                  "replacement": reading.nearest_known}  # no example wordings: the nearest is trained


def test_below_the_threshold_the_prompt_is_refused_naming_the_weakest_sentence(reader, tracker, plain):
    (reading,) = reader.read([NEW_OP])
    reader.threshold = reading.confidence + 1e-3
    with pytest.raises(ValueError, match=re.escape(
            f"sentence 2 {NEW_OP!r} is read as operation {reading.read_as!r} with confidence "
            f"{reading.confidence:.3f} (margin over the next meaning; nearest known wording: "
            f"{reading.nearest_known!r}), under this checkpoint's threshold")) as error:
        tracker(prompt(NEW_OP, KNOWN_OPS[1]))
    assert type(error.value).__name__ == "PromptFormatError" and "answer_unconfident=True" in str(error.value)
    out = tracker(prompt(NEW_OP, KNOWN_OPS[1]), answer_unconfident=True, halting=False)
    assert out["confident"] is False
    assert out["answers"] == plain(prompt(reading.nearest_known, KNOWN_OPS[1]), halting=False)["answers"]
    reader.threshold = None  # no threshold reached the target: every new wording is under it
    with pytest.raises(ValueError, match="no new wording reached the calibration target"):
        tracker(prompt(NEW_OP))
    assert tracker(prompt(*KNOWN_OPS))["confident"] is True  # known wordings are still answered


def test_a_batch_reads_each_prompt_as_alone(reader, tracker):
    (reading,) = reader.read([NEW_OP])
    reader.threshold = reading.confidence + 1e-3
    prompts = [prompt(*KNOWN_OPS), prompt(NEW_OP), " ".join([START, KNOWN_OPS[1], NEW_QUESTION])]
    batched = tracker(prompts, batch_size=3, answer_unconfident=True, return_readings=True, halting=False)
    assert batched == [tracker(p, answer_unconfident=True, return_readings=True, halting=False) for p in prompts]
    assert batched[0]["confident"] is True and batched[1]["confident"] is False
    assert batched[2]["readings"][2]["role"] == "question"


def test_allow_untrained_skips_the_reader_and_still_reports_readings(tracker, plain):
    new = prompt(NEW_OP)
    out = tracker(new, allow_untrained=True, return_readings=True, halting=False)
    assert "confident" not in out and out["readings"][1]["sentence"] == NEW_OP
    out.pop("readings")
    assert out == plain(new, allow_untrained=True, halting=False)


# -------------------------------------------------------------------------------------------- files and arguments
def test_the_checkpoint_holds_the_reader_and_its_calibration(reader_checkpoint, tracker):
    ckpt, settings = reader_checkpoint
    config = json.loads((ckpt / "config.json").read_text())
    assert config["sentence_reader"] == settings
    assert settings["confidence"] == "margin" and settings["target"] == 0.99
    assert settings["sha256"] == add_reader.file_sha256(ckpt / "reader" / "model.safetensors")
    calibration = settings["calibration"]
    assert calibration["sentences"] == 6 + 8 + 1  # the wordings of the calibration file training never used
    # the threshold is the one choose_threshold picks on those sentences' readings
    sentences = add_reader.calibration_sentences(load_task(CALIBRATION), tracker.prompt_format,
                                                 tracker.sentence_reader)
    readings = tracker.sentence_reader.read([s for s, _ in sentences])
    right = [(r.role, r.slot, r.read_as) == m for r, (_, m) in zip(readings, sentences)]
    assert settings["threshold"] == choose_threshold([r.confidence for r in readings], right, 0.99)
    assert calibration["read_right"] == sum(right)
    stored = json.loads((ckpt / "reader" / "known_sentences.json").read_text())
    assert [k["text"] for k in stored] == [k.text for k in tracker.sentence_reader.known]
    assert torch.equal(load_file(ckpt / "reader" / "known_sentences.safetensors")["encodings"],
                       tracker.sentence_reader.known_encodings)
    assert (ckpt / "sentence_reader.py").read_bytes() == (REPO / "modeling_par" / "sentence_reader.py").read_bytes()


def test_bad_arguments_are_refused_by_name(tracker, plain, tmp_path):
    with pytest.raises(ValueError, match="return_readings must be a bool; got 'yes'"):
        tracker(prompt(), return_readings="yes")
    with pytest.raises(ValueError, match="answer_unconfident must be a bool; got 1"):
        tracker(prompt(), answer_unconfident=1)
    with pytest.raises(ValueError, match="answer_unconfident=True and allow_untrained=True: choose one"):
        tracker(prompt(), answer_unconfident=True, allow_untrained=True)
    for name in ("return_readings", "answer_unconfident"):
        with pytest.raises(ValueError, match=f"{name}: this checkpoint has no sentence reader"):
            plain(prompt(), **{name: True})
    with pytest.raises(SystemExit, match="--target must be in"):
        checkpoint_with_reader(tmp_path / "a", target=1.5)
    with pytest.raises(SystemExit, match="not both"):
        checkpoint_with_reader(tmp_path / "b", calibration_file=str(CALIBRATION), threshold=0.1)
    with pytest.raises(SystemExit, match="needs a text checkpoint"):
        add_reader.add_sentence_reader(SYMBOLIC, tmp_path, "none")
    with pytest.raises(SystemExit, match="every wording in it is a known one"):
        checkpoint_with_reader(tmp_path / "e", calibration_file=str(REPO / "examples" / "tasks" / "batch_process.json"))
    with pytest.raises(SystemExit, match="is not this checkpoint's machine"):
        checkpoint_with_reader(tmp_path / "c", calibration_file=str(REPO / "examples" / "tasks" / "register3.json"))
    ckpt, _ = checkpoint_with_reader(tmp_path / "d", threshold=0.2)
    config = json.loads((ckpt / "config.json").read_text())
    assert config["sentence_reader"]["calibrated_on"] == "set by hand (--threshold)"
    config["sentence_reader"]["threshold"] = "high"
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="sentence_reader threshold must be a number or None; got 'high'"):
        pipeline("state-tracking", model=str(ckpt), trust_remote_code=True)


def test_an_export_carries_the_reader(reader_checkpoint, tracker, tmp_path):
    push_to_hub = load_example("examples/push_to_hub.py")
    out = push_to_hub.export_for_hub(reader_checkpoint[0], tmp_path / "export", repo_id="me/par-reader")
    assert json.loads((out / "config.json").read_text())["sentence_reader"] == reader_checkpoint[1]
    exported = pipeline("state-tracking", model=str(out), trust_remote_code=True)
    prompts = [prompt(*KNOWN_OPS), prompt(NEW_OP, KNOWN_OPS[1])]
    assert exported(prompts, answer_unconfident=True, return_readings=True) == tracker(
        prompts, answer_unconfident=True, return_readings=True)


def test_a_stale_known_sentence_list_is_refused(tmp_path):
    ckpt, _ = checkpoint_with_reader(tmp_path, threshold=0.0)
    index = ckpt / "reader" / "known_sentences.json"
    index.write_text(json.dumps(json.loads(index.read_text())[1:] + json.loads(index.read_text())[:1]))
    with pytest.raises(ValueError, match="does not list the known sentences"):
        pipeline("state-tracking", model=str(ckpt), trust_remote_code=True)


# -------------------------------------------------------------------------------------------- the folder alone
READ_IN_FRESH_PROCESS = """
    from transformers import pipeline
    tracker = pipeline("state-tracking", model=sys.argv[1], trust_remote_code=True)
    prompts = json.loads(sys.argv[3])
    out = tracker(prompts, answer_unconfident=True, return_readings=True, halting=False)
    print(json.dumps({"results": out, "pipeline": type(tracker).__module__,
                      "reader": type(tracker.sentence_reader).__module__}))
"""
FRESH_PROMPTS = [prompt(*KNOWN_OPS), prompt(NEW_OP, KNOWN_OPS[1]), " ".join([START, NEW_OP, NEW_QUESTION])]


@fresh_process_job("sentence_reader_folder")
def reader_folder_job(folder):
    """A checkpoint with a reader (threshold calibrated on held-out set 1), loaded by `fresh_process` from its
    folder alone (package blocked)."""
    ckpt, settings = checkpoint_with_reader(folder, calibration_file=str(CALIBRATION))
    return dict(script=READ_IN_FRESH_PROCESS, folder=ckpt, args=[json.dumps(FRESH_PROMPTS)], settings=settings)


def test_the_reader_loads_from_the_folder_alone(fresh_process):
    job = fresh_process_result(fresh_process, "sentence_reader_folder")
    out = job["output"]
    assert out["pipeline"].startswith("transformers_modules") and out["reader"].startswith("transformers_modules")
    here = pipeline("state-tracking", model=str(job["folder"]), trust_remote_code=True)
    assert out["results"] == here(FRESH_PROMPTS, answer_unconfident=True, return_readings=True, halting=False)
    assert out["results"][0]["confident"] is True
    assert [r["known"] for r in out["results"][1]["readings"]] == [True, False, True, True]
