"""pretrained_smollm2.py's tables, records and held-out bookkeeping, on records written by hand (no trained row):
the recipe summary, the rows and sentences tables, two-stage records, the second held-out set read once."""

from __future__ import annotations

import json

import pytest

from par_studies.pretrained_smollm2 import (
    diagnostics,
    evaluation,
    report,
    rows,
    runner,
    training,
)


def test_read_as_names_the_operations_the_answers_fit():
    import numpy as np

    transitions = np.array([[1, 1, 2], [0, 2, 2], [0, 1, 2]])  # op a, op b, identity
    assert diagnostics.read_as([1, 1, 2], transitions, ["a", "b", "id"]) == ["a"]
    assert diagnostics.read_as([0, 1, 2], transitions, ["a", "b", "id"]) == ["id"]
    # 2 of 3 agree with b, 1 with id and a
    assert diagnostics.read_as([0, 2, 0], transitions, ["a", "b", "id"]) == ["b"]
    assert diagnostics.read_as([2, 0, 0], transitions, ["a", "b", "id"]) == ["a", "b", "id"]  # none agrees at all


def test_a_two_stage_row_trains_its_first_stage_first_and_starts_from_it(tmp_path, monkeypatch):
    """A row with `init_from` fine-tunes the same seed's trained stage-1 row (--init_from_par its folder); train()
    trains that row first when it has not finished, and not again when it has."""
    calls = []

    def fake_segment(folder, seed, flags, name):
        calls.append((name, seed, flags.get("--init_from_par")))
        (folder / "summary.json").parent.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text("{}")
        return []

    monkeypatch.setattr(training, "RUN_DIR", tmp_path)
    monkeypatch.setattr(training, "REPO", tmp_path.parent)
    monkeypatch.setattr(training, "train_segment", fake_segment)
    monkeypatch.setattr(training, "parent_folder", lambda name="smollm2-135m": f"some/{name}")
    training.train("qwen_stage2_frozen_prelude", 3)
    training.train("qwen_stage2_all", 3)
    stage1 = f"{tmp_path.name}/qwen_frozen_emb_s3"
    assert calls == [("qwen_frozen_emb", 3, None), ("qwen_stage2_frozen_prelude", 3, stage1),
                     ("qwen_stage2_all", 3, stage1)]
    flags = training.row_flags("qwen_stage2_frozen_prelude", 3)
    assert flags["--freeze_prelude"] == "true" and "--init_from_qwen2" not in flags
    assert flags["--curriculum_start_depth"] == "8" and flags["--probe_phrasing"] == "held_out"


def test_the_sentences_table_shows_each_held_out_wording_and_what_a_misread_one_fit():
    sentences = [{"operation": "abort", "wording": "The batch is aborted.", "held_out": False, "accuracy": 1.0,
                  "read_as": ["abort"]},
                 {"operation": "abort", "wording": "An abort is issued.", "held_out": True, "accuracy": 0.5,
                  "read_as": ["alarm"]},
                 {"operation": "start", "wording": "The operator starts the batch.", "held_out": True,
                  "accuracy": 5 / 6, "read_as": ["level_ok", "temp_ok", "reset"]},
                 {"operation": "reset", "wording": "A reset is issued.", "held_out": True, "accuracy": 1.0,
                  "read_as": ["reset"]}]
    lines = report.sentences_table([{"row": "r", "seed": 2, "sentences": sentences}])
    assert lines[3] == ("| row | seed | “An abort is issued.” | “The operator starts the batch.” | "
                        "“A reset is issued.” |")
    assert lines[-1] == "| r | 2 | 50 (alarm) | 83 (3 operations fit) | 100 |"
    assert report.sentences_table([]) == []


def test_a_two_stage_record_counts_what_its_first_stage_cost(tmp_path, monkeypatch):
    folder = tmp_path / "qwen_frozen_emb_s1"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"steps": 300}))
    (folder / "segments.json").write_text(json.dumps([
        {"command": "python examples/train_par.py --max_steps 300", "trained_seconds_before": 0.0,
         "wall_seconds": 900.0, "status": "interrupted"},
        {"command": "python examples/train_par.py --max_steps 300 --resume_from_checkpoint c", "peak_rss_gb": 7.5,
         "trained_seconds_before": 800.0, "wall_seconds": 2500.5, "status": "finished"}]))
    monkeypatch.setattr(training, "RUN_DIR", tmp_path)
    monkeypatch.setattr(runner, "scrub", lambda text: text)
    stage1 = runner.stage1_of("qwen_stage2_all", 1)
    assert stage1 == {"row": "qwen_frozen_emb", "steps": 300, "train_seconds": 3300.5, "peak_rss_gb": 7.5,
                      "train_commands": ["python examples/train_par.py --max_steps 300",
                                         "python examples/train_par.py --max_steps 300 --resume_from_checkpoint c"]}


