"""LSTM / GRU baselines on PAR's data: the obvious rival of the local view.

The local view makes PAR's loop an RNN over operations whose cell is the weight-shared core, with the operation
boundaries given. This baseline is the plain RNN on the same inputs: it reads the same symbolic token ids as PAR
(`<bos> op_1 … op_d <q_1> … <q_Q>`), one token per step, and a linear head reads the state after operation i at
op i's token (`operation_ends`). Trained on the same step labels (z_1..z_d, the state after every operation;
`--labels final`: z_d only, an ablation), the same training problems (`build_dataset`, same seed), the same depth
curriculum and batches (`DepthBatchSampler`: one depth per batch, start 2, +1 every 100 steps up to d = 8 by
default, as `train_par.py`), and scored on the same test problems (`evaluation.draw_test_problems`) with the same
metric (overall state accuracy: every query right), with the length-generalization study's stop rule (two
consecutive depths under 2% end the grid).

    python examples/baselines/rnn.py --cell lstm --hidden 128 --seed 0 --results_json results/x.json
    python examples/baselines/rnn.py --cell gru --labels final --max_steps 500

Recorded data (`state_tracking.records`), with `train_par.py`'s data flags and their meaning: `--train_file` (or
`--dataset_name`) holds the training records (CSV / JSON Lines / Parquet; `--operations_column`, `--state_column`,
`--step_states_column`, `--initial_state_column`, `--operation_delimiter`, `--skip_bad_records`,
`--max_train_samples`, `--operation_tokens`), read with the vocabulary PAR learns from them (`discover_format`,
`build_record_tokenizer`).
The batches are `DepthBatchSampler`'s over the lengths present (the training range defaults to the shortest..longest
record, the curriculum start is clamped into it); the step labels are the recorded states (a final-states-only record
trains on its final state: unrecorded targets are masked out of the loss). `--test_file` (and `--validation_file`)
are scored by the same metric per sequence length present, every length (no stop rule):

    python examples/baselines/rnn.py --train_file data/train.csv --test_file data/test.csv --results_json x.json

Writes one JSON: the command, seed, steps, wall times (train, eval), parameters, machine, date, the loss curve at
every logging step, and per depth the accuracy (records: per length of the test split, else the validation split;
`splits` holds every split's).
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
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from par_cli.flag_modes import FLAG_MODES, run_cli, true_or_false  # noqa: E402
from par_cli.record_flags import RecordFlags, add_record_flags, with_record_flags  # noqa: E402
from state_tracking import (  # noqa: E402
    StateTrackingCollator,
    build_dataset,
    build_tokenizer,
    encode_batch,
    get_task,
    model_token_ids,
)
from state_tracking.accuracy import overall_state_accuracy  # noqa: E402
from state_tracking.data import LABEL_PAD_ID  # noqa: E402
from state_tracking.evaluation import STOP_BELOW, command_line, draw_test_problems, repo_relative  # noqa: E402
from state_tracking.records import (  # noqa: E402
    OPERATION_TOKENS,
    RecordColumns,
    has_step_states,
    longest_records,
    read_record_splits,
    record_token_ids,
)
from trainers import DepthBatchSampler, probe_stop  # noqa: E402

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}
LABELS = ("step", "final")
# Flags whose default depends on the data (None: not given): generated data takes these values; records take the
# depth range and curriculum start from the lengths present, and have no task, train size or test depths.
GENERATED_DEFAULTS = {"task": "swap_s5", "min_train_depth": 1, "max_train_depth": 8, "curriculum_start_depth": 2,
                      "eval_depths": "8,16,32,64,128,256,512", "eval_n": 256}
# what describes generated data (refused with records) and what needs --train_file / --dataset_name: the table
# train_par.py and evaluate_par.py share (par_cli.flag_modes)
GENERATED_ONLY, RECORD_FLAGS = FLAG_MODES["rnn.py"]
# the validation probe's defaults with records (train_par.py's: --probe_n, --probe_every_steps, --probe_stop_patience)
PROBE_DEFAULTS = {"stop_when_validation_exact": True, "probe_n": 256, "probe_every_steps": 250,
                  "probe_stop_patience": 2}


class RNNStateTracker(nn.Module):
    """Embedding → LSTM/GRU → a linear head giving, at any token, logits over the candidates of every query."""

    def __init__(self, cell: str, vocab_size: int, hidden: int, layers: int, num_queries: int, num_candidates: int):
        super().__init__()
        self.num_queries, self.num_candidates = num_queries, num_candidates
        self.embed = nn.Embedding(vocab_size, hidden)
        self.rnn = CELLS[cell](hidden, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_queries * num_candidates)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids (b, t); positions (b, k) token indices to read -> logits (b, k, Q, C)."""
        hidden, _ = self.rnn(self.embed(input_ids))
        at = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        return self.head(at).unflatten(-1, (self.num_queries, self.num_candidates))


