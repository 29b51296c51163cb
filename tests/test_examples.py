"""The example scripts end to end at tiny scale: train_par.py (both trainers, LoRA) and its outputs."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from tests.conftest import load_example

REPO = Path(__file__).resolve().parents[1]
train_par = load_example("examples/train_par.py")

TINY = ["--hidden_size", "32", "--intermediate_size", "64", "--num_attention_heads", "2", "--num_key_value_heads",
        "2", "--max_steps", "4", "--per_device_train_batch_size", "8", "--max_train_depth", "3",
        "--curriculum_start_depth", "2", "--curriculum_every_steps", "2", "--eval_depths", "2,6", "--eval_n", "16",
        "--logging_steps", "2", "--disable_tqdm", "true", "--use_cpu", "true", "--max_iterations", "24"]


def test_train_par_defaults_are_the_documented_cpu_job():
    model_args, task_args, train_args = train_par.parse_args([])
    assert task_args.task == "swap_s5" and task_args.rendering == "symbolic"
    assert train_args.max_train_depth == 8 and train_args.curriculum_start_depth == 2
    assert max(int(d) for d in task_args.eval_depths.split(",")) > train_args.max_train_depth
    assert model_args.init_from_qwen2 is None and train_args.report_to == []
    assert (train_args.learning_rate, train_args.adapter_learning_rate, train_args.warmup_steps) == (1e-3, 2e-3, 100)
    assert train_par.resolve_view(model_args) == train_par.RECIPE_VIEW


def test_retrofit_takes_the_papers_schedule_unless_given(tmp_path):
    _, _, paper = train_par.parse_args(["--init_from_qwen2", "some/qwen", "--rendering", "text"])
    assert (paper.learning_rate, paper.adapter_learning_rate, paper.warmup_steps) == (2e-5, 1e-4, 200)
    model_args, _, mine = train_par.parse_args(["--init_from_qwen2", "q", "--learning-rate", "3e-4", "--warmup_steps", "5"])
    assert (mine.learning_rate, mine.adapter_learning_rate, mine.warmup_steps) == (3e-4, 1e-4, 5)
    assert train_par.resolve_view(model_args) == train_par.PAPER_VIEW  # retrofit keeps the parent's causal view
    config = tmp_path / "c.yaml"
    config.write_text("init_from_qwen2: q\nlearning_rate: 0.0001\n")
    _, _, from_file = train_par.parse_args([str(config)])
    assert (from_file.learning_rate, from_file.adapter_learning_rate) == (1e-4, 1e-4)


def test_train_par_end_to_end_writes_model_table_plot(tmp_path):
    out = tmp_path / "run"
    summary = train_par.main(TINY + ["--output_dir", str(out), "--eval_halting", "true",
                                     "--halting_loss_weight", "0.5", "--depth_schedule", "hold"])
    for name in ("model.safetensors", "config.json", "modeling_par.py", "tokenizer.json", "state_tracking_task.json",
                 "eval_forced.json", "eval_halting.json", "eval_table.md", "accuracy_vs_depth.png", "summary.json"):
        assert (out / name).is_file(), name
    assert set(summary["accuracy"]) == {"forced", "halting"}
    assert set(summary["accuracy"]["forced"]) == {2, 6}
    table = (out / "eval_table.md").read_text()
    assert "| 2 (train) |" in table and "| 6 |" in table
    model = AutoModel.from_pretrained(out, trust_remote_code=True)
    assert model.config.halt_token_ids is not None


def test_train_par_config_file_and_self_distillation(tmp_path):
    out = tmp_path / "sd"
    config = tmp_path / "sd.json"
    args = dict(zip(TINY[::2], TINY[1::2]))
    fields = {k.lstrip("-"): v for k, v in args.items()}
    fields = {k: int(v) if v.isdigit() else v for k, v in fields.items()}
    fields.update(output_dir=str(out), self_distillation=True, max_steps=3)
    fields["disable_tqdm"] = fields["use_cpu"] = True
    config.write_text(json.dumps(fields))
    summary = train_par.main([str(config)])
    assert summary["max_steps"] == 3 and (out / "eval_forced.json").is_file()


def test_train_par_lora_and_bad_flags(tmp_path):
    out = tmp_path / "lora"
    summary = train_par.main(TINY + ["--output_dir", str(out), "--peft", "lora", "--lora_r", "4"])
    assert (out / "adapter_model.safetensors").is_file() and "forced" in summary["accuracy"]
    with pytest.raises(ValueError, match="--peft"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "x"), "--peft", "ia3"])
    with pytest.raises(ValueError, match="ParTrainingArguments.objective"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "y"), "--objective", "nope"])


def test_train_par_fine_tunes_a_par_checkpoint(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    train_par.main(TINY + ["--output_dir", str(first), "--max_steps", "2"])
    summary = train_par.main(TINY + ["--output_dir", str(second), "--max_steps", "2", "--init_from_par", str(first),
                                     "--hidden_size", "64"])  # the checkpoint's config wins over size flags
    assert summary["steps"] == 2
    assert AutoModel.from_pretrained(second, trust_remote_code=True).config.hidden_size == 32
    with pytest.raises(ValueError, match="at most one of --init_from_qwen2 and --init_from_par"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "x"), "--init_from_par", str(first),
                               "--init_from_qwen2", str(first)])


def test_every_study_run_parses_into_valid_arguments():
    """Each row of examples/studies/length_generalization.py is a valid train_par.py command, and the rows that
    claim a view/option really set it (the flags are explicit, whatever train_par.py's defaults are)."""
    study = load_example("examples/studies/length_generalization.py")
    for name, (_, flags) in study.RUNS.items():
        model_args, _, train_args = train_par.parse_args(flags + ["--output_dir", "x"])
        view = train_par.resolve_view(model_args)
        assert view == {k: getattr(model_args, k) for k in view}, name  # no row relies on a default view
        if name.startswith("local"):
            assert view["loop_view"] == "local" and view["progress_positions"]
        if name == "baseline":
            assert view == train_par.PAPER_VIEW and train_args.stretch_steps == 0


def test_same_seed_same_initialisation_and_run(tmp_path):
    """--seed fixes the model's initialisation, not only the data: two runs with one seed give the same weights."""
    from safetensors.torch import load_file

    weights = []
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        train_par.main(TINY + ["--output_dir", str(tmp_path / name), "--max_steps", "2", "--seed", seed,
                               "--eval_depths", "2", "--eval_n", "4"])
        weights.append(load_file(tmp_path / name / "model.safetensors"))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])