def recipe_record(seed: int, seen: list[float], held: list[float], n: int = 1024) -> dict:
    return {"row": "qwen_stage2_frozen_prelude", "label": "two stages", "seed": seed, "n_per_depth": n,
            "command": f"c{seed}", "steps": 200, "train_seconds": 2000.0, "peak_rss_gb": 8.5, "seconds_per_step": 10,
            "trainable_parameters": 227e6,
            "stage1": {"steps": 300, "train_seconds": 3000.0, "peak_rss_gb": 7.0},
            "evaluation": {"seen": {"depths": [8, 64], "accuracy": seen},
                           "held_out": {"depths": [8, 64], "accuracy": held}}}


def test_the_recipe_summary_averages_the_seeds_and_states_whether_the_goal_is_met():
    records = [recipe_record(2, [1.0, 0.99], [0.97, 0.96]), recipe_record(0, [1.0, 0.995], [0.95, 0.96]),
               recipe_record(1, [0.99, 0.995], [0.96, 0.95])]
    summary = report.recipe_summary(records)
    assert summary["seeds"] == [0, 1, 2] and summary["n_per_depth"] == 1024
    held8 = summary["accuracy"]["held_out"]["8"]
    assert held8["per_seed"] == [0.95, 0.96, 0.97]
    assert held8["mean"] == pytest.approx(0.96) and held8["sd"] == pytest.approx(0.01)
    assert summary["cost"][0] == {"seed": 0, "steps": 500, "train_seconds": 5000.0, "peak_rss_gb": 8.5}
    assert summary["goal_met"] is True
    assert summary["goal_parts"] == {"held_out_8x_at_least_95": True, "trained_8x_at_least_99": True,
                                     "trained_1x_at_least_99": True}
    # trained 8x under 99% on average, held out 8x under 95% (however good at d = 8), or fewer than three seeds: not met
    low = [recipe_record(s, [0.98, 0.9], [0.97, 0.96]) for s in range(3)]
    assert report.recipe_summary(low)["goal_met"] is False
    assert report.recipe_summary(low)["goal_parts"] == {"held_out_8x_at_least_95": True,
                                                       "trained_8x_at_least_99": False,
                                                       "trained_1x_at_least_99": False}
    in_range = [recipe_record(s, [0.995, 0.97], [0.99, 0.96]) for s in range(3)]  # trained 99% at d = 8, not at 8x
    assert report.recipe_summary(in_range)["goal_met"] is False
    assert report.recipe_summary(in_range)["goal_parts"] == {"held_out_8x_at_least_95": True,
                                                            "trained_8x_at_least_99": False,
                                                            "trained_1x_at_least_99": True}
    far = [recipe_record(s, [1.0, 0.99], [0.99, 0.94]) for s in range(3)]
    assert report.recipe_summary(far)["goal_met"] is False
    assert report.recipe_summary(records[:2])["goal_met"] is False


def test_the_rows_table_says_how_many_prompts_each_row_was_tested_on():
    table = report.rows_table([recipe_record(0, [1.0, 0.98], [0.99, 0.98], n=256),
                              recipe_record(1, [1.0, 0.98], [0.99, 0.98])])
    lines = table.splitlines()
    assert "| prompts |" in lines[0]
    assert "| 227.0 M | 256 | 100.00 | 98.00 | 99.00 | 98.00 |" in lines[2]
    assert "| 227.0 M | 1,024 | 100.00 | 98.00 | 99.00 | 98.00 |" in lines[3]
    # a first stage screened alone (held-out wordings at d = 8 only) gets its own table, not a row of dashes
    stage1 = dict(recipe_record(1, [], [0.957], n=256), row="qwen_determiners", steps=300, train_seconds=3508.0,
                  seconds_per_step=11.69, evaluation={"held_out": {"depths": [8], "accuracy": [0.957]}})
    lines = report.rows_table([recipe_record(0, [1.0, 0.98], [0.99, 0.98]), stage1]).splitlines()
    assert len([line for line in lines if line.startswith("| qwen_determiners")]) == 1
    assert "| qwen_determiners | 1 | 300 | 3508 | 11.69 | 256 | 95.70 |" in lines


