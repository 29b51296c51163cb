"""Issue 68: does the full view fail past its training range because the rows it reads stop holding what they hold?

An intervention at test time, no training. In the full view every row of the prompt goes through the core at every
iteration, so at iteration k the query reads operation k's row after k passes of the core — never more than
d_train passes in training. `drift.json` found that the readout breaks within one or two iterations at a k that varies
between problems, and the padding control that holding a state past the operations fails at k ≈ 2 d_train. If the
rows of the prompt that the query reads degrade with the number of passes, keeping them as they were after a few
passes should move the break; if the break stays, it is the query's own step. Conditions (`CONDITIONS`), applied to
the state each core update returns (`freeze_rows`):

- `none`: the model as trained.
- `prompt_after_m`: every row outside the query region (the question after the last operation) keeps its state from
  iteration m on (m = the training depth: no prompt row ever passes the core more often than in training).
- `operation_after_j+g`: the rows of operation j (and the preamble as j = 0) keep their state from iteration j + g
  on: each operation's row is read at iteration j as it was trained, and then held (uses the operation boundaries,
  which the model itself is not given).
- `operation_window_w`: the rows of operation j pass the core only at iterations j − w < k ≤ j + 1 and keep their
  state otherwise (before: s_0 = e), so no row is read after more passes than training gave (w ≤ d_train).

Per condition and depth (2x and 4x the training depth), the accuracy of the forced-depth answer and the share of
problems whose readout at iteration k is z_k (the progress profile), on fresh problems.

    python examples/studies/full_view_row_freeze.py [--rows pose_conv_s0 pose_conv_s1] [--n 256]

Writes results/full_view_positions/row_freeze.json (the figures, the command, the environment).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from par_studies.runs import finished_par_runs  # noqa: E402
from par_studies.tables import save_record  # noqa: E402

RUN_DIR = REPO / "runs" / "full_view_positions"
OUT = REPO / "results" / "full_view_positions" / "row_freeze.json"
TASK_FILE = "examples/tasks/swap_s5_short.json"


def conditions(train_depth: int) -> dict:
    """condition -> (kind, its iteration parameter)."""
    return {"none": ("none", 0), f"prompt_after_{train_depth}": ("prompt", train_depth),
            "operation_after_j+1": ("operation", 1), "operation_after_j+2": ("operation", 2),
            f"operation_window_{train_depth}": ("window", train_depth),
            f"operation_window_{train_depth // 2}": ("window", train_depth // 2)}


def active_iterations(kind: str, g: int, operation_ends, attention_mask):
    """((b, t), (b, t)): each row passes the core at iterations start < k <= stop and keeps its state otherwise. Rows
    of operation j (tokens after operation j − 1's last token up to operation j's; the preamble is j = 0): stop at
    j + g (`operation`), or start at j − g and stop at j + 1 (`window`); every row before the question stops at g
    (`prompt`); the question's rows always pass."""
    import torch

    b, t = attention_mask.shape
    never = torch.full((b, t), 10**6, dtype=torch.long)
    always = torch.full((b, t), -(10**6), dtype=torch.long)
    if kind == "none":
        return always, never
    from modeling_par.loop_views import token_segments

    segments, depth, _ = token_segments(operation_ends.cpu(), attention_mask.cpu())  # j of each token; d + 1: question
    before_question = segments <= depth[:, None]
    if kind == "prompt":
        return always, torch.where(before_question, torch.full_like(never, g), never)
    index = segments
    if kind == "operation":
        return always, torch.where(before_question, index + g, never)
    return torch.where(before_question, index - g, always), torch.where(before_question, index + 1, never)


def freeze_rows(model, active):
    """Wrap `model.core_update` so that a row outside its `active["rows"]` = (start, stop) iterations keeps s_{k−1}:
    s_k[i] = s_{k−1}[i] unless start[i] < k <= stop[i]. Returns the counter to reset before each forward."""
    original = model.core_update
    counter = {"k": 0}

    def update(e_half, x, mask, cos, sin, reference_rms, token_valid=None):
        counter["k"] += 1
        out = original(e_half, x, mask, cos, sin, reference_rms, token_valid)
        start, stop = active["rows"]
        k = counter["k"]
        keep = ((k <= start) | (k > stop)).to(x.device)[..., None]
        return out._replace(state=out.state.where(~keep, x))

    model.core_update = update
    return counter


