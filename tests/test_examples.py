"""The example scripts end to end at tiny scale: train_par.py (both trainers, LoRA) and its outputs."""

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


def test_paper_protocol_rows_are_valid_and_explicit():
    """Every PAR row of examples/reproduce/paper_protocol.py parses as train_par.py flags, sets its view explicitly,
    trains to d = 32 with the stated curriculum (32 reached at step 750), and the recipe row trains halting with the
    offset-1 labels; the RNN rows take the same curriculum and steps."""
    from par_studies import argv
    from trainers import curriculum_max_depth

    protocol = load_example("examples/reproduce/paper_protocol.py")
    p = protocol.PROTOCOLS["swap_s5"]
    for name, row in protocol.ROWS.items():
        if row.kind == "rnn":
            rnn = load_example("examples/baselines/rnn.py").parse_args(argv({**protocol.common_rnn(p), **row.flags}))
            assert (rnn.max_train_depth, rnn.curriculum_every_steps, rnn.eval_n) == (32, 25, 1024)
            assert rnn.depths == p.grid
            continue
        model_args, _, args = train_par.parse_args(argv({**protocol.common_par(p), **row.flags})
                                                   + ["--output_dir", "x"])
        view = resolve_view(model_args)
        assert view == {k: getattr(model_args, k) for k in view}, name
        assert args.max_train_depth == 32 and args.save_strategy == "steps"
        assert args.restore_callback_states_from_checkpoint
        start, every = args.curriculum_start_depth, args.curriculum_every_steps
        if args.curriculum_advance_accuracy is not None:  # mastery: from d ≤ 2, grown by accuracy, not by step
            assert start == 2 and args.curriculum_advance_accuracy == 0.9, name
        else:
            assert curriculum_max_depth(749, start, every, 1, 32) == 31
            assert curriculum_max_depth(750, start, every, 1, 32) == 32
        if name == "recipe_halting":
            assert view == RECIPE_VIEW and args.halt_label_offset == 1 and args.halting_loss_weight > 0
        if name.startswith("full_view"):
            assert view == PAPER_VIEW
            assert (args.stretch_steps > 0) == name.endswith("stretch")


