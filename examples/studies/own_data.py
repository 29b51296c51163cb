"""Own-data study: PAR and LSTM / GRU trained on records files, as a user with a log would train them.

Files are written by `examples/make_dataset.py` (train: lengths 1..16; test: 1,024 sequences at each of 16, 64, 256)
from four machines: the batch-process machine (`examples/tasks/batch_process.json`), swap-S5 (five boxes: a state
is a mapping box -> item), `register3` (three bits and five operations, two of them irreversible; written for this
study, `examples/tasks/register3.json`) and S5 with the state as one label among 120 (`--state_ids`: a tagging
file's state, no factorisation into boxes). Each machine has a step-states file and a final-states-only file.

    python examples/studies/own_data.py --make_data [--machine M]                  # runs/own_data/data/
    python examples/studies/own_data.py --machine register3 --row par_final --seed 0 [--train_n 1000]
    python examples/studies/own_data.py --extract --machine register3 --row par_final --seed 0
    python examples/studies/own_data.py --collect                                  # results/own_data_cpu/

Rows (`ROWS`): PAR with step states (`par_step`), PAR with final states only in its two modes (`par_final`:
final-answer training over the lengths present, `par_final_sd`: label-free prefix self-distillation), final-answer
training with one flag changed (`par_final_fast`: a faster mastery curriculum, `FAST_CURRICULUM`; `par_final_whole`:
one token per distinct statement, `--operation_tokens whole`; `par_final_whole_fast`: both), and LSTM / GRU of PAR's
size on either file. PAR rows run `train_par.py` with only the data flags (its default recipe and budget) and theirs;
RNN rows run `examples/baselines/rnn.py` with the same files. Each run writes one JSON under
results/own_data_cpu/runs/ (command, seed, steps, wall time, curve, accuracy per length); `--collect` writes the tables.
One thread per run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from par_cli.flag_values import true_or_false  # noqa: E402
from par_studies import REPO, SELF_DISTILL, Row, argv, combine, load_records, mean_sd, rows_by_name, run_logged
from state_tracking.evaluation import repo_relative

DATA = REPO / "runs" / "own_data" / "data"
RUNS = REPO / "runs" / "own_data"
RESULTS = REPO / "results" / "own_data_cpu"
TRAIN_LENGTHS, TEST_LENGTHS, TEST_N, TRAIN_N = "1-16", "16,64,256", 1024, 16000
TRAIN_SIZES = (250, 1000, 4000, 16000)

MACHINES = {  # name -> the task its files are written from; state_ids: the state as one label (make_dataset.py)
    "batch_process": dict(task="examples/tasks/batch_process.json"),
    "register3": dict(task="examples/tasks/register3.json"),
    "swap_s5": dict(task="swap_s5"),
    "s5_ids": dict(task="s5", state_ids=True),
    # a variable-tracking log as another project's generator writes it (`write_variable_swaps`): final mappings only,
    # in its own column names; tests at 4x and 16x the training length
    "var_swap5": dict(writer="variable_swaps", columns={"--operations_column": "history", "--state_column": "state"},
                      test_lengths=(21, 69, 261), swaps=(1, 16)),
    # the same log with every training record 16..21 statements long, as issue 38's file (no short record)
    "var_swap5_long": dict(writer="variable_swaps", columns={"--operations_column": "history",
                                                             "--state_column": "state"},
                           test_lengths=(21, 69, 261), swaps=(11, 16)),
}
VARIABLES = [f"x{i}" for i in range(5)]


def variable_swap_records(n: int, swaps: tuple[int, int], seed: int) -> list[dict]:
    """`n` records of a variable-tracking log: `history` the statements, the five initial assignments
    (``x0 = False`` ... ``x4 = True``, in order) then swaps written as Python tuple assignments (``x2, x4 = x4, x2``,
    either order), `state` the final values as a mapping of booleans ({"x0": false, ...})."""
    import numpy as np

    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        values = [bool(v) for v in rng.integers(0, 2, len(VARIABLES))]
        history = [f"{name} = {value}" for name, value in zip(VARIABLES, values)]
        for _ in range(int(rng.integers(swaps[0], swaps[1] + 1))):
            a, b = (int(i) for i in rng.choice(len(VARIABLES), 2, replace=False))
            values[a], values[b] = values[b], values[a]
            history.append(f"{VARIABLES[a]}, {VARIABLES[b]} = {VARIABLES[b]}, {VARIABLES[a]}")
        records.append({"history": history, "state": dict(zip(VARIABLES, values))})
    return records


def write_variable_swaps(machine: str) -> None:
    """A variable-swap machine's files: 16,000 training records of 5 assignments + `swaps` swaps (var_swap5: 6..21
    statements; var_swap5_long: 16..21; seed 0) and a test file with 1,024 records at each of 21, 69 and 261
    statements (5 assignments + 16, 64, 256 swaps; seeds 1, 2, 3), JSON Lines."""
    DATA.mkdir(parents=True, exist_ok=True)
    with open(data_file(machine, "final"), "w") as f:
        for record in variable_swap_records(TRAIN_N, MACHINES[machine]["swaps"], seed=0):
            f.write(json.dumps(record) + "\n")
    with open(data_file(machine, "test"), "w") as f:
        for k, length in enumerate(MACHINES[machine]["test_lengths"]):
            swaps = length - len(VARIABLES)
            for record in variable_swap_records(TEST_N, (swaps, swaps), seed=1 + k):
                f.write(json.dumps(record) + "\n")


@dataclass(frozen=True)
class OwnDataRow(Row):
    """file: the training file the row reads, "step" (step states) or "final" (final states only)."""

    file: str = "step"


# PAR (hidden 128, 1 + 2 + 1 layers) has about the parameters of an LSTM of hidden 288 or a GRU of hidden 336
# (results/paper_protocol_cpu: the same sizes at the paper's protocol). PAR rows: train_par.py with only the data flags
# (its default recipe and budget).
LSTM, GRU = {"--cell": "lstm", "--hidden": "288"}, {"--cell": "gru", "--hidden": "336"}
# the mastery test on the last 5 batches at d_max (not 20) and at least 20 steps apart (not 50): at a cap of 16 only
# one batch in ~16 has depth d_max, so the default window of 20 such batches holds d_max ~300 steps after mastery
FAST_CURRICULUM = {"--curriculum_window": "5", "--curriculum_every_steps": "20"}
H64 = {"--hidden_size": "64", "--intermediate_size": "128"}
SMALL = {**H64, "--prelude_layers": "1", "--core_layers": "1", "--coda_layers": "1"}  # a quarter of the parameters
WHOLE = {"--operation_tokens": "whole"}  # one token per distinct statement instead of its words
# the third pass's best recipe at 1,000 register3 records: a smaller core, the gradient through the whole record, more
# weight decay, the LSTM's fixed-pace curriculum, 4,000 steps, eager (results/own_data_cpu/README.md)
SMALL_REG = {**H64, "--grad_window": "16", "--weight_decay": "0.1", "--curriculum_advance_accuracy": "none",
             "--curriculum_every_steps": "100", "--max_steps": "4000", "--compile_core": "false"}
FEEDBACK = {"--answer_feedback": "true"}  # each iteration passes on only its soft answer (config.answer_feedback)
ROWS = rows_by_name(
    OwnDataRow.of("par_step", "PAR, step states", file="step"),
    OwnDataRow.of("par_final", "PAR, final states only (final-answer training)", file="final"),
    OwnDataRow.of("par_final_sd", "PAR, final states only (prefix self-distillation)", SELF_DISTILL, file="final"),
    OwnDataRow.of("par_final_fast", "PAR, final states only, fast mastery curriculum", FAST_CURRICULUM, file="final"),
    OwnDataRow.of("par_final_whole", "PAR, final states only, one token per statement", WHOLE, file="final"),
    OwnDataRow.of("par_final_whole_fast", "PAR, final states only, one token per statement, fast curriculum",
                  {**WHOLE, **FAST_CURRICULUM}, file="final"),
    # the same 6,000-step cap with twice the then-default 840 s (the records default has been steps only since
    # 2026-12-05): the budget was set on a day this machine ran steps about twice as fast (results/own_data_cpu)
    OwnDataRow.of("par_final_whole_fast_2x", "PAR, final states only, one token per statement, fast curriculum, "
                  "1,680 s", {**WHOLE, **FAST_CURRICULUM, "--max_train_seconds": "1680"}, file="final"),
    # the same with half the peak learning rate: at 1e-3 one var_swap5 seed collapses when the fast curriculum
    # reaches the longest records (results/own_data_cpu/README.md)
    OwnDataRow.of("par_final_whole_fast_2x_lr5e-4", "PAR, final states only, one token per statement, fast "
                  "curriculum, 1,680 s, learning rate 5e-4",
                  {**WHOLE, **FAST_CURRICULUM, "--max_train_seconds": "1680", "--learning_rate": "5e-4"},
                  file="final"),
    # the same with Adam's second-moment decay 0.95 (not 0.999): the collapse is a spike when longer records arrive
    # after a stretch of tiny gradients; a faster-tracking second moment is the usual remedy
    OwnDataRow.of("par_final_whole_fast_2x_b95", "PAR, final states only, one token per statement, fast "
                  "curriculum, 1,680 s, Adam beta2 0.95",
                  {**WHOLE, **FAST_CURRICULUM, "--max_train_seconds": "1680", "--adam_beta2": "0.95"}, file="final"),
    # a quarter of the parameters (hidden 64, 1 + 1 + 1 layers): a step costs about what the LSTM 288's step costs
    # (benchmarks/bench_records_step.py), so time to result is a question of steps
    OwnDataRow.of("par_final_small_fast", "PAR h64 1+1+1, final states only, fast mastery curriculum",
                  {**SMALL, **FAST_CURRICULUM}, file="final"),
    # the same two without torch.compile: --compile_core auto compiles a records run (6,000 steps, 840 s), and a
    # run that stops after ~2,000 steps may spend more time compiling (one graph per length) than it saves
    OwnDataRow.of("par_final_fast_eager", "PAR, final states only, fast mastery curriculum, eager",
                  {**FAST_CURRICULUM, "--compile_core": "false"}, file="final"),
    OwnDataRow.of("par_final_small_fast_eager", "PAR h64 1+1+1, final states only, fast mastery curriculum, eager",
                  {**SMALL, **FAST_CURRICULUM, "--compile_core": "false"}, file="final"),
    OwnDataRow.of("par_final_small_reg", "PAR h64, final states only, grad window 16, weight decay 0.1, fixed pace",
                  SMALL_REG, file="final"),
    # the same with answer feedback: a finite-state bottleneck for a state the answers name whole
    OwnDataRow.of("par_final_small_reg_fb", "PAR h64, final states only, grad window 16, weight decay 0.1, fixed pace, "
                  "answer feedback",
                  {**SMALL_REG, **FEEDBACK}, file="final"),
    # the quarter-size model on the swap log's stable recipe: one token per statement, fast curriculum, beta2 0.95
    OwnDataRow.of("par_final_whole_small_fast_b95", "PAR h64 1+1+1, final states only, one token per statement, fast "
                  "curriculum, Adam beta2 0.95, eager, 1,680 s",
                  {**SMALL, **WHOLE, **FAST_CURRICULUM, "--adam_beta2": "0.95", "--compile_core": "false",
                   "--max_train_seconds": "1680"}, file="final"),
    OwnDataRow.of("par_final_whole_small_reg_fb", "PAR h64, final states only, one token per statement, grad window "
                  "16, weight decay 0.1, fixed pace, answer feedback",
                  {**WHOLE, **SMALL_REG, **FEEDBACK}, file="final"),
    OwnDataRow.of("par_final_fb", "PAR, final states only, answer feedback", FEEDBACK, file="final"),
    OwnDataRow.of("par_final_small_fast_eager_fb", "PAR h64 1+1+1, final states only, fast mastery curriculum, eager, "
                  "answer feedback", {**SMALL, **FAST_CURRICULUM, "--compile_core": "false", **FEEDBACK},
                  file="final"),
    OwnDataRow.of("par_final_whole_fast_2x_b95_fb", "PAR, final states only, one token per statement, fast "
                  "curriculum, 1,680 s, Adam beta2 0.95, answer feedback",
                  {**WHOLE, **FAST_CURRICULUM, "--max_train_seconds": "1680", "--adam_beta2": "0.95", **FEEDBACK},
                  file="final"),
    OwnDataRow.of("lstm_step", "LSTM 288, step states", LSTM, kind="rnn", file="step"),
    OwnDataRow.of("lstm_final", "LSTM 288, final states only", LSTM, kind="rnn", file="final"),
    OwnDataRow.of("gru_step", "GRU 336, step states", GRU, kind="rnn", file="step"),
    OwnDataRow.of("gru_final", "GRU 336, final states only", GRU, kind="rnn", file="final"),
    OwnDataRow.of("lstm_final_whole", "LSTM 288, final states only, one token per statement", {**LSTM, **WHOLE},
                  kind="rnn", file="final"),
    OwnDataRow.of("gru_final_whole", "GRU 336, final states only, one token per statement", {**GRU, **WHOLE},
                  kind="rnn", file="final"),
    OwnDataRow.of("rpni_step", "RPNI (AALpy), step states", {"--algorithm": "rpni"}, kind="automata", file="step"),
    OwnDataRow.of("rpni_final", "RPNI (AALpy), final states only", {"--algorithm": "rpni"}, kind="automata",
                  file="final"),
    OwnDataRow.of("gsm_final", "GSM (AALpy), final states only", {"--algorithm": "gsm"}, kind="automata",
                  file="final"),
)


def data_file(machine: str, kind: str) -> Path:
    jsonl = kind == "final" or MACHINES[machine].get("writer") is not None
    return DATA / f"{machine}_{kind}.{'jsonl' if jsonl else 'csv'}"


def make_data(machines: list[str]) -> None:
    """Train (step states and final only, lengths 1..16, seed 0) and test (seed 1) files per machine."""
    for machine in machines:
        spec = MACHINES[machine]
        if spec.get("writer") == "variable_swaps":
            write_variable_swaps(machine)
            continue
        flags = ["--task", spec["task"], *(["--state_ids"] if spec.get("state_ids") else [])]
        for kind, extra in (("step", []), ("final", ["--final_only"])):
            run_logged(["python", "examples/make_dataset.py", *flags, "--depths", TRAIN_LENGTHS, "--n", str(TRAIN_N),
                        "--seed", "0", "--out", str(data_file(machine, kind)), *extra])
        run_logged(["python", "examples/make_dataset.py", *flags, "--depths", TEST_LENGTHS, "--n_per_depth",
                    str(TEST_N), "--seed", "1", "--out", str(data_file(machine, "test"))])


def run_name(machine: str, row: str, seed: int, train_n: int) -> str:
    return f"{machine}_{row}_n{train_n}_s{seed}"


def train_row(machine: str, row: str, seed: int, train_n: int) -> dict:
    spec, name = ROWS[row], run_name(machine, row, seed, train_n)
    folder = RUNS / name
    folder.mkdir(parents=True, exist_ok=True)
    data = {"--train_file": repo_relative(data_file(machine, spec.file)),
            "--test_file": repo_relative(data_file(machine, "test")), "--seed": str(seed),
            **MACHINES[machine].get("columns", {})}
    if train_n != TRAIN_N:
        data["--max_train_samples"] = str(train_n)
    started = time.time()
    if spec.kind == "par":
        command = ["python", spec.script, *argv(combine(row, data, spec.flags, {
            "--output_dir": repo_relative(folder), "--disable_tqdm": "true"}))]
        run_logged(command, folder / "train.log")
        summary = json.loads((folder / "summary.json").read_text())
        evaluation = json.loads((folder / "eval_test.json").read_text())
        record = dict(steps=summary["steps"], train_seconds=summary["train_seconds"], curve=summary["curve"],
                      training_mode=summary["records"]["training_mode"], per_depth=[
                          {k: r[k] for k in ("depth", "n", "accuracy")} for r in evaluation["per_depth"]])
    elif spec.kind == "automata":
        results = folder / "automata.json"
        command = ["python", spec.script, *argv(combine(row, data, spec.flags, {
            "--results_json": repo_relative(results)}))]
        run_logged(command, folder / "train.log")
        out = json.loads(results.read_text())
        record = dict(steps=None, train_seconds=out["train_seconds"], curve=None, num_states=out["num_states"],
                      training_mode=f"{out['method']} on {out['labels']} states",
                      per_depth=[{k: r[k] for k in ("depth", "n", "accuracy")} for r in out["per_depth"]])
    else:
        results = folder / "rnn.json"
        command = ["python", spec.script, *argv(combine(row, data, spec.flags, {
            "--threads": "1", "--results_json": repo_relative(results)}))]
        run_logged(command, folder / "train.log")
        out = json.loads(results.read_text())
        record = dict(steps=out.get("steps"), train_seconds=out.get("train_seconds"), curve=out.get("curve"),
                      training_mode=out.get("records", {}).get("training_mode"),
                      per_depth=[{k: r[k] for k in ("depth", "n", "accuracy")} for r in out["per_depth"]])
    record.update(machine=machine, row=row, seed=seed, train_n=train_n, label=spec.label,
                  command=" ".join(command), wall_seconds=round(time.time() - started, 1),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  host=f"{platform.node()} ({os.cpu_count()} CPUs), one thread")
    save(record, RESULTS / "runs" / f"{name}.json")
    print(json.dumps({k: record[k] for k in ("machine", "row", "seed", "train_n", "per_depth", "wall_seconds")}))
    return record


def extract(machine: str, row: str, seed: int, train_n: int) -> dict:
    """`extract_machine.py` on a trained PAR run: the machine it learned, and its agreement with the model
    at d = 256."""
    name = run_name(machine, row, seed, train_n)
    out = RESULTS / "machines" / f"{name}.json"
    run_logged(["python", "examples/extract_machine.py", "--model", repo_relative(RUNS / name), "--out",
                repo_relative(out), "--plot", repo_relative(out.with_suffix(".png")), "--agreement_depth", "256",
                "--agreement_n", "1024", "--max_states", "130"])
    extracted = json.loads(out.read_text())
    extracted["recovered"] = recovered(extracted, machine)
    save(extracted, out)
    print(json.dumps(extracted["recovered"]))
    return extracted


def generating_task(machine_name: str):
    """The task a machine's files were written from."""
    from state_tracking import GROUP_TASK_NAMES, get_task, load_task

    name = MACHINES[machine_name]["task"]
    return get_task(name) if name in GROUP_TASK_NAMES else load_task(str(REPO / name))


