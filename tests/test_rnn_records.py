"""examples/baselines/rnn.py on recorded data (--train_file / --test_file, the data flags of train_par.py): an LSTM /
GRU trains on the records' own vocabulary and is scored per sequence length present in the test file."""

import csv
import json
from collections import Counter

import numpy as np
import pytest

from tests.conftest import load_example
from tests.counter_records import draw, write_csv

rnn = load_example("examples/baselines/rnn.py")

# A tiny machine: a counter mod 3 (tests.counter_records).
TRAIN_LENGTHS = range(1, 7)
TEST_LENGTHS = {9: 12, 14: 7}  # length -> records

TINY = ["--hidden", "16", "--max_steps", "30", "--batch_size", "16", "--curriculum_every_steps", "5",
        "--logging_steps", "10", "--learning_rate", "3e-3", "--eval_batch_size", "8"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rnn_records")
    rng = np.random.default_rng(0)
    train = [draw(rng, int(length)) for length in rng.choice(list(TRAIN_LENGTHS), size=200)]
    train += [draw(rng, length) for length in TRAIN_LENGTHS]  # every length present
    test = [draw(rng, length) for length, n in TEST_LENGTHS.items() for _ in range(n)]
    rng.shuffle(test)
    write_csv(root / "train.csv", train)
    write_csv(root / "test.csv", test)
    with open(root / "train_final.jsonl", "w") as handle:  # final states only
        for ops, states in train:
            handle.write(json.dumps({"operations": ops, "state": states[-1]}) + "\n")
    return root


def check_scores(saved, split="test"):
    assert saved["eval_split"] == split
    assert [row["depth"] for row in saved["per_depth"]] == sorted(TEST_LENGTHS) == saved["depths"]
    assert {row["depth"]: row["n"] for row in saved["per_depth"]} == TEST_LENGTHS
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in saved["per_depth"])
    assert saved["accuracy"] == [row["accuracy"] for row in saved["per_depth"]]
    assert saved["splits"][split]["per_depth"] == saved["per_depth"]
    assert saved["splits"][split]["n_records"] == sum(TEST_LENGTHS.values())


def test_rnn_trains_on_step_states_and_scores_every_test_length(files, tmp_path):
    out = tmp_path / "rnn.json"
    results = rnn.main(TINY + ["--train_file", str(files / "train.csv"), "--test_file", str(files / "test.csv"),
                               "--results_json", str(out)])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(results))
    check_scores(saved)
    # the depth range is the lengths present, the curriculum starts at 2 inside it, the vocabulary is the records'
    assert (saved["min_train_depth"], saved["max_train_depth"], saved["curriculum"]["start"]) == (1, 6, 2)
    # 5% (10) of the 206 training records held out as the validation split (--validation_split_percentage)
    assert saved["records"]["train_records"] == 196 and saved["records"]["operations"] == 3
    assert saved["splits"]["validation"]["n_records"] == 10
    assert saved["records"]["labels"] == 3 and saved["records"]["queries"] == ["state"]
    assert saved["records"]["training_mode"].startswith("step labels")
    assert saved["task"] == "train" and saved["steps"] == 30 and len(saved["curve"]) == 3
    assert all(np.isfinite(row["loss"]) for row in saved["curve"])
    # the LSTM reads the records' vocabulary and answers over their 3 labels: <pad> <unk> <bos> <q1> Yes No, 3 label
    # tokens, 3 operation words = 12 ids; h = 16
    h, vocab = 16, 12
    assert saved["parameters"] == vocab * h + 4 * (2 * h * h + 2 * h) + h * 3 + 3


def test_rnn_trains_on_final_states_only(files, tmp_path):
    """A JSON Lines file of final states only: each record trains on its final state (the rest is masked out of the
    loss, whose mean stays finite), scored on the validation file (a GRU, --labels step)."""
    out = tmp_path / "rnn_final.json"
    rnn.main(TINY + ["--cell", "gru", "--train_file", str(files / "train_final.jsonl"), "--validation_file",
                     str(files / "test.csv"), "--results_json", str(out)])
    saved = json.loads(out.read_text())
    check_scores(saved, split="validation")
    assert saved["records"]["training_mode"].startswith("final states only")
    assert all(np.isfinite(row["loss"]) for row in saved["curve"])


