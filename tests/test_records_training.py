"""Training, serving and evaluating from recorded data: train_par.py on files a user wrote (step states, final states
only, mapping states), the pipeline and evaluate_par.py from the trained folder, resuming, and the flags and records
refused before training. Reading the files themselves is tests/test_records.py."""

import json
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, pipeline

from modeling_par import PromptFormatError
from state_tracking.records import RecordColumns, RecordError, load_record_files
from tests.conftest import load_example
from tests.test_records import turnstile_rows, write_csv
from trainers import answer_loss, readout_accuracy

train_par = load_example("examples/train_par.py")
evaluate_par = load_example("examples/evaluate_par.py")

TINY = ["--hidden_size", "32", "--intermediate_size", "64", "--num_attention_heads", "2", "--num_key_value_heads",
        "2", "--per_device_train_batch_size", "16", "--eval_n", "16", "--logging_steps", "10", "--disable_tqdm", "true",
        "--use_cpu", "true", "--max_iterations", "64", "--compile_core", "false"]


def test_answer_loss_and_accuracy_skip_unrecorded_targets():
    torch.manual_seed(0)
    logits, targets = torch.randn(3, 4, 2, 5), torch.randint(0, 5, (3, 4, 2))
    full = answer_loss(logits, targets)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
    assert torch.allclose(full, expected.view(3, 4, 2).mean(dim=(1, 2)).sum())
    masked = targets.clone()
    masked[:2] = -100  # final-state-only records: nothing recorded before the last iteration
    last = torch.nn.functional.cross_entropy(logits[2].flatten(0, 1), targets[2].flatten())
    assert torch.allclose(answer_loss(logits, masked), last)
    accuracy = readout_accuracy(logits, masked)
    assert accuracy[:2].tolist() == [0.0, 0.0] and accuracy[2] == readout_accuracy(logits[2:], targets[2:])[0]