def recovered(machine: dict, machine_name: str) -> dict:
    """Does the extracted table equal the generating machine on the states it found? Each extracted state is mapped to
    the task's state (its answers; S5 ids decoded to the permutation), every (state, operation) transition compared
    with `task.apply`. Also: how many of the machine's reachable states were found."""
    import itertools

    import numpy as np

    task = generating_task(machine_name)
    ids = MACHINES[machine_name].get("state_ids", False)
    perms = list(itertools.permutations(range(task.num_candidates))) if ids else None

    def task_state(answers: dict) -> tuple:
        if ids:
            return tuple(perms[int(answers["state"])])
        return tuple(task.candidate_names.index(answers[q]) for q in task.query_names)

    by_name = {s["name"]: task_state(s["answers"]) for s in machine["states"]}
    ops = {op: task.op_names.index(original) for op, original in machine["operation_names"].items()}
    wrong = []
    for op, row in machine["task"]["operations"].items():
        for source, target in row.items():
            if source not in by_name:
                continue  # the pseudo-start or the unexplored sink
            expected = tuple(task.apply(np.array([by_name[source]]), np.array([ops[op]]))[0])
            if by_name.get(target) != expected:
                wrong.append({"state": source, "operation": machine["operation_names"][op], "got": target})
    start = task.default_initial(task.num_ops)
    reachable = {tuple(s) for s in task.apply(start, np.arange(task.num_ops))}  # after >= 1 op (what a model answers)
    frontier = set(reachable)
    while frontier:
        states = np.array(sorted(frontier))
        new = set()
        for o in range(task.num_ops):
            new |= {tuple(s) for s in task.apply(states, np.full(len(states), o))}
        frontier = new - reachable
        reachable |= new
    found = set(by_name.values())
    return {"same_transitions": not wrong, "wrong_transitions": wrong[:10], "num_wrong": len(wrong),
            "states_found": len(found), "states_reachable": len(reachable),
            "all_reachable_found": reachable <= found}


