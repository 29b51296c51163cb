"""A user's log with only the data flags (issue 51): `train_par.py --train_file … --test_file … --seed S --baselines
lstm,rpni` and nothing else, per log and seed — the recipe chosen from the records (`--recipe auto`, the default), the
6,000-step budget, then the LSTM (`examples/baselines/rnn.py` defaults) and RPNI (AALpy) on the same files in the same
command, so that the three are timed under the same machine load.

    python examples/studies/own_data.py --make_data --machine M          # the study's machines (runs/own_data/data/)
    python examples/studies/defaults.py --make_data                      # the new logs below, register3 at 1,000
    python examples/studies/defaults.py --log register3 --seed 0         # one run: results/own_data_cpu/defaults/
    python examples/studies/defaults.py --all --seeds 0,1,2 --jobs 2      # every log and seed not yet recorded
    python examples/studies/defaults.py --collect                        # results/own_data_cpu/defaults.md
    python examples/studies/defaults.py --log counters4 --variant long_budget --seed 0   # a miss's cause, PAR only
    python examples/studies/defaults.py --per_length superseded/counters4_s0   # a run's accuracy per length

Logs (`LOGS`): the final-states files of results/own_data_cpu (register3, batch_process, swap-S5 final mappings,
var_swap5, and register3's first 1,000 records) and two written for this study, neither used to choose a rule:
- `elevator` (free text, 16 states): a lift controller's log — floor 1..4, doors open / closed, normal / maintenance
  mode — whose events (moves and doors common, service mode rarer, a fire recall rare) are sentences in three
  wordings each ("The car went up one floor.", "Lift moved up a floor.", ...); every record starts from the lobby,
  doors closed, normal; lengths 1..16; the state is the mapping {floor, doors, mode}.
- `counters4` (4 variables of 0..2, 81 states): statements a program logged — four initial assignments (`a = 2`) then
  increments modulo 3 (`c = (c + 1) % 3`), copies (`b = d`), resets (`a = 0`) and swaps (`a, d = d, a`); 1..16
  operations after the assignments (so no record is shorter than 5 statements); the state is the mapping of the four.
Each test file: 1,024 records at 16, 64 and 256 operations (var_swap5 and counters4: plus their initial assignments).
Variants (`VARIANTS`, `--variant V`): the same command with a few flags added, PAR only unless they name
`--baselines`, to measure what a miss is owed to or what cuts PAR's time; their records go to
results/own_data_cpu/defaults/variants/ (with the curriculum's progress over the steps) and never into the defaults
table.
RPNI is not run on swap_s5, var_swap5 and counters4: it did not finish in 834 s (swap_s5, 15,200 records), 150 s
(var_swap5) and 300 s (counters4, 1,000 records).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

from par_cli.flag_values import true_or_false  # noqa: E402
from par_studies import REPO, argv, load_records, mean_sd, repo_module, run_logged, splice_table
from state_tracking.evaluation import repo_relative

DATA = REPO / "runs" / "own_data" / "data"
RUNS = REPO / "runs" / "own_data" / "defaults"
RESULTS = REPO / "results" / "own_data_cpu"
TRAIN_N, TEST_N, TRAIN_LENGTHS, TEST_LENGTHS = 16000, 1024, (1, 16), (16, 64, 256)
SMALL_N = 1000

# log -> its files (under runs/own_data/data), the columns it names, and its test lengths (16x is the last)
LOGS = {
    "register3": dict(train="register3_final.jsonl", test="register3_test.csv"),
    "batch_process": dict(train="batch_process_final.jsonl", test="batch_process_test.csv"),
    # RPNI (AALpy, pure Python) did not finish on swap-S5's 15,200 records in 834 s (killed; 2026-12-05), nor on
    # var_swap5 in 150 s (README.md): the LSTM only
    "swap_s5": dict(train="swap_s5_final.jsonl", test="swap_s5_test.csv", baselines="lstm"),
    "var_swap5": dict(train="var_swap5_final.jsonl", test="var_swap5_test.jsonl", test_lengths=(21, 69, 261),
                      columns={"--operations_column": "history", "--state_column": "state"}, baselines="lstm"),
    "register3_1000": dict(train="register3_final_n1000.jsonl", test="register3_test.csv"),
    "elevator": dict(train="elevator_final.jsonl", test="elevator_test.jsonl",
                     columns={"--operations_column": "events", "--state_column": "status"}),
    # RPNI did not finish on counters4 in 300 s from its first 1,000 records (577 MB; measured 2026-12-05, one thread):
    # the LSTM only
    "counters4": dict(train="counters4_final.jsonl", test="counters4_test.jsonl", test_lengths=(20, 68, 260),
                      columns={"--operations_column": "statements", "--state_column": "values"}, baselines="lstm"),
}


def new_log_spec(name: str, **extra) -> dict:
    """A `LOGS` entry for one of `examples/studies/new_logs.py`'s logs: its files (relative to `DATA`) and columns as
    that script writes and names them."""
    new_logs = repo_module("examples.studies.new_logs")
    _, operations, state = new_logs.LOGS[name]
    return {**{kind: os.path.relpath(path, DATA) for kind, path in new_logs.files(name).items()},
            "columns": {"--operations_column": operations, "--state_column": state}, **extra}


# issue 71 (0c): the three logs no rule was chosen on (new_logs.py writes them and checks their sha256), read once;
# bool_swap5's records open with five assignments (test 21 / 69 / 261 statements) and, like var_swap5, run the LSTM only
LOGS.update(bool_swap5=new_log_spec("bool_swap5", test_lengths=(21, 69, 261), baselines="lstm"),
            reset_counter=new_log_spec("reset_counter"), regular_check=new_log_spec("regular_check"))

LOAD = "two runs at a time"  # what else ran beside each run; PAR_LOAD in the environment says otherwise
# variant -> (what it asks, the flags added to the data flags); PAR only unless its flags name --baselines
VARIANTS = {
    "long_budget": ("is the miss the step budget? 15,000 steps instead of the default 6,000", {"--max_steps": "15000"}),
    # the recipe the rules chose on the logs whose records start short (register3, batch_process, swap-S5, elevator)
    "feedback": ("is the miss the refused answer feedback? the feedback recipe (h64 1 + 1 + 1, answer feedback, fast "
                 "curriculum, one token per statement) forced",
                 {"--answer_feedback": "true", "--hidden_size": "64", "--intermediate_size": "128",
                  "--prelude_layers": "1", "--core_layers": "1", "--coda_layers": "1", "--operation_tokens": "whole",
                  "--compile_core": "false"}),
    # issue 71 (0b): the recipe measured on the run's own validation split instead of inferred (par_cli.recipe_race)
    "race": ("does racing the rules' recipe against its answer-feedback opposite and the fixed defaults (200 steps "
             "each, successive halving, the winner resumed) pick better than the rules?", {"--recipe": "race"}),
    "race_500": ("does a longer race (500 steps in the first round, 1,000 in the second) pick better?",
                 {"--recipe": "race", "--race_steps": "500"}),
    # issue 71 (3): the records step is dispatch-bound (benchmarks/bench_records_step.py: at d = 16 a batch of 256
    # costs PAR ~2x a batch of 64, the LSTM ~4x), so fewer, larger steps may cut PAR's time; the LSTM (rnn.py's
    # defaults, batch 64) runs in the same command, so the ratio is measured under one load
    "batch256": ("do 4x larger batches (256, the learning rate kept) cut PAR's time to the result?",
                 {"--per_device_train_batch_size": "256", "--baselines": "lstm"}),
    "batch256_lr2e-3": ("do 4x larger batches with the learning rate doubled (2e-3) cut PAR's time to the result?",
                        {"--per_device_train_batch_size": "256", "--learning_rate": "2e-3", "--baselines": "lstm"}),
    # batch256 took as many steps as batch 64 (register3 s0: 1,250 against 1,500): the curriculum's pace and the probe
    # are counted in steps, not examples; here both are scaled by 64 / 256 (register3 s0: unstable, stopped at step
    # 3,279 with the curriculum at 14; results/own_data_cpu/defaults.md)
    # issue 71 (2-3): every iteration reads c operations (`--step_size`), so a record of d operations runs ceil(d / c)
    # iterations: about 1 / c of the step's tensor operations, if the harder step map is still learned
    "step2": ("does reading two operations per iteration (--step_size 2: half the iterations) cut PAR's time to the "
              "result?", {"--step_size": "2", "--baselines": "lstm"}),
    "batch256_pace": ("4x larger batches with the step-counted schedule scaled by 1/4 (curriculum every 5 steps, probe "
                      "every 63, warm-up 25)?",
                      {"--per_device_train_batch_size": "256", "--curriculum_every_steps": "5",
                       "--probe_every_steps": "63", "--warmup_steps": "25", "--baselines": "lstm"}),
}

# ---- the elevator log: 4 floors x doors x mode = 16 states, free-text events in three wordings each ----
ELEVATOR_EVENTS = {
    "up": ("The car went up one floor.", "Lift moved up a floor.", "Elevator ascended one level."),
    "down": ("The car went down one floor.", "Lift moved down a floor.", "Elevator descended one level."),
    "open": ("Doors opened.", "The doors open at this floor.", "Door sensor reports doors open."),
    "close": ("Doors closed.", "The doors shut.", "Door sensor reports doors closed."),
    "service_on": ("Maintenance key turned on.", "Technician switched the car to service mode.",
                   "Service mode engaged."),
    "service_off": ("Maintenance key turned off.", "Technician returned the car to normal service.",
                    "Service mode released."),
    "fire": ("Fire recall: car sent to the lobby.", "Fire alarm recalled the lift to floor 1.",
             "Emergency recall to the ground floor."),
}
# how often each event occurs (a log's mix: moves and doors common, service mode rarer, a fire recall rare)
ELEVATOR_WEIGHTS = {"up": 0.24, "down": 0.18, "open": 0.2, "close": 0.2, "service_on": 0.07, "service_off": 0.07,
                    "fire": 0.04}


def elevator_step(state: tuple, event: str) -> tuple:
    """(floor 1..4, doors "open"/"closed", mode "normal"/"service") after `event`: the car moves one floor only with
    the doors closed in normal mode (not past 1 or 4); doors open or close in any mode; fire recall sends the car to
    floor 1 with the doors open in normal mode."""
    floor, doors, mode = state
    if event in ("up", "down"):
        if doors == "closed" and mode == "normal":
            floor = min(4, floor + 1) if event == "up" else max(1, floor - 1)
        return floor, doors, mode
    if event in ("open", "close"):
        return floor, "open" if event == "open" else "closed", mode
    if event in ("service_on", "service_off"):
        return floor, doors, "service" if event == "service_on" else "normal"
    return 1, "open", "normal"  # fire recall


def elevator_records(n: int, lengths: tuple[int, int], seed: int) -> list[dict]:
    """`n` elevator records: `events` the sentences (events drawn by `ELEVATOR_WEIGHTS`, wordings uniform),
    `status` the final state."""
    import numpy as np

    rng = np.random.default_rng(seed)
    names = list(ELEVATOR_EVENTS)
    records = []
    for _ in range(n):
        state, events = (1, "closed", "normal"), []
        for _ in range(int(rng.integers(lengths[0], lengths[1] + 1))):
            event = names[int(rng.choice(len(names), p=[ELEVATOR_WEIGHTS[name] for name in names]))]
            state = elevator_step(state, event)
            events.append(ELEVATOR_EVENTS[event][int(rng.integers(3))])
        records.append({"events": events, "status": {"floor": str(state[0]), "doors": state[1], "mode": state[2]}})
    return records


# ---- the counters4 log: 4 variables of 0..2 = 81 states, assignment / increment / copy / reset / swap statements ----
COUNTERS = ("a", "b", "c", "d")


def counters_records(n: int, lengths: tuple[int, int], seed: int) -> list[dict]:
    """`n` counters4 records: `statements` the four initial assignments then the operations (kind uniform among
    increment, copy, reset, swap; variables uniform), `values` the final values (as strings)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        values = [int(v) for v in rng.integers(0, 3, len(COUNTERS))]
        statements = [f"{name} = {value}" for name, value in zip(COUNTERS, values)]
        for _ in range(int(rng.integers(lengths[0], lengths[1] + 1))):
            kind = int(rng.integers(4))
            i, j = (int(k) for k in rng.choice(len(COUNTERS), 2, replace=False))
            x, y = COUNTERS[i], COUNTERS[j]
            if kind == 0:
                values[i] = (values[i] + 1) % 3
                statements.append(f"{x} = ({x} + 1) % 3")
            elif kind == 1:
                values[i] = values[j]
                statements.append(f"{x} = {y}")
            elif kind == 2:
                values[i] = 0
                statements.append(f"{x} = 0")
            else:
                values[i], values[j] = values[j], values[i]
                statements.append(f"{x}, {y} = {y}, {x}")
        records.append({"statements": statements, "values": {k: str(v) for k, v in zip(COUNTERS, values)}})
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def make_data() -> None:
    """The new logs (train: 16,000 records of 1..16 operations, seed 0; test: 1,024 at each of 16, 64, 256
    operations, seeds 1, 2, 3) and register3's first 1,000 training records."""
    for name, writer in (("elevator", elevator_records), ("counters4", counters_records)):
        write_jsonl(DATA / LOGS[name]["train"], writer(TRAIN_N, TRAIN_LENGTHS, seed=0))
        write_jsonl(DATA / LOGS[name]["test"], [r for k, d in enumerate(TEST_LENGTHS)
                                                for r in writer(TEST_N, (d, d), seed=1 + k)])
    source = DATA / LOGS["register3"]["train"]
    if not source.is_file():
        raise SystemExit(f"{source} is missing: run python examples/studies/own_data.py --make_data --machine "
                         "register3 first")
    lines = source.read_text().splitlines()[:SMALL_N]
    (DATA / LOGS["register3_1000"]["train"]).write_text("\n".join(lines) + "\n")
    print(f"wrote the elevator, counters4 and register3_1000 files under {repo_relative(DATA)}")