def test_train_par_under_torchrun_counts_both_ranks(tmp_path):
    """Under torchrun on a CPU machine the run is data-parallel (gloo): the dataset and `samples_seen` cover both
    ranks. Without --use_cpu, transformers would train each rank alone (NOT_PARALLEL): that is a clear error."""
    import os
    import subprocess
    import sys

    out = tmp_path / "ddp"
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
         "examples/train_par.py", *TINY, "--max_steps", "2", "--per_device_train_batch_size", "4",
         "--eval_depths", "2", "--eval_n", "4", "--output_dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["samples_seen"] == 2 * 4 * 2
    if not torch.cuda.is_available():
        i = TINY.index("--use_cpu")
        args = TINY[:i] + TINY[i + 2:]  # the same run without --use_cpu true
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
             "examples/train_par.py", *args, "--max_steps", "2", "--output_dir", str(tmp_path / "alone")],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and "use_cpu must be True when 2 processes are launched" in proc.stderr


def test_rnn_baseline_trains_on_step_labels_and_scores_the_shared_test_problems(tmp_path):
    """examples/baselines/rnn.py: an LSTM on PAR's symbolic ids and step labels; the loss falls, the JSON holds the
    run's record, and the test problems are the evaluator's (`draw_test_problems`)."""
    rnn = load_example("examples/baselines/rnn.py")
    out = tmp_path / "rnn.json"
    results = rnn.main(["--hidden", "32", "--max_steps", "120", "--curriculum_start_depth", "2",
                        "--curriculum_every_steps", "20", "--max_train_depth", "3", "--eval_depths", "2,3",
                        "--eval_n", "16", "--logging_steps", "40", "--learning_rate", "3e-3",
                        "--results_json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["depths"] == [2, 3] and len(saved["accuracy"]) == 2 and saved["steps"] == 120
    assert saved["command"].startswith("python examples/baselines/rnn.py --hidden 32")
    assert saved["curve"][-1]["loss"] < 0.8 * saved["curve"][0]["loss"], saved["curve"]
    from state_tracking import build_tokenizer, get_task, model_token_ids

    vocab = model_token_ids(build_tokenizer(get_task("swap_s5"), "symbolic"), get_task("swap_s5"))["vocab_size"]
    h, qc = 32, 5 * 5  # embedding, LSTM (4 gates, two biases), head over 5 queries × 5 candidates
    assert saved["parameters"] == vocab * h + 4 * (2 * h * h + 2 * h) + h * qc + qc
    assert results["labels"] == "step" and 0.0 <= min(saved["accuracy"]) <= max(saved["accuracy"]) <= 1.0


def test_rnn_baseline_rejects_bad_arguments(capsys):
    rnn = load_example("examples/baselines/rnn.py")
    for argv, message in ((["--hidden", "0"], "--hidden must be an integer >= 1"),
                          (["--eval_depths", "8,x"], "--eval_depths must be comma-separated integers"),
                          (["--max_train_depth", "0"], "--max_train_depth must be >= --min_train_depth")):
        with pytest.raises(SystemExit):
            rnn.parse_args(argv)
        assert message in capsys.readouterr().err
