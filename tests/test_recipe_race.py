"""The recipe race (`train_par.py --recipe race`, `par_cli.recipe_race`, issue 71 item 0b): the candidates the rules
order, successive halving's rounds, the ranking (ties to the rules' order), the refusals, the validation records it
scores, and a tiny records run whose winner resumes from its own checkpoint."""

import json

import numpy as np
import pytest
from datasets import Dataset

from par_cli.recipe import record_statistics
from par_cli.recipe_race import Candidate, RaceRun, check_race, halving_rounds, race_candidates, run_race
from state_tracking.records import RecordColumns, read_record_splits, records_across_lengths
from tests.test_default_recipe import TINY, counter_records, train_par, write_jsonl
from tests.test_resolution import argument_sets_recorded


def test_halving_rounds_halve_the_field_and_double_the_steps():
    assert halving_rounds(3, 200) == [(200, 2), (400, 1)]
    assert halving_rounds(4, 10) == [(10, 2), (20, 1)]
    assert halving_rounds(5, 7) == [(7, 3), (14, 2), (28, 1)]
    assert halving_rounds(1, 50) == []  # one candidate: nothing to race
    with pytest.raises(ValueError, match="n >= 1 and race_steps >= 1"):
        halving_rounds(3, 0)


def test_check_race_refuses_what_cannot_race_by_name():
    check_race(200, 6000, 3, True, 1)
    with pytest.raises(ValueError, match="--race_steps must be an integer >= 1"):
        check_race(0, 6000, 3, True, 1)
    with pytest.raises(ValueError, match="--race_steps must be an integer >= 1"):
        check_race(True, 6000, 3, True, 1)
    with pytest.raises(ValueError, match="validation split.*--validation_file"):
        check_race(200, 6000, 3, False, 1)
    with pytest.raises(ValueError, match="one process"):
        check_race(200, 6000, 3, True, 2)
    # 3 candidates: rounds end at 200 and 400; --max_steps 400 leaves the winner nothing to train
    with pytest.raises(ValueError, match=r"trains to step 400 .*\(at most 199\)"):
        check_race(200, 400, 3, True, 1)
    check_race(200, 401, 3, True, 1)
    check_race(10_000, 50, 1, True, 1)  # one candidate: no round, nothing to check against the budget


def statistics(tmp_path, records, **kwargs):
    path = write_jsonl(tmp_path / "train.jsonl", records)
    return record_statistics(read_record_splits(RecordColumns(**kwargs), path, validation_split_percentage=0))


def test_candidates_come_in_the_rules_order_and_the_users_flags_win(tmp_path):
    s = statistics(tmp_path, counter_records(300))  # final states, the label the whole state: feedback on
    candidates = race_candidates(s, None, False, set())
    assert [c.name for c in candidates] == ["rules", "feedback_off", "defaults"]
    rules, flipped, defaults = candidates
    assert rules.flags["answer_feedback"] is True and flipped.flags["answer_feedback"] is False
    assert "hidden_size" in rules.flags and "hidden_size" not in flipped.flags  # the rules re-derived without feedback
    assert flipped.flags["adam_beta2"] == 0.95 and defaults.flags == {} and defaults.recipe is None
    assert flipped.recipe.reasons["answer_feedback"].startswith("off: the opposite of the rules' choice")
    assert rules.recipe.reasons["answer_feedback"].startswith("on:")  # the rules' own recipe untouched
    # the user's --answer_feedback: no flipped candidate (their flag wins in every candidate)
    given = {"answer_feedback"}
    assert [c.name for c in race_candidates(s, True, False, given)] == [
        "rules", "defaults"]


def test_candidates_that_set_the_same_are_one(tmp_path):
    s = statistics(tmp_path, counter_records(300))
    # step states (or self-distillation): the rules keep the defaults, so one candidate and no race
    assert [c.name for c in race_candidates(s, None, True, set())] == ["rules"]
    # the user's flags cover every flag the rules set: the rules' recipe is the defaults
    covering = set()
    for candidate in race_candidates(s, None, False, set()):
        covering |= set(candidate.flags)
    names = [c.name for c in race_candidates(s, None, False, covering)]
    assert names == ["rules"]


def fake_race(scores: dict, race_steps: int = 10):
    """run_race with a train_to that records its calls and scores each candidate by `scores[name][round]`."""
    import par_cli.recipe_race as race

    calls, rounds = [], {}

    def train_to(candidate, step, checkpoint):
        calls.append((candidate.name, step, None if checkpoint is None else checkpoint.name))
        rounds[candidate.name] = rounds.get(candidate.name, -1) + 1
        return RaceRun(model=(candidate.name, rounds[candidate.name]), validation=None, pad_token_id=0,
                       checkpoint=__import__("pathlib").Path(f"{candidate.name}-{step}"), step=step)

    original = race.race_score
    race.race_score = lambda model, *a, **k: {"entries": scores[model[0]][model[1]], "exact": 0.0, "records": 1}
    try:
        candidates = [Candidate(name, None) for name in scores]
        return run_race(candidates, train_to, race_steps), calls
    finally:
        race.race_score = original


