"""The comparisons study at tiny scale: the comparison rows are valid commands, the fixed-R ablations train and are
evaluated at their own R, the process state machine (not a group) trains with the package's tools, and the study's
table/plot are built from run records."""

import json

import numpy as np
import pytest

from state_tracking import build_tokenizer, evaluate_length_generalization, load_task, model_token_ids
from tests.conftest import load_example
from tests.test_evaluator import tiny_swap_s5_par_model
from tests.test_examples import TINY, train_par
from trainers.model_setup import resolve_view

study = load_example("examples/studies/comparisons.py")
PROCESS = study.REPO / "examples" / "tasks" / "batch_process.json"


def test_every_comparison_row_parses_into_valid_arguments():
    for name, row in study.ROWS.items():
        if row.kind != "par":
            continue
        command = study.command(name, 0)
        assert command[:2] == ["python", "examples/train_par.py"], name
        model_args, task_args, train_args = train_par.parse_args(command[2:])
        view = resolve_view(model_args)
        assert view == {k: getattr(model_args, k) for k in view}, name  # explicit view, whatever the defaults
        assert task_args.eval_depths == "8,16,32,64" and task_args.eval_n == 256, name
        if name in ("plain_transformer", "unshared_stack", "fixed_depth"):
            assert train_args.depth_schedule == "fixed" and train_args.objective == "final_only"
            assert view["loop_view"] == "full"
        if name == "unshared_stack":
            assert model_args.prelude_layers + model_args.core_layers + model_args.coda_layers == 1 + 8 * 2 + 1
            assert train_args.fixed_iterations == 1
        if name == "random_depth_final":
            assert train_args.depth_schedule == "random" and train_args.random_max_iterations == 16
        if name in ("self_distill", "s5_self_distill"):
            assert task_args.self_distillation and train_args.depth_schedule == "forced"
        assert task_args.eval_halting == row.halting == (train_args.halting_loss_weight > 0), name


def test_fixed_iterations_evaluation_runs_that_r_at_every_depth():
    task, tokenizer, _, model = tiny_swap_s5_par_model()
    result = evaluate_length_generalization(model, tokenizer, task, [2, 7], n_per_depth=8, fixed_iterations=3,
                                            progress=False)
    assert [row["num_iterations"] for row in result["per_depth"]] == [3, 3]
    assert [row["mean_iterations"] for row in result["per_depth"]] == [3.0, 3.0]
    for bad in (dict(fixed_iterations=0), dict(fixed_iterations=2, mode="halting")):
        with pytest.raises(ValueError, match="fixed_iterations"):
            evaluate_length_generalization(model, tokenizer, task, [2], n_per_depth=4, progress=False, **bad)


def test_plain_transformer_row_trains_and_evaluates_at_r_1(tmp_path):
    out = tmp_path / "plain"
    summary = train_par.main(TINY + ["--output_dir", str(out), "--loop_view", "full", "--depth_schedule", "fixed",
                                     "--fixed_iterations", "1", "--objective", "final_only"])
    assert set(summary["mean_iterations"]["forced"].values()) == {1.0}
    forced = json.loads((out / "eval_forced.json").read_text())
    assert forced["fixed_iterations"] == 1
    assert all(e["iterations"] == 1 for e in summary["curve"] if "iterations" in e)
    with pytest.raises(ValueError, match="eval_halting"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "x"), "--depth_schedule", "fixed",
                               "--fixed_iterations", "1", "--eval_halting", "true"])


def test_process_machine_is_not_a_group_and_trains(tmp_path):
    task = load_task(PROCESS)
    assert task.candidate_names == ["idle", "filling", "heating", "holding", "draining", "fault"]
    transitions = task.transitions
    assert any(len(set(row)) < len(row) for row in transitions)  # non-invertible operations (merges)
    reset = transitions[task.op_names.index("reset")]
    assert reset[task.candidate_names.index("fault")] == task.candidate_names.index("idle")
    ops = task.sample_ops(np.random.default_rng(0), 500, 12)
    assert len(np.unique(task.final_states(ops))) == 6  # every state is reachable
    out = tmp_path / "process"
    summary = train_par.main(TINY + ["--output_dir", str(out), "--task_file", str(PROCESS), "--depth_schedule", "hold",
                                     "--hold_extra_iterations", "2", "--halting_loss_weight", "0.5",
                                     "--halt_label_offset", "1", "--eval_halting", "true"])
    assert set(summary["accuracy"]) == {"forced", "halting"}
    assert load_task(out / "state_tracking_task.json") == task  # the checkpoint carries the machine
    ids = model_token_ids(build_tokenizer(task, "symbolic"), task)
    assert len(ids["answer_token_ids"]) == 6


def test_study_collects_table_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(study, "OUT", tmp_path)
    (tmp_path / "runs").mkdir()
    for name, seed, acc in (("plain_transformer", 0, [0.5, 0.1, 0, 0]), ("plain_transformer", 1, [0.7, 0.1, 0, 0])):
        row = dict(run=name, group="baseline", description="plain", seed=seed, command="python x", steps=2,
                   train_seconds=60.0, depths=study.DEPTHS, accuracy=acc)
        (tmp_path / "runs" / f"{name}_s{seed}.json").write_text(json.dumps(row))
    table = study.collect()
    assert "| `plain_transformer` | plain | 0,1 | 60.0 ± 14.1 | 10.0 ± 0.0 |" in table
    assert (tmp_path / "table.md").exists() and (tmp_path / "accuracy_vs_depth.png").stat().st_size > 1000
