"""Peak memory and sequences/s of the local view's window path against the prompt length, before and after a change.

    python benchmarks/bench_prompt_memory.py [--depths 64,256,512] [--batch 8] [--repeats 3] [--before HEAD]
        [--attn par_eager] [--out results/prompt_memory_cpu/prompt_memory.json]

The workload: swap-S5 text prompts (`build_tokenizer(task, "text")`, `encode_batch`: 10 tokens per operation, a
31-token preamble, a 25-token query region), `--batch` sequences of depth d each, `model.predict` at forced depth
R = d (no grad, the runtime defaults: window plans, blocks of iterations; not compiled) of a random from-scratch model
of the main job's size (hidden 128, MLP 256, 4 heads, 1 + 2 + 1 layers; the recipe view: local, progress positions,
bidirectional queries) with "par_eager" attention (the CPU default of the window path; `--attn sdpa` for the other).

"before" and "after" are two copies of the remote code `modeling_par/`: `--before` is a git revision whose
`modeling_par/` is extracted (`git archive`) into a temporary folder (default HEAD: the code before an uncommitted
change; once the change is committed pass its parent) or a folder holding a `modeling_par/`; "after" is this checkout.
The inputs, weights and config are built once here (this checkout's `state_tracking`) and handed to both.

Each (code, d) runs in a fresh process, importing only that copy of `modeling_par`, on one thread. Peak memory is
the process's resident-set high-water mark (Linux `VmHWM`, reset through /proc/self/clear_refs just before the first
call, so model, inputs and imports are not counted: it is the first predict's peak above the RSS it started from);
with `--device cuda`, `torch.cuda.max_memory_allocated` above the allocation before the call. Sequences/s: batch /
the median of `--repeats` further calls. Each process also returns its answer logits: the table's last column is the
largest |after − before|. Written to --out as JSON (and a .md table beside it). Nothing is asserted: a benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4, prelude_layers=1,
             core_layers=2, coda_layers=1, loop_view="local", progress_positions=True, bidirectional_queries=True,
             max_position_embeddings=8192)


# ----------------------------------------------------------------------------------------------- one measurement
def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(tree: Path, inputs: Path, depth: int, repeats: int, device: str, attn: str, logits_out: Path) -> dict:
    """One (code, d) measurement in this process, with `tree`'s own `modeling_par`."""
    sys.path.insert(0, str(tree))
    import torch

    import modeling_par
    from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking

    assert tree.resolve() in Path(modeling_par.__file__).resolve().parents, modeling_par.__file__
    torch.set_num_threads(1)
    saved = torch.load(inputs, weights_only=False)
    config = ParLoopedQwenConfig(**saved["config"], attn_implementation=attn)
    model = ParLoopedQwenForStateTracking(config).eval()
    model.load_state_dict(saved["state_dict"])
    model.to(device)
    batch = {k: v.to(device) for k, v in saved["batches"][depth].items()}
    kwargs = {k: batch[k] for k in ("attention_mask", "query_positions", "operation_ends")}

    def call():
        out = model.predict(batch["input_ids"], num_iterations=depth, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start_bytes = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        start_bytes = rss_kib("VmRSS") * 1024
    started = time.perf_counter()
    out = call()
    first = time.perf_counter() - started
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - start_bytes
    else:
        peak = rss_kib("VmHWM") * 1024 - start_bytes
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    torch.save(out.answer_logits.cpu(), logits_out)
    return dict(peak_bytes=peak, start_bytes=start_bytes, first_call_s=first, seconds=seconds,
                median_s=statistics.median(seconds), tokens=int(batch["input_ids"].shape[1]))


# ----------------------------------------------------------------------------------------------- the whole run
def before_tree(before: str, scratch: Path) -> tuple[Path, str | None]:
    """A folder holding the "before" `modeling_par/`: `before` itself if it is one, else that git revision's."""
    path = Path(before)
    if (path / "modeling_par").is_dir():
        return path.resolve(), git(path, "rev-parse", "HEAD")
    commit = git(ROOT, "rev-parse", before)
    if commit is None:
        raise SystemExit(f"--before {before!r} is neither a folder with modeling_par/ nor a git revision")
    archive = scratch / "before.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit, "modeling_par"], cwd=ROOT,
                   check=True)
    tree = scratch / "before"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree, commit


