"""Issue 68: where does the full view keep the state it carries — at the operations' rows (a wavefront) or only at the
query rows — and where does it break past the training range?

Linear probes on the loop states, no training of the model. In the full view every row passes the core at every
iteration. A *wavefront* would hold z_j (the state after j operations) at operation j's last token from iteration j
on; the query would then read z_k at operation k's row. A probe (ridge regression on one-hot targets, closed form,
`fit_probe`) reads, from the state s_k of operation j's last token:

- `prefix_state`: z_j (every question's answer; right = all questions right), at k = j (the iteration that reads
  operation j) and at k = j + 1;
- `operation`: which operation j is (one of the task's operations), at k = j;
- `passes`: k itself, the number of passes the row has had (classes 1..d_train; a row past d_train passes that the
  probe still calls d_train reads as "saturated"), over the rows of operations the loop has not reached (j > k + 1);
- `flag`: the read-so-far flag of `--progress_flag_weight` (`flag_wave`), read at 4x the training depth;
- `query_passes`: k from the query rows (the answer tokens' states, averaged), at every iteration: the pointer must
  know which operation is next, and the carried state lives beside that count.

Each probe is fitted on problems at the training depth (every j ≤ k ≤ d_train) and read on fresh problems at 4x the
training depth, per j: if z_j is read right at operation j's row to some j and wrong past it, the wavefront breaks
there; if it is never read, the state lives at the query rows only.

    python examples/studies/full_view_row_probe.py [--rows pose_conv_s0 conv_s0] [--n 512]

Writes results/full_view_positions/row_probe.json (the figures, the command, the environment).
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
OUT = REPO / "results" / "full_view_positions" / "row_probe.json"
TASK_FILE = "examples/tasks/swap_s5_short.json"
RIDGE = 1e-2


def fit_probe(features, labels, num_classes: int):
    """Ridge regression onto one-hot targets, W = (XᵀX + λ n I)⁻¹ Xᵀ Y with a bias column (λ = `RIDGE`); a row's
    class is argmax(x W). features (n, h), labels (n, m) ints -> W (h + 1, m · num_classes)."""
    import torch

    x = torch.cat([features, torch.ones(len(features), 1)], 1).double()
    y = torch.nn.functional.one_hot(torch.as_tensor(labels).long(), num_classes).flatten(1).double()
    gram = x.T @ x + RIDGE * len(x) * torch.eye(x.shape[1], dtype=torch.float64)
    return torch.linalg.solve(gram, x.T @ y)


def read_probe(weights, features, num_classes: int):
    """The probe's classes for each row (n, m)."""
    import torch

    x = torch.cat([features, torch.ones(len(features), 1)], 1).double()
    return (x @ weights).view(len(x), -1, num_classes).argmax(-1)