def save(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def collect() -> str:
    """results/own_data_cpu/table.md (runs/) and table_3000_steps.md (runs_3000_steps/: the PAR rows trained under
    train_par.py's earlier 3,000-step default), and machines.md (the extractions)."""
    table = results_table(RESULTS / "runs")
    (RESULTS / "table.md").write_text(table)
    (RESULTS / "time_to_result.md").write_text(time_table(RESULTS / "runs"))
    if (RESULTS / "runs_3000_steps").is_dir():
        (RESULTS / "table_3000_steps.md").write_text(results_table(RESULTS / "runs_3000_steps"))
    machines = []
    for path in sorted((RESULTS / "machines").glob("*.json")):
        m = json.loads(path.read_text())
        got, agreement = m.get("recovered", {}), m.get("agreement", {})
        machines.append(f"| {path.stem} | {m.get('num_states')} of {got.get('states_reachable')} | "
                        f"{got.get('same_transitions')} ({got.get('num_wrong')} wrong) | {m.get('truncated')} | "
                        f"{100 * agreement.get('fraction', float('nan')):.2f} |")
    if machines:
        (RESULTS / "machines.md").write_text("\n".join([
            "| run | states found (of reachable) | same transitions as the generating machine | capped | agreement "
            "with the model at d = 256 (%) |", "|---|---|---|---|---|", *machines]) + "\n")
    print(table)
    return table


def accuracy_at(record: dict, which: int) -> float:
    """A run's accuracy at its machine's test length `which` (0: in range, 1: 4×, 2: 16×); NaN if not tested."""
    depth = MACHINES[record["machine"]].get("test_lengths", (16, 64, 256))[which]
    return next((d["accuracy"] for d in record["per_depth"] if d["depth"] == depth), float("nan"))


def results_table(folder: Path) -> str:
    """Accuracy (%) at 16 / 64 / 256 per machine, row and training size: mean ± sd over seeds (the seeds listed)."""
    import numpy as np

    records = load_records(folder)
    lines = ["| machine | row | train records | seeds | steps | d = 16 | d = 64 (4×) | d = 256 (16×) "
             "| train s (mean) |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["machine"], r["row"], r["train_n"]), []).append(r)
    order = {m: i for i, m in enumerate(MACHINES)}
    rows = {r: i for i, r in enumerate(ROWS)}
    for (machine, row, n), members in sorted(groups.items(), key=lambda x: (order[x[0][0]], -x[0][2], rows[x[0][1]])):
        cells = [mean_sd([accuracy_at(m, which) for m in members], digits=2) for which in range(3)]
        seconds = np.mean([m["train_seconds"] or 0 for m in members])
        seeds = ",".join(str(m["seed"]) for m in sorted(members, key=lambda m: m["seed"]))
        steps = "/".join(sorted({"–" if m["steps"] is None else str(m["steps"]) for m in members}))
        lines.append(f"| {machine} | {ROWS[row].label} | {n} | {seeds} | {steps} | " + " | ".join(cells)
                     + f" | {seconds:.0f} |")
    return "\n".join(lines) + "\n"


def time_table(folder: Path, goal: float = 0.99, baselines: tuple[str, ...] = ("lstm_final", "lstm_final_whole")
               ) -> str:
    """Time to result at the full training size: per machine and row, each seed's training seconds and whether it
    reached `goal` at 16×; the mean seconds of the seeds that did, and that mean over the fastest `baselines` row's
    (the LSTM on final states, reading operations either way; its seeds at the goal) — the PAR / LSTM time ratio,
    where both get there. Seconds depend on the day's machine load (the `run on` column): compare rows run on the
    same day."""
    import numpy as np

    groups: dict[tuple, list[dict]] = {}
    for r in load_records(folder):
        if r["train_n"] == TRAIN_N and r["train_seconds"] is not None:
            groups.setdefault((r["machine"], r["row"]), []).append(r)

    def at_16x(r: dict) -> float:
        return accuracy_at(r, 2)

    def mean_reached(members: list[dict]) -> float | None:
        reached = [m["train_seconds"] for m in members if at_16x(m) >= goal]
        return float(np.mean(reached)) if reached else None

    lines = [f"| machine | row | seeds | run on | steps | train s per seed | 16× % per seed | seeds ≥ {100 * goal:g}% "
             "| mean s (those) | / the fastest LSTM row at the goal |", "|---|---|---|---|---|---|---|---|---|---|"]
    order, rows = {m: i for i, m in enumerate(MACHINES)}, {r: i for i, r in enumerate(ROWS)}
    for (machine, row), members in sorted(groups.items(), key=lambda x: (order[x[0][0]], rows[x[0][1]])):
        members = sorted(members, key=lambda m: m["seed"])
        mean = mean_reached(members)
        base = min((t for t in (mean_reached(groups.get((machine, b), [])) for b in baselines) if t is not None),
                   default=None)
        ratio = f"{mean / base:.1f}×" if mean is not None and base and row not in baselines else "–"
        lines.append(" | ".join([
            f"| {machine}", ROWS[row].label, ",".join(str(m["seed"]) for m in members),
            ", ".join(sorted({m["date"][:10] for m in members})),
            "/".join("–" if m["steps"] is None else str(m["steps"]) for m in members),
            " / ".join(f"{m['train_seconds']:.0f}" for m in members),
            " / ".join(f"{100 * at_16x(m):.2f}" for m in members),
            f"{sum(at_16x(m) >= goal for m in members)} of {len(members)}",
            "–" if mean is None else f"{mean:.0f}", ratio]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make_data", type=true_or_false, nargs="?", const=True, default=False)
    parser.add_argument("--machine", choices=list(MACHINES))
    parser.add_argument("--row", choices=list(ROWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train_n", type=int, default=TRAIN_N, choices=TRAIN_SIZES)
    parser.add_argument("--extract", type=true_or_false, nargs="?", const=True, default=False)
    parser.add_argument("--collect", type=true_or_false, nargs="?", const=True, default=False)
    args = parser.parse_args(argv)
    if args.make_data:
        make_data([args.machine] if args.machine else list(MACHINES))
    elif args.collect:
        collect()
    elif args.machine and args.row:
        (extract if args.extract else train_row)(args.machine, args.row, args.seed, args.train_n)
    else:
        parser.error("give --make_data, --collect, or --machine and --row (with --extract to extract its machine)")


if __name__ == "__main__":
    main()
