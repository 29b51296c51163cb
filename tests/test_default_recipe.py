"""The records recipe chosen from the data (`par_cli.recipe`, issue 51 item 1): the statistics of hand-written
records, each rule's choice on records built to trigger it, the user's flags winning, the recipe block of summary.json,
`--recipe off` keeping the fixed defaults, and a bad `--recipe` refused by name."""

import dataclasses
import json

import numpy as np
import pytest
from datasets import Dataset

from par_cli.recipe import (
    MANY_RECORDS,
    MIN_REPEATS,
    MULTI_WORD,
    WHOLE_STATE_MIN_CHECKED,
    RecordStatistics,
    check_recipe,
    choose_recipe,
    compile_rule,
    curriculum_rule,
    effective_flags,
    feedback_rule,
    model_size_rule,
    operation_tokens_rule,
    optimizer_rule,
    record_statistics,
    regularization_rule,
    use_recipe,
    whole_state_check,
)
from par_cli.resolution import Resolution
from par_cli.training_data import prepare_records
from state_tracking.records import RecordColumns, read_record_splits
from tests.conftest import load_example

train_par = load_example("examples/train_par.py")

TINY = ["--hidden_size", "16", "--intermediate_size", "32", "--num_attention_heads", "2", "--num_key_value_heads",
        "2", "--per_device_train_batch_size", "8", "--eval_batch_size", "64", "--disable_tqdm", "true", "--use_cpu",
        "true", "--max_iterations", "12", "--logging_steps", "1", "--max_steps", "2", "--eval_n", "8"]


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def counter_records(n: int, lengths=(1, 4), seed: int = 0, labels=("zero", "one", "two")) -> list[dict]:
    """A counter mod 3 from "zero" ("up", "down", "hold"), final states only: the label is the whole state."""
    rng, step = np.random.default_rng(seed), {"up": 1, "down": -1, "hold": 0}
    out = []
    for _ in range(n):
        ops = [str(o) for o in rng.choice(list(step), size=int(rng.integers(lengths[0], lengths[1] + 1)))]
        out.append({"operations": ops, "state": labels[sum(step[o] for o in ops) % 3]})
    return out