def test_paper_protocol_trains_resumes_evaluates_and_tabulates(tmp_path, monkeypatch, scripts_in_process):
    """The protocol script at tiny scale: a PAR row trains with checkpoints, a second call after an interruption
    resumes from the newest checkpoint (two segments on record), the evaluation follows the stop rule on the grid,
    an RNN row scores the same grid, and --collect writes the paper-shaped table with the paper's rows above ours.
    train_par.py and rnn.py run in this process with the commands the protocol records (`scripts_in_process`; the
    fresh process of a study's row is tested by test_s5_breakthrough_tiny_trains_resumes_and_collects)."""
    from dataclasses import replace

    protocol = load_example("examples/reproduce/paper_protocol.py")
    tiny = replace(protocol.PROTOCOLS["swap_s5"], run_dir=REPO / "runs" / "test_paper_protocol" / tmp_path.name,
                   out=tmp_path / "results", train_max_depth=3, grid=[3, 6, 24, 48, 96], n=16, steps=2, save_steps=2,
                   profile_depths=[6], profile_n=8, in_range_depths=[2, 3], in_range_n=8, long_grid=[12, 30],
                   long_n=8, long_batch=4, curriculum_every=1)
    monkeypatch.setitem(protocol.PROTOCOLS, "swap_s5", tiny)
    small = {"--hidden_size": "32", "--intermediate_size": "64", "--num_attention_heads": "2",
             "--num_key_value_heads": "2", "--per_device_train_batch_size": "8", "--use_cpu": "true"}

    def shrunk(name, **flags):  # the row at test scale: its flags with these over them
        return replace(protocol.ROWS[name], flags={**protocol.ROWS[name].flags, **small, **flags})

    rows = {"recipe_halting": shrunk("recipe_halting"),
            "lstm": replace(protocol.ROWS["lstm"], flags={"--cell": "lstm", "--hidden": "16"}),
            # its mastery pace shrunk with its steps (a pace that cannot reach the longest length is refused)
            "recipe_mastery": shrunk("recipe_mastery", **{"--max_steps": "2", "--curriculum_window": "1",
                                                          "--curriculum_every_steps": "1"}),
            "recipe_then_halting": shrunk("recipe_then_halting", **{"--max_steps": "2"})}
    monkeypatch.setattr(protocol, "ROWS", rows)
    try:
        # a two-stage row needs its trained parent, then starts from it and counts its training time
        with pytest.raises(SystemExit, match="fine-tunes the trained recipe_mastery row"):
            protocol.main(["--row", "recipe_then_halting", "--seed", "0"])
        protocol.main(["--row", "recipe_mastery", "--seed", "0"])
        protocol.main(["--row", "recipe_then_halting", "--seed", "0"])
        staged = json.loads(protocol.record_path(tiny, "recipe_then_halting", 0).read_text())
        parent = json.loads(protocol.record_path(tiny, "recipe_mastery", 0).read_text())
        assert parent["curriculum"]["mastery_accuracy"] == 0.9
        assert isinstance(parent["curriculum"]["growth_steps"], list)
        assert parent["probe"] and parent["probe"][0]["step"] == 0  # the in-range probe ran
        assert staged["init_from"] == "recipe_mastery" and "--init_from_par" in staged["train_commands"][0]
        assert "runs/test_paper_protocol" in staged["train_commands"][0].split("--init_from_par ")[1]
        assert staged["train_seconds_total"] == pytest.approx(staged["train_seconds"] + parent["train_seconds"],
                                                              abs=0.2)
        assert set(staged["evaluation"]) == {"forced", "halting"} and set(parent["evaluation"]) == {"forced"}
        protocol.main(["--row", "recipe_halting", "--seed", "0"])
        folder = protocol.run_path(tiny, "recipe_halting", 0)
        assert (folder / "checkpoint-2").is_dir()
        (folder / "summary.json").unlink()  # as if the segment had been cut off before the end
        tiny = replace(tiny, steps=4)
        monkeypatch.setitem(protocol.PROTOCOLS, "swap_s5", tiny)
        protocol.main(["--row", "recipe_halting", "--seed", "0"])
        record = json.loads(protocol.record_path(tiny, "recipe_halting", 0).read_text())
        assert [s["resumed_from"] for s in record["segments"]] == [None, "checkpoint-2"]
        assert "--resume_from_checkpoint" in record["train_commands"][1] and record["steps"] == 4
        before = record["segments"][1]["trained_seconds_before"]
        assert before > 0 and record["train_seconds"] == round(before + record["segments"][1]["wall_seconds"], 1)
        for mode in ("forced", "halting"):
            evaluation = record["evaluation"][mode]
            depths = evaluation["depths"]
            assert depths == tiny.grid[: len(depths)] and evaluation["n_per_depth"] == 16
            low = [a < 0.02 for a in evaluation["accuracy"]]
            assert (len(depths) < len(tiny.grid)) == (low[-2:] == [True, True]) == evaluation["stopped_early"]
        assert record["profile"] and record["padding_control"]
        assert record["in_range"]["depths"] == [2, 3] and record["in_range"]["n_per_depth"] == 8
        protocol.main(["--row", "lstm", "--seed", "0"])
        lstm = json.loads(protocol.record_path(tiny, "lstm", 0).read_text())
        assert lstm["evaluation"]["forced"]["depths"] == tiny.grid[: len(lstm["evaluation"]["forced"]["depths"])]
        ran = ["python " + " ".join(command) for command in scripts_in_process]  # what ran is what the records say
        assert ran == (parent["train_commands"] + staged["train_commands"] + record["train_commands"]
                       + lstm["train_commands"])
        for row in ("recipe_halting", "lstm"):  # past the protocol
            protocol.main(["--long", row, "--seed", "0"])
            long = json.loads((tmp_path / "results" / "long" / f"{row}_s0.json").read_text())
            assert long["evaluation"]["n_per_depth"] == 8 and long["evaluation"]["depths"][0] == 12
        assert len(scripts_in_process) == 6 and scripts_in_process[-1][0] == "examples/baselines/rnn.py"  # LSTM again
        protocol.main(["--collect"])
        table = (tmp_path / "results" / "table.md").read_text()
        assert "Past the protocol (`--long`)" in table and "| d=12 (4×) | d=30 (10×) |" in table
        assert table.index("PAR + learned halting — *paper, reported*") < table.index("*ours, CPU*")
        assert "PAR recipe (local view) + halting labels, learned halting — *ours, CPU* | 1 |" in table
        assert "LSTM, hidden 288 (≈ PAR's parameters) — *ours, CPU* | 1 |" in table
        assert "| 2 + 2 |" in table  # the two-stage row: its parent's steps + its own
        assert "Inside the training range" in table and "| d=2 | d=3 | d=6 profile: iteration 1 / 2 |" in table
        shipped = protocol.export(tiny, "recipe_halting", 0, target=tmp_path / "ckpt")
        summary = json.loads((shipped / "training_summary.json").read_text())
        assert summary["max_train_depth"] == 3 and summary["steps"] == 4 and summary["n_per_depth"] == 16
        card = (shipped / "README.md").read_text()
        assert "learned halting (no R given)" in card, card
        config = AutoModel.from_pretrained(shipped, trust_remote_code=True).config
        assert config.max_iterations >= 1 and config.learned_halting is True
        assert config.prompt_format["rendering"] == "symbolic" and "state-tracking" in config.custom_pipelines
    finally:
        import shutil

        shutil.rmtree(REPO / "runs" / "test_paper_protocol", ignore_errors=True)