def test_rnn_records_take_the_given_depth_range_and_max_train_samples(files, tmp_path):
    out = tmp_path / "rnn_range.json"
    rnn.main(["--hidden", "8", "--max_steps", "4", "--batch_size", "8", "--logging_steps", "2", "--labels", "final",
              "--train_file", str(files / "train.csv"), "--test_file", str(files / "test.csv"),
              "--max_train_depth", "4", "--max_train_samples", "50", "--results_json", str(out)])
    saved = json.loads(out.read_text())
    assert (saved["min_train_depth"], saved["max_train_depth"]) == (1, 4)
    assert saved["records"]["train_records"] == 50 and saved["records"]["training_mode"].startswith("final state only")
    check_scores(saved)


def test_rnn_records_refuse_or_skip_a_bad_test_record(files, tmp_path):
    """An operation the training files never held: one error naming it, or with --skip_bad_records (train_par.py's
    flag, alone or with a value) the record is dropped and counted."""
    from state_tracking.records import RecordError

    rows = (files / "test.csv").read_text().splitlines()
    bad = tmp_path / "bad_test.csv"
    bad.write_text("\n".join(rows + ["up jump,one two"]) + "\n")
    flags = ["--hidden", "8", "--max_steps", "2", "--batch_size", "8", "--train_file", str(files / "train.csv"),
             "--test_file", str(bad)]
    with pytest.raises(RecordError, match="jump"):
        rnn.main(flags)
    for skip in (["--skip_bad_records"], ["--skip_bad_records", "true"]):
        saved = rnn.main(flags + skip)
        assert saved["records"]["skipped"] == {"train": 0, "validation": 0, "test": 1}
        assert {row["depth"]: row["n"] for row in saved["per_depth"]} == TEST_LENGTHS


@pytest.mark.parametrize("argv, message", [
    (["--task", "s5", "--train_file", "x.csv"], "--task describes generated data"),
    (["--train_file", "x.csv", "--eval_depths", "8", "--train_size", "4"], "--train_size, --eval_depths describe"),
    (["--test_file", "x.csv"], "--test_file needs --train_file or --dataset_name"),
    (["--validation_file", "x.csv", "--state_column", "s"], "--validation_file, --state_column need --train_file"),
    (["--train_file", "x.csv", "--dataset_name", "y"], "give --train_file or --dataset_name, not both"),
    (["--train_file", "x.csv", "--dataset_config_name", "c"], "--dataset_config_name needs --dataset_name"),
])
def test_rnn_refuses_bad_data_flag_combinations(argv, message, capsys):
    with pytest.raises(SystemExit):
        rnn.parse_args(argv)
    assert message in capsys.readouterr().err


def test_rnn_generated_defaults_are_unchanged():
    args = rnn.parse_args([])
    assert (args.task, args.min_train_depth, args.max_train_depth, args.curriculum_start_depth) == ("swap_s5", 1, 8, 2)
    assert (args.depths, args.eval_n, args.records) == ([8, 16, 32, 64, 128, 256, 512], 256, False)


def test_test_lengths_are_counted_right(files):
    with open(files / "test.csv") as handle:
        lengths = Counter(len(row["ops"].split()) for row in csv.DictReader(handle))
    assert dict(lengths) == TEST_LENGTHS