def high_low_records(n: int, seed: int = 0) -> list[dict]:
    """A counter mod 4 whose label says only whether it is 2 or more: the label is part of the state (after "up"
    from "low", the next label is "low" from 0 and "high" from 1)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ops = [str(o) for o in rng.choice(["up", "hold"], size=int(rng.integers(1, 7)))]
        out.append({"operations": ops, "state": "high" if ops.count("up") % 4 >= 2 else "low"})
    return out


def swap_records(n: int, seed: int = 0, shortest_swaps: int = 1) -> list[dict]:
    """Three booleans assigned, then swapped by Python tuple assignments (statements of 3-7 words), final mapping."""
    rng, names = np.random.default_rng(seed), ["a", "b", "c"]
    out = []
    for _ in range(n):
        values = [bool(v) for v in rng.integers(0, 2, 3)]
        history = [f"{name} = {value}" for name, value in zip(names, values)]
        for _ in range(int(rng.integers(shortest_swaps, 5))):
            i, j = (int(k) for k in rng.choice(3, 2, replace=False))
            values[i], values[j] = values[j], values[i]
            history.append(f"{names[i]}, {names[j]} = {names[j]}, {names[i]}")
        out.append({"operations": history, "state": dict(zip(names, values))})
    return out


def statistics_of(tmp_path, records) -> RecordStatistics:
    train = write_jsonl(tmp_path / "train.jsonl", records)
    return record_statistics(read_record_splits(RecordColumns(), train, validation_split_percentage=0))


# ---- statistics ----

LAMP = [  # a lamp from "dark", written by hand
    {"operations": ["switch on"], "state": "lit"},
    {"operations": ["switch off"], "state": "dark"},
    {"operations": ["switch on", "wait"], "state": "lit"},
    {"operations": ["switch on", "switch off"], "state": "dark"},
    {"operations": ["wait", "switch on"], "state": "lit"},
    {"operations": ["switch on", "wait", "switch off"], "state": "dark"},
]


def test_the_statistics_of_hand_written_records(tmp_path):
    s = statistics_of(tmp_path, LAMP)
    assert (s.records, s.queries, s.state_shape, s.labels, s.labels_per_query) == (6, 1, "label", 2, 2)
    assert (s.step_states, s.initial_state, s.shortest, s.longest) == (False, False, 1, 3)
    # switch on x5, switch off x3, wait x3; words 2, 2, 1
    assert (s.distinct_operations, s.operation_occurrences, s.min_operation_repeats, s.median_operation_repeats) == \
        (3, 11, 3, 3.0)
    assert s.words_per_operation == pytest.approx(19 / 11, abs=1e-3)
    # votes: records 1, 2 (the start's transitions), 3, 4 (from "lit", known after record 1), 6; record 5 starts with
    # "wait", whose transition from the start no shorter record shows
    assert (s.transitions_checked, s.transition_conflicts, s.whole_state) == (5, 0, None)


def test_a_mapping_state_with_step_states_and_initial_states(tmp_path):
    rows = [{"operations": ["flip a"], "initial_state": {"a": "0", "b": "1"}, "step_states": [{"a": "1", "b": "1"}]},
            {"operations": ["flip b", "flip b"], "initial_state": {"a": "0", "b": "0"},
             "step_states": [{"a": "0", "b": "1"}, {"a": "0", "b": "0"}]}]
    s = statistics_of(tmp_path, rows)
    assert (s.queries, s.state_shape, s.labels, s.step_states, s.initial_state) == (2, "mapping", 2, True, True)
    assert (s.shortest, s.longest, s.distinct_operations, s.words_per_operation) == (1, 2, 2, 2.0)
    assert (s.transitions_checked, s.transition_conflicts) == (3, 0)  # every recorded step state is a vote


def test_the_whole_state_check_tells_a_whole_label_from_part_of_the_state():
    def check(records):
        data = Dataset.from_dict({
            "operations": [r["operations"] for r in records],
            "labels": [[[""]] * (len(r["operations"]) - 1) + [[r["state"]]] for r in records],
            "initial": [[] for _ in records]})
        return whole_state_check(data, np.array([len(r["operations"]) for r in records]))

    whole, checked, conflicts = check(counter_records(200))
    assert whole is True and checked >= 100 and conflicts == 0
    whole, checked, conflicts = check(high_low_records(200))
    assert whole is False and conflicts > 0.01 * checked
    # no record of 1 operation to start a walk from, but the records of 3 are the first 3 operations of some of 4
    whole, checked, _ = check(counter_records(200, lengths=(3, 4)))
    assert whole is True and checked >= WHOLE_STATE_MIN_CHECKED
    assert check(counter_records(200, lengths=(4, 4)))[0] is None  # nothing to start from, no record a prefix
    # the least evidence decides: WHOLE_STATE_MIN_CHECKED checked transitions tell, one fewer does not
    ones = [r for r in counter_records(400, lengths=(1, 1)) if len(r["operations"]) == 1]
    assert check(ones[:WHOLE_STATE_MIN_CHECKED])[:2] == (True, WHOLE_STATE_MIN_CHECKED)
    assert check(ones[:WHOLE_STATE_MIN_CHECKED - 1])[:2] == (None, WHOLE_STATE_MIN_CHECKED - 1)


def assignment_records(n: int, whole: bool, seed: int = 0) -> list[dict]:
    """Two variables of 0..2 opened by their assignments (`a = 1`, `b = 2`), then 1..3 of `a = b`, `b = 0`, `a += 1`:
    no record shorter than 3 statements. The label: both values (the whole state) or a's alone (part of it)."""
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        a, b = (int(v) for v in rng.integers(0, 3, 2))
        ops = [f"a = {a}", f"b = {b}"]
        for _ in range(int(rng.integers(1, 4))):
            kind = int(rng.integers(3))
            if kind == 0:
                a, op = b, "a = b"
            elif kind == 1:
                b, op = 0, "b = 0"
            else:
                a, op = (a + 1) % 3, "a += 1"
            ops.append(op)
        records.append({"operations": ops, "state": [str(a), str(b)] if whole else [str(a)]})
    return records


