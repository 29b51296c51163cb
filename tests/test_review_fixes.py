"""Review fixes on the records path and the pipeline (issue 70): each defect as a user meets it, through the CLI or
the public API, failing on the code before the fix."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.conftest import load_example
from tests.test_records_new_user import COLUMNS, TINY, orders, write_csv
from trainers import DepthBatchSampler, MasteryCurriculum, curriculum_steps_needed

train_par = load_example("examples/train_par.py")
GENERATED = ["--hidden_size", "32", "--intermediate_size", "64", "--num_attention_heads", "2",
             "--num_key_value_heads", "2", "--per_device_train_batch_size", "8", "--eval_n", "8", "--eval_depths", "8",
             "--disable_tqdm", "true", "--use_cpu", "true", "--compile_core", "false"]


# ------------------------------------------------------------------------ 1. the step budget against the curriculum
def test_the_steps_a_curriculum_needs_follow_its_formula_and_a_perfect_learner():
    assert curriculum_steps_needed(2, 1, 8, 100) == 600  # fixed pace: every · growths
    assert curriculum_steps_needed(2, 4, 8, 100) == 200  # 2 -> 6 -> 8
    lengths = range(1, 31)  # mastery: Σ_c max(every, window · n_c) over the caps below d_max
    assert curriculum_steps_needed(2, 1, 30, 20, window=5, lengths=lengths) == sum(max(20, 5 * c) for c in range(2, 30))
    # a learner right on every batch, drawn by the package's sampler, takes about as long
    mastery = MasteryCurriculum(2, 1, 30, 0.9, 5, 20, lookahead=3, lengths=lengths)
    sampler = DepthBatchSampler(np.repeat(np.arange(1, 31), 4), 8, 10_000, 0, 1, 30, 2, 20, 1, mastery=mastery)
    step = 0
    while mastery.max_depth_at(step) < 30:
        depth = sampler.depth_at(step, np.random.default_rng([0, step]))
        mastery.observe(step, depth, 1.0)
        mastery.end_step(step, 1.0 if depth == mastery.measured_depth_at(step) else None)
        step += 1
    assert 0.8 < step / curriculum_steps_needed(2, 1, 30, 20, window=5, lengths=lengths) < 1.25


def test_a_pace_the_budget_cannot_reach_is_refused_when_given_and_adapted_when_chosen(tmp_path, caplog):
    path = write_csv(tmp_path / "orders.csv", orders(120, 1, 30, 0))
    run = TINY + ["--train_file", path, *COLUMNS, "--max_steps", "40"]
    with pytest.raises(ValueError, match=r"the mastery curriculum from length \d+ .* needs \d+ optimizer steps to reach "
                                         r"the longest training length 30; --max_steps is 40, so the longest lengths "
                                         r"would never be trained.*you set --curriculum_every_steps"):
        train_par.main(run + ["--curriculum_every_steps", "20", "--output_dir", str(tmp_path / "refused")])
    with caplog.at_level(logging.WARNING):
        summary = train_par.main(run + ["--output_dir", str(tmp_path / "adapted")])
    plan = summary["curriculum"]
    assert plan["longest_length"] == 30 and plan["steps_needed"] > 30 and plan["adapted"]
    assert plan["adapted"]["steps_needed"] <= 30 and plan["adapted"]["curriculum_increment"] > 1
    assert "the curriculum is adapted to --curriculum_increment" in caplog.text
    assert plan["complete"] == (plan["longest_trained"] >= 30)
    assert plan["complete"] or "were never trained" in caplog.text


def test_the_main_job_on_a_short_budget_paces_its_curriculum_to_reach_the_longest_depth(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        summary = train_par.main(GENERATED + ["--max_steps", "8", "--output_dir", str(tmp_path / "run")])
    plan = summary["curriculum"]
    assert plan["adapted"] == {"curriculum_every_steps": 1, "steps_needed": 6}  # ⌊0.75 · 8 / 6 growths⌋ = 1
    assert plan["complete"] and plan["longest_trained"] == 8 and plan["steps"] == 8
    assert "fixed pace curriculum from length 2 (+1 every 100 steps) needs 600 optimizer steps" in caplog.text


def test_a_run_whose_curriculum_never_reached_the_longest_length_says_so(tmp_path, caplog):
    path = write_csv(tmp_path / "orders.csv", orders(120, 1, 4, 0))
    flags = ["--curriculum_start_depth", "2", "--curriculum_advance_accuracy", "1.0", "--curriculum_window", "1",
             "--curriculum_every_steps", "1", "--max_steps", "10"]
    with caplog.at_level(logging.WARNING):
        summary = train_par.main(TINY + ["--train_file", path, *COLUMNS, *flags, "--output_dir", str(tmp_path / "r")])
    plan = summary["curriculum"]
    assert plan["adapted"] is None and plan["steps_needed"] <= 10
    assert not plan["complete"] and plan["longest_trained"] < 4
    assert f"the depth curriculum reached length {plan['longest_trained']} of 4 by step 10" in caplog.text