def loop_rows(model, tokenizer, task, depth: int, n: int, seed: int) -> dict:
    """Fresh problems at `depth`, the loop run for `depth` iterations: per problem, operation j's last-token state at
    every iteration (states (n, R, d, h)), the operations (n, d), the prefix states z_1..z_d (n, d, Q)."""
    import numpy as np
    import torch

    from state_tracking import StateTrackingCollator
    from state_tracking.diagnostics import collated_batches
    from state_tracking.tokenization import encode_batch

    ops = task.sample_ops(np.random.default_rng(seed), n, depth)
    collate = StateTrackingCollator(tokenizer.pad_token_id, padding_side="right")
    rows, queries = [], []
    for _, batch in collated_batches(encode_batch(task, tokenizer, "text", ops, None), collate, n, 32, "cpu"):
        with torch.inference_mode():
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], num_iterations=depth, output_loop_states=True)
        ends = batch["operation_ends"][:, 1 : depth + 1]  # (b, d): operation j's last token
        states = torch.stack(out.loop_states, 1)  # (b, R, t, h)
        index = ends[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
        rows.append(states.gather(2, index).float())  # (b, R, d, h)
        at = batch["query_positions"][:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
        queries.append(states.gather(2, at).float().mean(2))  # (b, R, h)
    z = torch.as_tensor(task.prefix_states(ops)[:, 1:])
    return {"states": torch.cat(rows), "queries": torch.cat(queries), "ops": torch.as_tensor(ops), "z": z}


def examples(data: dict, what: str, train_depth: int):
    """(features, labels, j, k) of one probe over a run of `loop_rows`: `prefix_state` at k = j and k = j + 1,
    `operation` at k = j, `passes` over the rows j > k + 1 and `query_passes` at every k (k capped at
    `train_depth`)."""
    import torch

    states = data["states"]
    n, iterations, depth, _ = states.shape
    if what == "query_passes":
        k = torch.arange(1, iterations + 1).repeat(n)
        return data["queries"].flatten(0, 1), (k.clamp(max=train_depth) - 1)[:, None], torch.zeros_like(k), k
    feats, labels, js, ks = [], [], [], []
    for j in range(1, depth + 1):
        for k in range(1, iterations + 1):
            if what.endswith("passes"):
                keep = j > k + 1
                label = torch.full((n, 1), min(k, train_depth) - 1)
            else:
                keep = k == j if what == "operation" else k in (j, j + 1)
                label = data["z"][:, j - 1] if what == "prefix_state" else data["ops"][:, j - 1 : j]
            if keep:
                feats.append(states[:, k - 1, j - 1])
                labels.append(label)
                js += [j] * n
                ks += [k] * n
    return torch.cat(feats), torch.cat(labels), torch.as_tensor(js), torch.as_tensor(ks)


def flag_wave(data: dict) -> dict:
    """The read-so-far flag as `--progress_flag_weight` trains it (`trainers.objectives.progress_flag_loss`), read at
    operation j's last token: flag on ⇔ s_k[0] / rms(s_k) > 0; right when on ⇔ j ≤ k. Per k: the share of rows
    right, and the share of problems whose every row is right (the whole wave in place). No sign of it in a row
    trained without the flag (about half right)."""
    import torch

    from trainers import progress_flag_logits

    states = data["states"]  # (n, R, d, h)
    flag = progress_flag_logits(states) > 0  # (n, R, d)
    iterations, depth = states.shape[1], states.shape[2]
    target = torch.arange(1, depth + 1)[None, :] <= torch.arange(1, iterations + 1)[:, None]  # (R, d)
    right = flag == target
    return {"rows_right": [round(x * 100, 1) for x in right.float().mean((0, 2)).tolist()],
            "whole_wave_right": [round(x * 100, 1) for x in right.all(-1).float().mean(0).tolist()]}


def probe_run(model, tokenizer, task, train_depth: int, n: int) -> dict:
    """Each probe fitted at the training depth and read at 4x it: % right per j (prefix_state at k = j and k = j + 1,
    operation at k = j) and, for passes, the mean class read per k and the share read as k."""
    fit_data = loop_rows(model, tokenizer, task, train_depth, n, seed=3000)
    test_depth = 4 * train_depth
    test_data = loop_rows(model, tokenizer, task, test_depth, max(64, n // 4), seed=4000 + test_depth)
    classes = {"prefix_state": task.num_candidates, "operation": task.num_ops, "passes": train_depth,
               "query_passes": train_depth}
    result = {"fit_depth": train_depth, "test_depth": test_depth}
    for what, num_classes in classes.items():
        x, y, _, _ = examples(fit_data, what, train_depth)
        weights = fit_probe(x, y, num_classes)
        fit_right = (read_probe(weights, x, num_classes) == y).all(-1).float().mean().item()
        x, y, js, ks = examples(test_data, what, train_depth)
        right = (read_probe(weights, x, num_classes) == y).all(-1).float()
        entry = {"fit_accuracy": round(fit_right * 100, 2)}
        if what.endswith("passes"):
            read = read_probe(weights, x, num_classes)[:, 0].float() + 1
            entry["k"] = sorted(set(ks.tolist()))
            entry["mean_read"] = [round(read[ks == k].mean().item(), 2) for k in entry["k"]]
            entry["share_right"] = [round(right[ks == k].mean().item() * 100, 1) for k in entry["k"]]
        else:
            for lag in ((0, 1) if what == "prefix_state" else (0,)):
                entry[f"k=j+{lag}"] = [round(right[(js == j) & (ks == j + lag)].mean().item() * 100, 1)
                                       for j in range(1, test_depth + 1 - lag)]
        result[what] = entry
    result["flag"] = flag_wave(test_data)
    return result


def main(argv=None) -> dict:
    import torch

    from state_tracking import build_tokenizer, load_task
    from state_tracking.evaluation import environment_info

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rows", nargs="+", default=["pose_conv_s0", "conv_s0"])
    parser.add_argument("--n", type=int, default=512, help="problems at the training depth to fit the probes on")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = load_task(TASK_FILE)
    tokenizer = build_tokenizer(task, "text")
    started, rows = time.time(), []
    for row, model, train_depth in finished_par_runs(RUN_DIR, args.rows):
        result = {"run": row, **probe_run(model, tokenizer, task, train_depth, args.n)}
        print(json.dumps(result), flush=True)
        rows.append(result)
    record = {"command": "python examples/studies/full_view_row_probe.py " + " ".join(argv or sys.argv[1:]),
              "task_file": TASK_FILE, "ridge": RIDGE, "rows": rows, "seconds": round(time.time() - started, 1),
              "environment": environment_info()}
    save_record(record, OUT)
    return record


if __name__ == "__main__":
    main()
