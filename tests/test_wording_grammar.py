"""The wording grammar of the reader fine-tune (issue 69, item 3; par_studies/wording_grammar.py): deterministic,
every sentence one sentence of the batch-process format with the meaning it is labelled with, and no wording of
held-out sets 1-3 in its output. No encoder is loaded."""

import random
from pathlib import Path

import pytest

from modeling_par.prompt_format import QUESTION_MARK
from modeling_par.sentence_reader import named_states
from modeling_par.sentences import collapse_whitespace, sentence_spans
from par_studies import wording_grammar as grammar
from tests.conftest import load_example

SETS = ("batch_process_phrasings.json", "batch_process_heldout2.json", "batch_process_heldout3.json")


@pytest.fixture(scope="module")
def fmt():
    return load_example("examples/studies/sentence_reader.py").recipe_format()


@pytest.fixture(scope="module")
def held_out(fmt):
    tasks = Path(__file__).resolve().parents[1] / "examples" / "tasks"
    return grammar.held_out_wordings([tasks / name for name in SETS], fmt.trained)


def test_the_grammar_is_deterministic_and_covers_every_meaning_and_form(fmt, held_out):
    first, info = grammar.generate(fmt.trained, 120, 0, held_out)
    again, _ = grammar.generate(fmt.trained, 120, 0, held_out)
    other, _ = grammar.generate(fmt.trained, 120, 1, held_out)
    assert first == again and first != other
    assert {w.meaning for w in first} == set(grammar.meanings()) and len(grammar.meanings()) == 15
    assert {w.form for w in first} == set(grammar.FORMS)
    assert len({w.text for w in first}) > 0.9 * len(first)  # mostly distinct sentences
    assert tuple(fmt.candidates) == grammar.STATES and tuple(fmt.operations) == grammar.OPERATIONS
    assert fmt.query_names == (grammar.QUESTION,)
    for meaning in grammar.meanings():  # every meaning has phrases in every form
        for form in grammar.FORMS:
            assert grammar.content(meaning, form, fmt.trained), (meaning, form)


def test_every_sentence_is_one_sentence_with_its_meaning(fmt, held_out):
    wordings, _ = grammar.generate(fmt.trained, 240, 0, held_out)
    assert len(wordings) > 3000
    for w in wordings:
        assert sentence_spans(w.text) == [(0, len(w.text))] and "\n" not in w.text, w.text  # one sentence, whole
        assert fmt.units(w.text) == [(0, len(w.text))], w.text
        is_question = collapse_whitespace(w.text).endswith(QUESTION_MARK)
        assert is_question == (w.role == "question") and w.text.count(QUESTION_MARK) == int(is_question), w.text
        if w.role == "start":  # the reader allows the start role only to a sentence naming its state: this one only
            assert named_states(w.text, fmt.candidates) == {w.name}, w.text


def test_no_held_out_wording_is_generated_and_the_check_bites(fmt, held_out):
    wordings, info = grammar.generate(fmt.trained, 240, 0, held_out)
    assert len(held_out) > 100  # sets 1-3's new wordings, start templates filled with every state
    assert not {grammar.normalized(w.text) for w in wordings} & held_out
    trained = grammar.trained_wordings(fmt.trained)
    assert not trained & held_out and len(trained) == 61
    # a held-out wording put into the grammar's content is dropped, dressed or not
    leaked = next(iter(held_out))
    saved = grammar.OPERATION_CONTENT["start"]["clause"]
    try:
        grammar.OPERATION_CONTENT["start"]["clause"] = [leaked]
        out, dropped = grammar.generate(fmt.trained, 60, 0, held_out, forms=("clause",))
    finally:
        grammar.OPERATION_CONTENT["start"]["clause"] = saved
    assert leaked in dropped["phrases_dropped"] and not [w for w in out if w.meaning == ("operation", "start")]


def test_typos_keep_state_names_and_change_one_word():
    rng = random.Random(0)
    for _ in range(200):
        text = grammar.add_typos("The batch reactor is holding again today", 1, rng)
        assert "holding" in text.split() and text != "The batch reactor is holding again today"
        assert sum(a != b for a, b in zip(text.split(), "The batch reactor is holding again today".split())) <= 1