def row_condition(model, tokenizer, task, depth: int, kind: str, g: int, n: int, seed: int = 0) -> dict:
    """The forced-depth accuracy and the progress profile under one condition at one depth."""
    import numpy as np
    import torch

    from state_tracking import StateTrackingCollator
    from state_tracking.diagnostics import collated_batches
    from state_tracking.tokenization import encode_batch

    rng = np.random.default_rng(1000 + depth)  # the same problems under every condition
    ops = task.sample_ops(rng, n, depth)
    targets = task.prefix_states(ops, None)[:, 1:]  # (n, d, Q)
    collate = StateTrackingCollator(tokenizer.pad_token_id, padding_side="right")
    frozen = {"rows": None}
    counter = freeze_rows(model, frozen)
    right = []
    try:
        for start, batch in collated_batches(encode_batch(task, tokenizer, "text", ops, None), collate, n, 64, "cpu"):
            frozen["rows"] = active_iterations(kind, g, batch["operation_ends"], batch["attention_mask"])
            counter["k"] = 0
            with torch.inference_mode():
                out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            query_positions=batch["query_positions"], num_iterations=depth,
                            readout_iterations=list(range(1, depth + 1)))
            read = out.answer_logits.argmax(-1).permute(1, 0, 2).numpy()  # (b, d, Q)
            right.append((read == targets[start : start + len(read)]).all(-1))
    finally:
        del model.core_update  # the class's method again
    right = np.concatenate(right)
    return {"depth": depth, "condition_kind": kind, "g": g, "accuracy": round(float(right[:, -1].mean()) * 100, 2),
            "profile": (right.mean(0) * 100).round(0).astype(int).tolist()}


def waiting_rows(model, tokenizer, task, depth: int, n: int) -> dict:
    """How the rows of operations the loop has not reached yet change from pass to pass: at iteration k, over the
    tokens of operations j > k + 1 (still waiting), the mean relative change ||s_k − s_{k−1}|| / ||s_{k−1}|| and
    the mean cosine between s_k and s_1 (1: the row holds what it held after its first pass). A row at a fixed point
    changes by 0 whatever k is; a row whose state moves every pass can tell how many passes it has had."""
    import numpy as np
    import torch

    from modeling_par.loop_views import token_segments
    from state_tracking import StateTrackingCollator
    from state_tracking.diagnostics import collated_batches
    from state_tracking.tokenization import encode_batch

    ops = task.sample_ops(np.random.default_rng(2000 + depth), n, depth)
    collate = StateTrackingCollator(tokenizer.pad_token_id, padding_side="right")
    change, cosine, count = np.zeros(depth), np.zeros(depth), np.zeros(depth)
    for _, batch in collated_batches(encode_batch(task, tokenizer, "text", ops, None), collate, n, 32, "cpu"):
        segments, operations, _ = token_segments(batch["operation_ends"], batch["attention_mask"])  # j per token, d
        with torch.inference_mode():
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], num_iterations=depth, output_loop_states=True)
        states = out.loop_states  # s_1 .. s_d, each (b, t, h)
        for k in range(2, depth + 1):
            waiting = (segments > k + 1) & (segments <= operations[:, None])  # operations j > k + 1, not the question
            if not waiting.any():
                continue
            now, before, first = states[k - 1][waiting], states[k - 2][waiting], states[0][waiting]
            change[k - 1] += ((now - before).norm(dim=-1) / before.norm(dim=-1)).sum().item()
            cosine[k - 1] += torch.nn.functional.cosine_similarity(now, first, dim=-1).sum().item()
            count[k - 1] += waiting.sum().item()
    seen = count > 0
    return {"depth": depth, "n": n, "iterations": (np.flatnonzero(seen) + 1).tolist(),
            "relative_change": (change[seen] / count[seen]).round(4).tolist(),
            "cosine_to_first_pass": (cosine[seen] / count[seen]).round(4).tolist()}


def main(argv=None) -> dict:
    import torch

    from state_tracking import build_tokenizer, load_task
    from state_tracking.evaluation import environment_info

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rows", nargs="+", default=["pose_conv_s0", "pose_conv_s1"])
    parser.add_argument("--n", type=int, default=256, help="problems per depth")
    parser.add_argument("--waiting", action="store_true",
                        help="only the waiting rows' change per pass (`waiting_rows`, 4x the training depth), added "
                             "to the existing record")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = load_task(TASK_FILE)
    tokenizer = build_tokenizer(task, "text")
    if args.waiting:
        record = json.loads(OUT.read_text())
        record["waiting"] = {"command": "python examples/studies/full_view_row_freeze.py " + " ".join(
            argv or sys.argv[1:]), "rows": []}
        for row, model, train_depth in finished_par_runs(RUN_DIR, args.rows):
            result = {"run": row, **waiting_rows(model, tokenizer, task, 4 * train_depth, args.n)}
            print(json.dumps(result), flush=True)
            record["waiting"]["rows"].append(result)
        save_record(record, OUT)
        return record
    started, rows = time.time(), []
    command = "python examples/studies/full_view_row_freeze.py " + " ".join(argv or sys.argv[1:])
    for row, model, train_depth in finished_par_runs(RUN_DIR, args.rows):
        for name, (kind, g) in conditions(train_depth).items():
            for depth in (2 * train_depth, 4 * train_depth):
                result = {"run": row, "condition": name, **row_condition(model, tokenizer, task, depth, kind, g,
                                                                          args.n)}
                print(json.dumps({k: result[k] for k in ("run", "condition", "depth", "accuracy")}), flush=True)
                rows.append(result)
                record = {"command": command, "n_per_depth": args.n, "rows": rows,
                          "seconds": round(time.time() - started, 1), "environment": environment_info()}
                save_record(record, OUT)  # after every result: a stopped study keeps what it measured
    return record


if __name__ == "__main__":
    main()
