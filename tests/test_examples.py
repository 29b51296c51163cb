"""The example scripts end to end at tiny scale: train_par.py (both trainers, LoRA) and its outputs (the study scripts
on it: tests/test_study_scripts.py)."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from modeling_par import ParLoopedQwenForStateTracking
from tests.conftest import load_example
from trainers.model_setup import PAPER_VIEW, RECIPE_VIEW, resolve_view

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
    assert model_args.init_from_parent is None and train_args.report_to == []
    assert (train_args.learning_rate, train_args.adapter_learning_rate, train_args.warmup_steps) == (1e-3, 2e-3, 100)
    assert resolve_view(model_args) == RECIPE_VIEW


def test_retrofit_takes_the_papers_schedule_unless_given(tmp_path):
    _, _, paper = train_par.parse_args(["--init_from_qwen2", "some/qwen", "--rendering", "text"])
    assert (paper.learning_rate, paper.adapter_learning_rate, paper.warmup_steps) == (2e-5, 1e-4, 200)
    model_args, _, mine = train_par.parse_args(["--init_from_qwen2", "q", "--learning-rate", "3e-4", "--warmup_steps",
                                                "5"])
    assert (mine.learning_rate, mine.adapter_learning_rate, mine.warmup_steps) == (3e-4, 1e-4, 5)
    assert resolve_view(model_args) == PAPER_VIEW  # retrofit keeps the parent's causal view
    config = tmp_path / "c.yaml"
    config.write_text("init_from_qwen2: q\nlearning_rate: 0.0001\n")
    _, _, from_file = train_par.parse_args([str(config)])
    assert (from_file.learning_rate, from_file.adapter_learning_rate) == (1e-4, 1e-4)


def test_init_from_parent_and_its_old_name_init_from_qwen2_are_one_flag(tmp_path, capsys):
    """--init_from_parent names what it takes (a Qwen2 or Llama parent, a folder, a GGUF file in it); the old
    --init_from_qwen2 (and its hyphen form, and the key in a config file) sets the same field with the same derived
    defaults; the two together are refused; --help says which is the alias."""
    new = train_par.parse_all_args(["--init_from_parent", "q", "--rendering", "text"])
    for old in (["--init_from_qwen2", "q"], ["--init-from-qwen2", "q"], ["--init_from_qwen2=q"]):
        parsed = train_par.parse_all_args([*old, "--rendering", "text"])
        assert parsed[0] == new[0] and parsed[3].learning_rate == new[3].learning_rate == 2e-5, old
        assert parsed[4] == new[4] == {"init_from_parent", "rendering"}
    config = tmp_path / "old.yaml"
    config.write_text("init_from_qwen2: q\nrendering: text\n")
    model_args, _, _, train_args, given = train_par.parse_all_args([str(config)])
    assert model_args.init_from_parent == "q" and train_args.warmup_steps == 200 and "init_from_parent" in given
    with pytest.raises(ValueError, match="--init_from_qwen2 is the old name of --init_from_parent"):
        train_par.parse_all_args(["--init_from_parent", "q", "--init_from_qwen2", "q"])
    with pytest.raises(SystemExit):
        train_par.parse_all_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--init_from_parent INIT_FROM_PARENT" in help_text and "--init_from_qwen2 INIT_FROM_PARENT" in help_text
    assert "--init_from_qwen2 is its old name, kept as an alias" in help_text


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
    assert (out / "lora_adapter" / "adapter_model.safetensors").is_file() and "forced" in summary["accuracy"]
    assert not (out / "adapter_config.json").exists()  # beside config.json, transformers would apply it twice
    merged = ParLoopedQwenForStateTracking.from_pretrained(out)  # the merged model: the folder loads alone
    assert not any("lora" in name for name, _ in merged.named_parameters())
    with pytest.raises(ValueError, match="--peft"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "x"), "--peft", "ia3"])
    with pytest.raises(ValueError, match="--lora_layers all chooses where --peft lora goes"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "z"), "--lora_layers", "all"])
    with pytest.raises(ValueError, match="ParTrainingArguments.objective"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "y"), "--objective", "nope"])


def test_a_set_optional_number_is_unset_by_none_on_the_command_line():
    """With records the mastery curriculum is on by default (curriculum_advance_accuracy 0.9); `none` selects the
    fixed pace from the command line as a config's null does, and a bad value is still argparse's error."""
    records = ["--train_file", "records.jsonl", "--output_dir", "x"]
    _, _, _, args, _ = train_par.parse_all_args(records)
    assert args.curriculum_advance_accuracy == 0.9
    for none in ("none", "None", "null"):
        _, _, _, args, given = train_par.parse_all_args(records + ["--curriculum_advance_accuracy", none])
        assert args.curriculum_advance_accuracy is None and "curriculum_advance_accuracy" in given
    _, _, _, args, _ = train_par.parse_all_args(records + ["--curriculum_advance_accuracy=none", "--max_grad_norm",
                                                           "0.5"])
    assert args.curriculum_advance_accuracy is None and args.max_grad_norm == 0.5
    _, _, _, args, _ = train_par.parse_all_args(records + ["--curriculum_advance_accuracy", "0.8"])
    assert args.curriculum_advance_accuracy == 0.8
    with pytest.raises(SystemExit):
        train_par.parse_all_args(records + ["--curriculum_advance_accuracy", "nope"])
    with pytest.raises(SystemExit):  # a number that cannot be None still refuses none
        train_par.parse_all_args(records + ["--learning_rate", "none"])


def test_the_default_curriculum_starts_at_a_given_min_train_depth(tmp_path):
    """--min_train_depth 4 alone moves the default curriculum's first cap (2) to 4 instead of refusing a start the
    command never gave; a start given below it is still one error naming the field."""
    for argv in (["--train_file", "records.jsonl"], ["--task", "swap_s5"]):
        _, _, _, args, _ = train_par.parse_all_args(argv + ["--min_train_depth", "4"])
        assert (args.min_train_depth, args.curriculum_start_depth) == (4, 4)
        _, _, _, args, _ = train_par.parse_all_args(argv + ["--min_train_depth", "4", "--curriculum_start_depth", "6"])
        assert args.curriculum_start_depth == 6
        with pytest.raises(ValueError, match="curriculum_start_depth must be None or within"):
            train_par.parse_all_args(argv + ["--min_train_depth", "4", "--curriculum_start_depth", "3"])
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"task": "swap_s5", "min_train_depth": 3}))
    _, _, _, args, _ = train_par.parse_all_args([str(config)])
    assert args.curriculum_start_depth == 3
    # no curriculum: the records' default mastery test goes with it, unless given (then one error naming it)
    records = ["--train_file", "records.jsonl"]
    _, _, _, args, _ = train_par.parse_all_args(records + ["--curriculum_start_depth", "none"])
    assert args.curriculum_start_depth is None and args.curriculum_advance_accuracy is None
    config.write_text(json.dumps({"train_file": "records.jsonl", "curriculum_start_depth": None}))
    _, _, _, args, _ = train_par.parse_all_args([str(config)])
    assert args.curriculum_start_depth is None and args.curriculum_advance_accuracy is None
    with pytest.raises(ValueError, match="curriculum_advance_accuracy must be None without a curriculum"):
        train_par.parse_all_args(records + ["--curriculum_start_depth", "none", "--curriculum_advance_accuracy", "0.9"])


def test_train_par_fine_tunes_a_par_checkpoint(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    train_par.main(TINY + ["--output_dir", str(first), "--max_steps", "2"])
    summary = train_par.main(TINY + ["--output_dir", str(second), "--max_steps", "2", "--init_from_par", str(first),
                                     "--hidden_size", "64"])  # the checkpoint's config wins over size flags
    assert summary["steps"] == 2
    assert AutoModel.from_pretrained(second, trust_remote_code=True).config.hidden_size == 32
    with pytest.raises(ValueError, match="at most one of --init_from_parent and --init_from_par"):
        train_par.main(TINY + ["--output_dir", str(tmp_path / "x"), "--init_from_par", str(first),
                               "--init_from_qwen2", str(first)])


def test_every_study_run_parses_into_valid_arguments():
    """Each row of examples/studies/length_generalization.py is a valid train_par.py command, and the rows that
    claim a view/option really set it (the flags are explicit, whatever train_par.py's defaults are)."""
    from par_studies import argv

    study = load_example("examples/studies/length_generalization.py")
    for name, row in study.ROWS.items():
        model_args, _, train_args = train_par.parse_args(argv(row.flags) + ["--output_dir", "x"])
        view = resolve_view(model_args)
        assert view == {k: getattr(model_args, k) for k in view}, name  # no row relies on a default view
        if name.startswith("local"):
            assert view["loop_view"] == "local" and view["progress_positions"]
        if name == "baseline":
            assert view == PAPER_VIEW and train_args.stretch_steps == 0


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


def test_train_par_under_torchrun_counts_both_ranks(tmp_path, monkeypatch):
    """Under torchrun on a CPU machine the run is data-parallel (gloo): the dataset and `samples_seen` cover both
    ranks. Without --use_cpu, transformers would train each rank alone (NOT_PARALLEL): that is a clear error, raised
    from the WORLD_SIZE torchrun sets (checked in this process: no second launch)."""
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
        args = TINY[:i] + TINY[i + 2:]  # the same run without --use_cpu true, as one of two launched ranks
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(ValueError, match="use_cpu must be True when 2 processes are launched"):
            train_par.main([*args, "--max_steps", "2", "--output_dir", str(tmp_path / "alone")])
        assert not (tmp_path / "alone").exists()
        monkeypatch.setenv("WORLD_SIZE", "1")  # one process: the same flags are accepted
        train_par.parse_all_args([*args, "--output_dir", str(tmp_path / "alone")])


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


def test_time_budget_spans_resumed_segments(tmp_path):
    """--max_train_seconds counts every segment: the time trained is saved in the checkpoint and a resumed run goes on
    counting from it (a checkpoint whose budget is spent stops the resumed run after one step); a budget raised on
    resume replaces the checkpoint's."""
    out = tmp_path / "budget"
    flags = TINY + ["--output_dir", str(out), "--eval_depths", "2", "--eval_n", "4", "--max_train_seconds", "1000",
                    "--save_strategy", "steps", "--save_steps", "2"]
    train_par.main(flags)
    state_file = out / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    saved = state["stateful_callbacks"]["TimeBudgetCallback"]["args"]
    assert saved["seconds"] == 1000 and 0 < saved["elapsed_before"] < 1000
    state["stateful_callbacks"]["TimeBudgetCallback"]["args"]["elapsed_before"] = 999.999  # an earlier long segment
    state_file.write_text(json.dumps(state))
    summary = train_par.main([*flags[: flags.index("--max_steps")], "--max_steps", "8",
                              *flags[flags.index("--max_steps") + 2:],
                              "--resume_from_checkpoint", str(state_file.parent)])
    assert summary["steps"] == 5  # resumed at 4, one step, then the restored budget stops it
    raised = [*flags[: flags.index("--max_steps")], "--max_steps", "8", *flags[flags.index("--max_steps") + 2:]]
    raised[raised.index("--max_train_seconds") + 1] = "100000"
    summary = train_par.main([*raised, "--resume_from_checkpoint", str(state_file.parent)])
    assert summary["steps"] == 8  # the same spent checkpoint, a larger budget: it trains to max_steps
    final = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    assert final["stateful_callbacks"]["TimeBudgetCallback"]["args"]["seconds"] == 100000


def test_time_budget_callback_state_round_trip():
    from trainers import TimeBudgetCallback

    callback = TimeBudgetCallback(60, elapsed_before=12.5)
    assert callback.elapsed() == 12.5
    restored = TimeBudgetCallback(**callback.state()["args"])
    assert (restored.seconds, restored.elapsed_before) == (60, 12.5)
    for bad, message in (((0,), "seconds must be > 0"), ((5, -1.0), "elapsed_before must be >= 0")):
        with pytest.raises(ValueError, match=message):
            TimeBudgetCallback(*bad)


def test_evaluation_after_training_falls_back_to_eager_when_compiled_graphs_fail(tmp_path, monkeypatch, caplog):
    """torch.compile can fail on the evaluation's shapes after a compiled training (inductor's value-range analysis
    raised on text prompts): the trained model is evaluated eagerly, with a warning, instead of the run exiting 1."""
    from torch._inductor.exc import InductorError

    from modeling_par import ParLoopedQwenForStateTracking
    from modeling_par.compile_support import eager_parts

    def fake_compile(self, **kwargs):  # compiled parts that are the eager ones: no compile time in a test
        self.compiled = None if kwargs.get("disable") else eager_parts(self)
        return self

    monkeypatch.setattr(ParLoopedQwenForStateTracking, "compile_core", fake_compile)
    real = train_par.evaluate_and_report
    seen = []

    def failing_when_compiled(model, *args, **kwargs):
        seen.append(model.compiled is not None)
        if model.compiled is not None:
            raise InductorError(ValueError("Exponent must be non-negative."), None)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(train_par, "evaluate_and_report", failing_when_compiled)
    with caplog.at_level("WARNING"):
        summary = train_par.main(TINY + ["--output_dir", str(tmp_path / "run"), "--compile_core", "true"])
    assert seen == [True, False] and "forced" in summary["accuracy"]
    assert "torch.compile failed on the evaluation's shapes (InductorError" in caplog.text