GENERATORS = {"elevator": elevator_records, "counters4": counters_records}
PER_LENGTH = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16)  # operations (counters4: after its four assignments)
PER_LENGTH_N = 256


def per_length(run_name: str) -> dict:
    """Where a run fails: its checkpoint on fresh records of each length of `PER_LENGTH` (a generated log's own
    generator, seed 7; `PER_LENGTH_N` per length), through examples/evaluate_par.py --test_file. A run whose accuracy
    falls off just past the longest length its curriculum reached fails to extrapolate; one that is wrong within it
    did not learn. Record: results/own_data_cpu/defaults/variants/<run>_per_length.json."""
    log = next((name for name in GENERATORS if Path(run_name).name.startswith(name + "_")), None)
    if log is None:
        raise SystemExit(f"--per_length: {run_name!r} is not a run of a generated log ({', '.join(GENERATORS)})")
    folder = RUNS / run_name
    if not (folder / "config.json").is_file():
        raise SystemExit(f"--per_length: {repo_relative(folder)} holds no trained checkpoint")
    test = folder / "per_length_test.jsonl"
    write_jsonl(test, [r for k, d in enumerate(PER_LENGTH) for r in GENERATORS[log](PER_LENGTH_N, (d, d), seed=7 + k)])
    out = folder / "per_length_eval.json"
    columns = LOGS[log].get("columns", {})
    command = ["python", "examples/evaluate_par.py", "--model", repo_relative(folder), "--test_file",
               repo_relative(test), *argv(columns), "--out", repo_relative(out)]
    run_logged(command, folder / "per_length.log")
    evaluation = json.loads(out.read_text())
    summary = json.loads((folder / "summary.json").read_text())
    rows = evaluation["per_depth"]
    record = {"run": run_name, "command": " ".join(command), "steps": summary["steps"],
              "curriculum": curriculum_progress(summary.get("curve") or []),
              "accuracy": {str(row["depth"]): row["accuracy"] for row in rows},
              "per_query_accuracy": {str(row["depth"]): row.get("per_query_accuracy") for row in rows},
              "n_per_length": PER_LENGTH_N,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path = RESULTS / "defaults" / "variants" / f"{run_name.replace('/', '_')}_per_length.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["accuracy"]))
    return record


def curriculum_progress(curve: list[dict]) -> list[list[int]]:
    """[step, d_max] at each logged step where the curriculum's cap changed (the first logged step included)."""
    progress: list[list[int]] = []
    for point in curve:
        cap = point.get("curriculum_max_depth")
        if cap is not None and (not progress or round(cap) != progress[-1][1]):
            progress.append([int(point["step"]), round(cap)])
    return progress


def run(log: str, seed: int, variant: str | None = None, rerecord: bool = False) -> dict:
    """One run: train_par.py with only the data flags and --baselines lstm,rpni; its record under
    results/own_data_cpu/defaults/. With `variant`: the variant's flags added, PAR only unless they name --baselines,
    its record under defaults/variants/. `rerecord`: the record written again from the run's folder (its
    summary.json), not trained again (its wall_seconds is then the training's own seconds)."""
    spec = LOGS[log]
    name = f"{log}_s{seed}" if variant is None else f"{log}_{variant}_s{seed}"
    folder = RUNS / name
    for kind in ("train", "test"):
        if not (DATA / spec[kind]).is_file():
            raise SystemExit(f"{DATA / spec[kind]} is missing: run --make_data, own_data.py --make_data and "
                             "new_logs.py (LOGS says which writes it)")
    flags = {"--train_file": repo_relative(DATA / spec["train"]), "--test_file": repo_relative(DATA / spec["test"]),
             **spec.get("columns", {}), "--seed": str(seed), "--baselines": spec.get("baselines", "lstm,rpni"),
             "--output_dir": repo_relative(folder), "--disable_tqdm": "true"}
    if variant is not None:
        del flags["--baselines"]
        flags.update(VARIANTS[variant][1])
    command = ["python", "examples/train_par.py", *argv(flags)]
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if not (rerecord and (folder / "summary.json").is_file()):
        run_logged(command, folder / "train.log")
    summary = json.loads((folder / "summary.json").read_text())
    recipe = summary["recipe"]
    if summary.get("baselines"):
        rows = {row["method"]: row for row in summary["baselines"]["rows"]}
    else:
        evaluation = json.loads((folder / "eval_test.json").read_text())
        rows = {"PAR": {"accuracy": {str(d): a for d, a in zip(evaluation["depths"], evaluation["accuracy"])},
                        "train_seconds": summary["train_seconds"], "steps": summary["steps"]}}
    record = {
        "log": log, "seed": seed, **({} if variant is None else {"variant": variant, "asks": VARIANTS[variant][0]}),
        "command": " ".join(command), "steps": summary["steps"],
        "stopped_by": summary.get("stopped_by"), "recipe": {k: recipe[k] for k in ("chosen", "reasons", "notes")},
        "records": None if recipe.get("statistics") is None else {  # a race won by the defaults, before 2026-12-07
            k: recipe["statistics"][k] for k in ("records", "shortest", "longest", "state_shape", "labels",
                                                 "whole_state", "distinct_operations", "words_per_operation",
                                                 "min_operation_repeats")},
        "race": recipe.get("race"),
        "methods": {name: {k: row.get(k) for k in ("accuracy", "train_seconds", "steps", "states", "error")}
                    for name, row in rows.items()},
        "curriculum": curriculum_progress(summary.get("curve") or []),
        "probes": summary.get("probe"),
        "wall_seconds": round(summary["train_seconds"] if rerecord else time.time() - started, 1),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs), one thread, {os.environ.get('PAR_LOAD', LOAD)}",
    }
    out = RESULTS / "defaults" / ("" if variant is None else "variants") / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"log": log, "seed": seed, "steps": record["steps"],
                      **{m: [v["accuracy"], v["train_seconds"]] for m, v in record["methods"].items()}}))
    return record


