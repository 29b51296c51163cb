"""The records stop rule and the best-probe restore, through the real code paths of train_par.py (and the shared rule
`trainers.probe_stop` that rnn.py calls too): a stop waits for a trained step at the longest length, the checkpoint
on disk is the one summary.json names, and probe flags that would change nothing are refused by name."""


import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import load_example
from tests.counter_records import write_counter_csv
from trainers import RecordsProbeCallback, curriculum_done, curriculum_max_depth, probe_stop

train_par = load_example("examples/train_par.py")

# records of a counter mod 3 (tests.counter_records) of lengths 1..4
TINY = ["--hidden_size", "16", "--intermediate_size", "32", "--num_attention_heads", "2", "--num_key_value_heads",
        "2", "--per_device_train_batch_size", "8", "--eval_n", "8", "--eval_batch_size", "64", "--disable_tqdm",
        "true", "--use_cpu", "true", "--max_iterations", "8", "--compile_core", "false", "--logging_steps", "1",
        "--operations_column", "ops", "--step_states_column", "states"]
# the fixed pace the issue reproduced: d_max 2, 2, 3, 3, 4, 4, ... at steps 0, 1, 2, ... (0-based)
PACE = ["--curriculum_advance_accuracy", "none", "--curriculum_start_depth", "2", "--curriculum_every_steps", "2",
        "--probe_every_steps", "2"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    rng = np.random.default_rng(0)
    # 5% held out: 33 validation records, enough for the probe to stop on and to choose weights by (>= 32)
    lengths = [1, 2, 3, 4] + [int(d) for d in rng.integers(1, 5, size=656)]
    return write_counter_csv(tmp_path_factory.mktemp("stop_rule") / "counter.csv", lengths, rng)


def scripted_probe(monkeypatch, accuracies):
    """The validation probe reports these accuracies, one per call, in order (the last one from then on)."""
    calls = []

    def evaluate(self, model):
        calls.append(len(calls))
        return accuracies[min(len(calls), len(accuracies)) - 1]

    monkeypatch.setattr(RecordsProbeCallback, "evaluate", evaluate)
    return calls


def test_the_curriculum_is_done_once_a_step_at_the_longest_length_was_trained():
    cap = lambda step: curriculum_max_depth(step, 2, 2, 1, 4)  # noqa: E731
    assert [cap(step) for step in range(6)] == [2, 2, 3, 3, 4, 4]
    # steps_done counts the steps trained (the Trainer's global_step at a step's end): the last one is steps_done - 1
    assert [curriculum_done(cap, steps_done, 4) for steps_done in range(7)] == [False] * 5 + [True] * 2
    exact = [1.0, 1.0]
    assert not probe_stop(exact, 1.0, 2, steps_done=4, curriculum_cap=cap, max_depth=4)
    assert probe_stop(exact, 1.0, 2, steps_done=6, curriculum_cap=cap, max_depth=4)
    assert probe_stop(exact, 1.0, 2, steps_done=4)  # no curriculum: no gate
    assert not probe_stop(exact, None, 2, steps_done=6)  # no stop accuracy: never
    assert not probe_stop([1.0, 0.5, 1.0], 1.0, 2, steps_done=6)  # the last `patience` probes, all of them


def test_a_records_run_stops_only_after_training_a_step_at_the_longest_length(records, tmp_path, monkeypatch):
    """The real gate of train_par.py at a cap change: probes every 2 steps that are always exact (of a validation
    split of 40 records, large enough to stop on), d_max 2, 2, 3, 3, 4, 4 at steps 1..6. Two exact probes at step 4
    do not stop the run (the steps it trained had caps 2, 2, 3, 3; the cap 4 is the next step's); step 6 does, after
    two steps at d_max 4."""
    scripted_probe(monkeypatch, [1.0])
    summary = train_par.main(TINY + PACE + ["--train_file", records, "--max_steps", "10", "--output_dir",
                                            str(tmp_path / "run"), "--validation_split_percentage", "40"])
    assert summary["max_train_depth"] == 4
    assert summary["steps"] == summary["probe_stopped_at"] == 6
    assert [row["curriculum_max_depth"] for row in summary["curve"]] == [2, 2, 3, 3, 4, 4]
    assert all(row["depth"] <= row["curriculum_max_depth"] for row in summary["curve"])


def same_weights(a, b) -> bool:
    first, second = load_file(a), load_file(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("save", [[], ["--save_strategy", "steps", "--save_steps", "3"]])
def test_the_checkpoint_on_disk_holds_the_weights_summary_json_names(records, tmp_path, monkeypatch, save):
    """Probes at steps 2, 4, 6 score 0.5, 0.75, 0.25: the run ends with the weights of step 4, and the checkpoint of
    step 4 on disk holds exactly them (the Trainer saved it when the probe was the best, and loaded it back); a
    checkpoint of the last step (--save_strategy steps) holds the last step's weights, as its name says."""
    calls = scripted_probe(monkeypatch, [0.5, 0.75, 0.25])
    out = tmp_path / "run"
    summary = train_par.main(TINY + PACE + ["--train_file", records, "--max_steps", "6",
                                            "--stop_when_validation_exact", "false", "--output_dir", str(out), *save])
    assert len(calls) == 3 and [p["accuracy"] for p in summary["probe"]] == [0.5, 0.75, 0.25]
    assert summary["probe_restored_step"] == 4 and summary["steps"] == 6
    assert same_weights(out / "checkpoint-4" / "model.safetensors", out / "model.safetensors")
    assert summary["best_model_checkpoint"] == str(out / "checkpoint-4")
    folders = sorted(p.name for p in out.glob("checkpoint-*"))
    if not save:  # the records default keeps one checkpoint: the one summary.json names
        assert folders == ["checkpoint-4"]
    else:  # every probe that was the best saved its checkpoint (2, 4) beside --save_steps' (3, 6); no limit given
        assert folders == ["checkpoint-2", "checkpoint-3", "checkpoint-4", "checkpoint-6"]
        assert not same_weights(out / "checkpoint-6" / "model.safetensors", out / "model.safetensors")


def test_final_weights_that_score_as_well_as_the_best_stay(records, tmp_path, monkeypatch):
    """Probes at steps 2, 4, 6 score 0.5, 0.75, 0.75: no restore, the last checkpoint is the best. (It had run in both
    parametrizations above, the same run each time.)"""
    scripted_probe(monkeypatch, [0.5, 0.75, 0.75])
    kept = train_par.main(TINY + PACE + ["--train_file", records, "--max_steps", "6", "--stop_when_validation_exact",
                                         "false", "--output_dir", str(tmp_path / "kept")])
    assert kept["probe_restored_step"] is None and kept["best_model_checkpoint"] == str(tmp_path / "kept" /
                                                                                       "checkpoint-6")


@pytest.mark.parametrize("flags, named", [
    (["--stop_when_validation_exact", "true"], "--stop_when_validation_exact sets"),
    (["--restore_best_probe", "true"], "--restore_best_probe sets"),
    (["--probe_n", "8"], "--probe_n sets"),
    (["--probe_every_steps", "5"], "--probe_every_steps sets"),
    (["--probe_stop_patience", "3", "--probe_n", "8"], "--probe_n, --probe_stop_patience set"),
])
def test_probe_flags_without_a_validation_split_are_refused_by_name(records, tmp_path, flags, named):
    with pytest.raises(ValueError, match=f"{named} the validation probe, and the records have no validation split"):
        train_par.main(TINY + ["--train_file", records, "--validation_split_percentage", "0", "--max_steps", "1",
                               "--output_dir", str(tmp_path / "x"), *flags])


def test_without_a_validation_split_the_defaults_and_a_false_stop_train(records, tmp_path):
    summary = train_par.main(TINY + ["--train_file", records, "--validation_split_percentage", "0", "--max_steps", "2",
                                     "--stop_when_validation_exact", "false", "--restore_best_probe", "false",
                                     "--output_dir", str(tmp_path / "x")])
    assert summary["steps"] == 2 and summary["probe"] == [] and summary["best_model_checkpoint"] is None


def test_a_validation_split_too_small_to_stop_on_never_stops_the_run(records, tmp_path, monkeypatch):
    """The switch of the stop rule (`RecordSplits.stop_rule_off`): the same always-exact probes on a split of 13
    records (2%, fewer than 32) never stop training; the run trains to --max_steps and its notes say why."""
    scripted_probe(monkeypatch, [1.0])
    summary = train_par.main(TINY + PACE + ["--train_file", records, "--max_steps", "10", "--output_dir",
                                            str(tmp_path / "run"), "--validation_split_percentage", "2"])
    assert summary["probe_stopped_at"] is None and summary["steps"] == 10 and summary["stopped_by"] == "max_steps"
    assert len(summary["probe"]) == 5 and all(p["accuracy"] == 1.0 for p in summary["probe"])
    assert any("too few for --stop_when_validation_exact" in note for note in summary["records"]["notes"])
