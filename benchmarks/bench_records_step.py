"""What one training step costs: PAR's recipe against the LSTM / GRU baselines on the same records batch.

One optimizer step (forward, backward, AdamW) on a batch of 64 records of one length d, one thread, as
`train_par.py --train_file` and `examples/baselines/rnn.py` run it: PAR with the local view, its gradient window
(readouts at the last min(d, 8) iterations), eager (no torch.compile), the attention `train_par.py` gives it on a CPU
("par_eager", `state_tracking.evaluation.default_attn_implementation`) and the Trainer's default optimizer (AdamW,
`fused=True`: TrainingArguments' `optim="adamw_torch_fused"`); the RNN reads every token, is read at the last
operation and steps rnn.py's `torch.optim.AdamW` (defaults). The row "+ answer feedback" is the model the recipe
chooses for final-state records whose answer is the whole state (`par_cli.recipe`: `answer_feedback`, hidden 64,
1 + 1 + 1 layers). `--as_first_measured`: PAR with transformers' default attention (sdpa) and a plain AdamW, as the
figures before 2026-12-07 were measured. Printed per model and length: seconds
per step (median of `--repeats` timed steps after 3 warm-up steps), FLOPs per step
(PAR: `torch.utils.flop_counter.FlopCounterMode`, matrix products and attention; the RNNs: `rnn_step_flops`, their
matrix products), the achieved GFLOP/s, and the tensor operations one step dispatches (`count_ops`: forward, backward
and AdamW; independent of the machine's load, unlike the seconds).

    python benchmarks/bench_records_step.py [--lengths 8,16] [--repeats 20] [--out results/own_data_cpu/step_cost.json]
    python benchmarks/bench_records_step.py --profile [--lengths 16]   # where a step's time goes, per model
    python benchmarks/bench_records_step.py --models "answer feedback" --repeats 10   # one model's rows only
    python benchmarks/bench_records_step.py --compiled --models "answer feedback,LSTM 128"   # + compile_core rows

`--compiled`: each PAR model also with `compile_core(dynamic=True)` (`compiled_rows`): the first step's seconds on a
cold, then a warm inductor cache, and the steady seconds per step.

`--profile`: each model's step once more under `torch.profiler`, its self CPU time grouped (`op_category`): matrix
products, attention, elementwise and normalization, the optimizer, autograd bookkeeping, and everything else (Python
and dispatch: the step's wall time minus the ops' self time, the profiler's own overhead included, so an upper
bound). The figures are shares of one step.

The records are `examples/studies/own_data.py --make_data`'s register3 final-states file (written if missing). A change
to modeling_par is measured before / after in one process by `benchmarks/ab_records_step.py`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FILE = REPO / "runs" / "own_data" / "data" / "register3_final.jsonl"
MODELS = {  # name -> builder arguments (PAR: hidden, intermediate, prelude / core / coda layers; RNN: cell, hidden)
    "PAR h128 1+2+1 (the records default)": ("par", dict(hidden=128, intermediate=256, layers=(1, 2, 1))),
    "PAR h64 1+2+1": ("par", dict(hidden=64, intermediate=128, layers=(1, 2, 1))),
    "PAR h64 1+1+1": ("par", dict(hidden=64, intermediate=128, layers=(1, 1, 1))),
    "PAR h64 1+1+1 + answer feedback (the recipe's choice)": ("par", dict(
        hidden=64, intermediate=128, layers=(1, 1, 1), answer_feedback=True)),
    "LSTM 288": ("rnn", dict(cell="lstm", hidden=288)),
    "LSTM 128 (rnn.py's default)": ("rnn", dict(cell="lstm", hidden=128)),
    "GRU 336": ("rnn", dict(cell="gru", hidden=336)),
}


def par_model(token_ids: dict, hidden: int, intermediate: int, layers: tuple[int, int, int],
              answer_feedback: bool = False, attn: str | None = None, package=None):
    """A fresh PAR model of the records defaults (local view, progress positions, bidirectional queries, gradient
    window 8) of this size, with answer feedback or not, in training mode; `attn`: the attention implementation
    (None: transformers' default); `package`: the `modeling_par` module to build it from (default: this checkout's)."""
    if package is None:
        import modeling_par as package
    config = package.ParLoopedQwenConfig(
        vocab_size=token_ids["vocab_size"], pad_token_id=token_ids["pad_token_id"], hidden_size=hidden,
        intermediate_size=intermediate, num_attention_heads=4, num_key_value_heads=4, prelude_layers=layers[0],
        core_layers=layers[1], coda_layers=layers[2], max_position_embeddings=4096,
        answer_token_ids=token_ids["answer_token_ids"], halt_token_ids=token_ids["halt_token_ids"],
        loop_view="local", progress_positions=True, bidirectional_queries=True, grad_window=8,
        answer_feedback=answer_feedback)
    model = package.ParLoopedQwenForStateTracking(config).train()
    if attn is not None:
        model.set_attn_implementation(attn)
    return model


def rnn_step_flops(cell: str, hidden: int, shape) -> int:
    """Matrix-product FLOPs of an RNN training step (FlopCounterMode does not see inside the fused LSTM op): per token,
    gates × (input + hidden) × hidden multiply-adds, forward once and backward twice (input and weight gradients)."""
    gates = {"lstm": 4, "gru": 3}[cell]
    batch, tokens = shape
    return 3 * 2 * gates * (hidden + hidden) * hidden * batch * tokens


def step_function(kind: str, model, batch: dict, depth: int, fused: bool | None = None):
    """One optimizer step's closure: the loss each training script computes on this batch, backward, AdamW
    (`fused`: torch.optim.AdamW's `fused`; None: its default, as rnn.py steps)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    rows = torch.arange(batch["input_ids"].shape[0])
    final = batch["step_labels"][rows, depth]  # (b, Q)

    def step():
        if kind == "par":
            reads = list(range(max(1, depth - model.config.grad_window + 1), depth + 1))
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], num_iterations=depth, readout_iterations=reads,
                        operation_ends=batch["operation_ends"])
            logits = out.answer_logits[-1]  # (b, Q, C): the final answer, as final-answer training on these records
        else:
            logits = model(batch["input_ids"], batch["operation_ends"][rows, depth][:, None])[:, 0]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), final.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def count_ops(step) -> int:
    """The tensor operations (ATen ops, views included) one call of `step` dispatches: forward, backward and the
    optimizer's, counted under a `TorchDispatchMode`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    with Counter() as counter:
        step()
    return counter.count


CATEGORIES = (  # (category, substrings of an op's name), the first match wins
    ("attention", ("attention", "softmax", "bmm", "baddbmm")),
    ("matrix products", ("addmm", "mm", "matmul", "linear", "lstm", "gru", "rnn")),
    ("optimizer", ("adam", "_foreach", "lerp", "addcdiv", "addcmul")),
    ("autograd bookkeeping", ("backward", "accumulategrad", "autograd", "zero_", "fill_")),
    ("elementwise / norm", ("mul", "add", "div", "sub", "pow", "rsqrt", "mean", "silu", "sigmoid", "tanh", "exp",
                            "neg", "cat", "where", "gather", "scatter", "index", "cos", "sin", "norm", "clamp")),
)


def op_category(name: str) -> str:
    """The category of a profiled op by its name (`CATEGORIES`), "other ops" if none matches."""
    lowered = name.lower()
    return next((category for category, keys in CATEGORIES if any(k in lowered for k in keys)), "other ops")


def profile_step(step) -> dict:
    """One step under torch.profiler: seconds per category of the ops' self CPU time, and the rest of the step's wall
    time as "python and dispatch"."""
    from torch.profiler import ProfilerActivity, profile

    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    wall = time.perf_counter() - started
    spent: dict[str, float] = {}
    for event in prof.key_averages():
        spent[op_category(event.key)] = spent.get(op_category(event.key), 0.0) + event.self_cpu_time_total / 1e6
    ops = sum(spent.values())
    spent["python and dispatch (wall - ops)"] = max(0.0, wall - ops)
    return {"wall_seconds": round(wall, 5), "share": {k: round(v / wall, 3) for k, v in
                                                      sorted(spent.items(), key=lambda item: -item[1])}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8,16")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", action="store_true", help="where a step's time goes (torch.profiler), per model")
    parser.add_argument("--as_first_measured", action="store_true",
                        help="PAR with sdpa attention and a plain AdamW, as measured before 2026-12-07")
    parser.add_argument("--compiled", action="store_true",
                        help="also each PAR model with compile_core(dynamic=True) (the step's first call timed on a "
                        "fresh inductor cache, then on a warm one)")
    parser.add_argument("--models", default=None, help="only the models whose name contains one of these "
                        "comma-separated words, e.g. 'answer feedback,LSTM' (default: every model)")
    return parser


def read_records():
    """The register3 records (`FILE`, written by own_data.py --make_data if missing), read as training reads them."""
    from state_tracking.records import RecordColumns, read_record_splits

    if not FILE.exists():
        import subprocess

        subprocess.run([sys.executable, "examples/studies/own_data.py", "--make_data", "--machine", "register3"],
                       cwd=REPO, check=True)
    return read_record_splits(RecordColumns(), str(FILE), validation_split_percentage=0)


def build_model(kind: str, spec: dict, records, as_first_measured: bool = False):
    """A freshly seeded model of `MODELS`' kind and spec, in training mode; PAR with train_par.py's attention on a
    CPU (`as_first_measured`: transformers' default, sdpa)."""
    import torch

    from par_studies import repo_module
    from state_tracking.records import record_token_ids

    token_ids = record_token_ids(records.tokenizer, records.record_format)
    torch.manual_seed(0)
    if kind == "par":
        from state_tracking.evaluation import default_attn_implementation

        attn = None if as_first_measured else default_attn_implementation("local", "cpu")
        return par_model(token_ids, **spec, attn=attn)
    num_queries, num_candidates = len(records.record_format.query_names), len(records.record_format.candidates)
    tracker = repo_module("examples.baselines.rnn").RNNStateTracker
    return tracker(spec["cell"], token_ids["vocab_size"], spec["hidden"], 1, num_queries, num_candidates).train()


def median_step_seconds(step, repeats: int, warmup: int = 3) -> float:
    """The median wall seconds of `repeats` calls of `step`, after `warmup` untimed calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_step(kind: str, spec: dict, model, batch: dict, depth: int, repeats: int, fused: bool | None = None
                 ) -> tuple:
    """(the step's closure, median seconds per step after 3 warm-up steps, FLOPs per step, how they were counted,
    tensor operations per step)."""
    from torch.utils.flop_counter import FlopCounterMode

    step = step_function(kind, model, batch, depth, fused=fused)
    seconds = median_step_seconds(step, repeats)
    if kind == "par":
        with FlopCounterMode(display=False) as counter:
            step()
        flops, source = counter.get_total_flops(), "FlopCounterMode"
    else:
        flops, source = rnn_step_flops(spec["cell"], spec["hidden"], batch["input_ids"].shape), "analytic"
    return step, seconds, flops, source, count_ops(step)


def compiled_rows(name: str, spec: dict, records, batches: dict, repeats: int) -> list[dict]:
    """`name`'s PAR model with `compile_core(dynamic=True)`, stepped as train_par.py steps it (fused AdamW,
    "par_eager"): per depth in `batches` (depth -> batch), the first step's seconds on a cold inductor cache (the
    process's own, empty at start: `TORCHINDUCTOR_CACHE_DIR` set by `main`), then the median step; then the same
    on a new model after `torch._dynamo.reset()`, the inductor cache warm (a second run of a user's command)."""
    import torch

    rows = []
    for cache in ("cold", "warm"):
        torch._dynamo.reset()
        model = build_model("par", spec, records).compile_core(dynamic=True)
        for depth, batch in batches.items():
            step = step_function("par", model, batch, depth, fused=True)
            started = time.perf_counter()
            step()
            first = time.perf_counter() - started
            seconds = median_step_seconds(step, repeats, warmup=2)
            rows.append({"model": name + " compiled", "depth": depth, "inductor_cache": cache,
                         "attention": model.config._attn_implementation, "optimizer_fused": True,
                         "first_step_seconds": round(first, 3), "seconds_per_step": round(seconds, 5)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.compiled:  # a cold inductor cache of this process's own, before torch reads the variable
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_records_inductor_")
    import numpy as np
    import torch

    from state_tracking import StateTrackingCollator

    torch.set_num_threads(1)
    records = read_records()
    encoded = records.encoded
    depths = np.asarray(encoded["depth"])
    collate = StateTrackingCollator(records.tokenizer.pad_token_id, padding_side="right")
    rows = []
    words = None if args.models is None else [w.strip() for w in args.models.split(",")]
    for name, (kind, spec) in MODELS.items():
        if words is not None and not any(w in name for w in words):
            continue
        model = build_model(kind, spec, records, args.as_first_measured)
        fused = True if kind == "par" and not args.as_first_measured else None  # the Trainer's adamw_torch_fused
        parameters = sum(p.numel() for p in model.parameters())
        batches = {d: collate([encoded[int(i)] for i in np.flatnonzero(depths == d)[:args.batch_size]])
                   for d in (int(d) for d in args.lengths.split(","))}
        for depth, batch in batches.items():
            step, seconds, flops, source, ops = measure_step(kind, spec, model, batch, depth, args.repeats, fused)
            attention = getattr(model.config, "_attn_implementation", None) if kind == "par" else None
            rows.append({"model": name, "parameters": parameters, "depth": depth, "optimizer_fused": bool(fused),
                         "attention": attention, "seconds_per_step": round(seconds, 5),
                         "gflops_per_step": round(flops / 1e9, 3), "flops_counted_by": source,
                         "gflops_per_second": round(flops / seconds / 1e9, 1), "ops_per_step": ops})
            if args.profile:
                rows[-1]["profile"] = profile_step(step)
            print(json.dumps(rows[-1]), flush=True)
        if args.compiled and kind == "par":
            rows += compiled_rows(name, spec, records, batches, args.repeats)
    result = {"command": "python benchmarks/bench_records_step.py " + " ".join(argv or sys.argv[1:]),
              "profile_categories": [c for c, _ in CATEGORIES] if args.profile else None,
              "batch_size": args.batch_size, "repeats": args.repeats, "threads": 1, "rows": rows,
              "torch": torch.__version__, "load": os.environ.get("PAR_LOAD", "as the machine was"),
              "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.processor()})",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
