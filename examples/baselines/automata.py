"""Classical passive automata learning on PAR's recorded data: AALpy's RPNI and GSM state merging.

The reference a user with a clean symbolic log should see beside PAR: a Moore machine learned from the records by
state merging (AALpy 2.0: `run_RPNI(data, automaton_type="moore", algorithm="classic")`, or generalized state merging
`run_GSM(data, output_behavior="moore")`). The operations are its input alphabet (each operation string one input
symbol, exactly as `train_par.py` reads them: the same files, column flags and delimiter, `state_tracking.records`),
the states its Moore outputs (a mapping state is one output: the tuple of its labels in query order). With step
states every prefix of a record is one sample (prefix, state after it); with final states only, each record is one
sample (operations, final state). An initial-state column becomes a first input symbol ``init=<labels>``.

    python examples/baselines/automata.py --train_file data/train.csv --test_file data/test.csv \
        --algorithm rpni --results_json results/x.json

Scored like PAR and the RNN baselines, on exactly the records they score (the encoded split: a record
``--skip_bad_records`` skipped is neither learned from nor scored): overall state accuracy (every query right) per
sequence length of the test split (else the validation split), in the same JSON shape (`per_depth`: depth, n,
accuracy); a record whose path leaves the learned machine (an input it never saw from that state) counts as wrong.
Writes the learned state count, the learning seconds, the records used and the command. Needs the optional extra:
``pip install -e ".[automata]"``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from par_cli.cli import run_cli  # noqa: E402
from par_cli.record_flags import RecordFlags, add_record_flags, with_record_flags  # noqa: E402
from state_tracking.evaluation import command_line, repo_relative  # noqa: E402
from state_tracking.records import ReadOptions, RecordColumns, read_record_splits  # noqa: E402

ALGORITHMS = ("rpni", "gsm")


def parse_args(argv=None, records: RecordFlags | None = None) -> argparse.Namespace:
    """The command line; `records`, train_par.py's parsed record flags (`--baselines`), replaces its record flags."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="rpni",
                        help="rpni: AALpy's classic RPNI; gsm: generalized state merging (faster)")
    add_record_flags(parser.add_argument_group("recorded data", "the flags and meaning of examples/train_par.py "
                                               "(par_cli.record_flags)"))
    parser.add_argument("--seed", type=int, default=0, help="the validation split's seed")
    parser.add_argument("--results_json", default=None)
    args = with_record_flags(parser.parse_args(argv), records)
    if args.train_file is None and args.dataset_name is None:
        parser.error("give --train_file or --dataset_name (the records to learn from)")
    return args


def encoded_records(encoded, record_format) -> list[tuple[tuple, list]]:
    """The records of an encoded split (`read_record_splits`: exactly the records PAR and the RNN baselines train on
    or score, the skipped ones left out) as [(inputs, states)]: the operations' strings (after ``init=<labels>`` where
    the records carry an initial state) and the state after each operation, a tuple of labels in query order (None
    where not recorded)."""
    operations, labels = record_format.operations, record_format.candidates
    table = encoded.data.table
    out = []
    for ops, rows in zip(table.column("ops").to_pylist(), table.column("step_labels").to_pylist()):
        head = [f"init={','.join(labels[c] for c in rows[0])}"] if record_format.initial_state else []
        states = [None if min(row) < 0 else tuple(labels[c] for c in row) for row in rows[1:]]  # -100: unrecorded
        out.append((tuple(head + [operations[o] for o in ops]), states))
    return out


def samples(encoded, record_format, step_states: bool) -> list[tuple[tuple, tuple]]:
    """AALpy's passive data: [(inputs, output)], one per record (final states) or per prefix (step states)."""
    out = []
    for inputs, states in encoded_records(encoded, record_format):
        head = len(inputs) - len(states)
        for k, state in enumerate(states, start=1):
            if (step_states or k == len(states)) and state is not None:
                out.append((inputs[:head + k], state))
    return out


def learn(data: list, algorithm: str):
    try:
        from aalpy.learning_algs import run_GSM, run_RPNI
    except ImportError:
        raise ValueError("examples/baselines/automata.py needs AALpy: pip install -e \".[automata]\" (or pip install "
                         "aalpy)") from None
    if algorithm == "rpni":
        model = run_RPNI(data, automaton_type="moore", algorithm="classic", print_info=False)
    else:
        model = run_GSM(data, output_behavior="moore")
    if model is None:
        raise ValueError("the records are not deterministic (one sequence of operations leads to two states): no "
                         "Moore machine fits them")
    return model


def run(model, inputs: tuple):
    """The learned machine's output after `inputs`, or None where its path leaves the machine."""
    state = model.initial_state
    for symbol in inputs:
        state = state.transitions.get(symbol)
        if state is None:
            return None
    return state.output


def score(model, encoded, record_format) -> list[dict]:
    """Overall state accuracy of the final state per length, over exactly the records of the encoded split (those PAR
    and the RNN baselines score; a record `--skip_bad_records` skipped is not scored)."""
    by_depth: dict[int, list[bool]] = {}
    for inputs, states in encoded_records(encoded, record_format):
        by_depth.setdefault(len(states), []).append(run(model, inputs) == states[-1])
    return [{"depth": d, "n": len(v), "accuracy": float(np.mean(v))} for d, v in sorted(by_depth.items())]


def main(argv=None, records: RecordFlags | None = None) -> dict:
    args = parse_args(argv, records)
    columns = RecordColumns(args.operations_column, args.state_column, args.step_states_column,
                            args.initial_state_column, args.operation_delimiter)
    started = time.time()
    records = read_record_splits(columns, args.train_file, args.validation_file, args.test_file, args.dataset_name,
                                 args.dataset_config_name, args.skip_bad_records, args.max_train_samples,
                                 validation_split_percentage=args.validation_split_percentage, seed=args.seed,
                                 options=ReadOptions())
    from state_tracking.records import has_step_states

    step_states = has_step_states(records.train)
    data = samples(records.encoded, records.record_format, step_states)
    read_seconds = time.time() - started
    started = time.time()
    model = learn(data, args.algorithm)
    learn_seconds = time.time() - started
    splits = {name: {"sources": [repo_relative(p) for p in loaded.sources],
                     "per_depth": score(model, encoded, records.record_format)}
              for name, (loaded, encoded) in records.splits.items()}
    eval_split = "test" if "test" in splits else "validation" if "validation" in splits else None
    per_depth = splits[eval_split]["per_depth"] if eval_split else []
    for row in per_depth:
        print(f"| {row['depth']} | {row['n']} | {row['accuracy']:.4f} |", flush=True)
    results = {
        "method": args.algorithm, "task": records.record_format.task_name, "labels": "step" if step_states else "final",
        "num_states": len(model.states), "samples": len(data), "train_records": len(records.encoded),
        "read_seconds": round(read_seconds, 2), "train_seconds": round(learn_seconds, 3),
        "eval_split": eval_split, "depths": [r["depth"] for r in per_depth],
        "accuracy": [r["accuracy"] for r in per_depth], "per_depth": per_depth, "splits": splits,
        "skipped": {k: len(v) for k, v in records.skipped.items()},
        "command": command_line(__file__, sys.argv[1:] if argv is None else argv),
        "machine": {"processor": platform.processor() or platform.machine(), "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if args.results_json:
        Path(args.results_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results_json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    run_cli(main)
