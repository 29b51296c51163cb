"""The tiny machine the records tests share: a counter mod 3 ("up" +1, "down" -1, "hold" +0) from "zero", its states
named; records drawn from it, written as a CSV with step states (columns `ops`, `states`)."""

import csv

OPS = {"up": 1, "down": -1, "hold": 0}
NAMES = ("zero", "one", "two")


def draw(rng, length) -> tuple[list[str], list[str]]:
    """One record of `length` operations drawn with `rng`: its operations and the state after each."""
    ops = [str(o) for o in rng.choice(list(OPS), size=int(length))]
    states, state = [], 0
    for op in ops:
        state = (state + OPS[op]) % 3
        states.append(NAMES[state])
    return ops, states


def write_csv(path, records, columns=("ops", "states"), delimiter=" ") -> str:
    """`records` ((ops, states) pairs) as a CSV with the two `columns`, each list joined by `delimiter`; returns the
    path as a string."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(list(columns))
        for ops, states in records:
            writer.writerow([delimiter.join(ops), delimiter.join(states)])
    return str(path)


def write_counter_csv(path, lengths, rng) -> str:
    """One record per length of `lengths`, drawn in order with `rng`, written by `write_csv`."""
    return write_csv(path, [draw(rng, length) for length in lengths])
