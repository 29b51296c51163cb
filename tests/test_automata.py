"""examples/baselines/automata.py: AALpy's RPNI / GSM on the records train_par.py reads, scored in its JSON shape."""

import csv
import json

import numpy as np
import pytest

from tests.conftest import load_example

pytest.importorskip("aalpy", reason="the automata extra: pip install -e '.[automata]' (in the dev extra)")
automata = load_example("examples/baselines/automata.py")

# a turnstile no code of this package wrote (coin unlocks, push locks; a kick jams it until a coin)
TURNSTILE = {"coin": {"locked": "unlocked", "unlocked": "unlocked", "jammed": "locked"},
             "push": {"locked": "locked", "unlocked": "locked", "jammed": "jammed"},
             "kick": {"locked": "jammed", "unlocked": "unlocked", "jammed": "jammed"}}


def rows(n, lo, hi, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        state, ops, states = "locked", [], []
        for _ in range(int(rng.integers(lo, hi + 1))):
            op = list(TURNSTILE)[int(rng.integers(3))]
            state = TURNSTILE[op][state]
            ops.append(op)
            states.append(state)
        out.append((ops, states))
    return out


def write(path, records, final_only):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["events", "status"])
        for ops, states in records:
            writer.writerow([";".join(ops), states[-1] if final_only else ";".join(states)])
    return str(path)


@pytest.mark.parametrize("algorithm", ["rpni", "gsm"])
@pytest.mark.parametrize("final_only", [True, False])
def test_the_learned_machine_is_exact_far_beyond_the_training_lengths(tmp_path, algorithm, final_only):
    train = write(tmp_path / "train.csv", rows(300, 1, 6, 0), final_only)
    test = write(tmp_path / "test.csv", rows(40, 8, 8, 1) + rows(20, 96, 96, 2), final_only)
    flags = ["--operations_column", "events", "--state_column" if final_only else "--step_states_column", "status",
             "--operation_delimiter", ";"]
    out = automata.main(["--train_file", train, "--test_file", test, *flags, "--algorithm", algorithm,
                         "--results_json", str(tmp_path / "a.json")])
    assert json.loads((tmp_path / "a.json").read_text()) == out
    assert [(r["depth"], r["n"], r["accuracy"]) for r in out["per_depth"]] == [(8, 40, 1.0), (96, 20, 1.0)]
    assert out["num_states"] == 3 and out["labels"] == ("final" if final_only else "step")
    assert out["train_records"] == 285 and out["splits"]["validation"]["per_depth"]  # 5% held out, as train_par


def test_a_path_that_leaves_the_learned_machine_counts_as_wrong():
    model = automata.learn([(("coin",), ("unlocked",)), (("coin", "coin"), ("unlocked",))], "rpni")
    assert automata.run(model, ("coin", "coin", "coin")) == ("unlocked",)
    assert automata.run(model, ("kick",)) is None  # an input it never saw: off the machine, scored wrong


def test_records_that_no_moore_machine_fits_are_one_error():
    with pytest.raises(ValueError, match="not deterministic"):
        automata.learn([(("coin",), ("unlocked",)), (("coin",), ("locked",))], "rpni")


def test_only_the_records_it_reads_are_scored(tmp_path):
    """--skip_bad_records drops a test record with an operation training never held: it is counted as skipped and not
    scored (10 records scored, as PAR and the RNN baselines score them), never scored wrong as an 11th."""
    train = write(tmp_path / "train.csv", rows(200, 1, 6, 0), final_only=True)
    test = write(tmp_path / "test.csv", rows(10, 3, 3, 1) + [(["coin", "dance"], ["unlocked", "unlocked"])],
                 final_only=True)
    out = automata.main(["--train_file", train, "--test_file", test, "--operations_column", "events",
                         "--state_column", "status", "--operation_delimiter", ";", "--algorithm", "gsm",
                         "--skip_bad_records", "true", "--validation_split_percentage", "0"])
    assert out["skipped"] == {"train": 0, "test": 1}
    assert [(r["depth"], r["n"], r["accuracy"]) for r in out["per_depth"]] == [(3, 10, 1.0)]
    assert out["train_records"] == 200