def test_the_race_keeps_the_better_half_resumes_survivors_and_ties_go_to_the_rules_order():
    (winner, checkpoint, race), calls = fake_race({"rules": [0.2, 0.5], "feedback_off": [0.6, 0.7],
                                                   "defaults": [0.1]})
    assert winner.name == "feedback_off" and checkpoint.name == "feedback_off-20"
    assert calls == [("rules", 10, None), ("feedback_off", 10, None), ("defaults", 10, None),
                     ("rules", 20, "rules-10"), ("feedback_off", 20, "feedback_off-10")]  # survivors resume
    first, second = race["rounds"]
    assert first["steps"] == 10 and [r["kept"] for r in first["candidates"]] == [True, True, False]
    assert second["steps"] == 20 and [r["kept"] for r in second["candidates"]] == [False, True]
    assert race["winner"] == "feedback_off" and race["race_steps"] == 10
    # equal scores: the earlier candidate (the rules' order) stays
    (winner, _, race), _ = fake_race({"rules": [0.3, 0.3], "feedback_off": [0.3, 0.3], "defaults": [0.3]})
    assert winner.name == "rules"
    # one candidate: no round, no checkpoint (the run trains from the start)
    (winner, checkpoint, race), calls = fake_race({"rules": []})
    assert winner.name == "rules" and checkpoint is None and race["rounds"] == [] and calls == []


def test_the_race_scores_records_of_every_length():
    encoded = Dataset.from_dict({"depth": [5, 1, 9, 1, 3, 7, 2, 8, 4, 6], "i": list(range(10))})
    part = records_across_lengths(encoded, 4)
    # by length 1 1 2 3 4 5 6 7 8 9: every third from the shortest to the longest, 1 3 6 9, kept in file order
    assert list(part["i"]) == [1, 2, 4, 9] and list(part["depth"]) == [1, 9, 3, 6]
    assert records_across_lengths(encoded, 50)["i"] == list(range(10))  # a small split whole


def test_a_tiny_records_race_resumes_its_winner_to_the_end(tmp_path, monkeypatch):
    resumed = []
    original = train_par.ParTrainer.train
    monkeypatch.setattr(train_par.ParTrainer, "train", lambda self, resume_from_checkpoint=None, **k: resumed.append(
        (self.args.output_dir, resume_from_checkpoint)) or original(self, resume_from_checkpoint, **k))
    path = write_jsonl(tmp_path / "counter.jsonl", counter_records(300))
    out = tmp_path / "run"
    argv = TINY + ["--train_file", path, "--output_dir", str(out), "--recipe", "race", "--race_steps", "2",
                   "--compile_core", "false"]
    argv[argv.index("--max_steps") + 1] = "9"
    with argument_sets_recorded(monkeypatch) as sets:  # each candidate's arguments built, none set (issue 70)
        summary = train_par.main(argv)
    assert sets == []
    recipe = json.loads((out / "summary.json").read_text())["recipe"]
    race = recipe["race"]
    assert recipe["statistics"]["records"] > 0  # whichever candidate wins (the defaults have no recipe of their own)
    assert recipe["mode"] == "race" and [c["name"] for c in race["candidates"]] == ["rules", "feedback_off",
                                                                                   "defaults"]
    assert [r["steps"] for r in race["rounds"]] == [2, 4]
    first = race["rounds"][0]["candidates"]
    assert [r["step"] for r in first] == [2, 2, 2] and sum(r["kept"] for r in first) == 2
    assert all(0 <= r["entries"] <= 1 and r["records"] > 0 for r in first)
    winner = race["winner"]
    assert [r["candidate"] for r in race["rounds"][1]["candidates"] if r["kept"]] == [winner]
    # the winner's flags are the run's, its folder kept (the run resumed from it), the losers' deleted
    assert sorted(p.name for p in (out / "race").iterdir()) == [winner]
    assert (out / "race" / winner / "checkpoint-4" / "trainer_state.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["answer_feedback"] is (winner == "rules")
    assert summary["steps"] == 9 and np.isfinite(summary["train_seconds"])
    # five race segments (3 + 2), then the run itself from the winner's step-4 checkpoint
    assert len(resumed) == 6 and resumed[-1] == (str(out), str(out / "race" / winner / "checkpoint-4"))
    assert [r for _, r in resumed[:3]] == [None, None, None]


def test_a_race_without_a_validation_split_is_refused_before_training(tmp_path):
    path = write_jsonl(tmp_path / "counter.jsonl", counter_records(100))
    with pytest.raises(ValueError, match="--recipe race scores the candidate recipes on the validation split"):
        train_par.main(TINY + ["--train_file", path, "--output_dir", str(tmp_path / "run"), "--recipe", "race",
                               "--validation_split_percentage", "0"])