def test_the_whole_state_check_reads_logs_that_open_with_assignments():
    def check(records):
        data = Dataset.from_dict({
            "operations": [r["operations"] for r in records],
            "labels": [[[""] * len(r["state"])] * (len(r["operations"]) - 1) + [r["state"]] for r in records],
            "initial": [[] for _ in records]})
        return whole_state_check(data, np.array([len(r["operations"]) for r in records]))

    whole, checked, conflicts = check(assignment_records(2000, whole=True))
    assert whole is True and checked >= WHOLE_STATE_MIN_CHECKED and conflicts == 0
    whole, checked, conflicts = check(assignment_records(2000, whole=False))  # a = b needs b, which a's label lacks
    assert whole is False and conflicts > 0.01 * checked


# ---- the rules, each on statistics built to trigger it ----

BASE = RecordStatistics(
    records=16_000, queries=1, state_shape="label", labels=8, labels_per_query=8, step_states=False,
    initial_state=False, shortest=1, longest=16, distinct_operations=5, operation_occurrences=136_000,
    min_operation_repeats=25_000, median_operation_repeats=27_000.0, words_per_operation=1.0,
    whole_state=True, transitions_checked=15_000, transition_conflicts=0)
SWAPS = dataclasses.replace(BASE, queries=5, state_shape="mapping", labels=2, shortest=6, longest=21,
                            distinct_operations=30, words_per_operation=5.5, min_operation_repeats=6_000,
                            whole_state=None, transitions_checked=0)


def test_feedback_rule():
    flags, reason = feedback_rule(BASE)
    assert flags == {"answer_feedback": True} and "results/own_data_cpu/README.md" in reason and "1.1-1.8x" in reason
    flags, reason = feedback_rule(dataclasses.replace(BASE, whole_state=False, transition_conflicts=900))
    assert flags == {} and "900 of 15000 transitions conflict" in reason
    assert feedback_rule(dataclasses.replace(BASE, whole_state=None))[0] == {}
    # no short record needed once the answer is known to be whole (logs that open with assignments)
    flags, reason = feedback_rule(dataclasses.replace(BASE, shortest=6))
    assert flags == {"answer_feedback": True} and "counters4" in reason
    flags, reason = feedback_rule(dataclasses.replace(SWAPS, whole_state=None))
    assert flags == {} and "too few records to check" in reason


def test_model_size_and_regularization_rules():
    small = {"hidden_size": 64, "intermediate_size": 128, "prelude_layers": 1, "core_layers": 1, "coda_layers": 1}
    assert model_size_rule(BASE, feedback=True)[0] == small
    few = dataclasses.replace(BASE, records=MANY_RECORDS - 1)
    flags, reason = model_size_rule(few, feedback=True)
    assert flags == {"hidden_size": 64, "intermediate_size": 128} and "par_final_small_reg_fb" in reason
    assert model_size_rule(BASE, feedback=False)[0] == {}  # the small model without feedback missed (59.77%)
    assert regularization_rule(few, feedback=True)[0] == {"grad_window": 16, "weight_decay": 0.1}
    assert regularization_rule(BASE, feedback=True)[0] == regularization_rule(few, feedback=False)[0] == {}
    # the boundary: MANY_RECORDS records are many (the 16,000-record rows), one fewer is few
    at = dataclasses.replace(BASE, records=MANY_RECORDS)
    assert model_size_rule(at, feedback=True)[0] == small and regularization_rule(at, feedback=True)[0] == {}


def test_curriculum_optimizer_and_compile_rules():
    assert curriculum_rule(BASE, feedback=True)[0] == {"curriculum_window": 5, "curriculum_every_steps": 20}
    assert curriculum_rule(SWAPS, feedback=False)[0] == {"curriculum_window": 5, "curriculum_every_steps": 20}
    few = dataclasses.replace(BASE, records=1_000)
    assert curriculum_rule(few, feedback=True)[0] == {"curriculum_advance_accuracy": None,
                                                      "curriculum_every_steps": 100}
    flags, reason = optimizer_rule(SWAPS, feedback=False)
    assert flags == {"adam_beta2": 0.95} and "88.18%" in reason and "judgement call" in reason
    assert optimizer_rule(BASE, feedback=True)[0] == {}
    assert compile_rule(BASE, feedback=True)[0] == {"compile_core": "false"}
    assert compile_rule(SWAPS, feedback=False)[0] == {}


