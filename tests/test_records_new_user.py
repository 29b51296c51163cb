"""Records as a new user meets them (issue 40): an order-lifecycle log of their own, in their own column names —
mixed cell types and wrong delimiters refused, long records named, the checkpoint remembering its columns, every
message true."""

import bz2
import csv
import gzip
import json
import shlex

import numpy as np
import pytest
from transformers import pipeline

from state_tracking.evaluation import legend_label
from state_tracking.records import RecordColumns, RecordError, load_record_files
from tests.conftest import load_example

train_par = load_example("examples/train_par.py")
evaluate_par = load_example("examples/evaluate_par.py")

# an order's lifecycle: what each event does to its status (no code of this package wrote it)
ORDER = {"pay": {"new": "paid", "paid": "paid", "shipped": "shipped", "cancelled": "cancelled"},
         "ship": {"new": "new", "paid": "shipped", "shipped": "shipped", "cancelled": "cancelled"},
         "cancel": {"new": "cancelled", "paid": "cancelled", "shipped": "shipped", "cancelled": "cancelled"},
         "reopen": {"new": "new", "paid": "paid", "shipped": "shipped", "cancelled": "new"}}
TINY = ["--hidden_size", "32", "--intermediate_size", "64", "--num_attention_heads", "2", "--num_key_value_heads",
        "2", "--per_device_train_batch_size", "16", "--eval_n", "8", "--logging_steps", "10", "--disable_tqdm", "true",
        "--use_cpu", "true", "--max_iterations", "40", "--compile_core", "false"]


