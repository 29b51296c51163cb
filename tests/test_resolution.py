"""The arguments a run trains with are built once (issue 70): what the data choose (the records' depth range, the
recipe, the validation probe, epochs as steps, the curriculum fitted to the budget) is chosen on a
`par_cli.resolution.Resolution` and built with `dataclasses.replace` (validated again), and nothing sets an attribute
on an argument object afterwards, nor on the parsed ones."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import pytest

from par_cli.resolution import Resolution
from tests.test_default_recipe import TINY, counter_records, train_par, write_jsonl
from trainers import ParTrainingArguments

PACKAGE = Path(__file__).resolve().parents[1]
ARGUMENT_CLASSES = (train_par.ModelArguments, train_par.TaskArguments, train_par.DataArguments, ParTrainingArguments)


@contextlib.contextmanager
def argument_sets_recorded(monkeypatch, classes=ARGUMENT_CLASSES):
    """Record every attribute the package's code sets on an argument object of `classes` once it exists: each set
    whose caller is a file of this repository (not transformers' or accelerate's: the Trainer sets `_n_gpu` and the
    like on its own arguments) and not the object's own `__init__` / `__post_init__` making it."""
    sets = []

    def guard(self, name, value):
        caller = sys._getframe(1)
        path = Path(caller.f_code.co_filename).resolve()
        building = caller.f_code.co_name in ("__init__", "__post_init__") and caller.f_locals.get("self") is self
        if not building and path.is_relative_to(PACKAGE) and not path.is_relative_to(PACKAGE / ".venv"):
            sets.append(f"{type(self).__name__}.{name} = {value!r} ({path.relative_to(PACKAGE)}:{caller.f_lineno})")
        object.__setattr__(self, name, value)

    for cls in classes:
        monkeypatch.setattr(cls, "__setattr__", guard)
    yield sets


def test_the_guard_sees_a_set_after_building_and_not_the_building_itself(monkeypatch, tmp_path):
    with argument_sets_recorded(monkeypatch) as sets:
        args = ParTrainingArguments(output_dir=str(tmp_path), max_steps=4, use_cpu=True, report_to="none")
        dataclasses.replace(args, max_steps=5)
        assert sets == []
        args.max_steps = 6
    assert sets == [f"ParTrainingArguments.max_steps = 6 (tests/test_resolution.py:{sys._getframe().f_lineno - 1})"]


def test_a_resolution_reads_its_choices_builds_once_and_sets_nothing(tmp_path):
    model_args, _, data_args, train_args, _ = train_par.parse_all_args(["--max_steps", "4", "--output_dir",
                                                                        str(tmp_path), "--use_cpu", "true"])
    run = Resolution(model_args, data_args, train_args)
    run.choose({"max_train_depth": 6, "hidden_size": 64})
    assert (run.train.max_train_depth, run.model.hidden_size, run.train.max_steps) == (6, 64, 4)
    assert not hasattr(run.train, "hidden_size")  # a choice is read only on the object whose field it is
    with pytest.raises(AttributeError, match=r"ParTrainingArguments\.max_steps is resolved, not set"):
        run.train.max_steps = 5
    with pytest.raises(ValueError, match=r"\['no_such_flag'\] is no field"):
        run.choose({"no_such_flag": 1})
    built_model, built_data, built_train = run.build()
    assert (built_model.hidden_size, built_train.max_train_depth) == (64, 6) and built_data is data_args
    assert (model_args.hidden_size, train_args.max_train_depth) == (128, 8)  # the parsed objects as parsed
    run.choose({"curriculum_window": 0})  # validated when built, as when parsed
    with pytest.raises(ValueError, match=r"ParTrainingArguments\.curriculum_window must be ≥ 1; got 0"):
        run.build()


