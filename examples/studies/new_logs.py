"""Issue 71: three logs of kinds no rule of the records recipe was chosen on, written before any change to the
defaults and read once, at the end (their commit precedes every run that uses them).

    python examples/studies/new_logs.py                 # write the files under runs/own_data/new_logs/, check sha256
    python examples/studies/new_logs.py --list          # each log: its kind, state, files and sha256

- `bool_swap5`: a program's log of 5 boolean variables: five assignments (`x3 = True`), then statements drawn
  uniformly among a tuple swap (`x1, x0 = x0, x1`), a negation (`x2 = not x2`), a constant (`x4 = False`) and a copy
  (`x0 = x3`); the final values of all five (32 states, the answer the whole state). The peer's failing log was of
  this kind (swaps only); this one adds the other statements.
- `reset_counter`: a counter machine with resets: a count mod 7 that events `tick` (+1), `double tick` (+2),
  `undo` (-1) and `reset` (to 0) change, interleaved with `heartbeat` (no change); the label is the count (whole).
- `regular_check`: a regular-language check of a symbol stream over `a b c`: the label says whether the stream read
  so far is in the language "an even number of `a`, or else a number of `b` that is a multiple of 3, not both" (an
  automaton of 6 states, 2 labels: the label is part of the state; about half accepted at every length).

Each: 16,000 training records of 1..16 operations (seed 0; bool_swap5: after its five assignments), and 1,024 test
records at each of 16, 64 and 256 operations (seeds 1, 2, 3), final states only, JSON Lines. The sha256 of every file
is in `SHA256` (written by this script when they were made; a different file is an error).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "runs" / "own_data" / "new_logs"
TRAIN_N, TEST_N, TRAIN_LENGTHS, TEST_LENGTHS = 16000, 1024, (1, 16), (16, 64, 256)
VARIABLES = tuple(f"x{i}" for i in range(5))


def bool_swap5(n: int, lengths: tuple[int, int], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        values = [bool(v) for v in rng.integers(0, 2, len(VARIABLES))]
        statements = [f"{x} = {v}" for x, v in zip(VARIABLES, values)]
        for _ in range(int(rng.integers(lengths[0], lengths[1] + 1))):
            kind = int(rng.integers(4))
            i, j = (int(k) for k in rng.choice(len(VARIABLES), 2, replace=False))
            x, y = VARIABLES[i], VARIABLES[j]
            if kind == 0:
                values[i], values[j] = values[j], values[i]
                statements.append(f"{x}, {y} = {y}, {x}")
            elif kind == 1:
                values[i] = not values[i]
                statements.append(f"{x} = not {x}")
            elif kind == 2:
                values[i] = bool(rng.integers(2))
                statements.append(f"{x} = {values[i]}")
            else:
                values[i] = values[j]
                statements.append(f"{x} = {y}")
        records.append({"program": statements, "values": {x: str(v) for x, v in zip(VARIABLES, values)}})
    return records


RESET_EVENTS = {"tick": 1, "double tick": 2, "undo": -1, "reset": None, "heartbeat": 0}


def reset_counter(n: int, lengths: tuple[int, int], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    names, weights = list(RESET_EVENTS), np.array([0.3, 0.15, 0.2, 0.05, 0.3])
    records = []
    for _ in range(n):
        count, events = 0, []
        for _ in range(int(rng.integers(lengths[0], lengths[1] + 1))):
            event = names[int(rng.choice(len(names), p=weights))]
            step = RESET_EVENTS[event]
            count = 0 if step is None else (count + step) % 7
            events.append(event)
        records.append({"events": events, "count": str(count)})
    return records


def regular_step(state: tuple[int, int], symbol: str) -> tuple[int, int]:
    """(number of a's mod 2, number of b's mod 3) after `symbol` (c changes nothing)."""
    return (state[0] + (symbol == "a")) % 2, (state[1] + (symbol == "b")) % 3


def regular_accepts(state: tuple[int, int]) -> bool:
    """The language: the number of a's is even, or else the number of b's is a multiple of 3 (exactly one of the
    two): accepted about half the time at every length, so no length is answered by its majority label."""
    return (state[0] == 0) != (state[1] == 0)


def regular_check(n: int, lengths: tuple[int, int], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        state, symbols = (0, 0), []
        for symbol in rng.choice(["a", "b", "c"], size=int(rng.integers(lengths[0], lengths[1] + 1))):
            state = regular_step(state, str(symbol))
            symbols.append(str(symbol))
        records.append({"stream": " ".join(symbols), "verdict": "accept" if regular_accepts(state) else "reject"})
    return records


LOGS = {"bool_swap5": (bool_swap5, "program", "values"), "reset_counter": (reset_counter, "events", "count"),
        "regular_check": (regular_check, "stream", "verdict")}
# the files as first written (2026-12-07, numpy 2.4.6 default_rng): a generator that writes anything else is an error
SHA256 = {
    "bool_swap5_train": "6fa6488441522d5c27a70eba5535855cf67965ba909f6fbd23abafad2f1e4fdc",
    "bool_swap5_test": "d0d88611f662671b9d59ee94f81dd035118442b943a89551e8e5d410e8e6dae6",
    "reset_counter_train": "d77b8eeb133cc28dedfe72ce62a79d6e2a3f1f923ca60a65361aaba0e8daa208",
    "reset_counter_test": "8a95280760425a79f4bb86a7aeb5dba79a9d491445a988458d790899898321aa",
    "regular_check_train": "87e3f557428b75e614ae64a2d7c2b39590175b70d27e492253b548459764837e",
    "regular_check_test": "d007e37a025cde94ef3164de88feb072a84fdbd6449e8c0d32601be80db2345d",
}


def files(name: str) -> dict[str, Path]:
    return {"train": DATA / f"{name}_train.jsonl", "test": DATA / f"{name}_test.jsonl"}


def write(name: str) -> dict[str, str]:
    generate = LOGS[name][0]
    paths = files(name)
    paths["train"].parent.mkdir(parents=True, exist_ok=True)
    parts = {"train": generate(TRAIN_N, TRAIN_LENGTHS, 0),
             "test": [r for k, d in enumerate(TEST_LENGTHS) for r in generate(TEST_N, (d, d), 1 + k)]}
    digests = {}
    for split, records in parts.items():
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in records))
        digests[split] = hashlib.sha256(paths[split].read_bytes()).hexdigest()
        expected = SHA256.get(f"{name}_{split}")
        if expected is not None and expected != digests[split]:
            raise SystemExit(f"{paths[split]}: sha256 {digests[split]}, expected {expected}: the generator changed")
    return digests


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    for name, (_, operations, state) in LOGS.items():
        if args.list:
            print(f"{name}: --operations_column {operations} --state_column {state}; {files(name)}")
            continue
        print(name, json.dumps(write(name)))


if __name__ == "__main__":
    main()