def test_paper_protocol_s5_a5_rows_train_the_group_to_16():
    """--protocol s5 / a5: the same rows on S5 / A5, train d ≤ 16 (reached at step 350), test 16 … 256; the label-free
    row is prefix self-distillation; rows outside the protocol and the swap-S5 export are refused."""
    from par_studies import argv
    from trainers import curriculum_max_depth

    protocol = load_example("examples/reproduce/paper_protocol.py")
    for name in ("s5", "a5"):
        p = protocol.PROTOCOLS[name]
        assert p.grid == [16, 32, 64, 128, 256] and p.out.parts[-2:] == ("s5_a5_cpu", name)
        for row in protocol.rows_of(p):
            spec = protocol.ROWS[row]
            if spec.kind == "rnn":
                rnn = load_example("examples/baselines/rnn.py").parse_args(
                    argv({**protocol.common_rnn(p), **spec.flags}))
                assert (rnn.task, rnn.max_train_depth, rnn.depths) == (name, 16, p.grid)
                continue
            _, task_args, args = train_par.parse_args(argv({**protocol.common_par(p), **spec.flags,
                                                            **protocol.probe_flags(p, row)}) + ["--output_dir", "x"])
            assert task_args.task == name and args.max_train_depth == 16
            start, every = args.curriculum_start_depth, args.curriculum_every_steps
            if "mastery" in row:  # grown by accuracy; probed in range, stops once learned unless nostop
                assert (args.curriculum_advance_accuracy, args.curriculum_window, every) == (0.9, 20, 100)
                stops = not row.endswith(("nostop", "_more", "_decay"))  # (self_distill_mastery_more_stop stops)
                assert (task_args.probe_depth, task_args.probe_stop_accuracy) == (16, 0.99 if stops else None)
                constant = row.startswith("self_distill_mastery") and not row.endswith(("cosine", "decay"))
                steps = 6_000 if row.endswith("decay") else 20_000 if constant else 10_000  # a constant rate
                assert (args.max_steps, args.lr_scheduler_type == "constant_with_warmup") == (  # does not run
                    (steps, constant)), row  # out while d_max grows
                if not spec.resume_curriculum:  # (that one reads its parent's run: next test)
                    curriculum = protocol.curriculum_of(p, row, protocol.REPO / "no-such-run", 0)
                    assert curriculum["mastery_accuracy"] == 0.9 and curriculum["growth_steps"] is None
            else:
                assert curriculum_max_depth(349, start, every, 1, 16) == 15
                assert curriculum_max_depth(350, start, every, 1, 16) == 16
                assert task_args.probe_depth is None
                assert protocol.curriculum_of(p, row, protocol.REPO, 0)["reaches_16_at_step"] == 350
            assert task_args.self_distillation == row.startswith("self_distill")
    from state_tracking import get_task

    a5 = protocol.PROTOCOLS["a5"]
    assert "no identity operation" in protocol.padding_control(a5, None, None, get_task("a5"), {})["skipped"]
    with pytest.raises(SystemExit):
        protocol.main(["--protocol", "s5", "--row", "full_view"])
    with pytest.raises(SystemExit):
        protocol.main(["--protocol", "a5", "--export", "recipe_halting"])


