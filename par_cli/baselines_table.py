"""`train_par.py --baselines lstm,rpni`: the baselines trained on the same records files after PAR, and one table.

Each baseline is its script's own `main` (`examples/baselines/rnn.py`: an LSTM with that script's defaults;
`examples/baselines/automata.py`: AALpy's RPNI), called with PAR's data flags and seed, so that it reads the same
files, columns, delimiter, held-out validation split and seed, and scores the same split; the command line it ran is
kept (to run it alone) and its full JSON written beside summary.json (`baseline_<name>.json`). The LSTM runs on as
many threads as PAR did.

The table: per method, the accuracy (%) per length of the test split (else the validation split), the training
seconds each reports (PAR: summary.json's `train_seconds`, reading the records included; the LSTM: rnn.py's training
loop; RPNI: the state merging) and, for RPNI, the states it learned.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from state_tracking.evaluation import command_line

from .record_flags import RECORD_FLAG_NAMES, RecordFlags, record_flags_of

SCRIPTS = Path(__file__).resolve().parents[1] / "examples" / "baselines"
# --baselines name -> (label, script, its flags choosing the method)
BASELINES = {"lstm": ("LSTM", "rnn.py", ["--cell", "lstm"]), "rpni": ("RPNI", "automata.py", ["--algorithm", "rpni"])}
# the validation probe's flags rnn.py takes as train_par.py does, passed where the command gives them
PROBE_FLAGS = ("stop_when_validation_exact", "probe_n", "probe_every_steps", "probe_stop_patience")


def parse_baselines(value: str | None) -> tuple[str, ...]:
    """The names of `--baselines` (a comma-separated list of `BASELINES`, each at most once); () when not given."""
    if value is None:
        return ()
    names = [name.strip() for name in str(value).split(",")]
    if not all(names) or any(name not in BASELINES for name in names) or len(set(names)) < len(names):
        raise ValueError(f"--baselines must be a comma-separated list of {', '.join(BASELINES)} (each at most once); "
                         f"got {value!r}.")
    return tuple(names)


def check_baselines(names: tuple[str, ...], data_args) -> None:
    """Refuse, before training, a --baselines the run cannot carry out: it needs records files (--train_file), a split
    to score (--test_file, --validation_file or a held-out validation split) and, for RPNI, AALpy; --max_eval_samples
    (PAR scored on fewer validation records than the baselines) and --dataset_name (the baselines read files) are
    refused with it."""
    if not names:
        return
    if data_args.train_file is None:
        also = " (with --dataset_name, run examples/baselines/rnn.py and automata.py with it)" \
            if data_args.dataset_name is not None else ""
        raise ValueError(f"--baselines trains the baselines on the same records files after PAR: it needs "
                         f"--train_file{also}.")
    if data_args.max_eval_samples is not None:
        raise ValueError("--baselines scores every record of the evaluation split, and --max_eval_samples would score "
                         "PAR on fewer: give one of them.")
    if data_args.test_file is None and data_args.validation_file is None and not data_args.validation_split_percentage:
        raise ValueError("--baselines compares accuracy on the test split (else the validation split), and this run "
                         "has neither: give --test_file, --validation_file or a --validation_split_percentage above 0.")
    if "rpni" in names and importlib.util.find_spec("aalpy") is None:
        raise ValueError("--baselines rpni needs AALpy: pip install -e \".[automata]\" (or pip install aalpy).")
    for name in names:
        if not (SCRIPTS / BASELINES[name][1]).is_file():
            raise ValueError(f"--baselines {name} runs examples/baselines/{BASELINES[name][1]}, which is not at "
                             f"{SCRIPTS}: run train_par.py from a checkout of this repository.")


def baseline_argv(name: str, data_args, task_args, seed: int, given: set, threads: int, output_dir: Path) -> list:
    """Baseline `name`'s own flags: its method, PAR's seed, its JSON file, and for the LSTM the operation tokens, the
    threads and the validation probe's flags the command gave. The record flags are not written here: the baseline
    gets train_par.py's parsed `RecordFlags` (`run_baseline`)."""
    argv = list(BASELINES[name][2]) + ["--seed", str(seed), "--results_json", str(output_dir / f"baseline_{name}.json")]
    if name == "lstm":
        argv += ["--operation_tokens", data_args.operation_tokens, "--threads", str(threads)]
        for flag in PROBE_FLAGS:
            if flag in given:
                value = getattr(data_args if flag == "stop_when_validation_exact" else task_args, flag)
                argv += [f"--{flag}", str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


def record_argv(records: RecordFlags) -> list:
    """The record flags as command-line words (`--flag=value`, the ones that differ from their defaults), for the
    command on record: the flags train_par.py read, in the form any value survives (``--operation_delimiter=->``)."""
    default = RecordFlags()
    return [f"--{name}={str(value).lower() if isinstance(value, bool) else value}" for name in RECORD_FLAG_NAMES
            if (value := getattr(records, name)) != getattr(default, name)]


def load_script(script: str):
    """examples/baselines/<script> as a module (registered under the name tests' `load_example` gives it)."""
    name = "example_" + Path(script).stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_baseline(name: str, argv: list, split: str, records: RecordFlags) -> dict:
    """One baseline's row: accuracy per length of `split`, training seconds, steps (LSTM), states (RPNI), its command;
    a bad input it refuses (a `ValueError`: records no Moore machine fits, ...) or any other failure (a crash, an
    argparse exit) is its row's error, named, not the run's: PAR's result, trained first, is kept. `records`: the
    record flags train_par.py parsed, handed over as they are."""
    label, script, _ = BASELINES[name]
    command = command_line(str(SCRIPTS / script), argv + record_argv(records))
    print(f"baseline {label}: {command}", flush=True)
    try:
        out = load_script(script).main(argv, records=records)
    except (Exception, SystemExit) as error:  # PAR has trained: a baseline's failure is its row, never the run's
        text = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        print(f"error: baseline {label}: {text}", flush=True)
        return {"method": label, "error": text, "command": command}
    rows = out["splits"][split]["per_depth"]
    return {"method": label, "accuracy": {r["depth"]: r["accuracy"] for r in rows},
            "train_seconds": out["train_seconds"], "steps": out.get("steps"), "states": out.get("num_states"),
            "command": command}


def baselines_table(split: str, rows: list[dict]) -> str:
    """The markdown table: method | accuracy (%) per length | train s | learned states."""
    lengths = sorted({length for row in rows for length in row.get("accuracy", {})})
    lines = [f"{split} split, overall state accuracy (%) per length; train s: PAR from reading the records to the end "
             "of training, the LSTM its training loop, RPNI its state merging",
             "| method | " + " | ".join(f"d = {d}" for d in lengths) + " | train s | learned states |",
             "|---|" + "---|" * (len(lengths) + 2)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['method']} | failed: {row['error']} |")
            continue
        accuracy = [f"{100 * row['accuracy'][d]:.2f}" if d in row["accuracy"] else "–" for d in lengths]
        states = "–" if row.get("states") is None else str(row["states"])
        lines.append(f"| {row['method']} | " + " | ".join(accuracy) + f" | {row['train_seconds']:.2f} | {states} |")
    return "\n".join(lines)


def run_baselines(data_args, task_args, train_args, given: set, results: dict, summary: dict) -> dict:
    """`--baselines`: after PAR, each baseline on the same records, then one table (printed) beside PAR's row;
    returns summary.json's "baselines": the split, the table's rows, the table and PAR's time over each baseline's
    (`time_ratios`)."""
    names = parse_baselines(data_args.baselines)
    split = "test" if "test" in results else "validation"
    if split not in results:
        raise ValueError("--baselines: the records left no test or validation split to compare the methods on.")
    par = results[split]
    rows = [{"method": "PAR", "accuracy": dict(zip(par["depths"], par["accuracy"])),
             "train_seconds": summary["train_seconds"], "steps": summary["steps"], "states": None,
             "command": summary["command"]}]
    for name in names:
        argv = baseline_argv(name, data_args, task_args, train_args.seed, given, torch.get_num_threads(),
                             Path(train_args.output_dir))
        rows.append(run_baseline(name, argv, split, record_flags_of(data_args)))
    table = baselines_table(split, rows)
    ratios = time_ratios(rows)
    print(table, flush=True)
    for method, ratio in ratios.items():
        print(f"PAR's training took {ratio:.2f}x the time of {method}'s", flush=True)
    return {"split": split, "rows": rows, "table": table, "par_time_ratio": ratios}


def time_ratios(rows: list[dict]) -> dict[str, float]:
    """PAR's training seconds over each baseline's that trained (not failed): {method: t_PAR / t_method}. PAR's time
    runs from reading the records to the end of training, the LSTM's is its training loop, RPNI's its state merging."""
    par = rows[0]["train_seconds"]
    return {row["method"]: round(par / row["train_seconds"], 2) for row in rows[1:]
            if "error" not in row and row.get("train_seconds")}


__all__ = ["BASELINES", "baselines_table", "check_baselines", "parse_baselines", "run_baselines", "time_ratios"]
