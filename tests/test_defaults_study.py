"""examples/studies/defaults.py: the two logs written for issue 51 hold the states their statements say, and a run is
train_par.py with only the data flags (and --baselines)."""

from __future__ import annotations

import pytest

from tests.conftest import load_example

study = load_example("examples/studies/defaults.py")


def test_counters4_values_are_what_python_computes_from_the_statements():
    for record in study.counters_records(200, (1, 16), seed=3):
        scope: dict = {}
        for statement in record["statements"]:
            exec(statement, {}, scope)  # the statements are Python: the interpreter is the oracle
        assert {k: str(v) for k, v in scope.items()} == record["values"]
        assert 5 <= len(record["statements"]) <= 20


def test_elevator_moves_only_closed_and_in_normal_mode_and_fire_recall_resets():
    step = study.elevator_step
    start = (1, "closed", "normal")
    assert step(start, "up") == (2, "closed", "normal")
    assert step(start, "down") == start  # not below the lobby
    assert step((4, "closed", "normal"), "up") == (4, "closed", "normal")
    assert step(step(start, "open"), "up") == (1, "open", "normal")  # doors open: the car stays
    assert step(step(start, "service_on"), "up") == (1, "closed", "service")
    assert step((3, "closed", "service"), "fire") == (1, "open", "normal")


def test_elevator_records_replay_through_their_wordings():
    wording = {text: event for event, texts in study.ELEVATOR_EVENTS.items() for text in texts}
    assert len(wording) == 3 * len(study.ELEVATOR_EVENTS)  # every wording names one event
    states = set()
    for record in study.elevator_records(2000, (1, 16), seed=5):
        state = (1, "closed", "normal")
        for sentence in record["events"]:
            state = study.elevator_step(state, wording[sentence])
        assert record["status"] == {"floor": str(state[0]), "doors": state[1], "mode": state[2]}
        states.add(state)
    assert len(states) == 16  # every state of 4 floors x doors x mode occurs


def test_a_run_gives_train_par_only_the_data_flags(monkeypatch, tmp_path):
    for spec in study.LOGS.values():  # the new logs' files lie beside the data folder (../new_logs/)
        for kind in ("train", "test"):
            path = tmp_path / "data" / spec[kind]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    monkeypatch.setattr(study, "DATA", tmp_path / "data")
    monkeypatch.setattr(study, "RUNS", tmp_path / "runs")
    seen = []

    def stop(command, log=None):
        seen.append(command)
        raise SystemExit("stopped")

    monkeypatch.setattr(study, "run_logged", stop)
    with pytest.raises(SystemExit):
        study.run("counters4", 2)
    flags = {arg for arg in seen[0] if arg.startswith("--")}
    assert flags == {"--train_file", "--test_file", "--operations_column", "--state_column", "--seed",
                     "--baselines", "--output_dir", "--disable_tqdm"}
    assert seen[0][seen[0].index("--seed") + 1] == "2"
    # a variant adds its flags, drops the baselines, and runs in a folder of its own
    with pytest.raises(SystemExit):
        study.run("counters4", 2, variant="long_budget")
    variant = seen[1]
    assert "--baselines" not in variant and variant[variant.index("--max_steps") + 1] == "15000"
    assert variant[variant.index("--output_dir") + 1].endswith("counters4_long_budget_s2")


def test_curriculum_progress_keeps_the_steps_where_the_cap_changed():
    curve = [{"step": 10, "curriculum_max_depth": 5.0}, {"step": 20, "curriculum_max_depth": 5.0}, {"step": 30},
             {"step": 40, "curriculum_max_depth": 5.98}, {"step": 50, "curriculum_max_depth": 6.0},
             {"step": 60, "curriculum_max_depth": 7.2}]
    assert study.curriculum_progress(curve) == [[10, 5], [40, 6], [60, 7]]


def test_the_recipe_label_names_what_each_rule_changed():
    assert study.recipe_label({}) == "h128 1+2+1"
    fb = {"answer_feedback": True, "hidden_size": 64, "intermediate_size": 128, "grad_window": 16,
          "weight_decay": 0.1, "curriculum_advance_accuracy": None, "curriculum_every_steps": 100,
          "compile_core": "false"}
    assert study.recipe_label(fb) == ("h64 1+2+1, feedback, grad window 16, weight decay 0.1, fixed pace (+1 every 100 "
                                      "steps), eager")
    swap = {"curriculum_window": 5, "curriculum_every_steps": 20, "operation_tokens": "whole", "adam_beta2": 0.95}
    assert study.recipe_label(swap) == "h128 1+2+1, fast curriculum, one token per statement, β2 0.95"


def test_each_seed_is_judged_on_accuracy_first_then_time_where_the_lstm_gets_there_too():
    def record(par, lstm, par_s, lstm_s):
        return {"log": "register3", "methods": {"PAR": {"accuracy": {"256": par}, "train_seconds": par_s},
                                                "LSTM": {"accuracy": {"256": lstm}, "train_seconds": lstm_s}}}

    assert study.seed_verdict(record(0.98, 1.0, 10, 10)) == "accuracy"
    assert study.seed_verdict(record(1.0, 0.95, 100, 10)) == "met: the LSTM misses 99%"
    assert study.seed_verdict(record(1.0, 1.0, 20, 10)) == "met"
    assert study.seed_verdict(record(1.0, 1.0, 21, 10)) == "time"


def test_per_length_needs_a_trained_run_of_a_generated_log(monkeypatch, tmp_path):
    monkeypatch.setattr(study, "RUNS", tmp_path)
    with pytest.raises(SystemExit, match="not a run of a generated log"):
        study.per_length("register3_s0")
    with pytest.raises(SystemExit, match="holds no trained checkpoint"):
        study.per_length("counters4_s0")