def test_operation_tokens_rule():
    flags, reason = operation_tokens_rule(SWAPS)
    assert flags == {"operation_tokens": "whole"} and "8.79%" in reason
    assert operation_tokens_rule(BASE)[0] == {}  # one word per operation: the same tokens either way
    flags, reason = operation_tokens_rule(dataclasses.replace(SWAPS, min_operation_repeats=3))
    assert flags == {} and "occurs 3 times" in reason
    # the thresholds are inclusive: MIN_REPEATS repeats and MULTI_WORD words choose whole tokens, one less does not
    for field, at in (("min_operation_repeats", MIN_REPEATS), ("words_per_operation", MULTI_WORD)):
        assert operation_tokens_rule(dataclasses.replace(SWAPS, **{field: at}))[0] == {"operation_tokens": "whole"}
        below = at - 1 if field == "min_operation_repeats" else at - 0.001
        assert operation_tokens_rule(dataclasses.replace(SWAPS, **{field: below}))[0] == {}


def test_choose_recipe_composes_the_rules_and_says_why():
    recipe = choose_recipe(BASE)
    assert recipe.chosen == {"answer_feedback": True, "hidden_size": 64, "intermediate_size": 128,
                             "prelude_layers": 1, "core_layers": 1, "coda_layers": 1, "curriculum_window": 5,
                             "curriculum_every_steps": 20, "compile_core": "false"}
    assert set(recipe.reasons) == {"answer_feedback", "model_size", "regularization", "curriculum",
                                   "operation_tokens", "optimizer", "compile"}
    assert choose_recipe(SWAPS).chosen == {"curriculum_window": 5, "curriculum_every_steps": 20,
                                           "operation_tokens": "whole", "adam_beta2": 0.95}
    # the user's --answer_feedback false: the rules after it read feedback off (no small model, no eager)
    assert choose_recipe(BASE, answer_feedback=False).chosen == {"answer_feedback": True, "curriculum_window": 5,
                                                                 "curriculum_every_steps": 20, "adam_beta2": 0.95}
    for s, self_distillation in ((dataclasses.replace(BASE, step_states=True), False), (BASE, True)):
        recipe = choose_recipe(s, self_distillation=self_distillation)
        assert recipe.chosen == {} and list(recipe.reasons) == ["default"]


def test_notes_name_what_no_recipe_learns():
    notes = choose_recipe(dataclasses.replace(SWAPS, shortest=16, records=250)).notes
    assert any("var_swap5_long" in n for n in notes) and any("250 records" in n for n in notes)
    assert any("120" in n for n in choose_recipe(dataclasses.replace(BASE, labels=120, step_states=True)).notes)
    assert choose_recipe(BASE).notes == []
    # the boundaries: FEW_RECORDS_NOTE records, a shortest record under LONG_SHORTEST_NOTE, MANY_LABELS_NOTE labels
    # are not noted; one past each is
    from par_cli.recipe import FEW_RECORDS_NOTE, LONG_SHORTEST_NOTE, MANY_LABELS_NOTE

    assert choose_recipe(dataclasses.replace(BASE, records=FEW_RECORDS_NOTE)).notes == []
    assert len(choose_recipe(dataclasses.replace(BASE, records=FEW_RECORDS_NOTE - 1)).notes) == 1
    assert choose_recipe(dataclasses.replace(SWAPS, shortest=LONG_SHORTEST_NOTE - 1)).notes == []
    assert choose_recipe(dataclasses.replace(BASE, labels=MANY_LABELS_NOTE, step_states=True)).notes == []
    assert len(choose_recipe(dataclasses.replace(BASE, labels=MANY_LABELS_NOTE + 1, step_states=True)).notes) == 1