def orders(n, lo, hi, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        status, events = "new", []
        for _ in range(int(rng.integers(lo, hi + 1))):
            event = list(ORDER)[int(rng.integers(len(ORDER)))]
            status = ORDER[event][status]
            events.append(event)
        out.append((events, status))
    return out


def write_csv(path, rows, opener=open):
    with opener(path, "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["order_events", "status"])
        for events, status in rows:
            writer.writerow([";".join(events), status])
    return str(path)


COLUMNS = ["--operations_column", "order_events", "--state_column", "status", "--operation_delimiter", ";"]


def test_a_number_among_the_operations_is_one_error_and_a_string_among_lists_is_one_record(tmp_path):
    path = tmp_path / "orders.jsonl"
    lines = [{"events": ["pay", "ship"], "status": "shipped"}, {"events": "cancel", "status": "cancelled"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    loaded = load_record_files(str(path), RecordColumns(operations="events", state="status"))
    # datasets reads the mixed column as JSON text; each cell is its own value again, never '"cancel"'
    assert loaded.dataset["operations"] == [["pay", "ship"], ["cancel"]]
    path.write_text(path.read_text() + json.dumps({"events": ["pay", 3], "status": "paid"}) + "\n")
    with pytest.raises(RecordError, match=r"record 2 \(0-based\), column 'events' \(--operations_column\): the "
                                          r"operations mix number and string items"):
        load_record_files(str(path), RecordColumns(operations="events", state="status"))


@pytest.mark.parametrize("flags, message", [
    ([], r"reads as one operation \(split at whitespace\), but every cell contains ';'.*--operation_delimiter ';'"),
    (["--operation_delimiter", ","], r"split at --operation_delimiter ','\), but every cell contains ';'"),
])
def test_a_missing_or_wrong_delimiter_is_one_error_suggesting_the_flag(tmp_path, flags, message):
    path = write_csv(tmp_path / "orders.csv", orders(30, 2, 5, 0))
    with pytest.raises(RecordError, match=message):
        train_par.main(TINY + ["--train_file", path, "--operations_column", "order_events", "--state_column",
                               "status", *flags, "--max_steps", "1", "--output_dir", str(tmp_path / "run")])


def test_messages_say_what_is_true(tmp_path):
    (tmp_path / "logs").mkdir()
    with pytest.raises(RecordError, match=r"--train_file '.*logs' is a folder, not a file.*--dataset_name"):
        load_record_files(str(tmp_path / "logs"))
    (tmp_path / "header.csv").write_text("order_events,status\n")
    with pytest.raises(RecordError, match=r"header.csv' holds no record \(it is empty, or only a header\)"):
        load_record_files(str(tmp_path / "header.csv"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(RecordError, match=r"empty.jsonl' holds no record \(it is empty\)"):
        load_record_files(str(tmp_path / "empty.jsonl"))
    with pytest.raises(RecordError, match=r"--test_file: file '.*nowhere.csv' does not exist"):
        load_record_files(str(tmp_path / "nowhere.csv"), flag="--test_file")


@pytest.mark.parametrize("suffix, opener", [(".csv.gz", gzip.open), (".csv.bz2", bz2.open), (".csv.zst", None)])
def test_compressed_files_are_read_as_datasets_reads_them(tmp_path, suffix, opener):
    rows = orders(20, 1, 4, 1)
    if opener is None:
        import zstandard

        def opener(path, mode, newline=None):
            import io
            return io.TextIOWrapper(zstandard.open(path, "wb"), newline=newline)
    path = write_csv(tmp_path / f"orders{suffix}", rows, opener)
    loaded = load_record_files(path, RecordColumns(operations="order_events", state="status", delimiter=";"))
    assert loaded.dataset["operations"] == [events for events, _ in rows]


def test_the_checkpoint_remembers_its_columns_for_evaluation_and_the_pipeline(tmp_path, capfd):
    train = write_csv(tmp_path / "train.csv", orders(200, 1, 5, 2))
    long_test = orders(6, 3, 3, 3) + orders(1, 50, 50, 4)  # one record longer than --max_iterations 40
    test = write_csv(tmp_path / "test.csv", long_test)
    out = tmp_path / "run"
    argv = TINY + ["--train_file", train, *COLUMNS, "--max_steps", "20", "--output_dir", str(out),
                   "--skip_bad_records", "true", "--test_file", test]
    summary = train_par.main(argv)
    assert summary["records"]["skipped"]["test"] == 1
    # the recorded command runs again as written: shell-quoted (';' would otherwise end the shell command), the shell
    # reads it back as exactly the arguments of this run
    assert "--operation_delimiter ';'" in summary["command"]
    assert shlex.split(summary["command"]) == ["python", "examples/train_par.py", *argv]
    # --disable_tqdm silences every bar: the reading, encoding and evaluation ones too
    err = capfd.readouterr().err
    assert "reading train.csv" not in err and "encoding records" not in err and "eval test" not in err, err[-2000:]
    # evaluate_par needs no column or delimiter flag: the checkpoint remembers them; the long record is named
    with pytest.raises(RecordError, match=r"test split: .*test.csv, record 6 \(0-based\) has 50 operations, more than "
                                          r"the 40 the checkpoint's loop can run \(config.max_iterations 40"):
        evaluate_par.main(["--model", str(out), "--test_file", test, "--out", str(tmp_path / "e.json"),
                           "--device", "cpu", "--no_progress"])
    result = evaluate_par.main(["--model", str(out), "--test_file", test, "--out", str(tmp_path / "e.json"),
                                "--device", "cpu", "--skip_bad_records", "true", "--disable_tqdm", "true"])
    assert result["skipped"] == 1 and result["n_records"] == 6 and result["split"] == "test"
    trained = json.loads((out / "eval_test.json").read_text())
    assert [(r["depth"], r["n"], r["accuracy"]) for r in result["per_depth"]] == \
        [(r["depth"], r["n"], r["accuracy"]) for r in trained["per_depth"]]
    # the pipeline answers under the user's state column and takes the user's operations key
    tracker = pipeline("state-tracking", model=str(out), trust_remote_code=True)
    by_key = tracker({"order_events": ["pay", "ship"]})
    assert set(by_key["answers"]) == {"status"} and by_key == tracker({"operations": ["pay", "ship"]})
    assert by_key == tracker("pay;ship")
    with pytest.raises(ValueError, match="no input: give one record"):
        tracker([])
    with pytest.raises(ValueError, match=r"its operations under one of \['operations', 'order_events'\]"):
        tracker({"events": ["pay"]})


def test_plot_labels_name_the_split_and_its_records():
    assert legend_label("test", [{"n_records": 100}]) == "test (100 records)"
    assert legend_label("PAR", [{}, {}, {}]) == "PAR (3 seeds)"
    assert legend_label("PAR", [{}]) == "PAR (1 seed)"


def test_the_cards_limits_state_the_checkpoints_own_segmentation_rule():
    push_to_hub = load_example("examples/push_to_hub.py")
    rule = push_to_hub.segmentation_rule
    assert rule({"rendering": "records", "delimiter": ";"}) == \
        "a list of operation strings, or one string split at the delimiter ';'"
    assert rule({"rendering": "records", "delimiter": None}).endswith("split at whitespace")
    assert rule({"rendering": "text", "delimiter": None}) == "one operation per sentence"
    assert rule({"rendering": "text", "delimiter": "\\n"}) == "one operation per piece between matches of '\\\\n'"


@pytest.mark.parametrize("script", ["examples/train_par.py", "examples/evaluate_par.py", "examples/extract_machine.py",
                                    "examples/baselines/rnn.py"])
def test_clis_print_a_bad_input_as_one_error_line_and_exit_2(tmp_path, capsys, monkeypatch, script):
    from par_cli.cli import run_cli

    (tmp_path / "logs").mkdir()
    logs = str(tmp_path / "logs")
    argv = {"examples/train_par.py": ["--train_file", logs],
            "examples/baselines/rnn.py": ["--train_file", logs],
            "examples/evaluate_par.py": ["--model", logs, "--test_file", logs, "--out", str(tmp_path / "e.json")],
            "examples/extract_machine.py": ["--model", logs, "--out", str(tmp_path / "m.json")]}[script]
    main = load_example(script).main
    monkeypatch.delenv("PAR_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        run_cli(main, argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and lines[0].startswith("error: ") and len(lines) == 2, lines
    with pytest.raises(ValueError):  # --debug: the exception itself, with its traceback
        run_cli(main, [*argv, "--debug"])
    monkeypatch.setenv("PAR_DEBUG", "1")
    with pytest.raises(ValueError):
        run_cli(main, argv)


def test_the_cli_wiring_of_a_script_exits_2_with_one_error_line(tmp_path, capsys, monkeypatch):
    """`python examples/train_par.py ...`: its __main__ (run in this process, as test_cli_errors runs the others')
    prints one error line and exits 2, no traceback."""
    import runpy
    import sys
    from pathlib import Path

    (tmp_path / "logs").mkdir()
    script = Path(__file__).resolve().parents[1] / "examples" / "train_par.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--train_file", str(tmp_path / "logs")])
    monkeypatch.delenv("PAR_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(script), run_name="__main__")
    stderr = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert "error: --train_file" in stderr and "is a folder, not a file" in stderr


def test_answer_feedback_trains_saves_and_evaluates_as_trained(tmp_path, capsys):
    """`--answer_feedback true` reaches the config, the checkpoint keeps it, and evaluate_par on the saved checkpoint
    (its own remote code) gives the numbers training gave, and the pipeline answers through it."""
    train = write_csv(tmp_path / "train.csv", orders(200, 1, 5, 2))
    test = write_csv(tmp_path / "test.csv", orders(24, 3, 8, 3))
    out = tmp_path / "run"
    train_par.main(TINY + ["--train_file", train, *COLUMNS, "--max_steps", "20", "--output_dir", str(out),
                           "--test_file", test, "--answer_feedback", "true"])
    assert json.loads((out / "config.json").read_text())["answer_feedback"] is True
    result = evaluate_par.main(["--model", str(out), "--test_file", test, "--out", str(tmp_path / "e.json"),
                                "--device", "cpu", "--disable_tqdm", "true"])
    trained = json.loads((out / "eval_test.json").read_text())
    assert [(r["depth"], r["n"], r["accuracy"]) for r in result["per_depth"]] == \
        [(r["depth"], r["n"], r["accuracy"]) for r in trained["per_depth"]]
    tracker = pipeline("state-tracking", model=str(out), trust_remote_code=True)
    assert set(tracker("pay;ship")["answers"]) == {"status"}
    with pytest.raises(SystemExit) as stop:
        train_par.main(TINY + ["--train_file", train, *COLUMNS, "--max_steps", "2", "--output_dir",
                               str(tmp_path / "bad"), "--answer_feedback", "maybe"])
    assert stop.value.code == 2 and "argument --answer_feedback" in capsys.readouterr().err