def git(cwd: Path, *args: str) -> str | None:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def build_inputs(depths: list[int], batch_size: int, seed: int, path: Path) -> dict:
    """The config, random weights and one batch of text prompts per depth, saved to `path`."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch

    from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking
    from state_tracking import StateTrackingCollator, build_tokenizer, encode_batch, get_task, model_token_ids

    task = get_task("swap_s5")
    tokenizer = build_tokenizer(task, "text")
    ids = model_token_ids(tokenizer, task)
    config = dict(MODEL, vocab_size=ids["vocab_size"], pad_token_id=ids["pad_token_id"],
                  answer_token_ids=ids["answer_token_ids"], halt_token_ids=list(ids["halt_token_ids"]),
                  max_iterations=max(1024, max(depths)))
    torch.manual_seed(seed)
    model = ParLoopedQwenForStateTracking(ParLoopedQwenConfig(**config))
    rng = np.random.default_rng(seed)
    batches = {}
    for depth in depths:
        rows = encode_batch(task, tokenizer, "text", task.sample_ops(rng, batch_size, depth))
        batch = StateTrackingCollator(tokenizer.pad_token_id)(rows)
        batches[depth] = {k: batch[k] for k in ("input_ids", "attention_mask", "query_positions", "operation_ends")}
    torch.save(dict(config=config, state_dict=model.state_dict(), batches=batches), path)
    return config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="64,256,512")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the first (median)")
    parser.add_argument("--before", default="HEAD", help="git revision, or a folder holding modeling_par/")
    parser.add_argument("--attn", default="par_eager")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON report (default results/prompt_memory_<device>/"
                        "prompt_memory.json), a .md table beside it")
    parser.add_argument("--measure", nargs=5, default=None, help=argparse.SUPPRESS)  # internal: one process
    return parser


def measure_in_process(args, tree: Path, scratch: Path, label: str, depth: int) -> dict:
    """One (code, d) measurement in a fresh process (`--measure`), its logits loaded back."""
    import torch

    logits, result = scratch / f"{label}_{depth}.pt", scratch / f"{label}_{depth}.json"
    command = [sys.executable, __file__, "--measure", str(tree), str(scratch / "inputs.pt"),
               str(depth), str(logits), str(result), "--repeats", str(args.repeats), "--attn", args.attn,
               "--device", args.device]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=scratch,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"measuring {label} at d = {depth} failed:\n{proc.stderr[-3000:]}")
    run = json.loads(result.read_text())
    run["logits"] = torch.load(logits)
    return run


def measure_all(args, depths: list[int]) -> tuple[dict, str | None, dict]:
    """Every (code, d) measurement, before and after alternating in order; (runs, before commit, model config)."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        trees = {"before": None, "after": ROOT}
        trees["before"], before_commit = before_tree(args.before, scratch)
        config = build_inputs(depths, args.batch, args.seed, scratch / "inputs.pt")
        runs = {label: {} for label in trees}
        for n, depth in enumerate(depths):
            for label in (("before", "after") if n % 2 == 0 else ("after", "before")):
                r = runs[label][depth] = measure_in_process(args, trees[label], scratch, label, depth)
                print(f"d = {depth:4d} {label:6s}: peak {r['peak_bytes'] / 2**20:8.1f} MiB, "
                      f"{args.batch / r['median_s']:7.2f} seq/s (first call {r['first_call_s']:.2f} s)", flush=True)
    return runs, before_commit, config


def table_rows(runs: dict, depths: list[int], batch: int) -> list[dict]:
    """One row per depth: peaks, sequences/s and the largest logit difference (the logits are taken out of `runs`)."""
    rows = []
    for depth in depths:
        before, after = runs["before"][depth], runs["after"][depth]
        rows.append(dict(depth=depth, tokens=after["tokens"], before_peak_mib=before["peak_bytes"] / 2**20,
                         after_peak_mib=after["peak_bytes"] / 2**20, before_seq_per_s=batch / before["median_s"],
                         after_seq_per_s=batch / after["median_s"],
                         max_abs_logit_diff=float((after.pop("logits") - before.pop("logits")).abs().max())))
    for label in ("before", "after"):  # peak per operation between consecutive depths: constant if linear in d
        key = f"{label}_peak_mib"
        for previous, row in zip(rows, rows[1:]):
            row[f"{label}_mib_per_op_from_previous"] = (row[key] - previous[key]) / (row["depth"] - previous["depth"])
    return rows


def markdown_table(args, rows: list[dict]) -> str:
    peak_note = ("VmHWM above the RSS before the call" if args.device == "cpu"
                 else "cuda max_memory_allocated above the allocation before the call")
    lines = [f"swap-S5 text prompts, batch {args.batch}, predict at forced depth R = d, {args.attn} attention, "
             f"{args.device}, 1 thread. Peak: {peak_note}.",
             "",
             "| d | tokens | peak before (MiB) | peak after (MiB) | seq/s before | seq/s after | max abs logit diff |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['depth']} | {r['tokens']} | {r['before_peak_mib']:.1f} | {r['after_peak_mib']:.1f} | "
              f"{r['before_seq_per_s']:.2f} | {r['after_seq_per_s']:.2f} | {r['max_abs_logit_diff']:.1e} |"
              for r in rows]
    lines += ["", "Peak growth per operation between consecutive depths (MiB / op; constant when linear in d):"]
    lines += [f"- d = {p['depth']} -> {r['depth']}: before {r['before_mib_per_op_from_previous']:.3f}, "
              f"after {r['after_mib_per_op_from_previous']:.3f}" for p, r in zip(rows, rows[1:])]
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.measure is not None:
        tree, inputs, depth, logits_out, result_out = args.measure
        result = measure(Path(tree), Path(inputs), int(depth), args.repeats, args.device, args.attn, Path(logits_out))
        Path(result_out).write_text(json.dumps(result))
        return None

    import torch

    depths = [int(d) for d in args.depths.split(",")]
    out = Path(args.out or ROOT / "results" / f"prompt_memory_{args.device}" / "prompt_memory.json")
    started = time.time()
    runs, before_commit, config = measure_all(args, depths)
    rows = table_rows(runs, depths, args.batch)
    table = markdown_table(args, rows)
    print(table)
    report = {
        "command": " ".join(["python", "benchmarks/bench_prompt_memory.py", *(sys.argv[1:] if argv is None else argv)]),
        "before": args.before, "before_commit": before_commit, "after_commit": git(ROOT, "rev-parse", "HEAD"),
        "after_tree_modified": bool(git(ROOT, "status", "--porcelain", "--", "modeling_par")),
        "workload": dict(task="swap_s5", rendering="text", batch=args.batch, mode="predict, forced depth",
                         attn=args.attn, device=args.device, threads=1, repeats=args.repeats, seed=args.seed),
        "model": config, "peak_memory": ("VmHWM (reset via /proc/self/clear_refs) minus VmRSS just before the first "
                                         "predict, fresh process per (code, d)" if args.device == "cpu" else
                                         "torch.cuda.max_memory_allocated minus memory_allocated before the call"),
        "rows": rows, "runs": runs, "wall_seconds": round(time.time() - started, 1),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(table + "\n")
    return report

if __name__ == "__main__":
    main()
