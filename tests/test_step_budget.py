"""The records default's budget is in steps, not seconds: the same command and seed train the same steps and the same
weights on a busy machine and an idle one; a wall-clock cap is an option, and a run it ends says so."""

import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import load_example
from tests.counter_records import write_counter_csv
from trainers import ParTrainer

train_par = load_example("examples/train_par.py")

# records of a counter mod 3 (tests.counter_records) of lengths 1..4, step states
TINY = ["--hidden_size", "16", "--intermediate_size", "32", "--num_attention_heads", "2", "--num_key_value_heads",
        "2", "--per_device_train_batch_size", "8", "--eval_batch_size", "64", "--disable_tqdm", "true", "--use_cpu",
        "true", "--max_iterations", "8", "--compile_core", "false", "--logging_steps", "1", "--operations_column",
        "ops", "--step_states_column", "states", "--max_steps", "8"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 5, size=60)
    return write_counter_csv(tmp_path_factory.mktemp("step_budget") / "counter.csv", lengths, rng)


def slow_steps(monkeypatch, seconds: float) -> None:
    """Every training step takes `seconds` longer, as on a machine busy with other work."""
    step = ParTrainer.training_step

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(ParTrainer, "training_step", slow)


def test_the_records_default_has_a_step_budget_and_no_wall_clock_cap():
    _, _, _, args, _ = train_par.parse_all_args(["--train_file", "log.csv"])
    assert args.max_steps == 6000 and args.max_train_seconds is None
    _, _, _, args, _ = train_par.parse_all_args(["--train_file", "log.csv", "--max_train_seconds", "600"])
    assert args.max_train_seconds == 600  # the cap stays an option


def test_a_slowed_run_trains_the_same_steps_and_the_same_weights(records, tmp_path, monkeypatch):
    """Two runs of one command and seed, the second with every step 50 ms slower: same step count, bit-identical
    weights, both ended by the step budget."""
    idle = train_par.main(TINY + ["--train_file", records, "--output_dir", str(tmp_path / "idle")])
    slow_steps(monkeypatch, 0.05)
    started = time.time()
    busy = train_par.main(TINY + ["--train_file", records, "--output_dir", str(tmp_path / "busy")])
    assert time.time() - started >= 8 * 0.05  # the slowing was real
    assert idle["steps"] == busy["steps"] == 8
    assert idle["stopped_by"] == busy["stopped_by"] == "max_steps" and busy["max_train_seconds"] is None
    first, second = load_file(tmp_path / "idle" / "model.safetensors"), load_file(tmp_path / "busy" /
                                                                                  "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert idle["accuracy"] == busy["accuracy"]


def test_a_wall_clock_cap_that_ends_a_run_says_so(records, tmp_path, monkeypatch, capsys):
    """--max_train_seconds on the slowed machine: the run stops before its step budget, the log line names the cap and
    summary.json's stopped_by is "max_train_seconds"."""
    slow_steps(monkeypatch, 0.1)
    summary = train_par.main(TINY + ["--train_file", records, "--output_dir", str(tmp_path / "capped"),
                                     "--max_train_seconds", "0.25"])
    assert 1 <= summary["steps"] < 8
    assert summary["stopped_by"] == "max_train_seconds" and summary["max_train_seconds"] == 0.25
    assert f"max_train_seconds: 0.25 s of training reached at step {summary['steps']} of 8: stopping" in (
        capsys.readouterr().out)
