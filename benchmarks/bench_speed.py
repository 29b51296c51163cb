"""Speed of every training and evaluation path, side by side, against this machine's matmul ceiling.

    python benchmarks/bench_speed.py [--repeats 5] [--out results/speed_cpu/bench_speed.json]

One run measures, on the same machine and in the same process tree:
  * the ceiling: GFLOP/s of a plain matmul (n = 2048, and the model's own (rows × 128) @ (128 × 256) shape) in fp32
    and bf16, on 1 and on all threads;
  * training samples/s (one optimizer step of the default `train_par.py` model: hidden 128, 1 + 2 + 1 layers,
    batch 64, the PAR loss over the 8-iteration gradient window) at d = 8 and d = 32, for the recipe view
    (`loop_view="local"` on its window path, the from-scratch default) and the paper's full view (the retrofit
    default), on each path of TRAIN_PATHS: `before` is the code before the CPU fast paths (sdpa with a
    materialized mask, the local window rebuilt op by op every iteration: `window_plan_iterations=1`, the adapter
    run on [e ; s] every iteration: `split_adapter=False`); then one thread, the sdpa causal fast path, bf16
    autocast, `compile_core()`, eager attention, eager attention + `compile_core()` (round 4's default: no-grad
    runs of `block_iterations` iterations as one graph), "par_eager" attention + `compile_core()` (the same with
    the window's few-key attention blocks as fused broadcast products: the CPU default of `train_par.py` for the
    recipe), and 2 processes × 1 thread (DDP, gloo);
  * evaluation sequences/s at d = 64 (256 sequences, forced depth and learned halting) of the shipped checkpoint, and
    forced depth of the full view (a random model of the same size: speed does not depend on the weights), on each
    path of EVAL_PATHS;
  * achieved GFLOP/s of each path from a FLOP count of the same step (`torch.utils.flop_counter`: matmuls and
    attention), its fraction of the fp32 ceiling, and its ratio to `before`.
In-process paths are timed in interleaved rounds (median of --repeats; the machine's run-to-run drift reaches
±30%, so every path sees the same drift); compiled paths are warmed up first and their first calls reported.
Printed as tables and written to --out as JSON. Nothing is asserted: speed is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking  # noqa: E402
from state_tracking import (  # noqa: E402
    StateTrackingCollator,
    build_dataset,
    build_tokenizer,
    evaluate_length_generalization,
    get_task,
    load_task_from_dir,
    model_token_ids,
)
from trainers import answer_loss, progress_targets  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "par-swap-s5-small"
VIEWS = {
    "recipe (local view, window)": dict(loop_view="local", progress_positions=True, bidirectional_queries=True),
    "paper (full view)": {},
}
THREADS = os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------------- helpers
def seconds_per_call(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def matmul_ceiling(threads: int, dtype: torch.dtype, n: int, m: int, k: int, budget_s: float = 1.0) -> float:
    """GFLOP/s of (n × k) @ (k × m) on `threads` threads."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, k, dtype=dtype), torch.randn(k, m, dtype=dtype)
    once = seconds_per_call(lambda: a @ b, 1)
    repeats = max(1, min(50, int(budget_s / max(once, 1e-6))))
    return 2 * n * m * k / seconds_per_call(lambda: a @ b, repeats, warmup=0) / 1e9


def default_model(view: dict, seed: int = 0, attn: str = "sdpa") -> tuple[ParLoopedQwenForStateTracking, dict]:
    task = get_task("swap_s5")
    ids = model_token_ids(build_tokenizer(task, "symbolic"), task)
    torch.manual_seed(seed)
    config = ParLoopedQwenConfig(
        vocab_size=ids["vocab_size"], pad_token_id=ids["pad_token_id"], hidden_size=128, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=4, prelude_layers=1, core_layers=2, coda_layers=1,
        answer_token_ids=ids["answer_token_ids"], halt_token_ids=ids["halt_token_ids"], attn_implementation=attn,
        **view)
    return ParLoopedQwenForStateTracking(config).train(), ids


def training_batch(depth: int, batch_size: int, ids: dict) -> dict:
    task = get_task("swap_s5")
    data = build_dataset(task, build_tokenizer(task, "symbolic"), n=batch_size, depths=depth, seed=0)
    return StateTrackingCollator(ids["pad_token_id"])([data[i] for i in range(batch_size)])