def test_the_rules_on_records_built_to_trigger_them(tmp_path):
    assert choose_recipe(statistics_of(tmp_path, counter_records(200))).chosen["answer_feedback"] is True
    s = statistics_of(tmp_path, high_low_records(200))
    assert s.whole_state is False and "answer_feedback" not in choose_recipe(s).chosen
    s = statistics_of(tmp_path, swap_records(300))  # shortest record: 3 assignments + 1 swap
    assert s.shortest == 4 and s.words_per_operation > 3
    # its records of 4 are the first 4 statements of some of 5: the answer is checked whole, feedback on (300 records:
    # the regularized small model)
    assert (s.whole_state, s.transition_conflicts) == (True, 0) and s.transitions_checked >= 20
    assert choose_recipe(s).chosen == {"answer_feedback": True, "hidden_size": 64, "intermediate_size": 128,
                                       "grad_window": 16, "weight_decay": 0.1, "curriculum_advance_accuracy": None,
                                       "curriculum_every_steps": 100, "operation_tokens": "whole",
                                       "compile_core": "false"}
    # wholeness unknown: the swap log's recipe without feedback
    assert choose_recipe(dataclasses.replace(s, whole_state=None)).chosen == {
        "curriculum_window": 5, "curriculum_every_steps": 20, "operation_tokens": "whole", "adam_beta2": 0.95}


# ---- on train_par.py's arguments ----

def parsed(argv):
    model_args, task_args, data_args, train_args, given = train_par.parse_all_args(argv)
    return model_args, task_args, data_args, train_args, given


def read(args):
    """The records of parsed arguments, and the Resolution reading them chose the depth range on."""
    model_args, task_args, data_args, train_args, given = args
    run = Resolution(model_args, data_args, train_args)
    return prepare_records(run, task_args, given), run


def test_the_recipe_sets_what_the_user_did_not_give_and_names_what_they_did(tmp_path):
    path = write_jsonl(tmp_path / "counter.jsonl", counter_records(200))
    args = parsed(["--train_file", path, "--hidden_size", "96", "--curriculum_every_steps", "30", "--disable_tqdm",
                   "true"])
    model_args, task_args, data_args, train_args, given = args
    parsed_fields = dataclasses.asdict(model_args), train_args.to_dict()
    records, run = read(args)
    summary = use_recipe(records, given, task_args, run)
    assert summary["mode"] == "auto" and summary["statistics"]["records"] == 190  # the few-records feedback recipe
    assert summary["chosen"] == {"answer_feedback": True, "hidden_size": 64, "intermediate_size": 128,
                                 "grad_window": 16, "weight_decay": 0.1, "curriculum_advance_accuracy": None,
                                 "curriculum_every_steps": 100, "compile_core": "false"}
    # --hidden_size drops the model-size rule whole (not a 96-wide model with the recipe's MLP), and
    # --curriculum_every_steps the curriculum rule (the records default's mastery test stays on)
    assert summary["overridden_by_user"] == ["curriculum_advance_accuracy", "curriculum_every_steps", "hidden_size",
                                             "intermediate_size"]
    model_args, _, train_args = run.build()
    assert (model_args.hidden_size, model_args.intermediate_size) == (96, 256)
    assert (train_args.curriculum_advance_accuracy, train_args.curriculum_every_steps) == (0.9, 30)
    assert model_args.answer_feedback is True and model_args.compile_core == "false"
    assert (model_args.grad_window, train_args.weight_decay) == (16, 0.1)
    # chosen, then built: the parsed arguments themselves are as they were parsed
    assert (dataclasses.asdict(args[0]), args[3].to_dict()) == parsed_fields


def test_effective_flags_keep_a_rule_whole_or_not_at_all():
    recipe = choose_recipe(SWAPS)
    assert effective_flags(recipe, {"curriculum_advance_accuracy"}) == {"operation_tokens": "whole",
                                                                        "adam_beta2": 0.95}
    assert effective_flags(recipe, set()) == recipe.chosen and effective_flags(None, set()) == {}