def test_a_rerun_test_keeps_the_diagnostics_and_the_earlier_test_of_the_same_model():
    old = recipe_record(0, [1.0, 0.98], [0.99, 0.98], n=256)
    old.update(train_commands=["python examples/train_par.py a"], sentences=[{"wording": "w"}],
               random_start={"seen": 1})
    new = recipe_record(0, [1.0, 0.99], [0.98, 0.97])
    new.update(train_commands=["python examples/train_par.py a"])
    merged = runner.carry_over(old, new)
    assert merged["n_per_depth"] == 1024 and merged["evaluation"] == new["evaluation"]
    assert merged["sentences"] == [{"wording": "w"}] and merged["random_start"] == {"seen": 1}
    assert merged["earlier_tests"] == [{"n_per_depth": 256, "evaluation": old["evaluation"]}]
    # the same test again adds nothing; another training replaces the record whole
    assert "earlier_tests" not in runner.carry_over(new, dict(new))
    other = dict(new, train_commands=["python examples/train_par.py b"])
    assert runner.carry_over(old, other) == other


def test_rows_trained_on_augmented_wordings_are_tested_on_the_original_files_prompts():
    """A row trained on an augmented copy of the task file (more trained wordings, the same machine and held-out
    wordings) is tested on the original file, so its seen prompts are every other row's; its held-out prompts are the
    same either way."""
    import numpy as np

    from state_tracking import load_task
    from state_tracking.prompts import text_prompt

    augmented = [name for name, row in rows.ROWS.items() if row.flags.get("--task_file") in rows.AUGMENTED]
    assert {"retrofit_determiners", "qwen_stage2_determiners", "qwen_stage2_deletions"} <= set(augmented)
    original = load_task(rows.REPO / rows.TASK_FILE)
    for path in rows.AUGMENTED:
        trained = load_task(rows.REPO / path)
        tested = evaluation.test_task("row", trained)
        assert tested.phrasing_options("seen") == original.phrasing_options("seen")
        assert tested.phrasing_options("seen") != trained.phrasing_options("seen")
        ops = np.arange(trained.num_ops)
        assert (text_prompt(trained, ops, phrasing="held_out", rng=np.random.default_rng(0))
                == text_prompt(original, ops, phrasing="held_out", rng=np.random.default_rng(0)))
    other = load_task("examples/tasks/register3.json")
    with pytest.raises(SystemExit, match="another machine"):
        evaluation.test_task("row", other)


def test_the_second_held_out_set_is_attached_to_the_recipe_it_tested(tmp_path):
    second = {"row": "qwen_stage2_frozen_prelude", "task_file": "examples/tasks/batch_process_heldout2.json",
              "seeds": [0, 1], "n_per_depth": 1024, "mean": {"8": 0.9, "64": 0.8}, "sd": {"8": 0.1, "64": 0.1},
              "command": "c", "per_seed": {"0": {"depths": [8, 64], "accuracy": [1.0, 0.9], "seconds": 1.0},
                                           "1": {"depths": [8, 64], "accuracy": [0.8, 0.7], "seconds": 1.0}}}
    path = tmp_path / "heldout2.json"
    recipes = {"qwen_stage2_frozen_prelude": {"goal_met": False}, "other": {}}
    report.attach_second_held_out_set(recipes, path)  # not read yet: nothing attached
    assert recipes == {"qwen_stage2_frozen_prelude": {"goal_met": False}, "other": {}}
    path.write_text(json.dumps(second))
    report.attach_second_held_out_set(recipes, path)
    attached = recipes["qwen_stage2_frozen_prelude"]["second_held_out_set"]
    assert attached["mean"] == {"8": 0.9, "64": 0.8} and attached["per_seed"] == {"0": [1.0, 0.9], "1": [0.8, 0.7]}
    assert "second_held_out_set" not in recipes["other"]
    recipes = {"other": {}}  # a set read on a recipe no longer summarised is attached to none
    report.attach_second_held_out_set(recipes, path)
    assert recipes == {"other": {}}


def test_a_held_out_set_is_read_once(tmp_path):
    """`par_studies.runs.previous_results`: a study's results as they stand, and a held-out set already in them
    refused by name (the sentence-reader studies' --final_set3 / --final_set4)."""
    import json

    import pytest

    from par_studies.runs import previous_results

    out = tmp_path / "results.json"
    assert previous_results(out, "set3") == {}
    out.write_text(json.dumps({"set2": {"date": "2026-12-06"}, "set3": {"date": "2026-12-07"}}))
    assert previous_results(out, None)["set2"] == {"date": "2026-12-06"}
    with pytest.raises(SystemExit, match=r"already holds set3 \(read once, 2026-12-07\)"):
        previous_results(out, "set3")
    from par_studies.runs import held_out_study_start

    assert held_out_study_start("doc", out, "set4", []) == (False, previous_results(out, None))
    assert held_out_study_start("doc", out, "set4", ["--final_set4"])[0] is True  # set 4 not read yet
    with pytest.raises(SystemExit, match="already holds set3"):
        held_out_study_start("doc", out, "set3", ["--final_set3"])