def make_step(model, batch: dict, depth: int, bf16: bool = False):
    """One optimizer step of the PAR loss over the gradient window, as `ParTrainer` runs it (forced depth)."""
    config = getattr(model, "module", model).config  # a DistributedDataParallel wrapper keeps it on .module
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # the Trainer's default (adamw_torch_fused)
    window = list(range(max(1, depth - config.grad_window + 1), depth + 1))
    ends = batch["operation_ends"] if config.loop_view != "full" else None

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], operation_ends=ends, num_iterations=depth,
                        readout_iterations=window)
        targets = progress_targets(batch["step_labels"], batch["depth"], torch.tensor(window), 1)
        answer_loss(out.answer_logits, targets).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


# ---------------------------------------------------------------------------------------------------- DDP worker
def _ddp_worker(rank: int, world: int, view: dict, depth: int, batch_size: int, repeats: int, port: int, out: str,
                attn: str = "sdpa", compile_core: bool = False):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, ids = default_model(view, attn=attn)
    if compile_core:
        model.compile_core()
    batch = training_batch(depth, batch_size, ids)
    half = {k: v[rank * batch_size // world : (rank + 1) * batch_size // world] for k, v in batch.items()}
    step = make_step(torch.nn.parallel.DistributedDataParallel(model), half, depth)
    dist.barrier()
    seconds = seconds_per_call(step, repeats, warmup=3 if compile_core else 1)
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": seconds}))
    dist.barrier()  # tear down together: a rank leaving early aborted gloo here now and then (the run then hung)
    dist.destroy_process_group()


def free_port() -> int:
    """A TCP port free right now (a fixed port can hang gloo's rendezvous when an earlier run left it in use)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ddp_step_seconds(view: dict, depth: int, batch_size: int, repeats: int, attn: str = "sdpa",
                     compile_core: bool = False, timeout_s: float = 300.0, tries: int = 2) -> float | None:
    """Seconds per step of 2 processes × 1 thread (gloo). A run that has not finished within `timeout_s` (gloo's
    rendezvous occasionally hung on this machine) is killed and tried again on a fresh port; None if all tries hang."""
    for _ in range(tries):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ddp.json")
            context = mp.start_processes(
                _ddp_worker, args=(2, view, depth, batch_size, repeats, free_port(), out, attn, compile_core),
                nprocs=2, join=False, start_method="spawn")
            deadline = time.monotonic() + timeout_s
            while not context.join(timeout=5):
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    print(f"  DDP run hung for {timeout_s:.0f} s: killed", flush=True)
                    break
            else:
                return json.loads(Path(out).read_text())["seconds"]
    return None


# ---------------------------------------------------------------------------------------------------- sections
def bench_ceiling() -> dict:
    rows = {}
    for threads in sorted({1, THREADS}):
        for dtype in (torch.float32, torch.bfloat16):
            # bf16 at n = 512: on a CPU without bf16 matmul units one 2048³ product takes about a minute
            for shape in ((2048, 2048, 2048) if dtype == torch.float32 else (512, 512, 512), (2048, 256, 128)):
                budget = 1.0 if dtype == torch.float32 else 0.3
                key = f"{threads} thread(s), {str(dtype)[6:]}, n,m,k={shape}"
                rows[key] = matmul_ceiling(threads, dtype, *shape, budget_s=budget)
                print(f"  ceiling {key}: {rows[key]:.1f} GFLOP/s", flush=True)
    torch.set_num_threads(THREADS)
    return rows


def interleaved_seconds(calls: dict, rounds: int) -> dict:
    """Median seconds of each call over `rounds` rounds that run every call once in turn, so that drift of a shared
    machine (run-to-run noise here reaches ±30%) falls on every path alike. calls: name -> (fn, threads)."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, threads) in calls.items():
            torch.set_num_threads(threads)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    torch.set_num_threads(THREADS)
    return {name: statistics.median(t) for name, t in times.items()}


def rate_fields(flops: int, seconds: float, before: float, ceiling_fp32: float) -> dict:
    """Achieved GFLOP/s, its fraction of the fp32 ceiling, and the ratio to `before` (seconds of the reference)."""
    gflop_per_s = flops / seconds / 1e9
    return dict(gflop_per_s=gflop_per_s, fraction_of_fp32_ceiling=gflop_per_s / ceiling_fp32,
                speedup_vs_before=before / seconds)


def prepare_model(model, path: dict):
    """Apply a path's options to a freshly built model: the per-iteration window construction of the code before the
    fast paths (`window_plan_iterations=1`, `block_iterations=1`), explicit mask and whole adapter for `before`, then
    compile (with the path's inductor `options`, if any)."""
    model.runtime.causal_fast_path = path.get("fast", True)
    if path.get("before"):
        model.runtime.window_plan_iterations = 1
        model.runtime.split_adapter = False
        model.runtime.block_iterations = 1
    if path.get("compile"):
        model.compile_core(**({"options": path["options"]} if "options" in path else {}))
    return model


# eager attention + compile_core() (round 4's default: no-grad runs of `block_iterations` iterations as one graph),
# and the same with "par_eager" attention (the window's few-key blocks as fused broadcast products: the CPU default).
# Round 3's default (one compiled call per iteration) is described in results/speed_cpu/README.md.
EAGER_COMPILED_PATHS = [
    ("eager attention + compile_core()", dict(attn="eager", compile=True)),
    ("par_eager attention + compile_core()", dict(attn="par_eager", compile=True)),
]

TRAIN_PATHS = [
    ("before: eager fp32, sdpa, mask", dict(fast=False, before=True)),
    ("eager fp32, 1 thread", dict(fast=False, before=True, threads=1)),
    ("sdpa causal fast path", dict(full_view_only=True)),
    ("bf16 autocast", dict(bf16=True)),
    ("compile_core() (sdpa)", dict(compile=True)),
    ("eager attention", dict(attn="eager")),
    *EAGER_COMPILED_PATHS,
    ("DDP 2 processes × 1 thread (sdpa)", dict(ddp=True)),
    ("DDP 2 × 1 + par_eager attention + compile_core()", dict(ddp=True, attn="par_eager", compile=True)),
]


def bench_training(args, ceiling_fp32: float) -> list[dict]:
    rows = []
    for view_name, view in VIEWS.items():
        for depth in (8, 32):
            torch._dynamo.reset()  # a fresh compile cache per group
            model, ids = default_model(view)
            batch = training_batch(depth, args.batch_size, ids)
            flops = counted_flops(make_step(prepare_model(model, dict(fast=False, before=True)), batch, depth))
            calls, seconds, first = {}, {}, {}
            for name, path in TRAIN_PATHS:
                if path.get("full_view_only") and view:
                    continue
                if path.get("bf16") and depth > args.bf16_max_depth:
                    rows.append(dict(section="train", view=view_name, depth=depth, path=name, skipped=(
                        f"bf16 matmul here runs at a small fraction of fp32 (see ceiling); measured at d ≤ "
                        f"{args.bf16_max_depth} only")))
                    continue
                if path.get("ddp"):
                    ddp = ddp_step_seconds(view, depth, args.batch_size, args.repeats, path.get("attn", "sdpa"),
                                           path.get("compile", False))
                    if ddp is None:
                        rows.append(dict(section="train", view=view_name, depth=depth, path=name,
                                         skipped="both DDP runs hung (gloo rendezvous); killed after 300 s"))
                    else:
                        seconds[name] = ddp
                    continue
                threads = path.get("threads", THREADS)
                torch.set_num_threads(threads)
                model = prepare_model(default_model(view, attn=path.get("attn", "sdpa"))[0], path)
                step = make_step(model, batch, depth, bf16=path.get("bf16", False))
                start = time.perf_counter()
                for _ in range(3 if path.get("compile") else 1):  # compile (grad, no-grad, first iteration) here
                    step()
                first[name] = time.perf_counter() - start
                if path.get("bf16"):  # ~10× slower here: timed once, outside the rounds
                    seconds[name] = seconds_per_call(step, 1, warmup=0)
                else:
                    calls[name] = (step, threads)
            torch.set_num_threads(THREADS)
            seconds.update(interleaved_seconds(calls, args.repeats))
            before = seconds[TRAIN_PATHS[0][0]]
            for name, _ in TRAIN_PATHS:
                if name not in seconds:
                    continue
                sec = seconds[name]
                row = dict(section="train", view=view_name, depth=depth, path=name, ms_per_step=1000 * sec,
                           samples_per_s=args.batch_size / sec, gflop_per_step=flops / 1e9,
                           **rate_fields(flops, sec, before, ceiling_fp32))
                if name in first and "compile" in name:
                    row["first_3_steps_s"] = first[name]
                rows.append(row)
                print(f"  train {view_name} d={depth} {name}: {1000 * sec:.0f} ms/step, "
                      f"{row['samples_per_s']:.0f} samples/s, {row['gflop_per_s']:.1f} GFLOP/s, "
                      f"×{row['speedup_vs_before']:.2f}", flush=True)
    return rows


EVAL_PATHS = [
    ("before: eager fp32, sdpa", dict(fast=False, before=True)),
    ("eager fp32, 1 thread", dict(fast=False, before=True, threads=1)),
    ("sdpa causal fast path", dict(full_view_only=True)),
    ("bf16 weights", dict(bf16=True)),
    ("compile_core() (sdpa)", dict(compile=True, forced_only=True)),
    ("workers=2 (sdpa)", dict(workers=2)),
    ("eager attention", dict(attn="eager")),
    *EAGER_COMPILED_PATHS,
    ("eager attention + workers=2", dict(attn="eager", workers=2)),
]


def bench_evaluation(args, ceiling_fp32: float) -> list[dict]:
    rows = []
    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
    task = load_task_from_dir(CHECKPOINT)
    cases = [("recipe (shipped checkpoint)", "forced"), ("recipe (shipped checkpoint)", "halting"),
             ("paper (full view, random weights)", "forced")]
    for model_name, mode in cases:
        torch._dynamo.reset()
        calls, seconds, first, flops = {}, {}, {}, None
        for name, path in EVAL_PATHS:
            if (path.get("full_view_only") and not model_name.startswith("paper")) or (
                    path.get("forced_only") and mode != "forced"):
                continue
            attn = path.get("attn", "sdpa")
            if model_name.startswith("recipe"):
                model = ParLoopedQwenForStateTracking.from_pretrained(CHECKPOINT, dtype=torch.float32,
                                                                      attn_implementation=attn).eval()
            else:
                model = default_model({}, attn=attn)[0].eval()
            model = prepare_model(model, path)
            if path.get("bf16"):
                model = model.to(torch.bfloat16)
            n = args.bf16_eval_n if path.get("bf16") else args.eval_n

            def run(n=n, model=model, path=path, mode=mode):
                return evaluate_length_generalization(model, tokenizer, task, [args.eval_depth], n_per_depth=n,
                                                      mode=mode, batch_size=args.eval_n, progress=False,
                                                      workers=path.get("workers", 1))

            threads = path.get("threads", THREADS)
            torch.set_num_threads(threads)
            if flops is None:  # the same work on every path: counted once, on the reference
                flops = counted_flops(run)
            start = time.perf_counter()
            run()  # compiles on the compiled paths
            first[name] = time.perf_counter() - start
            if path.get("bf16"):
                seconds[name] = seconds_per_call(run, 1, warmup=0) * args.eval_n / n
            else:
                calls[name] = (run, threads)
        torch.set_num_threads(THREADS)
        seconds.update(interleaved_seconds(calls, args.repeats))
        before = seconds[EVAL_PATHS[0][0]]
        for name, _ in EVAL_PATHS:
            if name not in seconds:
                continue
            sec = seconds[name]
            row = dict(section="eval", model=model_name, mode=mode, depth=args.eval_depth,
                       n=args.bf16_eval_n if name == "bf16 weights" else args.eval_n, path=name,
                       seconds_per_256=sec, sequences_per_s=args.eval_n / sec, gflop=flops / 1e9,
                       **rate_fields(flops, sec, before, ceiling_fp32))
            if "compile" in name:
                row["first_call_s"] = first[name]
            rows.append(row)
            print(f"  eval {model_name} {mode} d={args.eval_depth} {name}: {row['sequences_per_s']:.1f} sequences/s, "
                  f"{row['gflop_per_s']:.1f} GFLOP/s, ×{row['speedup_vs_before']:.2f}", flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = ["| section | model / view | d | mode | path | time | throughput | GFLOP/s | of fp32 ceiling | × before |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["training"] + report["evaluation"]:
        if "skipped" in r:
            lines.append(f"| train | {r['view']} | {r['depth']} | | {r['path']} | skipped: {r['skipped']} | | | | |")
            continue
        if r["section"] == "train":
            lines.append(f"| train | {r['view']} | {r['depth']} | forced | {r['path']} | "
                         f"{r['ms_per_step']:.0f} ms/step | {r['samples_per_s']:.0f} samples/s | "
                         f"{r['gflop_per_s']:.1f} | {100 * r['fraction_of_fp32_ceiling']:.0f}% | "
                         f"{r['speedup_vs_before']:.2f} |")
        else:
            lines.append(f"| eval | {r['model']} | {r['depth']} | {r['mode']} | {r['path']} | "
                         f"{r['seconds_per_256']:.2f} s / 256 | {r['sequences_per_s']:.1f} seq/s | "
                         f"{r['gflop_per_s']:.1f} | {100 * r['fraction_of_fp32_ceiling']:.0f}% | "
                         f"{r['speedup_vs_before']:.2f} |")
    return "\n".join(lines)


DEFAULT_PATH = "par_eager attention + compile_core()"  # train_par.py's CPU default for the recipe (see README)


def summary(report: dict) -> str:
    """One row per (section, view, depth, mode): `before`, the CPU default path of the recipe, the fastest path, and
    the fraction of the fp32 ceiling each reaches."""
    lines = [f"| what | before | {DEFAULT_PATH} | × | fastest path | × | of ceiling: before → default |",
             "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in report["training"] + report["evaluation"]:
        if "skipped" not in r:
            key = (r["section"], r.get("view") or r.get("model"), r["depth"], r.get("mode", "forced"))
            groups.setdefault(key, []).append(r)
    for (section, name, depth, mode), rows in groups.items():
        unit, field = ("samples/s", "samples_per_s") if section == "train" else ("seq/s", "sequences_per_s")
        before, default = rows[0], next((r for r in rows if r["path"] == DEFAULT_PATH), None)
        best = max(rows, key=lambda r: r["speedup_vs_before"])
        digits = 0 if section == "train" else 1

        def cell(r, field=field, unit=unit, digits=digits):
            return f"{r[field]:.{digits}f} {unit}"

        lines.append(
            f"| {section}, {name}, {mode}, d = {depth} | {cell(before)} | "
            f"{cell(default) if default else '–'} | {default['speedup_vs_before']:.2f} | "
            f"{best['path']}: {cell(best)} | "
            f"{best['speedup_vs_before']:.2f} | {100 * before['fraction_of_fp32_ceiling']:.0f}% → "
            f"{100 * default['fraction_of_fp32_ceiling']:.0f}% |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=64)
    parser.add_argument("--eval_depth", "--eval-depth", type=int, default=64)
    parser.add_argument("--eval_n", "--eval-n", type=int, default=256)
    parser.add_argument("--bf16_eval_n", "--bf16-eval-n", type=int, default=16,
                        help="bf16 is slow on CPUs without bf16 matmul units")
    parser.add_argument("--bf16_max_depth", "--bf16-max-depth", type=int, default=8)
    parser.add_argument("--sections", default="ceiling,train,eval")
    parser.add_argument("--out", default=None, help="JSON report (and a .md table beside it)")
    parser.add_argument("--summary_from", "--summary-from", default=None, metavar="JSON",
                        help="print the summary table of an existing report and exit")
    args = parser.parse_args(argv)
    if args.summary_from:
        print(summary(json.loads(Path(args.summary_from).read_text())))
        return
    # every compiled path keeps its own graphs (grad / no-grad / first iteration, core and coda) alive at once
    torch._dynamo.config.recompile_limit, torch._dynamo.config.accumulated_recompile_limit = 64, 512
    sections = set(args.sections.split(","))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    report = dict(command="python benchmarks/bench_speed.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  date=datetime.datetime.now().isoformat(timespec="seconds"), machine=platform.platform(), cpu=cpu,
                  cpu_capability=torch.backends.cpu.get_cpu_capability(), threads=THREADS,
                  torch=torch.__version__, ceiling={}, training=[], evaluation=[])
    print(f"{cpu}, {THREADS} threads, torch {torch.__version__}, {report['cpu_capability']}", flush=True)
    if "ceiling" in sections:
        report["ceiling"] = bench_ceiling()
    ceiling_fp32 = max((v for k, v in report["ceiling"].items() if "float32" in k and k.startswith(f"{THREADS} ")),
                       default=float("nan"))
    report["ceiling_fp32_all_threads"] = ceiling_fp32
    if "train" in sections:
        report["training"] = bench_training(args, ceiling_fp32)
    if "eval" in sections:
        report["evaluation"] = bench_evaluation(args, ceiling_fp32)
    table = markdown(report) + "\n\n" + summary(report)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