def test_train_on_a_hand_written_csv_then_serve_and_evaluate_from_the_folder(tmp_path):
    write_csv(tmp_path / "train.csv", turnstile_rows(300, 1, 6, 0))
    write_csv(tmp_path / "test.csv", turnstile_rows(20, 12, 12, 1) + turnstile_rows(10, 24, 24, 2))
    out = tmp_path / "run"
    summary = train_par.main(TINY + [
        "--train_file", str(tmp_path / "train.csv"), "--operations_column", "events", "--step_states_column",
        "observed", "--operation_delimiter", ";", "--test_file", str(tmp_path / "test.csv"), "--max_steps", "30",
        "--output_dir", str(out)])
    assert summary["records"]["training_mode"].startswith("progress-aligned targets")
    # 5% of the training file held out as the validation split (--validation_split_percentage), not trained on
    assert summary["records"]["train_records"] == 285 and summary["max_train_depth"] == 6
    assert json.loads((out / "eval_validation.json").read_text())["n_records"] == 15
    result = json.loads((out / "eval_test.json").read_text())
    assert [(r["depth"], r["n"]) for r in result["per_depth"]] == [(12, 20), (24, 10)]
    assert (out / "profile_test.json").is_file() and (out / "accuracy_vs_depth.png").is_file()
    # the served folder answers every test record as the evaluator scored it (the same encoding and readout)
    tracker = pipeline("state-tracking", model=str(out), trust_remote_code=True)
    rows = turnstile_rows(20, 12, 12, 1) + turnstile_rows(10, 24, 24, 2)
    answers = tracker([";".join(ops) for ops, _ in rows])
    right = [a["answers"]["observed"] == states[-1] for a, (_, states) in zip(answers, rows)]
    assert [np.mean(right[:20]), np.mean(right[20:])] == pytest.approx([r["accuracy"] for r in result["per_depth"]])
    answer = tracker(rows[0][0][:3], return_trajectory=True)
    assert answer["depth"] == 3 and len(answer["trajectory"]) == 3
    assert tracker("coin;kick", delimiter=";")["depth"] == 2
    assert [r["depth"] for r in tracker([["coin"], ["coin", "push"]])] == [1, 2]
    with pytest.raises(ValueError, match="operation 2 'dance' never occurs in the training data") as error:
        tracker(["coin", "dance"])
    assert type(error.value).__name__ == PromptFormatError.__name__  # the folder's own remote-code class
    # an operation training never held, in words it did: answered only when asked, and flagged
    with pytest.raises(ValueError, match="operation 2 'coin push' never occurs .* allow_untrained=True"):
        tracker(["coin", "coin push"])
    flagged = tracker(["coin", "coin push"], allow_untrained=True)
    assert flagged["depth"] == 2 and [u["sentence"] for u in flagged["untrained"]] == ["coin push"]
    assert tracker(["coin", "push"], allow_untrained=True)["untrained"] == []
    with pytest.raises(ValueError, match="'dance' has a word this tokenizer does not know"):
        tracker(["coin", "dance"], allow_untrained=True)
    # any checkpoint scores any file: evaluate_par.py on the same test file gives the same numbers
    again = evaluate_par.main(["--model", str(out), "--test_file", str(tmp_path / "test.csv"), "--operations_column",
                               "events", "--step_states_column", "observed", "--out", str(tmp_path / "e.json"),
                               "--no-progress", "--device", "cpu"])
    assert again["accuracy"] == result["accuracy"]
    model = AutoModel.from_pretrained(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(model.config.answer_token_ids) == 3 and tokenizer.convert_ids_to_tokens(
        model.config.answer_token_ids) == ["<=jammed>", "<=locked>", "<=unlocked>"]


def test_final_states_only_json_lines_trains_in_the_chosen_mode(tmp_path):
    with open(tmp_path / "train.jsonl", "w") as f:
        for ops, states in turnstile_rows(200, 1, 5, 3):
            f.write(json.dumps({"actions": ops, "final_state": states[-1]}) + "\n")
    out = tmp_path / "final"
    summary = train_par.main(TINY + ["--train_file", str(tmp_path / "train.jsonl"), "--max_steps", "12",
                                     "--output_dir", str(out)])
    assert summary["records"]["training_mode"].startswith("final-answer training over the lengths present")
    # the pipeline: a list of strings is one record, a list of delimited strings (whitespace here) a batch of records
    tracker = pipeline("state-tracking", model=str(out), trust_remote_code=True)
    batch = tracker(["coin push", "kick coin coin"])
    assert [r["depth"] for r in batch] == [2, 3]
    assert [r["answers"] for r in batch] == [tracker(["coin", "push"])["answers"],
                                             tracker(["kick", "coin", "coin"])["answers"]]
    assert tracker(["coin", "push"])["depth"] == 2 and tracker("coin push")["depth"] == 2
    distilled = train_par.main(TINY + ["--train_file", str(tmp_path / "train.jsonl"), "--max_steps", "6",
                                       "--self_distillation", "true", "--output_dir", str(tmp_path / "sd")])
    assert distilled["records"]["training_mode"].startswith("label-free prefix self-distillation")
    with pytest.raises(ValueError, match="--task describes generated data"):
        train_par.main(TINY + ["--train_file", str(tmp_path / "train.jsonl"), "--task", "s5", "--max_steps", "2",
                               "--output_dir", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="need --train_file or --dataset_name"):
        train_par.main(TINY + ["--test_file", str(tmp_path / "train.jsonl"), "--max_steps", "2", "--output_dir",
                               str(tmp_path / "y")])


def test_mapping_states_with_an_initial_state_train_and_answer(tmp_path):
    """Two boolean queries, an initial state per record, final states only: the checkpoint asks for the start."""
    rng = np.random.default_rng(0)
    with open(tmp_path / "bits.jsonl", "w") as f:
        for _ in range(120):
            bits = {"x0": bool(rng.integers(2)), "x1": bool(rng.integers(2))}
            start, ops = dict(bits), []
            for _ in range(int(rng.integers(1, 5))):
                op = ["flip x0", "flip x1", "swap"][int(rng.integers(3))]
                bits = ({"x0": not bits["x0"], "x1": bits["x1"]} if op == "flip x0" else
                        {"x0": bits["x0"], "x1": not bits["x1"]} if op == "flip x1" else
                        {"x0": bits["x1"], "x1": bits["x0"]})
                ops.append(op)
            f.write(json.dumps({"operations": ops, "initial_state": start, "state": bits}) + "\n")
    out = tmp_path / "bits"
    summary = train_par.main(TINY + ["--train_file", str(tmp_path / "bits.jsonl"), "--max_steps", "4",
                                     "--output_dir", str(out), "--test_file", str(tmp_path / "bits.jsonl")])
    assert summary["records"]["queries"] == ["x0", "x1"] and summary["records"]["labels"] == 2
    config = AutoModel.from_pretrained(out, trust_remote_code=True).config
    assert config.prompt_format["initial_state"] is True and config.prompt_format["candidates"] == ["false", "true"]
    # the served folder reads the initial state as training did: its answers score as the evaluator scored them
    tracker = pipeline("state-tracking", model=str(out), trust_remote_code=True)
    result = json.loads((out / "eval_test.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "bits.jsonl").read_text().splitlines()]
    for row in result["per_depth"]:
        at_depth = [r for r in records if len(r["operations"]) == row["depth"]]
        answers = [tracker({"operations": r["operations"], "initial_state": r["initial_state"]})["answers"]
                   for r in at_depth]
        truth = [{q: str(v).lower() for q, v in r["state"].items()} for r in at_depth]
        assert np.mean([a == t for a, t in zip(answers, truth)]) == pytest.approx(row["accuracy"])
    with pytest.raises(ValueError, match="pass initial_state"):
        tracker(["flip x0"])


def test_small_review_fixes_refuse_or_report_what_is_true(tmp_path):
    """--max_train_samples 0 is one error (not an empty-concatenation crash); --self-distillation (the hyphen alias)
    chooses the self-distillation arguments; self-distillation on step-state records says so (not "progress-aligned
    targets"); latest_checkpoint ignores a folder named checkpoint-foo."""
    from par_studies import latest_checkpoint

    path = tmp_path / "log.csv"
    write_csv(path, turnstile_rows(60, 1, 4, seed=1))
    with pytest.raises(RecordError, match="--max_train_samples must be an integer >= 1"):
        load_record_files(str(path), RecordColumns(step_states="observed", delimiter=";"), max_records=0)
    base = TINY + ["--train_file", str(path), "--step_states_column", "observed", "--operation_delimiter", ";",
                   "--max_steps", "2"]
    assert train_par._wants_self_distillation(["--self-distillation", "true"])
    assert train_par._wants_self_distillation(["--self-distillation=true"]) and not train_par._wants_self_distillation(
        ["--self-distillation", "false"])
    summary = train_par.main(base + ["--self-distillation", "true", "--save_steps", "2",
                                     "--output_dir", str(tmp_path / "sd")])
    assert summary["records"]["training_mode"].startswith("label-free prefix self-distillation")
    assert latest_checkpoint(tmp_path / "sd").name == "checkpoint-2"
    (tmp_path / "sd" / "checkpoint-foo").mkdir()
    complete = tmp_path / "sd" / "checkpoint-3"
    shutil.copytree(tmp_path / "sd" / "checkpoint-2", complete)
    assert latest_checkpoint(tmp_path / "sd").name == "checkpoint-3"
    assert latest_checkpoint(tmp_path / "absent") is None


def test_a_checkpoint_whose_saving_was_cut_off_is_skipped_on_resume_and_refused_when_named(tmp_path):
    """A session that ends while the Trainer saves leaves checkpoint-N with the weights but no trainer_state.json
    (written last). Resuming from it would restart the step count and the learning-rate schedule at 0 with the
    step-N weights, silently: the resumers take the newest *complete* checkpoint (with a warning naming the other),
    and train_par refuses it by name."""
    from par_studies import latest_checkpoint

    path = tmp_path / "log.csv"
    write_csv(path, turnstile_rows(60, 1, 4, seed=1))
    out = tmp_path / "run"
    base = TINY + ["--train_file", str(path), "--step_states_column", "observed", "--operation_delimiter", ";"]
    train_par.main(base + ["--max_steps", "2", "--save_steps", "2", "--output_dir", str(out)])
    cut = out / "checkpoint-4"
    shutil.copytree(out / "checkpoint-2", cut)
    (cut / "trainer_state.json").unlink()
    with pytest.warns(UserWarning, match="checkpoint-4 is an incomplete checkpoint"):
        assert latest_checkpoint(out).name == "checkpoint-2"
    with pytest.raises(ValueError, match=r"resume_from_checkpoint: .*checkpoint-4 has no trainer_state.json"):
        train_par.main(base + ["--max_steps", "4", "--output_dir", str(out), "--resume_from_checkpoint", str(cut)])
    with pytest.raises(ValueError, match=r"resume_from_checkpoint: .*absent is not a directory"):
        train_par.main(base + ["--max_steps", "4", "--output_dir", str(out),
                               "--resume_from_checkpoint", str(tmp_path / "absent")])


def test_records_longer_than_the_loop_can_run_are_named_before_training_or_skipped(tmp_path):
    """A test record longer than --max_iterations is one error before training (split, file, record, length, flag),
    not a crash in evaluation after it; --skip_bad_records drops it and counts it."""
    write_csv(tmp_path / "train.csv", turnstile_rows(40, 1, 4, seed=2))
    write_csv(tmp_path / "test.csv", turnstile_rows(3, 2, 3, seed=3) + turnstile_rows(1, 30, 30, seed=4))
    base = TINY + ["--train_file", str(tmp_path / "train.csv"), "--test_file", str(tmp_path / "test.csv"),
                   "--step_states_column", "observed", "--operation_delimiter", ";", "--max_steps", "2",
                   "--max_iterations", "20"]
    with pytest.raises(RecordError, match=r"test split: .*test.csv, record 3 \(0-based\) has 30 operations, more than "
                                          r"the 20 the loop can run \(--max_iterations 20"):
        train_par.main(base + ["--output_dir", str(tmp_path / "a")])
    assert not (tmp_path / "a" / "model.safetensors").exists()
    summary = train_par.main(base + ["--output_dir", str(tmp_path / "b"), "--skip_bad_records", "true"])
    assert summary["records"]["skipped"]["test"] == 1
    assert json.loads((tmp_path / "b" / "eval_test.json").read_text())["depths"] == [2, 3]


def test_operations_that_encode_alike_are_one_error(tmp_path):
    """'a-b', 'a - b' and 'a -b' are three operation strings but the same words a, -, b: training would merge them."""
    path = tmp_path / "log.jsonl"
    with open(path, "w") as f:
        for ops in (["a-b", "c"], ["a - b", "c"], ["c", "c"]):
            f.write(json.dumps({"operations": ops, "state": "s"}) + "\n")
    with pytest.raises(RecordError, match=r"operations 'a-b' and 'a - b' \(column 'operations' "
                                          r"\(--operations_column\)\) encode to the same tokens \['a', '-', 'b'\]"):
        train_par.main(TINY + ["--train_file", str(path), "--max_steps", "1", "--output_dir", str(tmp_path / "x")])


@pytest.mark.parametrize("script, argv, message", [
    ("train_par", ["--eval_depths", "8,16", "--max_steps", "1"], r"--eval_depths applies to generated problems only"),
    ("train_par", ["--task", "s5"], r"--task describes generated data"),
    ("evaluate_par", ["--depths", "8", "--seed", "3", "--compile"], r"--depths, --seed, --compile apply to generated"),
    ("evaluate_par", ["--phrasing", "seen", "--fixed-iterations", "2"], r"--phrasing, --fixed_iterations apply"),
])
def test_flags_with_no_effect_on_records_are_refused_by_name(tmp_path, script, argv, message):
    """One table (par_cli.flag_modes) says which flags apply to generated problems and which to records, for
    train_par.py, evaluate_par.py and rnn.py; a flag that would be ignored is one error naming it."""
    write_csv(tmp_path / "train.csv", turnstile_rows(20, 1, 3, seed=5))
    data = ["--step_states_column", "observed", "--operation_delimiter", ";"]
    with pytest.raises(ValueError, match=message):
        if script == "train_par":
            train_par.main(TINY + ["--train_file", str(tmp_path / "train.csv"), *data, "--output_dir",
                                   str(tmp_path / "x"), *argv])
        else:
            evaluate_par.main(["--model", str(tmp_path), "--test_file", str(tmp_path / "train.csv"), *data, "--out",
                               str(tmp_path / "e.json"), *argv])


def test_record_flags_without_records_are_refused_by_name(tmp_path):
    from par_cli.flag_modes import FLAG_MODES, check_flags

    for name in ("max_train_samples", "skip_bad_records", "dataset_config_name", "data_name"):
        with pytest.raises(ValueError, match=f"--{name} applies to recorded data only"):
            train_par.main(TINY + [f"--{name}", "true" if name == "skip_bad_records" else "3", "--output_dir",
                                   str(tmp_path / name)])
    with pytest.raises(ValueError, match="--split applies to recorded data only"):
        evaluate_par.main(["--model", str(tmp_path), "--split", "test", "--out", str(tmp_path / "e.json")])
    rnn = load_example("examples/baselines/rnn.py")
    assert (rnn.GENERATED_ONLY, rnn.RECORD_FLAGS) == FLAG_MODES["rnn.py"]
    check_flags("rnn.py", records=False, given={"task", "hidden"})  # nothing to refuse


def test_training_on_records_learns_the_machine(tmp_path):
    """A few hundred steps on a hand-written turnstile log (step states) learn it: in-range test accuracy far above
    chance (1/3), and the pipeline's answers are the turnstile's own states."""
    write_csv(tmp_path / "train.csv", turnstile_rows(600, 1, 5, seed=7))
    test_rows = turnstile_rows(64, 5, 5, seed=8)
    write_csv(tmp_path / "test.csv", test_rows)
    out = tmp_path / "run"
    train_par.main(TINY + ["--train_file", str(tmp_path / "train.csv"), "--test_file", str(tmp_path / "test.csv"),
                           "--step_states_column", "observed", "--operation_delimiter", ";", "--max_steps", "300",
                           "--learning_rate", "3e-3", "--output_dir", str(out)])
    result = json.loads((out / "eval_test.json").read_text())
    assert result["per_depth"][0]["depth"] == 5 and result["accuracy"][0] >= 0.9, result["accuracy"]
    tracker = pipeline("state-tracking", model=str(out), trust_remote_code=True)
    answers = [tracker(ops)["answers"]["observed"] for ops, _ in test_rows[:16]]
    assert np.mean([a == states[-1] for a, (_, states) in zip(answers, test_rows[:16])]) >= 0.9