def run_all(seeds: list[int], jobs: int, logs: list[str] | None = None) -> None:
    """Every (seed, log) of `logs` (default all) without a record, seed by seed, `jobs` runs at a time (each its own
    process, one thread)."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    todo = [(log, seed) for seed in seeds for log in (logs or LOGS)
            if not (RESULTS / "defaults" / f"{log}_s{seed}.json").is_file()]

    def one(job: tuple[str, int]) -> int:
        log, seed = job
        claim = RUNS / f"{log}_s{seed}.claim"  # another --all started this run: leave it to that one
        RUNS.mkdir(parents=True, exist_ok=True)
        try:
            claim.open("x").close()
        except FileExistsError:
            print(f"skip {log} seed {seed}: {repo_relative(claim)} exists (another --all runs it)", flush=True)
            return 0
        print(f"start {log} seed {seed}", flush=True)
        code = subprocess.run([sys.executable, __file__, "--log", log, "--seed", str(seed)], cwd=REPO).returncode
        print(f"end {log} seed {seed}: exit {code}", flush=True)
        if code:
            claim.unlink()  # failed: a later --all may try again
        return code

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        codes = list(pool.map(one, todo))
    if any(codes):
        raise SystemExit(f"{sum(1 for c in codes if c)} of {len(todo)} runs failed")


def recipe_label(chosen: dict) -> str:
    """The chosen flags in a few words: model size, then each rule that changed a default."""
    size = f"h{chosen.get('hidden_size', 128)} {chosen.get('prelude_layers', 1)}+{chosen.get('core_layers', 2)}+" \
           f"{chosen.get('coda_layers', 1)}"
    words = [size]
    if chosen.get("answer_feedback"):
        words.append("feedback")
    if "grad_window" in chosen:
        words.append(f"grad window {chosen['grad_window']}, weight decay {chosen['weight_decay']}")
    if chosen.get("curriculum_window") == 5:
        words.append("fast curriculum")
    elif "curriculum_advance_accuracy" in chosen:
        words.append(f"fixed pace (+1 every {chosen['curriculum_every_steps']} steps)")
    if chosen.get("operation_tokens") == "whole":
        words.append("one token per statement")
    if "adam_beta2" in chosen:
        words.append(f"β2 {chosen['adam_beta2']}")
    if chosen.get("compile_core") == "false":
        words.append("eager")
    return ", ".join(words)


def at_16x(record: dict, method: str) -> float:
    spec = LOGS[record["log"]]
    accuracy = record["methods"].get(method, {}).get("accuracy") or {}
    return float(accuracy.get(str(spec.get("test_lengths", TEST_LENGTHS)[-1]), float("nan")))


def seed_verdict(record: dict, goal: float = 0.99, ratio_goal: float = 2.0) -> str:
    """One seed against the goal: "accuracy" (PAR under `goal` at 16x), "met: the LSTM misses 99%" (PAR at the goal,
    the LSTM not: it never reaches the result, so no time to compare), "met" (both at the goal, PAR in at most
    `ratio_goal` times the LSTM's seconds) or "time" (both at the goal, PAR slower than that)."""
    if at_16x(record, "PAR") < goal:
        return "accuracy"
    if at_16x(record, "LSTM") < goal:
        return "met: the LSTM misses 99%"
    ratio = record["methods"]["PAR"]["train_seconds"] / record["methods"]["LSTM"]["train_seconds"]
    return "met" if ratio <= ratio_goal else "time"


TABLE_START, TABLE_END = "<!-- defaults table: generated by --collect -->", "<!-- end of the defaults table -->"


def collect(goal: float = 0.99, ratio_goal: float = 2.0) -> str:
    """results/own_data_cpu/defaults.md: per log, the recipe chosen (as the first seed's log wrote it), PAR / LSTM /
    RPNI accuracy at 16x (mean ± sd over the seeds) and training seconds (mean), the PAR / LSTM time ratio, and
    how many seeds meet the goal (`seed_verdict`), and why the others do not."""
    import numpy as np

    records = load_records(RESULTS / "defaults")
    lines = ["| log | state / training records | seeds | recipe chosen | steps PAR / LSTM | PAR 16× % | LSTM 16× % | "
             "RPNI 16× % (states) | PAR s | LSTM s | RPNI s | ms per step PAR / LSTM | PAR / LSTM time | "
             "seeds at the goal |",
             "|---" * 14 + "|"]
    for log in LOGS:
        group = sorted((r for r in records if r["log"] == log), key=lambda r: r["seed"])
        if not group:
            continue
        cells = {m: mean_sd([at_16x(r, m) for r in group], digits=2) for m in ("PAR", "LSTM", "RPNI")}
        seconds = {m: float(np.mean([r["methods"][m]["train_seconds"] if m in r["methods"] else np.nan
                                     for r in group])) for m in ("PAR", "LSTM", "RPNI")}
        ratio = seconds["PAR"] / seconds["LSTM"]
        verdicts = [seed_verdict(r, goal, ratio_goal) for r in group]
        met = f"{sum(v.startswith('met') for v in verdicts)} of {len(group)}" + "".join(
            f"; {label}: {verdicts.count(why)}" for why, label in (
                ("met: the LSTM misses 99%", "the LSTM under 99%"), ("time", "missed on time"),
                ("accuracy", "missed on accuracy")) if why in verdicts)
        stats = group[0]["records"]
        states = "/".join(sorted({str(r["methods"].get("RPNI", {}).get("states")) for r in group}))
        steps = " · ".join(f"{r['steps']}/{r['methods']['LSTM']['steps']}" for r in group)
        per_step = [1000 * float(np.mean([r["methods"][m]["train_seconds"] / r["methods"][m]["steps"] for r in group]))
                    for m in ("PAR", "LSTM")]
        lines.append(" | ".join([
            f"| {log}", f"{stats['state_shape']} / {stats['records']}", ",".join(str(r["seed"]) for r in group),
            recipe_label(group[0]["recipe"]["chosen"]), steps, cells["PAR"], cells["LSTM"],
            "not run" if "RPNI" not in group[0]["methods"] else f"{cells['RPNI']} ({states})",
            f"{seconds['PAR']:.0f}", f"{seconds['LSTM']:.0f}", f"{seconds['RPNI']:.0f}",
            f"{per_step[0]:.0f} / {per_step[1]:.0f}", f"{ratio:.1f}×", met]) + " |")
    table = "\n".join(lines)
    if not splice_table(RESULTS / "defaults.md", TABLE_START, TABLE_END, table):
        print(f"note: {repo_relative(RESULTS / 'defaults.md')} has no table markers; the table is printed only")
    print(table)
    return table


def main(args=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make_data", type=true_or_false, nargs="?", const=True, default=False)
    parser.add_argument("--log", choices=list(LOGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rerecord", action="store_true",
                        help="with --log: the run's record written again from its folder's summary.json")
    parser.add_argument("--variant", choices=list(VARIANTS), default=None,
                        help="with --log: the variant's flags added, PAR only unless they name --baselines "
                        "(records under defaults/variants/)")
    parser.add_argument("--per_length", default=None, metavar="RUN",
                        help="a run of a generated log (a folder under runs/own_data/defaults, e.g. counters4_s0 or "
                             "superseded/counters4_s0) on fresh records of each length")
    parser.add_argument("--collect", type=true_or_false, nargs="?", const=True, default=False)
    parser.add_argument("--all", type=true_or_false, nargs="?", const=True, default=False,
                        help="every log and seed of --seeds that has no record yet")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for --all")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time for --all (one thread each)")
    parser.add_argument("--logs", default=None, help="comma-separated logs for --all (default: every log)")
    parsed = parser.parse_args(args)
    if parsed.jobs < 1:
        parser.error(f"--jobs must be >= 1; got {parsed.jobs}")
    if parsed.make_data:
        make_data()
    elif parsed.all:
        logs = None if parsed.logs is None else parsed.logs.split(",")
        unknown = sorted(set(logs or []) - set(LOGS))
        if unknown:
            parser.error(f"--logs: unknown {', '.join(unknown)}; the logs are {', '.join(LOGS)}")
        run_all([int(seed) for seed in parsed.seeds.split(",")], parsed.jobs, logs)
    elif parsed.collect:
        collect()
    elif parsed.per_length:
        per_length(parsed.per_length)
    elif parsed.log:
        run(parsed.log, parsed.seed, parsed.variant, parsed.rerecord)
    else:
        parser.error("give --make_data, --collect, --all, or --log L [--seed S]")


if __name__ == "__main__":
    main()
