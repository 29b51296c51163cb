"""examples/reproduce/determiner_variants.py: the rule-based augmentation of a task file's trained operation sentences
(the leading determiner swapped), which keeps every held-out wording last and out of training."""

from __future__ import annotations

import json

from state_tracking import load_task
from tests.conftest import load_example

variants = load_example("examples/reproduce/determiner_variants.py")


def test_the_leading_determiner_is_swapped_by_the_next_words_first_letter():
    assert variants.determiner_variant("The alarm goes off.") == "An alarm goes off."
    assert variants.determiner_variant("The tank is full.") == "A tank is full."
    assert variants.determiner_variant("An alarm trips.") == "The alarm trips."
    assert variants.determiner_variant("A fault alarm is raised.") == "The fault alarm is raised."
    assert variants.determiner_variant("Start is pressed.") is None
    assert variants.determiner_variant("Then the tank is full.") is None and variants.determiner_variant("The") is None


def test_augmented_spec_keeps_the_held_out_wordings_last_and_never_trains_a_forbidden_one():
    spec = {"text": {"held_out_phrasings": 1, "operations": {
        "alarm": ["An alarm trips.", "The alarm goes off.", "Start is pressed.", "The safety alarm trips."],
        "abort": ["The batch is aborted.", "A batch is aborted.", "An abort is issued."]}}}
    out, added, dropped = variants.augment(spec, forbidden={"The alarm trips."})
    assert out["text"]["operations"]["alarm"] == ["An alarm trips.", "The alarm goes off.", "Start is pressed.",
                                                  "An alarm goes off.", "The safety alarm trips."]
    # "A batch is aborted." is listed already; "The batch is aborted." from it too
    assert out["text"]["operations"]["abort"] == ["The batch is aborted.", "A batch is aborted.", "An abort is issued."]
    assert added == {"alarm": ["An alarm goes off."], "abort": []} and dropped == 3
    assert spec["text"]["operations"]["alarm"][0] == "An alarm trips."  # the input is not changed


def test_the_committed_file_is_what_the_script_writes_and_holds_out_what_the_original_holds_out():
    source = json.loads(open(variants.SOURCE).read())
    heldout2 = json.loads(open(variants.HELDOUT2).read())
    forbidden = variants.held_out_wordings(source) | variants.held_out_wordings(heldout2)
    expected, _, _ = variants.augment(source, forbidden)
    committed = json.loads(open(variants.TARGET).read())
    assert committed == expected
    original, augmented = load_task(variants.SOURCE), load_task(variants.TARGET)
    assert original.phrasing_options("held_out") == augmented.phrasing_options("held_out")
    trained = {w for options in augmented.phrasing_options("seen")[1] for w in options}
    assert not trained & forbidden
    assert {w for options in original.phrasing_options("seen")[1] for w in options} < trained


deletions = load_example("examples/reproduce/deletion_variants.py")


def test_deletion_variants_drop_one_deletable_word_at_a_time_and_keep_the_sentence_punctuated():
    deletable = {"the", "a", "an", "operator", "alarm"}
    assert deletions.deletion_variants("The operator resets the alarm.", deletable) == [
        "Operator resets the alarm.", "The resets the alarm.", "The operator resets alarm.",
        "The operator resets the."]
    assert deletions.deletion_variants("An alarm trips.", deletable) == ["Alarm trips.", "An trips."]
    assert deletions.deletion_variants("Alarm trips.", deletable) == []  # one word would be left
    assert deletions.deletion_variants("Start is pressed.", deletable) == []  # nothing deletable


def test_deletable_words_are_determiners_and_words_two_operations_train_on():
    spec = {"text": {"held_out_phrasings": 1, "operations": {
        "abort": ["The operator aborts the batch.", "An abort is issued."],
        "reset": ["The operator resets the alarm.", "A reset is issued."],
        "alarm": ["An alarm trips.", "The safety alarm trips."]}}}
    # "issued" is in two operations' held-out wordings only: never trained, so not deletable
    assert deletions.deletable_words(spec) == {"the", "a", "an", "operator", "alarm"}


def test_a_variant_two_operations_would_train_on_is_dropped_from_both():
    spec = {"text": {"held_out_phrasings": 0, "operations": {
        "start": ["The operator starts.", "Start is pressed."],
        "stop": ["An operator starts.", "Stop is pressed."]}}}
    deletable = deletions.deletable_words(spec)
    assert deletable == {"the", "a", "an", "operator", "starts", "is", "pressed"}
    ambiguous = deletions.ambiguous_variants(spec, deletable)
    assert ambiguous == {"Operator starts."}  # from "The operator starts." and from "An operator starts."
    out, added, _ = variants.augment(spec, ambiguous, lambda s: deletions.deletion_variants(s, deletable))
    assert not {v for vs in added.values() for v in vs} & ambiguous
    assert added == {"start": ["The starts.", "The operator.", "Start pressed.", "Start is."],
                     "stop": ["An starts.", "An operator.", "Stop pressed.", "Stop is."]}


def test_the_committed_deletion_file_is_what_the_script_writes_and_holds_out_what_the_original_holds_out():
    source = json.loads(open(variants.SOURCE).read())
    heldout2 = json.loads(open(variants.HELDOUT2).read())
    deletable = deletions.deletable_words(source)
    forbidden = variants.held_out_wordings(source) | variants.held_out_wordings(heldout2)
    expected, _, _ = variants.augment(source, forbidden | deletions.ambiguous_variants(source, deletable),
                                      lambda s: deletions.deletion_variants(s, deletable))
    assert json.loads(open(deletions.TARGET).read()) == expected
    original, augmented = load_task(variants.SOURCE), load_task(deletions.TARGET)
    assert original.phrasing_options("held_out") == augmented.phrasing_options("held_out")
    trained = [w for options in augmented.phrasing_options("seen")[1] for w in options]
    assert not set(trained) & forbidden and len(trained) == len(set(trained))  # no wording in two operations
    assert "abort" not in deletable and "aborts" not in deletable