def test_recipe_off_keeps_the_fixed_defaults(tmp_path):
    path = write_jsonl(tmp_path / "counter.jsonl", counter_records(200))
    args = parsed(["--train_file", path, "--recipe", "off", "--disable_tqdm", "true"])
    model_args, task_args, data_args, train_args, given = args
    records, run = read(args)
    depths = dict(run.chosen)  # the reading steps' choice: the depth range from the lengths
    summary = use_recipe(records, given, task_args, run)
    assert summary == {"mode": "off", "chosen": {}, "reasons": {}, "overridden_by_user": [], "notes": [],
                       "statistics": None}
    assert run.chosen == depths and set(depths) == {"min_train_depth", "max_train_depth", "curriculum_start_depth"}
    built_model, built_data, built_train = run.build()
    assert built_model is model_args and built_data is data_args  # nothing of theirs chosen
    assert (built_model.answer_feedback, built_model.hidden_size, built_train.curriculum_window,
            built_train.adam_beta2) == (False, 128, 20, 0.999)


def test_a_bad_recipe_value_is_one_error_naming_the_flag(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--recipe must be one of \['auto', 'off', 'race'\].*got 'sometimes'"):
        check_recipe("sometimes")
    path = write_jsonl(tmp_path / "counter.jsonl", counter_records(50))
    with pytest.raises(SystemExit) as stop:
        train_par.main(["--train_file", path, "--recipe", "sometimes"])
    assert stop.value.code == 2 and "argument --recipe: invalid choice: 'sometimes'" in capsys.readouterr().err
    config = tmp_path / "run.yaml"  # a config file is not checked by argparse: the same rule refuses it
    config.write_text(f"train_file: {path}\nrecipe: sometimes\n")
    with pytest.raises(ValueError, match="--recipe must be one of"):
        train_par.main([str(config)])
    with pytest.raises(ValueError, match="--recipe applies to recorded data only"):
        train_par.main(["--recipe", "off", "--max_steps", "1"])


# ---- a tiny records run ----

def test_summary_json_holds_the_recipe_of_a_tiny_records_run(tmp_path):
    path = write_jsonl(tmp_path / "counter.jsonl", counter_records(200))
    out = tmp_path / "run"
    summary = train_par.main(TINY + ["--train_file", path, "--output_dir", str(out)])
    recipe = json.loads((out / "summary.json").read_text())["recipe"]
    assert recipe == summary["recipe"]
    assert set(recipe) == {"mode", "chosen", "reasons", "overridden_by_user", "notes", "statistics"}
    assert recipe["chosen"]["answer_feedback"] is True and "hidden_size" in recipe["overridden_by_user"]
    assert all("results/own_data_cpu" in recipe["reasons"][r] for r in ("answer_feedback", "curriculum", "compile"))
    assert recipe["statistics"]["shortest"] == 1 and recipe["statistics"]["step_states"] is False
    assert json.loads((out / "config.json").read_text())["answer_feedback"] is True


def test_a_recipe_that_reads_statements_whole_encodes_the_records_again_without_reading_them(tmp_path, monkeypatch):
    from state_tracking.records import splits

    path = write_jsonl(tmp_path / "swaps.jsonl", swap_records(300))
    out = tmp_path / "run"
    reads = []
    original = splits.load_record_files
    monkeypatch.setattr(splits, "load_record_files", lambda *a, **k: reads.append(a[0]) or original(*a, **k))
    summary = train_par.main(TINY + ["--train_file", path, "--output_dir", str(out), "--compile_core", "false"])
    assert reads == [path]  # read once (the validation split is cut from it), encoded twice
    whole = splits.read_record_splits(splits.RecordColumns(), path, validation_split_percentage=5,
                                      operation_tokens="whole")
    assert summary["records"]["train_records"] == len(whole.encoded)  # as if read with whole tokens from the start
    again = splits.reencode_record_splits(splits.read_record_splits(splits.RecordColumns(), path,
                                                                    validation_split_percentage=5), "whole")
    for name in ("input_ids", "operation_ends", "step_labels"):
        assert again.encoded[name] == whole.encoded[name]
        assert again.splits["validation"][1][name] == whole.splits["validation"][1][name]
    assert summary["recipe"]["chosen"]["operation_tokens"] == "whole"
    tokens = {t["content"] for t in json.loads((out / "tokenizer.json").read_text())["added_tokens"]}
    assert "a, b = b, a" in tokens  # one token per statement in the trained tokenizer
