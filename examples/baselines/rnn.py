"""LSTM / GRU baselines on PAR's data (issue 20, item 1): the obvious rival of the local view.

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

Writes one JSON: the command, seed, steps, wall times (train, eval), parameters, machine, date, the loss curve at
every logging step, and per depth the accuracy.
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

from state_tracking import (  # noqa: E402
    StateTrackingCollator,
    build_dataset,
    build_tokenizer,
    encode_batch,
    get_task,
    model_token_ids,
)
from state_tracking.accuracy import overall_state_accuracy  # noqa: E402
from state_tracking.evaluation import STOP_BELOW, draw_test_problems, repo_relative  # noqa: E402
from trainers import DepthBatchSampler  # noqa: E402

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}
LABELS = ("step", "final")


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


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--task", default="swap_s5", help="a built-in group task (swap_s5, s5, a5)")
    parser.add_argument("--cell", default="lstm", choices=sorted(CELLS))
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--labels", default="step", choices=LABELS, help="step: z_1..z_d; final: z_d only")
    parser.add_argument("--min_train_depth", type=int, default=1)
    parser.add_argument("--max_train_depth", type=int, default=8)
    parser.add_argument("--curriculum_start_depth", type=int, default=2)
    parser.add_argument("--curriculum_every_steps", type=int, default=100)
    parser.add_argument("--max_steps", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--train_size", type=int, default=None, help="default: max_steps × batch_size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval_depths", default="8,16,32,64,128,256,512")
    parser.add_argument("--eval_n", type=int, default=256)
    parser.add_argument("--eval_batch_size", type=int, default=256)
    parser.add_argument("--logging_steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--results_json", default=None)
    args = parser.parse_args(argv)
    for name in ("hidden", "layers", "max_steps", "batch_size", "eval_n", "eval_batch_size", "logging_steps",
                 "threads", "min_train_depth"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1; got {getattr(args, name)}")
    if args.max_train_depth < args.min_train_depth:
        parser.error(f"--max_train_depth must be >= --min_train_depth ({args.min_train_depth})")
    if args.learning_rate <= 0:
        parser.error(f"--learning_rate must be > 0; got {args.learning_rate}")
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


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    tokenizer = build_tokenizer(task, "symbolic")
    ids = model_token_ids(tokenizer, task)
    started = time.time()
    n = args.train_size or args.max_steps * args.batch_size
    data = build_dataset(task, tokenizer, "symbolic", n=n, depths=(args.min_train_depth, args.max_train_depth),
                         seed=args.seed)
    sampler = DepthBatchSampler(np.asarray(data["depth"]), batch_size=args.batch_size, num_batches=args.max_steps,
                                seed=args.seed, min_depth=args.min_train_depth, max_depth=args.max_train_depth,
                                curriculum_start=args.curriculum_start_depth,
                                curriculum_every=args.curriculum_every_steps)
    collate = StateTrackingCollator(tokenizer.pad_token_id)
    torch.manual_seed(args.seed)
    model = RNNStateTracker(args.cell, ids["vocab_size"], args.hidden, args.layers, task.num_queries,
                            len(task.candidate_names))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 100))  # 100-step warm-up
    curve, losses = [], []
    data_seconds = time.time() - started
    started = time.time()
    model.train()
    for step, rows in enumerate(sampler, start=1):
        batch = collate([data[int(i)] for i in rows])
        positions = op_positions(batch)
        targets = batch["step_labels"][:, 1:]  # (b, d, Q): z_1..z_d
        if args.labels == "final":
            positions, targets = positions[:, -1:], targets[:, -1:]
        logits = model(batch["input_ids"], positions)
        loss = nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten())
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
    train_seconds = time.time() - started
    started = time.time()
    per_depth = evaluate(model, task, tokenizer, args.depths, args.eval_n, args.seed, args.eval_batch_size)
    results = {
        "method": f"{args.cell}_{args.labels}_labels", "task": task.name, "seed": args.seed, "cell": args.cell,
        "hidden": args.hidden, "layers": args.layers, "labels": args.labels,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": args.max_steps, "batch_size": args.batch_size, "max_train_depth": args.max_train_depth,
        "curriculum": {"start": args.curriculum_start_depth, "every_steps": args.curriculum_every_steps},
        "data_seconds": round(data_seconds, 1), "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(time.time() - started, 1), "threads": args.threads,
        "depths": [r["depth"] for r in per_depth], "accuracy": [r["accuracy"] for r in per_depth],
        "per_depth": per_depth, "curve": curve,
        "command": "python " + " ".join([repo_relative(__file__)] + (sys.argv[1:] if argv is None else list(argv))),
        "machine": {"processor": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if args.results_json:
        Path(args.results_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results_json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