def test_the_probe_chooses_the_best_model_whatever_the_save_strategy_and_is_checked_as_such(tmp_path):
    common = dict(output_dir=str(tmp_path), max_steps=4, use_cpu=True, report_to="none", save_strategy="steps",
                  save_steps=2, metric_for_best_model="probe_accuracy", load_best_model_at_end=True)
    args = ParTrainingArguments(**common)  # no evaluation to match: the probe saves each best itself
    assert args.load_best_model_at_end and args.probe_selects_best and args.greater_is_better is True
    assert dataclasses.replace(args) == args
    with pytest.raises(ValueError, match=r"ParTrainingArguments\.greater_is_better must be True when "
                                         r"metric_for_best_model is 'probe_accuracy'"):
        ParTrainingArguments(**common, greater_is_better=False)
    with pytest.raises(ValueError, match="--load_best_model_at_end requires the save and eval strategy to match"):
        ParTrainingArguments(**{**common, "metric_for_best_model": "loss"})  # an evaluation's metric: HF's check


def test_a_records_run_builds_its_arguments_once_from_what_the_data_chose(tmp_path, monkeypatch):
    """A records run with the recipe (the few-records feedback recipe of a counter), the validation probe choosing
    the best model (a split of 40 records) under --save_steps, and a budget the curriculum is fitted to: the
    TrainingArguments the Trainer gets are the ones built, equal to themselves validated again, with what the recipe,
    the records, the probe and the budget chose; no attribute was set on an argument object by the package's code,
    and the parsed objects are as parsed."""
    path = write_jsonl(tmp_path / "counter.jsonl", counter_records(800))
    argv = TINY + ["--train_file", path, "--save_steps", "4", "--output_dir", str(tmp_path / "run")]
    argv[argv.index("--max_steps") + 1] = "8"
    handed, parsed, snapshot = [], [], []
    original_init, original_parse = train_par.ParTrainer.__init__, train_par.parse_all_args

    def fields(arguments):
        return [a.to_dict() if hasattr(a, "to_dict") else dataclasses.asdict(a) for a in arguments]

    def init(self, *args, **kwargs):
        handed.append(kwargs["args"])
        original_init(self, *args, **kwargs)

    def parse(argv=None):
        result = original_parse(argv)
        parsed.extend(result[:4])
        snapshot.extend(fields(parsed))
        return result

    monkeypatch.setattr(train_par.ParTrainer, "__init__", init)
    monkeypatch.setattr(train_par, "parse_all_args", parse)
    with argument_sets_recorded(monkeypatch) as sets:
        summary = train_par.main(argv)
    assert sets == []
    (args,) = handed
    assert dataclasses.replace(args) == args  # validated again, the same arguments
    recipe, curriculum = summary["recipe"], summary["curriculum"]
    chosen = {k: v for k, v in recipe["chosen"].items() if k not in recipe["overridden_by_user"]}
    assert chosen == {"answer_feedback": True, "grad_window": 16, "weight_decay": 0.1,
                      "curriculum_advance_accuracy": None, "curriculum_every_steps": 100, "compile_core": "false"}
    # the budget of 8 steps cannot pace lengths 2 -> 4 every 100 steps: the fit adapts the recipe's pace
    assert curriculum["adapted"] == {"curriculum_every_steps": 3, "steps_needed": 6}
    expected = {**chosen, "curriculum_every_steps": 3, "min_train_depth": 1, "max_train_depth": 4,
                "curriculum_start_depth": 2, "max_steps": 8, "metric_for_best_model": "probe_accuracy",
                "greater_is_better": True, "load_best_model_at_end": True, "save_strategy": "steps"}
    config = (tmp_path / "run" / "config.json").read_text()
    for name, value in expected.items():
        if hasattr(args, name):
            assert getattr(args, name) == value, name
        else:  # a model field: the model was built with it
            assert name in ("answer_feedback", "grad_window", "compile_core")
    assert '"answer_feedback": true' in config and '"grad_window": 16' in config
    assert fields(parsed) == snapshot  # the parsed objects as parsed
    assert parsed[3].max_train_depth != 4 and not parsed[3].load_best_model_at_end and args is not parsed[3]
