"""Every command line prints a bad input as one ``error: <message>`` line (and the --debug hint) and exits 2
(par_cli.cli.run_cli): a missing file or folder, a folder that is not a checkpoint, a missing GGUF file, a bad
task file — each checked where its flag is read, before anything loads, the message naming the flag and the path."""

import json

import pytest

from par_cli.cli import require_checkpoint, run_cli
from tests.conftest import load_example


def error_line(main, argv, capsys, monkeypatch) -> str:
    """The one error line `run_cli(main, argv)` prints (exit 2, no traceback)."""
    monkeypatch.delenv("PAR_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        run_cli(main, [str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert stopped.value.code == 2 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 2 and lines[0].startswith("error: ") and "--debug" in lines[1], lines
    return lines[0]


@pytest.fixture
def paths(tmp_path):
    """A folder that is not a checkpoint, a checkpoint-looking folder (config.json), task files that are not tasks."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "checkpoint" / "other.gguf").write_bytes(b"")
    (tmp_path / "not_json.json").write_text("states: a, b")
    (tmp_path / "bad_items.json").write_text(json.dumps({"group": "s5", "items": 3}))
    (tmp_path / "weights.bin").write_bytes(b"")
    return tmp_path


TRAIN_PAR_CASES = [
    (["--task_file", "/nonexistent.json"],
     "error: --task_file /nonexistent.json: does not exist; give a task JSON file"),
    (["--task_file", "{tmp}/empty"], "--task_file {tmp}/empty: is a folder; give a task JSON file"),
    (["--task_file", "{tmp}/not_json.json"], "--task_file {tmp}/not_json.json: not a task spec: task file"),
    (["--task_file", "{tmp}/bad_items.json"], "--task_file {tmp}/bad_items.json: not a task spec: 'int' object"),
    (["--init_from_par", "/nonexistent"], "--init_from_par /nonexistent: no such folder; give a checkpoint folder"),
    (["--init_from_par", "{tmp}/empty"], "--init_from_par {tmp}/empty: the folder is not a checkpoint (it has no "
                                         "config.json)"),
    (["--init_from_parent", "/nonexistent"], "--init_from_parent /nonexistent: no such folder"),
    (["--init_from_qwen2", "/nonexistent"], "--init_from_parent /nonexistent: no such folder"),  # the old name
    (["--init_from_parent", "{tmp}/checkpoint", "--gguf_file", "missing.gguf", "--rendering", "text"],
     "--gguf_file missing.gguf: no such file in --init_from_parent {tmp}/checkpoint (GGUF files there: "
     "['other.gguf'])"),
    (["--metric_for_best_model", "probe_accuracy", "--load_best_model_at_end", "true", "--save_strategy", "steps"],
     "--metric_for_best_model probe_accuracy follows the probe, and no probe runs: give --probe_depth"),
]


@pytest.mark.parametrize("argv, message", TRAIN_PAR_CASES)
def test_train_par_names_a_bad_path_in_one_line(paths, capsys, monkeypatch, argv, message):
    train_par = load_example("examples/train_par.py")
    argv = [a.replace("{tmp}", str(paths)) for a in argv] + ["--output_dir", str(paths / "run")]
    assert message.replace("{tmp}", str(paths)) in error_line(train_par.main, argv, capsys, monkeypatch)
    assert not (paths / "run").exists()  # refused before anything ran


@pytest.mark.parametrize("argv, message", [
    (["--model", "/nonexistent"], "error: --model /nonexistent: no such folder; give a checkpoint folder"),
    (["--model", "{tmp}/empty"], "--model {tmp}/empty: the folder is not a checkpoint (it has no config.json)"),
    (["--model", "{tmp}/weights.bin"], "--model {tmp}/weights.bin: a file, not a checkpoint"),
    (["--model", "{tmp}/checkpoint", "--task", "/nonexistent.json"],
     "--task /nonexistent.json: does not exist; give a preset ['swap_s5', 's5', 'a5'] or a task JSON file"),
    (["--model", "{tmp}/checkpoint", "--task", "{tmp}/not_json.json"], "--task {tmp}/not_json.json: not a task spec"),
    (["--model", "{tmp}/checkpoint"], "--model {tmp}/checkpoint has no state_tracking_task.json; pass --task"),
])
def test_evaluate_par_names_a_bad_path_in_one_line(paths, capsys, monkeypatch, argv, message):
    evaluate_par = load_example("examples/evaluate_par.py")
    argv = [a.replace("{tmp}", str(paths)) for a in argv] + ["--out", str(paths / "e.json")]
    assert message.replace("{tmp}", str(paths)) in error_line(evaluate_par.main, argv, capsys, monkeypatch)


def test_evaluate_par_refuses_split_with_a_test_file(paths, capsys, monkeypatch):
    """--split chooses a split of --dataset_name; with --test_file it was ignored and the result labelled "test"."""
    evaluate_par = load_example("examples/evaluate_par.py")
    (paths / "records.csv").write_text("operations,state\na b,x\n")
    argv = ["--model", paths / "checkpoint", "--test_file", paths / "records.csv", "--split", "validation", "--out",
            paths / "e.json"]
    line = error_line(evaluate_par.main, argv, capsys, monkeypatch)
    assert "--split chooses the split of --dataset_name; a --test_file is scored whole" in line


@pytest.mark.parametrize("argv, message", [
    (["--model", "/nonexistent"], "error: --model /nonexistent: no such folder"),
    (["--model", "{tmp}/empty"], "--model {tmp}/empty: the folder is not a checkpoint"),
])
def test_extract_machine_names_a_bad_path_in_one_line(paths, capsys, monkeypatch, argv, message):
    extract_machine = load_example("examples/extract_machine.py")
    argv = [a.replace("{tmp}", str(paths)) for a in argv] + ["--out", str(paths / "m.json")]
    assert message.replace("{tmp}", str(paths)) in error_line(extract_machine.main, argv, capsys, monkeypatch)


@pytest.mark.parametrize("task, message", [
    ("/nonexistent.json", "error: --task /nonexistent.json: does not exist; give a preset"),
    ("{tmp}/not_json.json", "--task {tmp}/not_json.json: not a task spec"),
])
def test_make_dataset_names_a_bad_task_in_one_line(paths, capsys, monkeypatch, task, message):
    make_dataset = load_example("examples/make_dataset.py")
    argv = ["--task", task.replace("{tmp}", str(paths)), "--depths", "1-2", "--n", "2", "--out", paths / "d.csv"]
    assert message.replace("{tmp}", str(paths)) in error_line(make_dataset.main, argv, capsys, monkeypatch)
    assert not (paths / "d.csv").exists()


@pytest.mark.parametrize("argv, message", [
    (["--checkpoint", "/nonexistent"], "error: --checkpoint must be a folder with config.json"),
    (["--checkpoint", "{tmp}/checkpoint", "--results", "/nonexistent.md"],
     "error: --results /nonexistent.md: does not exist; give a results file"),
])
def test_push_to_hub_names_a_bad_path_in_one_line(paths, capsys, monkeypatch, argv, message):
    push_to_hub = load_example("examples/push_to_hub.py")
    argv = [a.replace("{tmp}", str(paths)) for a in argv] + ["--output_dir", str(paths / "export")]
    assert message.replace("{tmp}", str(paths)) in error_line(push_to_hub.main, argv, capsys, monkeypatch)


def test_run_cli_keeps_the_traceback_of_a_bug(capsys):
    """Only bad input becomes an error line: any other exception is a bug and propagates with its traceback."""
    def buggy(argv):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_cli(buggy, [])
    assert capsys.readouterr().err == ""


def test_a_hub_id_passes_the_checkpoint_check():
    """A value that is no local path but a Hub id is left to from_pretrained (which reads the Hub)."""
    assert require_checkpoint("--model", "someone/par-swap-s5") == "someone/par-swap-s5"
    assert require_checkpoint("--model", None) is None


@pytest.mark.parametrize("script, argv", [
    ("examples/make_dataset.py",
     ["--task", "/nonexistent.json", "--depths", "1-2", "--n", "2", "--out", "{tmp}/d.csv"]),
    ("examples/push_to_hub.py", ["--checkpoint", "/nonexistent", "--output_dir", "{tmp}/export"]),
])
def test_scripts_run_as_commands_go_through_run_cli(tmp_path, capsys, monkeypatch, script, argv):
    """`python examples/<script>.py ...` (its __main__, run in this process): the error line and exit 2, not a
    traceback (these two ran main() bare)."""
    import runpy
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / script
    monkeypatch.setattr(sys, "argv", [str(path)] + [a.replace("{tmp}", str(tmp_path)) for a in argv])
    monkeypatch.delenv("PAR_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(path), run_name="__main__")
    assert stopped.value.code == 2 and capsys.readouterr().err.startswith("error: ")
