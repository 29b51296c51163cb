"""train_par.py --baselines lstm,rpni: after PAR, the LSTM (examples/baselines/rnn.py) and RPNI (automata.py) on the
same records files, seed and split, one table, and summary.json's "baselines"; a bad --baselines is one error."""

import json
import shlex

import numpy as np
import pytest

from par_cli import baselines_table
from par_cli.cli import run_cli
from tests.conftest import load_example
from tests.counter_records import write_counter_csv

train_par = load_example("examples/train_par.py")

# records of a counter mod 3 (tests.counter_records), step states
TINY = ["--hidden_size", "16", "--intermediate_size", "32", "--num_attention_heads", "2", "--num_key_value_heads",
        "2", "--per_device_train_batch_size", "8", "--eval_batch_size", "64", "--disable_tqdm", "true", "--use_cpu",
        "true", "--max_iterations", "32", "--compile_core", "false", "--max_steps", "4", "--operations_column", "ops",
        "--step_states_column", "states"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("baselines")
    rng = np.random.default_rng(0)
    return (write_counter_csv(folder / "train.csv", rng.integers(1, 7, size=300), np.random.default_rng(1)),
            write_counter_csv(folder / "test.csv", [8] * 20 + [16] * 20, np.random.default_rng(2)))


@pytest.mark.parametrize("value", ["lstm,hmm", "", "lstm,lstm", "gru"])
def test_a_bad_baselines_value_is_one_error_naming_the_flag(files, tmp_path, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli(train_par.main, ["--train_file", files[0], "--baselines", value, "--output_dir", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --baselines must be a comma-separated list of lstm, rpni (each at most once); "
                          f"got {value!r}.")
    assert not (tmp_path / "summary.json").exists()  # refused before anything trained


@pytest.mark.parametrize("flags, message", [
    ([], "--baselines trains the baselines on the same records files after PAR: it needs --train_file."),
    (["--dataset_name", "some/dataset"], "with --dataset_name, run examples/baselines/rnn.py and automata.py"),
    (["--train_file", "TRAIN", "--max_eval_samples", "5"], "--max_eval_samples would score PAR on fewer"),
    (["--train_file", "TRAIN", "--validation_split_percentage", "0"], "give --test_file, --validation_file or a"),
])
def test_baselines_need_records_files_and_a_split_to_score(files, tmp_path, flags, message):
    flags = [files[0] if flag == "TRAIN" else flag for flag in flags]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        train_par.main(flags + ["--baselines", "lstm", "--output_dir", str(tmp_path)])


def test_baselines_train_on_the_same_files_after_par_and_print_one_table(files, tmp_path, monkeypatch, capsys):
    # the LSTM at a test's size (rnn.py's own flags after its defaults: the last one given wins)
    monkeypatch.setitem(baselines_table.BASELINES, "lstm",
                        ("LSTM", "rnn.py", ["--cell", "lstm", "--hidden", "16", "--max_steps", "20"]))
    train, test = files
    out = tmp_path / "run"
    summary = train_par.main(TINY + ["--train_file", train, "--test_file", test, "--seed", "3", "--baselines",
                                     "lstm,rpni", "--output_dir", str(out)])
    table = summary["baselines"]
    assert table["split"] == "test" and [row["method"] for row in table["rows"]] == ["PAR", "LSTM", "RPNI"]
    par, lstm, rpni = table["rows"]
    assert par["accuracy"] == summary["accuracy"]["test"] and par["train_seconds"] == summary["train_seconds"]
    assert set(lstm["accuracy"]) == set(rpni["accuracy"]) == {8, 16}  # the same test lengths, every one
    assert lstm["steps"] == 20 and lstm["states"] is None and rpni["states"] == 3  # the counter's three states
    assert rpni["accuracy"] == {8: 1.0, 16: 1.0}
    for row, script in ((lstm, "rnn.py"), (rpni, "automata.py")):  # each command, read by its script's own parser
        words = shlex.split(row["command"])
        assert words[1].endswith(f"examples/baselines/{script}")
        args = load_example(f"examples/baselines/{script}").parse_args(words[2:])
        assert (args.train_file, args.test_file, args.seed, args.validation_split_percentage) == (train, test, 3, 5)
        assert (args.operations_column, args.step_states_column) == ("ops", "states")
    lstm_args = load_example("examples/baselines/rnn.py").parse_args(shlex.split(lstm["command"])[2:])
    assert lstm_args.operation_tokens == "words" and lstm_args.hidden == 16 and lstm_args.max_steps == 20
    assert load_example("examples/baselines/automata.py").parse_args(
        shlex.split(rpni["command"])[2:]).algorithm == "rpni"
    assert table["par_time_ratio"] == {m: round(par["train_seconds"] / r["train_seconds"], 2)
                                       for m, r in (("LSTM", lstm), ("RPNI", rpni))}
    saved = json.loads((out / "summary.json").read_text())
    assert saved["baselines"]["table"] == table["table"]
    assert json.loads((out / "baseline_lstm.json").read_text())["seed"] == 3
    printed = capsys.readouterr().out
    assert table["table"] in printed
    lines = table["table"].splitlines()
    assert lines[1] == "| method | d = 8 | d = 16 | train s | learned states |"
    assert lines[5].startswith("| RPNI | 100.00 | 100.00 | ") and lines[5].endswith(" | 3 |")


def test_a_baseline_that_refuses_the_records_is_its_rows_error(monkeypatch):
    def refuse(argv, records=None):
        raise ValueError("the records are not deterministic")

    monkeypatch.setattr(baselines_table.load_script("automata.py"), "main", refuse)
    from par_cli.record_flags import RecordFlags

    row = baselines_table.run_baseline("rpni", ["--algorithm", "rpni"], "test", RecordFlags(train_file="t.csv"))
    assert row["method"] == "RPNI" and row["error"] == "the records are not deterministic"
    table = baselines_table.baselines_table("test", [{"method": "PAR", "accuracy": {4: 0.5}, "train_seconds": 1.25,
                                                      "states": None}, row])
    assert table.splitlines()[3:] == ["| PAR | 50.00 | 1.25 | – |",
                                      "| RPNI | failed: the records are not deterministic |"]