def test_paper_protocol_second_stage_resumes_the_parents_curriculum(tmp_path):
    """A `resume_curriculum` row (self_distill_mastery_more) starts from its parent's trained weights with the mastery
    curriculum at the parent's last d_max (start + growths, at most train_max_depth), and says so in its record; a
    parent without a curriculum state is refused by name."""
    from dataclasses import replace

    from par_studies import argv

    protocol = load_example("examples/reproduce/paper_protocol.py")
    p = replace(protocol.PROTOCOLS["s5"], run_dir=tmp_path)
    row, parent = "self_distill_mastery_more", "self_distill_mastery"
    assert protocol.ROWS[row].init_from == parent
    parent_checkpoint = protocol.run_path(p, parent, 1) / "checkpoint-900"
    parent_checkpoint.mkdir(parents=True)
    (parent_checkpoint / "trainer_state.json").write_text("{}")  # a complete checkpoint (trainer_state written last)
    (protocol.run_path(p, parent, 1) / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match="no curriculum state"):
        protocol.parent_flags(p, row, 1)
    (parent_checkpoint / "curriculum_state.json").write_text(json.dumps({"advances": [300, 500, 800], "recent": []}))
    flags = protocol.parent_flags(p, row, 1)
    assert flags["--curriculum_start_depth"] == "5" and "--init_from_par" in flags
    _, _, args = train_par.parse_args(argv(protocol.train_flags(p, row, 1)) + ["--output_dir", "x"])
    assert args.curriculum_start_depth == 5 and args.curriculum_advance_accuracy == 0.9
    assert protocol.curriculum_of(p, row, tmp_path / "no-such-run", 1)["start"] == 5
    (parent_checkpoint / "curriculum_state.json").write_text(json.dumps({"advances": list(range(30)), "recent": []}))
    assert protocol.curriculum_of(p, row, tmp_path / "no-such-run", 1)["start"] == 16  # capped at d ≤ 16
    assert protocol.resumed_curriculum_flags(p, "recipe_then_halting", 1) == {}


def test_s5_breakthrough_rows_are_valid_and_explicit(tmp_path, monkeypatch):
    """Every row of examples/studies/s5_breakthrough.py parses as train_par.py flags: S5, the recipe's view set
    explicitly, train d ≤ 8, the study's cap (10,000 steps, 7,200 s), a checkpoint and a probe (d = 8, 256 sequences)
    every 250 steps; each variant trains what it says and each change is in the flags."""
    from par_studies import argv

    study = load_example("examples/studies/s5_breakthrough.py")
    rows = study.ROWS
    assert {name for name, spec in rows.items() if spec.label.startswith("baseline")} == set(study.VARIANTS)
    monkeypatch.setattr(study, "RUN_DIR", tmp_path)
    for parent in {spec.init_from for spec in rows.values()} - {None}:  # trained parents, as a fine-tune needs
        study.run_path(parent, 0).mkdir()
        (study.run_path(parent, 0) / "summary.json").write_text("{}")
    for name, spec in rows.items():
        flags = argv(study.train_flags(name, 0))
        model_args, task_args, args = train_par.parse_args(flags + ["--output_dir", "x", "--seed", "0"])
        assert resolve_view(model_args) == RECIPE_VIEW == {
            k: getattr(model_args, k) for k in RECIPE_VIEW}, name
        assert task_args.task == "s5" and args.max_train_depth == 8 and args.max_train_seconds == 7200
        fine_tune = {"self_distill_stretch_ft": 1000, "halting_from_labels": 2000}
        assert args.max_steps == fine_tune.get(name, 10_000), name
        # from-scratch rows stop once two probes in a row reach 99%; fine-tuning rows start near it and run on
        assert task_args.probe_stop_accuracy == (None if spec.init_from else 0.99), name
        assert task_args.probe_stop_patience == 2, name
        assert args.save_strategy == "steps" and args.save_steps == 250 and args.restore_callback_states_from_checkpoint
        assert (task_args.probe_depth, task_args.probe_n, task_args.probe_every_steps) == (8, 256, 250)
        assert task_args.self_distillation == (spec.group == "self_distill"), name
        assert (args.depth_schedule == "hold") == (spec.group == "halting"), name
        assert (args.halting_loss_weight == 0.5) == (spec.group == "halting" and name != "halting_noloss"), name
        assert task_args.eval_halting == (args.halting_loss_weight > 0) == spec.halting, name
        change = name[len(spec.group) + 1:]
        if change.startswith("lr"):
            assert args.learning_rate == float(change[2:]) and args.adapter_learning_rate == 2 * args.learning_rate
        if change == "width192":
            assert (model_args.hidden_size, model_args.intermediate_size) == (192, 384)
        if change == "pace25":
            assert (args.curriculum_start_depth, args.curriculum_every_steps) == (2, 25)
        if change.startswith("ema"):
            assert args.ema_decay == float(change[3:])
        if name == "self_distill_stretch_ft":
            assert args.stretch_steps == args.max_steps and args.stretch_max_scale == 8
        if spec.init_from is not None:
            with pytest.raises(SystemExit, match=f"fine-tunes the trained {spec.init_from} row"):
                study.train_flags(name, 12345)  # no trained parent for that seed
    assert study.left_chance_step([{"step": 0, "accuracy": 0.0}, {"step": 250, "accuracy": 0.099},
                                   {"step": 500, "accuracy": 0.1}, {"step": 750, "accuracy": 0.0}]) == 500
    assert study.left_chance_step([{"step": 0, "accuracy": 0.05}]) is None
    with pytest.raises(ValueError, match="need --probe_depth"):  # probe settings without a probe change nothing
        train_par.main(TINY + ["--output_dir", "x", "--probe_every_steps", "10"])