def test_rnn_stops_once_the_validation_split_is_exact(files, tmp_path):
    """train_par.py's stop rule: the validation split (5% of the training file here) probed every --probe_every_steps
    steps; two exact probes in a row end training before --max_steps, and `steps` says where. With
    --stop_when_validation_exact false the probes are logged and the run goes to --max_steps."""
    flags = ["--hidden", "16", "--max_steps", "600", "--batch_size", "16", "--curriculum_every_steps", "5",
             "--logging_steps", "50", "--learning_rate", "1e-2", "--probe_every_steps", "25",
             "--train_file", str(files / "train.csv"), "--test_file", str(files / "test.csv"),
             "--validation_split_percentage", "20"]  # 41 records: enough to stop on (a 5% split is 10: too few)
    stopped = rnn.main(flags)
    probes = [row for row in stopped["curve"] if "probe_accuracy" in row]
    assert stopped["max_steps"] == 600 and stopped["steps"] < 600
    assert stopped["steps"] == probes[-1]["step"] and [p["probe_accuracy"] for p in probes[-2:]] == [1.0, 1.0]
    assert all(p["probe_n"] == 41 and p["probe_split"] == "validation" for p in probes)
    assert all(a < 1.0 or b < 1.0 for a, b in zip([p["probe_accuracy"] for p in probes[:-2]],
                                                    [p["probe_accuracy"] for p in probes[1:-1]]))
    full = rnn.main(flags[:3] + ["200"] + flags[4:] + ["--stop_when_validation_exact", "false"])
    assert full["steps"] == 200 and len([row for row in full["curve"] if "probe_accuracy" in row]) == 8


def test_rnn_does_not_stop_on_a_validation_split_too_small_to_mean_anything(files, monkeypatch, capsys):
    """A 5% split of these 205 records is 10 records: exact probes of it do not stop training (train_par.py's rule,
    `RecordSplits.stop_rule_off`), and the run says why."""
    monkeypatch.setattr(rnn, "probe_accuracy", lambda *args: 1.0)
    run = rnn.main(["--hidden", "8", "--max_steps", "12", "--batch_size", "8", "--curriculum_every_steps", "2",
                    "--logging_steps", "4", "--probe_every_steps", "2", "--train_file", str(files / "train.csv")])
    assert run["steps"] == 12
    assert "warning: the validation split" in capsys.readouterr().out


def test_rnn_stops_only_after_training_a_step_at_the_longest_length(files, monkeypatch):
    """The real gate at a cap change (`trainers.probe_stop`, train_par.py's rule): probes every 2 steps that are
    always exact, d_max 2 + ⌊i / 2⌋ up to 6 for batch i (0-based). After 8 steps the last batch trained (i = 7) had
    d_max 5, so the exact probes at step 8 do not stop the run (the cap 6 of batch 8 is the next step's); step 10
    does, after the batches 8 and 9 at d_max 6."""
    monkeypatch.setattr(rnn, "probe_accuracy", lambda *args: 1.0)
    stopped = rnn.main(["--hidden", "8", "--max_steps", "20", "--batch_size", "8", "--curriculum_every_steps", "2",
                        "--logging_steps", "1", "--probe_every_steps", "2", "--labels", "step",
                        "--train_file", str(files / "train.csv"), "--test_file", str(files / "test.csv"),
                        "--validation_split_percentage", "20"])  # 41 records: a split large enough to stop on
    assert stopped["steps"] == 10 and stopped["max_train_depth"] == 6
    caps = [min(6, 2 + i // 2) for i in range(stopped["steps"])]
    assert caps[-1] == 6 and caps[:-2] == [2, 2, 3, 3, 4, 4, 5, 5]
    trained = [row["depth"] for row in stopped["curve"] if "loss" in row]
    assert len(trained) == 10 and all(depth <= cap for depth, cap in zip(trained, caps))


@pytest.mark.parametrize("flags, named", [
    (["--stop_when_validation_exact", "true"], "--stop_when_validation_exact sets"),
    (["--probe_n", "8", "--probe_every_steps", "5"], "--probe_n, --probe_every_steps set"),
    (["--probe_stop_patience", "3"], "--probe_stop_patience sets"),
])
def test_rnn_refuses_probe_flags_without_a_validation_split(files, flags, named):
    with pytest.raises(ValueError, match=f"{named} the validation probe, and these records have no validation split"):
        rnn.main(["--hidden", "8", "--max_steps", "2", "--batch_size", "8", "--train_file", str(files / "train.csv"),
                  "--validation_split_percentage", "0", *flags])
    saved = rnn.main(["--hidden", "8", "--max_steps", "2", "--batch_size", "8", "--train_file",
                      str(files / "train.csv"), "--validation_split_percentage", "0", "--stop_when_validation_exact",
                      "false"])
    assert saved["steps"] == 2 and saved["splits"] == {}