def build_parser() -> argparse.ArgumentParser:
    """The command line: the network, the training, the evaluation, and the recorded data (`RecordFlags`' flags)."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--task", default=None, help="a built-in group task (swap_s5, s5, a5); None: swap_s5 "
                        "(not with --train_file / --dataset_name)")
    parser.add_argument("--cell", default="lstm", choices=sorted(CELLS))
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--labels", default="step", choices=LABELS, help="step: z_1..z_d; final: z_d only")
    parser.add_argument("--min_train_depth", type=int, default=None,
                        help="None: 1 (records: the shortest length present)")
    parser.add_argument("--max_train_depth", type=int, default=None,
                        help="None: 8 (records: the longest length present)")
    parser.add_argument("--curriculum_start_depth", type=int, default=None,
                        help="None: 2 (records: 2 clamped into the training range)")
    parser.add_argument("--curriculum_every_steps", type=int, default=100)
    parser.add_argument("--max_steps", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--train_size", type=int, default=None, help="default: max_steps × batch_size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval_depths", default=None, help="None: 8,16,32,64,128,256,512 (generated data only)")
    parser.add_argument("--eval_n", type=int, default=None, help="None: 256 (generated data only)")
    parser.add_argument("--eval_batch_size", type=int, default=256)
    parser.add_argument("--logging_steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--results_json", default=None)
    data = parser.add_argument_group("recorded data", "train and score on records from files instead of a task "
                                     "(the flags and meaning of examples/train_par.py; state_tracking.records)")
    add_record_flags(data)
    data.add_argument("--operation_tokens", default=None, choices=OPERATION_TOKENS,
                      help="how an operation is read, as train_par.py: 'words' (default: its words, one token each) "
                           "or 'whole' (one token per distinct operation)")
    data.add_argument("--stop_when_validation_exact", type=true_or_false, nargs="?", const=True, default=None,
                      help="probe the validation split (its --probe_n longest records) every --probe_every_steps steps "
                           "and stop once the last --probe_stop_patience probes were all exact, as train_par.py does "
                           "(default true with a validation split; false: probe and log only)")
    data.add_argument("--probe_n", type=int, default=None, help="validation probe: records (default 256)")
    data.add_argument("--probe_every_steps", type=int, default=None, help="validation probe: steps between probes "
                      "(default 250)")
    data.add_argument("--probe_stop_patience", type=int, default=None, help="validation probe: consecutive exact "
                      "probes that stop training (default 2)")
    return parser


def parse_args(argv=None, records: RecordFlags | None = None) -> argparse.Namespace:
    """The command line; `records`, train_par.py's parsed record flags (`--baselines`), replaces its record flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if records is not None:
        with_record_flags(args, records)
    args.records = args.train_file is not None or args.dataset_name is not None
    if args.records:
        if args.train_file is not None and args.dataset_name is not None:
            parser.error("give --train_file or --dataset_name, not both")
        generated = [f"--{name}" for name in GENERATED_ONLY if getattr(args, name) is not None]
        if generated:
            parser.error(f"{', '.join(generated)} {'describes' if len(generated) == 1 else 'describe'} generated "
                         "data; with --train_file / --dataset_name the records are the data (score them with "
                         "--test_file / --validation_file)")
        if args.dataset_config_name is not None and args.dataset_name is None:
            parser.error("--dataset_config_name needs --dataset_name")
        if args.max_train_samples is not None and args.max_train_samples < 1:
            parser.error(f"--max_train_samples must be an integer >= 1; got {args.max_train_samples}")
    else:
        record_flags = [f"--{name}" for name in RECORD_FLAGS if getattr(args, name) not in (None, False)]
        if record_flags:
            parser.error(f"{', '.join(record_flags)} {'needs' if len(record_flags) == 1 else 'need'} --train_file or "
                         "--dataset_name (recorded data); without them the data is generated from --task")
    # the validation probe's flags the command gave (stop_when_validation_exact: given true), refused in main when
    # the records have no validation split to probe
    args.probe_given = [name for name in PROBE_DEFAULTS if getattr(args, name) not in (None, False)]
    if args.records:
        with_record_flags(args, records)  # the record flags' defaults where not given
        for name, value in PROBE_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    # which data-dependent flags were given (records fill the others from the lengths present, in main)
    args.given = {name for name in GENERATED_DEFAULTS if getattr(args, name) is not None}
    if not args.records:
        for name, value in GENERATED_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    for name in ("hidden", "layers", "max_steps", "batch_size", "eval_n", "eval_batch_size", "logging_steps",
                 "threads", "min_train_depth", "probe_n", "probe_every_steps", "probe_stop_patience"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1; got {getattr(args, name)}")
    if args.min_train_depth is not None and args.max_train_depth is not None and (
            args.max_train_depth < args.min_train_depth):
        parser.error(f"--max_train_depth must be >= --min_train_depth ({args.min_train_depth})")
    if args.learning_rate <= 0:
        parser.error(f"--learning_rate must be > 0; got {args.learning_rate}")
    args.depths = None
    if not args.records:
        try:
            args.depths = sorted({int(d) for d in args.eval_depths.split(",")})
        except ValueError:
            parser.error(f"--eval_depths must be comma-separated integers; got {args.eval_depths!r}")
        if args.depths[0] < 1:
            parser.error("--eval_depths must be >= 1")
    return args


def op_positions(batch: dict) -> torch.Tensor:
    """The token index of each operation (its last token; symbolic: the op token), (b, d)."""
    return batch["operation_ends"][:, 1:]


def evaluate(model, task, tokenizer, depths, n, seed, batch_size) -> list[dict]:
    """Overall state accuracy of the final readout (after op d) on `draw_test_problems`, with the study's stop rule."""
    collate = StateTrackingCollator(tokenizer.pad_token_id)
    rows, below = [], 0
    model.eval()
    for depth in depths:
        ops, _ = draw_test_problems(task, depth, n, seed)
        answers = []
        with torch.no_grad():
            for start in range(0, n, batch_size):
                batch = collate(encode_batch(task, tokenizer, "symbolic", ops[start:start + batch_size]))
                logits = model(batch["input_ids"], op_positions(batch)[:, -1:])[:, 0]  # (b, Q, C)
                answers.append(logits.argmax(-1).numpy())
        accuracy = overall_state_accuracy(np.concatenate(answers), task.final_states(ops))
        rows.append({"depth": depth, "accuracy": accuracy, "n": n})
        print(f"  d = {depth}: {accuracy:.4f}", flush=True)
        below = below + 1 if accuracy < STOP_BELOW else 0
        if below == 2:  # the evaluator's stop rule (evaluate_until_failed): two consecutive depths under 2% end it
            break
    return rows


def final_readout(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's final readout position (op d's last token) and final state z_d: (b, 1) positions, (b, Q) targets."""
    rows = torch.arange(batch["depth"].shape[0])
    return batch["operation_ends"][rows, batch["depth"]][:, None], batch["step_labels"][rows, batch["depth"]]


def evaluate_encoded(model, encoded, pad_token_id: int, batch_size: int, quiet: bool = False) -> list[dict]:
    """Overall state accuracy of the final readout on encoded records (`encode_records`), per sequence length present
    (every length: the records are the test, no stop rule)."""
    collate = StateTrackingCollator(pad_token_id)
    lengths = np.asarray(encoded.data.table.column("depth").to_numpy(), dtype=np.int64)
    rows = []
    model.eval()
    for depth in np.unique(lengths).tolist():
        index = np.flatnonzero(lengths == depth)
        answers, targets = [], []
        with torch.no_grad():
            for start in range(0, len(index), batch_size):
                batch = collate(encoded[index[start:start + batch_size].tolist()])
                positions, final = final_readout(batch)
                answers.append(model(batch["input_ids"], positions)[:, 0].argmax(-1).numpy())  # (b, Q)
                targets.append(final.numpy())
        accuracy = overall_state_accuracy(np.concatenate(answers), np.concatenate(targets))
        rows.append({"depth": int(depth), "accuracy": accuracy, "n": int(len(index))})
        if not quiet:
            print(f"  d = {depth}: {accuracy:.4f} (n = {len(index)})", flush=True)
    return rows


def prepare_records(args: argparse.Namespace) -> dict:
    """Read and encode the training records (and the evaluation splits) as train_par.py does
    (`par_cli.training_data.prepare_records`), and set the depth range and curriculum start from the lengths
    present where not given."""
    columns = RecordColumns(args.operations_column, args.state_column, args.step_states_column,
                            args.initial_state_column, args.operation_delimiter)
    records = read_record_splits(columns, args.train_file, args.validation_file, args.test_file, args.dataset_name,
                                 args.dataset_config_name, args.skip_bad_records, args.max_train_samples,
                                 validation_split_percentage=args.validation_split_percentage, seed=args.seed,
                                 operation_tokens=args.operation_tokens or "words")
    train, encoded, record_format, splits = records.train, records.encoded, records.record_format, records.splits
    for split, bad in records.skipped.items():
        if bad:
            print(f"skipped {len(bad)} {split} record(s) (--skip_bad_records); the first: {bad[0]}", flush=True)
    lengths = np.asarray(encoded.data.table.column("depth").to_numpy(), dtype=np.int64)
    if "min_train_depth" not in args.given:
        args.min_train_depth = int(lengths.min())
    if "max_train_depth" not in args.given:
        args.max_train_depth = int(lengths.max())
    if args.max_train_depth < args.min_train_depth:
        raise ValueError(f"--min_train_depth {args.min_train_depth} / --max_train_depth {args.max_train_depth}: an "
                         f"empty training range (the training records have lengths {lengths.min()}..{lengths.max()}).")
    if "curriculum_start_depth" not in args.given:
        args.curriculum_start_depth = int(min(max(GENERATED_DEFAULTS["curriculum_start_depth"], lengths.min()),
                                              args.max_train_depth))
    if args.labels == "final":
        mode = "final state only (--labels final)"
    elif has_step_states(train):
        mode = "step labels: the recorded state after every operation (unrecorded ones masked out of the loss)"
    else:
        mode = "final states only: the records carry no intermediate state, each trains on its final state"
    print(f"records: {len(encoded)} training records ({len(record_format.operations)} operations, "
          f"{len(record_format.candidates)} labels, {len(record_format.query_names)} queries) of lengths "
          f"{lengths.min()}..{lengths.max()}; evaluation splits: {list(splits) or 'none'}; training: {mode}",
          flush=True)
    if not splits:
        print("no --test_file / --validation_file: nothing is evaluated after training", flush=True)
    if records.stop_rule_off and args.stop_when_validation_exact:
        print(f"warning: {records.stop_rule_off}", flush=True)
    return {"train": train, "encoded": encoded, "format": record_format, "tokenizer": records.tokenizer,
            "splits": splits, "skipped": records.skipped, "mode": mode, "stop_rule_off": records.stop_rule_off}


def no_validation_probe(flags: list[str]) -> str:
    """The error for validation-probe flags given to a run whose records have no validation split."""
    named = ", ".join(f"--{name}" for name in flags)
    return (f"{named} {'sets' if len(flags) == 1 else 'set'} the validation probe, and these records have no "
            "validation split (--validation_split_percentage 0 and no --validation_file): give a --validation_file "
            f"or a --validation_split_percentage above 0, or leave {'it' if len(flags) == 1 else 'them'} out.")


def probe_accuracy(model, encoded, pad_token_id: int, batch_size: int) -> float:
    """Overall state accuracy of the final readout over every record of `encoded` (all lengths together)."""
    rows = evaluate_encoded(model, encoded, pad_token_id, batch_size, quiet=True)
    return sum(r["accuracy"] * r["n"] for r in rows) / sum(r["n"] for r in rows)


def train_model(args, model, data, sampler, collate, probe=None) -> tuple[list[dict], float]:
    """The training loop (step labels z_1..z_d, or z_d with --labels final; unrecorded targets, -100, are left out of
    the loss and the mean) -> the loss curve and the seconds it took. `probe` (records with a validation split): the
    encoded validation records probed every --probe_every_steps steps, logged as {"step", "probe_accuracy",
    "seconds"}; with --stop_when_validation_exact training stops once the last --probe_stop_patience probes were all
    1.0 and the curriculum has reached the longest training length (`trainers.probe_stop`, train_par.py's rule)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 100))  # 100-step warm-up
    curve, losses, probes = [], [], []
    started = time.time()
    model.train()
    for step, rows in enumerate(sampler, start=1):
        batch = collate([data[int(i)] for i in rows])
        positions = op_positions(batch)
        targets = batch["step_labels"][:, 1:]  # (b, d, Q): z_1..z_d
        if args.labels == "final":
            positions, targets = positions[:, -1:], targets[:, -1:]
        logits = model(batch["input_ids"], positions)
        loss = nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=LABEL_PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % args.logging_steps == 0 or step == args.max_steps:
            curve.append({"step": step, "loss": round(float(np.mean(losses)), 5), "depth": int(positions.shape[1])
                          if args.labels == "step" else None, "seconds": round(time.time() - started, 1)})
            losses = []
            print(f"step {step}: loss {curve[-1]['loss']:.4f}", flush=True)
        if probe is not None and step % args.probe_every_steps == 0:
            accuracy = probe_accuracy(model, probe, collate.pad_token_id, args.eval_batch_size)
            model.train()
            probes.append(accuracy)
            curve.append({"step": step, "probe_accuracy": accuracy, "probe_split": "validation",
                          "probe_n": len(probe), "seconds": round(time.time() - started, 1)})
            print(curve[-1], flush=True)
            if probe_stop(probes, 1.0 if args.stop_when_validation_exact else None, args.probe_stop_patience,
                          steps_done=step, curriculum_cap=sampler.cap_at, max_depth=sampler.max_depth):
                print(f"stopping at step {step}: the last {args.probe_stop_patience} validation probes were exact "
                      "and the curriculum has reached the longest training length (--stop_when_validation_exact)",
                      flush=True)
                break
    return curve, time.time() - started


def prepare_run(args) -> dict:
    """The training data (records, or problems generated as train_par.py does), its batches and a seeded model:
    {"records" (prepare_records' dict, or None), "task" (None with records), "tokenizer", "data", "sampler",
    "collate", "model"}."""
    records = task = None
    if args.records:
        records = prepare_records(args)
        record_format, tokenizer, data = records["format"], records["tokenizer"], records["encoded"]
        vocab_size = record_token_ids(tokenizer, record_format)["vocab_size"]
        num_queries, num_candidates = len(record_format.query_names), len(record_format.candidates)
    else:
        task = get_task(args.task)
        tokenizer = build_tokenizer(task, "symbolic")
        vocab_size = model_token_ids(tokenizer, task)["vocab_size"]
        num_queries, num_candidates = task.num_queries, len(task.candidate_names)
        n = args.train_size or args.max_steps * args.batch_size
        data = build_dataset(task, tokenizer, "symbolic", n=n, depths=(args.min_train_depth, args.max_train_depth),
                             seed=args.seed)
    depths = data.data.table.column("depth").to_numpy() if records else data["depth"]
    sampler = DepthBatchSampler(np.asarray(depths), batch_size=args.batch_size, num_batches=args.max_steps,
                                seed=args.seed, min_depth=args.min_train_depth, max_depth=args.max_train_depth,
                                curriculum_start=args.curriculum_start_depth,
                                curriculum_every=args.curriculum_every_steps)
    collate = StateTrackingCollator(tokenizer.pad_token_id)
    torch.manual_seed(args.seed)
    model = RNNStateTracker(args.cell, vocab_size, args.hidden, args.layers, num_queries, num_candidates)
    return {"records": records, "task": task, "tokenizer": tokenizer, "data": data, "sampler": sampler,
            "collate": collate, "model": model}


def validation_probe(args, records: dict | None):
    """The validation records probed during training (records with a validation split), else None; refuses probe
    flags without a validation split and turns the stop rule off where too few records back it."""
    probe = None
    if records is not None and "validation" in records["splits"]:
        encoded_validation = records["splits"]["validation"][1]
        probe = longest_records(encoded_validation, args.probe_n)
    elif records is not None and args.probe_given:
        raise ValueError(no_validation_probe(args.probe_given))
    if records is not None and records["stop_rule_off"]:  # too few validation records to stop on (train_par.py's rule)
        args.stop_when_validation_exact = False
    return probe


def evaluate_run(args, run: dict) -> tuple[list[dict], str | None, dict | None]:
    """(per-depth rows, the split they are, every split's results): generated data on the test problems up to the
    stop rule; records per length of each split, the test split's rows first choice, else the validation split's."""
    model, tokenizer, records = run["model"], run["tokenizer"], run["records"]
    if records is None:
        per_depth = evaluate(model, run["task"], tokenizer, args.depths, args.eval_n, args.seed, args.eval_batch_size)
        return per_depth, None, None
    splits = {}
    for split, (loaded, encoded) in records["splits"].items():
        print(f"{split}:", flush=True)
        rows = evaluate_encoded(model, encoded, tokenizer.pad_token_id, args.eval_batch_size)
        splits[split] = {"sources": [repo_relative(p) for p in loaded.sources], "n_records": len(encoded),
                         "depths": [r["depth"] for r in rows], "accuracy": [r["accuracy"] for r in rows],
                         "per_depth": rows}
    eval_split = "test" if "test" in splits else "validation" if "validation" in splits else None
    return (splits[eval_split]["per_depth"] if eval_split else []), eval_split, splits


def records_results(records: dict) -> dict:
    """What the results JSON says of the training records."""
    train, record_format = records["train"], records["format"]
    return {"training_mode": records["mode"], "train_records": len(records["encoded"]),
            "train_sources": [repo_relative(p) for p in train.sources], "operations": len(record_format.operations),
            "labels": len(record_format.candidates), "queries": list(record_format.query_names),
            "skipped": {k: len(v) for k, v in records["skipped"].items()}}


def main(argv=None, records: RecordFlags | None = None) -> dict:
    args = parse_args(argv, records)
    torch.set_num_threads(args.threads)
    started = time.time()
    run = prepare_run(args)
    model, records, task = run["model"], run["records"], run["task"]
    data_seconds = time.time() - started
    probe = validation_probe(args, records)
    curve, train_seconds = train_model(args, model, run["data"], run["sampler"], run["collate"], probe)
    steps = max((row["step"] for row in curve), default=0)
    started = time.time()
    per_depth, eval_split, splits = evaluate_run(args, run)
    results = {
        "method": f"{args.cell}_{args.labels}_labels",
        "task": task.name if records is None else records["format"].task_name, "seed": args.seed, "cell": args.cell,
        "hidden": args.hidden, "layers": args.layers, "labels": args.labels,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": steps, "max_steps": args.max_steps, "batch_size": args.batch_size,
        "max_train_depth": args.max_train_depth,
        "curriculum": {"start": args.curriculum_start_depth, "every_steps": args.curriculum_every_steps},
        "data_seconds": round(data_seconds, 1), "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.time() - started, 1), "threads": args.threads,
        "depths": [r["depth"] for r in per_depth], "accuracy": [r["accuracy"] for r in per_depth],
        "per_depth": per_depth, "curve": curve,
        "command": command_line(__file__, sys.argv[1:] if argv is None else argv),
        "machine": {"processor": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if records is not None:  # which split the top-level depths / accuracy / per_depth are, every split, the data
        results.update(min_train_depth=args.min_train_depth, eval_split=eval_split, splits=splits,
                       records=records_results(records))
    if args.results_json:
        Path(args.results_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results_json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    run_cli(main)