def test_s5_breakthrough_tiny_trains_resumes_and_collects(tmp_path, monkeypatch, request):
    """The study end to end at --tiny scale: a row trains with probes at steps 0, 2, 4 and checkpoints; run again after
    an interruption it resumes from the newest checkpoint (two segments on record, the probes of both in one curve);
    --collect writes the README table and the curve plot. The first segment is a fresh process, as a study runs a
    row; the resumed one runs in this process with the command on record (`scripts_in_process`)."""
    study = load_example("examples/studies/s5_breakthrough.py")
    monkeypatch.setattr(study, "TINY_RUN_DIR", tmp_path / "runs")
    monkeypatch.setattr(study, "TINY_OUT", tmp_path / "study")
    study.main(["--run", "labels", "--seed", "0", "--tiny"])
    folder = study.run_path("labels", 0, tiny=True)
    first = json.loads(study.record_path("labels", 0, tiny=True).read_text())
    assert [p["step"] for p in first["curve"]] == [0, 2, 4] and first["steps"] == 4
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in first["curve"]) and (folder / "checkpoint-4").is_dir()
    assert first["final_probe_accuracy"] == first["curve"][-1]["accuracy"]  # the final test at d = 8: the probe set
    assert "--probe_depth 8" in first["train_commands"][0] and "--max_train_seconds 7200" in first["train_commands"][0]

    (folder / "summary.json").unlink()  # as if the segment had been cut off before the end
    monkeypatch.setattr(study, "TINY_STEPS", 6)
    in_process = request.getfixturevalue("scripts_in_process")  # from here on, train_par.py runs in this process
    study.main(["--run", "labels", "--seed", "0", "--tiny", "--collect"])
    record = json.loads(study.record_path("labels", 0, tiny=True).read_text())
    assert ["python " + " ".join(command) for command in in_process] == record["train_commands"][1:]
    assert [s["resumed_from"] for s in record["segments"]] == [None, "checkpoint-4"]
    assert "--resume_from_checkpoint" in record["train_commands"][1]
    assert [p["step"] for p in record["curve"]] == [0, 2, 4, 6] and record["steps"] == record["max_steps"] == 6
    assert record["curve"][:3] == first["curve"]  # the first segment's probes come back with the checkpoint
    before = record["segments"][1]["trained_seconds_before"]
    assert before > 0 and record["train_seconds"] == round(before + record["segments"][1]["wall_seconds"], 1)
    assert record["stopped_by"] == "max_steps" and record["probe"]["left_chance_threshold"] == 0.1
    readme = (tmp_path / "study" / "README.md").read_text()
    assert "| `labels` | labels | baseline: forced depth + step labels | 0 | 6 |" in readme
    assert "Not run yet: `halting`, `self_distill`" in readme and "EMA warm-up" in readme
    assert (tmp_path / "study" / "accuracy_vs_step.png").is_file()


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
