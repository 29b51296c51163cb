"""Seconds per training step and peak memory of the retrofit rows of the paper-claim study
(examples/reproduce/pretrained_swap_s5.py): a truncated pretrained parent looped on swap-S5 in its text rendering,
full view (the paper's) and local view, today's step against the cheaper variants, in one run.

    python -m par_studies.parents fetch smollm2-135m                     # the parent (pip, ~100 MB, once)
    python benchmarks/bench_retrofit_step.py [--split 2 2 2] [--batch 16] [--depth 8] [--repeats 3]
        [--parent smollm2-135m] [--json results/pretrained_swap_s5/step_cost.json]

Variants (each adds to the one before):
- `today`: long wording ("Swap the contents of Box 1 and Box 3."), every weight trained (the embeddings and the tied
  LM head too), eager core;
- `frozen_embeddings`: the input embeddings (and with them the tied LM head) not trained
  (`model.freeze_embeddings()`, `--freeze_embeddings true`): most of the parameters and of AdamW's state;
- `short_prompts`: the short wording ("swap 1 3.", `examples/tasks/swap_s5_short.json`);
- `compiled`: the core compiled (`--compile_core true`).

One optimizer step is what `ParTrainer` runs at forced depth: the forward over R = d iterations, the PAR loss over
the gradient window, backward, AdamW (fused, the Trainer's default). Each (view, variant) runs in a fresh process with
one torch thread for its peak RSS; the seconds per step come from one process per view that builds every variant
and times them in turns (round r steps each variant once; the median over rounds), as CPU seconds of the one-thread
process (what a step costs whatever else the machine runs; the speed-ups use these) and as wall seconds. Random ids
are not used: the batch is real swap-S5 text at depth d.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ["today", "frozen_embeddings", "short_prompts", "compiled"]
VIEWS = {"full": dict(loop_view="full", progress_positions=False, bidirectional_queries=False),
         "local": dict(loop_view="local", progress_positions=True, bidirectional_queries=True)}
TASKS = {"long": {"group": "swap_s5"}, "short": {"group": "swap_s5", "text": "short"}}


def build(view: str, variant: str, split: list[int], batch: int, depth: int, parent: str):
    """(step function, facts) of one (view, variant): the retrofit, its batch and one optimizer step of it."""
    import torch
    from bench_speed import make_step  # benchmarks/ is on sys.path
    from transformers import AutoTokenizer

    from modeling_par import ParLoopedQwenForStateTracking
    from par_studies.parents import get_parent
    from state_tracking import StateTrackingCollator, build_dataset, load_task, model_token_ids

    torch.manual_seed(0)
    level = VARIANTS.index(variant)
    spec = get_parent(parent)
    folder = spec.ensure(quiet=True)
    task = load_task(TASKS["short" if level >= 2 else "long"])
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=spec.gguf_file)
    if tokenizer.pad_token_id is None:  # as train_par.py does for a pretrained tokenizer
        tokenizer.pad_token = tokenizer.eos_token
    ids = model_token_ids(tokenizer, task)
    model = ParLoopedQwenForStateTracking.from_pretrained_parent(
        str(folder), *split, answer_token_ids=ids["answer_token_ids"], dtype=torch.float32, gguf_file=spec.gguf_file,
        truncate=True, **VIEWS[view]).train()
    if level >= 1:
        model.freeze_embeddings()
    if level >= 3:
        model.compile_core()
    data = build_dataset(task, tokenizer, n=batch, depths=depth, seed=0, rendering="text")
    batch_ = StateTrackingCollator(ids["pad_token_id"])([data[i] for i in range(batch)])
    step = make_step(model, batch_, depth)  # the optimizer step bench_speed.py times (frozen weights get no grad)
    params = [p for p in model.parameters() if p.requires_grad]
    facts = {"view": view, "variant": variant, "tokens_per_prompt": int(batch_["attention_mask"].sum(1).float().mean()),
             "trained_parameters": sum(p.numel() for p in params),
             "parameters": sum(p.numel() for p in model.parameters())}
    return step, facts


def peak_memory(view: str, variant: str, split, batch, depth, parent) -> dict:
    """One (view, variant) alone in this process: two steps (the first compiles where it compiles), peak RSS."""
    import torch

    torch.set_num_threads(1)
    step, facts = build(view, variant, split, batch, depth, parent)
    step()
    step()
    return {**facts, "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def interleaved(view: str, variants: list[str], split, batch, depth, repeats: int, parent) -> dict:
    """Seconds per step of every variant of `view`, built in this process and timed in turns (round r times each
    variant once), so a change in the machine's load touches every variant alike: the median over `repeats` rounds
    after one warm-up step each, as CPU seconds of this one-thread process (`time.process_time`: what the step
    costs, whatever else the machine runs) and as wall seconds."""
    import torch

    torch.set_num_threads(1)
    steps = {v: build(view, v, split, batch, depth, parent)[0] for v in variants}
    for step in steps.values():
        step()
    wall, cpu = {v: [] for v in variants}, {v: [] for v in variants}
    for _ in range(repeats):
        for v, step in steps.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            step()
            wall[v].append(time.perf_counter() - started)
            cpu[v].append(time.process_time() - started_cpu)
    return {v: {"cpu_seconds_per_step": round(statistics.median(cpu[v]), 3),
                "seconds_per_step": round(statistics.median(wall[v]), 3),
                "cpu_rounds": [round(x, 3) for x in cpu[v]], "wall_rounds": [round(x, 3) for x in wall[v]]}
            for v in variants}


def child(args: list[str]) -> dict:
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode:
        raise SystemExit(f"{args} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", type=int, nargs=3, default=[2, 2, 2], metavar=("P", "C", "Q"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parent", default="smollm2-135m")
    parser.add_argument("--views", nargs="+", default=list(VIEWS), choices=list(VIEWS))
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--memory", nargs=2, metavar=("VIEW", "VARIANT"), help=argparse.SUPPRESS)  # child
    parser.add_argument("--timing", metavar="VIEW", help=argparse.SUPPRESS)  # child
    args = parser.parse_args(argv)
    shape = (args.split, args.batch, args.depth)
    if args.memory:
        print(json.dumps(peak_memory(*args.memory, *shape, args.parent)))
        return
    if args.timing:
        print(json.dumps(interleaved(args.timing, args.variants, *shape, args.repeats, args.parent)))
        return
    common = ["--split", *map(str, args.split), "--batch", str(args.batch), "--depth", str(args.depth), "--parent",
              args.parent, "--repeats", str(args.repeats), "--variants", *args.variants]
    rows = []
    for view in args.views:
        timing = child([*common, "--timing", view])
        for variant in args.variants:
            row = {**child([*common, "--memory", view, variant]), **timing[variant]}
            rows.append(row)
            print(f"{view:5s} {variant:17s} {row['cpu_seconds_per_step']:7.3f} CPU s/step "
                  f"({row['seconds_per_step']:.3f} wall)  peak {row['peak_rss_gb']:5.2f} GB  "
                  f"{row['tokens_per_prompt']} tokens  trained {row['trained_parameters'] / 1e6:.1f} M", flush=True)
    for view in args.views:
        base = next(r for r in rows if r["view"] == view and r["variant"] == args.variants[0])
        for r in rows:
            if r["view"] == view:
                r["speedup_over_first"] = round(base["cpu_seconds_per_step"] / r["cpu_seconds_per_step"], 2)
        best = min((r for r in rows if r["view"] == view), key=lambda r: r["cpu_seconds_per_step"])
        print(f"{view}: {args.variants[0]} / {best['variant']} = {best['speedup_over_first']:.2f}x")
    if args.json:
        import torch

        from state_tracking.evaluation import environment_info

        record = {"command": "python benchmarks/bench_retrofit_step.py " + " ".join(
            argv if argv is not None else sys.argv[1:]), "parent": args.parent, "split": args.split,
            "batch": args.batch, "depth": args.depth, "rows": rows, "date": time.strftime("%Y-%m-%d"),
            "timing": "interleaved: every variant of a view built in one process, timed in turns, median of rounds; "
                      "cpu_seconds_per_step is time.process_time of the one-thread process (load-independent), "
                      "seconds_per_step wall time; speedup_over_first from CPU seconds",
            "environment": environment_info(torch.device("cpu"))}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
