"""Speed of every training and evaluation path, side by side, against this machine's matmul ceiling.

    python benchmarks/bench_speed.py [--repeats 3] [--out results/speed_cpu/bench_speed.json]

One run measures, on the same machine and in the same process tree:
  * the ceiling: GFLOP/s of a plain matmul (n = 2048, and the model's own (rows × 128) @ (128 × 256) shape) in fp32
    and bf16, on 1 and on all threads;
  * training samples/s (one optimizer step of the default `train_par.py` model: hidden 128, 1 + 2 + 1 layers,
    batch 64, the PAR loss over the 8-iteration gradient window) at d = 8 and d = 32, for the recipe view
    (`loop_view="local"` on its window path, the from-scratch default) and the paper's full view (the retrofit
    default), on each path: eager fp32 with mask as before this work (`before`), the sdpa causal fast path,
    bf16 autocast, `compile_core()`, and 2 processes × 1 thread (DDP, gloo);
  * evaluation sequences/s at d = 64 (256 sequences, forced depth and learned halting) of the shipped checkpoint, and
    forced depth of the full view (a random model of the same size: speed does not depend on the weights), on each
    path: eager fp32 (`before`), bf16 weights, `compile_core()`, `workers=2` (two halves at once, one thread each);
  * achieved GFLOP/s of each path from a FLOP count of the same step (`torch.utils.flop_counter`: matmuls and
    attention), its fraction of the fp32 ceiling, and its ratio to `before`.
Printed as tables and written to --out as JSON. Nothing is asserted: speed is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
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
from transformers import AutoTokenizer  # noqa: E402

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


def default_model(view: dict, seed: int = 0) -> tuple[ParLoopedQwenForStateTracking, dict]:
    task = get_task("swap_s5")
    ids = model_token_ids(build_tokenizer(task, "symbolic"), task)
    torch.manual_seed(seed)
    config = ParLoopedQwenConfig(
        vocab_size=ids["vocab_size"], pad_token_id=ids["pad_token_id"], hidden_size=128, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=4, prelude_layers=1, core_layers=2, coda_layers=1,
        answer_token_ids=ids["answer_token_ids"], halt_token_ids=ids["halt_token_ids"], **view)
    return ParLoopedQwenForStateTracking(config).train(), ids


def training_batch(depth: int, batch_size: int, ids: dict) -> dict:
    task = get_task("swap_s5")
    data = build_dataset(task, build_tokenizer(task, "symbolic"), n=batch_size, depths=depth, seed=0)
    return StateTrackingCollator(ids["pad_token_id"])([data[i] for i in range(batch_size)])


def make_step(model, batch: dict, depth: int, bf16: bool = False):
    """One optimizer step of the PAR loss over the gradient window, as `ParTrainer` runs it (forced depth)."""
    config = getattr(model, "module", model).config  # a DistributedDataParallel wrapper keeps it on .module
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
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
def _ddp_worker(rank: int, world: int, view: dict, depth: int, batch_size: int, repeats: int, port: int, out: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, ids = default_model(view)
    batch = training_batch(depth, batch_size, ids)
    half = {k: v[rank * batch_size // world : (rank + 1) * batch_size // world] for k, v in batch.items()}
    step = make_step(torch.nn.parallel.DistributedDataParallel(model), half, depth)
    dist.barrier()
    seconds = seconds_per_call(step, repeats)
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": seconds}))
    dist.destroy_process_group()


def ddp_step_seconds(view: dict, depth: int, batch_size: int, repeats: int, port: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.json")
        mp.spawn(_ddp_worker, args=(2, view, depth, batch_size, repeats, port, out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())["seconds"]


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


def bench_training(args, ceiling_fp32: float) -> list[dict]:
    rows = []
    for view_name, view in VIEWS.items():
        for depth in (8, 32):
            model, ids = default_model(view)
            batch = training_batch(depth, args.batch_size, ids)
            model.causal_fast_path = False
            flops = counted_flops(make_step(model, batch, depth))
            paths = [("before: eager fp32, mask", dict(fast=False, threads=THREADS)),
                     ("eager fp32, 1 thread", dict(fast=False, threads=1))]
            if not view:
                paths.append(("sdpa causal fast path", dict(fast=True, threads=THREADS)))
            paths += [("bf16 autocast", dict(fast=True, threads=THREADS, bf16=True)),
                      ("compile_core()", dict(fast=True, threads=THREADS, compile=True)),
                      ("DDP 2 processes × 1 thread", dict(fast=True, ddp=True))]
            before = None
            for name, path in paths:
                if path.get("bf16") and depth > args.bf16_max_depth:
                    rows.append(dict(section="train", view=view_name, depth=depth, path=name, skipped=(
                        f"bf16 matmul here runs at a small fraction of fp32 (see ceiling); measured at d ≤ "
                        f"{args.bf16_max_depth} only")))
                    print(f"  train {view_name} d={depth} {name}: skipped", flush=True)
                    continue
                if path.get("ddp"):
                    seconds = ddp_step_seconds(view, depth, args.batch_size, args.repeats, args.port + depth)
                else:
                    torch.set_num_threads(path["threads"])
                    model, _ = default_model(view)
                    model.causal_fast_path = path["fast"]
                    if path.get("compile"):
                        torch._dynamo.reset()  # a fresh cache: earlier paths' graphs must not use up the recompile limit
                        model.compile_core()
                    step = make_step(model, batch, depth, bf16=path.get("bf16", False))
                    warm = seconds_per_call(step, 1, warmup=0)  # compile happens here
                    seconds = seconds_per_call(step, 1 if path.get("bf16") else args.repeats,
                                               warmup=2 if path.get("compile") else 0)
                    torch.set_num_threads(THREADS)
                before = seconds if before is None else before
                row = dict(section="train", view=view_name, depth=depth, path=name, ms_per_step=1000 * seconds,
                           samples_per_s=args.batch_size / seconds, gflop_per_step=flops / 1e9,
                           gflop_per_s=flops / seconds / 1e9, fraction_of_fp32_ceiling=flops / seconds / 1e9 / ceiling_fp32,
                           speedup_vs_before=before / seconds)
                if path.get("compile"):
                    row["first_step_s"] = warm
                rows.append(row)
                print(f"  train {view_name} d={depth} {name}: {1000 * seconds:.0f} ms/step, "
                      f"{row['samples_per_s']:.0f} samples/s, {row['gflop_per_s']:.1f} GFLOP/s, "
                      f"×{row['speedup_vs_before']:.2f}", flush=True)
    return rows


def bench_evaluation(args, ceiling_fp32: float) -> list[dict]:
    rows = []
    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
    task = load_task_from_dir(CHECKPOINT)
    cases = [("recipe (shipped checkpoint)", "forced"), ("recipe (shipped checkpoint)", "halting"),
             ("paper (full view, random weights)", "forced")]
    for model_name, mode in cases:
        paths = [("before: eager fp32", dict(fast=False)), ("eager fp32, 1 thread", dict(fast=False, threads=1)),
                 ("bf16 weights", dict(bf16=True)), ("compile_core()", dict(compile=True)),
                 ("workers=2 (1 thread each)", dict(workers=2))]
        if model_name.startswith("paper"):
            paths.insert(2, ("sdpa causal fast path", {}))
        before = flops = None
        for name, path in paths:
            if path.get("compile") and mode != "forced":
                continue  # one compiled case per model is enough to place it (compiling costs ~a minute)
            torch.set_num_threads(path.get("threads", THREADS))
            if model_name.startswith("recipe"):
                model = ParLoopedQwenForStateTracking.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
            else:
                model = default_model({})[0].eval()
            model.causal_fast_path = path.get("fast", True)
            if path.get("bf16"):
                model = model.to(torch.bfloat16)
            if path.get("compile"):
                torch._dynamo.reset()
                model.compile_core()
            n = args.bf16_eval_n if path.get("bf16") else args.eval_n

            def run(n=n, model=model, path=path):
                return evaluate_length_generalization(model, tokenizer, task, [args.eval_depth], n_per_depth=n,
                                                      mode=mode, batch_size=args.eval_n, progress=False,
                                                      workers=path.get("workers", 1))

            if flops is None:  # the same work on every path: counted once, on the reference
                flops = counted_flops(run)
            seconds = seconds_per_call(run, 1, warmup=1 if path.get("compile") else 0) * args.eval_n / n
            torch.set_num_threads(THREADS)
            before = seconds if before is None else before
            row = dict(section="eval", model=model_name, mode=mode, depth=args.eval_depth, n=n, path=name,
                       seconds_per_256=seconds, sequences_per_s=args.eval_n / seconds, gflop=flops / 1e9,
                       gflop_per_s=flops / seconds / 1e9, fraction_of_fp32_ceiling=flops / seconds / 1e9 / ceiling_fp32,
                       speedup_vs_before=before / seconds)
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
            lines.append(f"| train | {r['view']} | {r['depth']} | forced | {r['path']} | {r['ms_per_step']:.0f} ms/step "
                         f"| {r['samples_per_s']:.0f} samples/s | {r['gflop_per_s']:.1f} | "
                         f"{100 * r['fraction_of_fp32_ceiling']:.0f}% | {r['speedup_vs_before']:.2f} |")
        else:
            lines.append(f"| eval | {r['model']} | {r['depth']} | {r['mode']} | {r['path']} | "
                         f"{r['seconds_per_256']:.2f} s / 256 | {r['sequences_per_s']:.1f} seq/s | "
                         f"{r['gflop_per_s']:.1f} | {100 * r['fraction_of_fp32_ceiling']:.0f}% | "
                         f"{r['speedup_vs_before']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-depth", type=int, default=64)
    parser.add_argument("--eval-n", type=int, default=256)
    parser.add_argument("--bf16-eval-n", type=int, default=16, help="bf16 is slow on CPUs without bf16 matmul units")
    parser.add_argument("--bf16-max-depth", type=int, default=8)
    parser.add_argument("--port", type=int, default=29611)
    parser.add_argument("--sections", default="ceiling,train,eval")
    parser.add_argument("--out", default=None, help="JSON report (and a .md table beside it)")
    args = parser.parse_args(argv)
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
    table = markdown(report)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
