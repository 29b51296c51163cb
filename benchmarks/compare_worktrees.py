"""Is a refactor speed-neutral? The default paths of `bench_speed.py`, timed from two checkouts, interleaved.

    git worktree add ../before <commit>            # the code before the change
    python benchmarks/compare_worktrees.py --before ../before --after . [--rounds 3] [--repeats 5] \
        [--out results/speed_cpu/split_before_after.json]

Each round runs one measuring process per checkout (the order alternates between rounds), so both see the machine's
drift alike. With `--interleaved`, one live process per checkout instead, timed in turn case by case (`--repeats`
calls each, the order alternating): no process-to-process or compile differences. A process imports that checkout's
own `modeling_par` and `benchmarks/bench_speed.py` helpers (`default_model`, `make_step`, `training_batch`, the
shipped checkpoint) and times, after warm-up (which compiles), the median of `--repeats` calls of each case: one
training step at d = 8 and d = 32 and evaluation of 256 sequences at d = 64 (forced and learned halting) on the
recipe's CPU default ("par_eager" attention + `compile_core()`), and the paper's full view (sdpa, no compile: its
default) at d = 32 / d = 64. Reported: per case the median over rounds for each checkout and after / before. Nothing
is asserted: a benchmark, not a test.
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
import time
from pathlib import Path

CASES = [  # (name, section, view, depth, mode, attention, compile)
    ("train, recipe, d = 8", "train", "recipe", 8, None, "par_eager", True),
    ("train, recipe, d = 32", "train", "recipe", 32, None, "par_eager", True),
    ("eval, recipe, forced, d = 64", "eval", "recipe", 64, "forced", "par_eager", True),
    ("eval, recipe, halting, d = 64", "eval", "recipe", 64, "halting", "par_eager", True),
    ("train, paper view, d = 32", "train", "paper", 32, None, "sdpa", False),
    ("eval, paper view, forced, d = 64", "eval", "paper", 64, "forced", "sdpa", False),
]


def selected(cases: str | None) -> list[tuple]:
    words = None if cases is None else [w.strip() for w in cases.split(",")]
    return [case for case in CASES if words is None or any(w in case[0] for w in words)]


def measure(tree: Path, repeats: int, cases: list[tuple]) -> dict:
    """Seconds per call (median of `repeats`) of every case, with `tree`'s own code (a fresh process per tree)."""
    return {name: statistics.median(timed(fn, repeats)) for name, fn in build(tree, cases).items()}


def timed(fn, count: int) -> list[float]:
    """Seconds of each of `count` calls of `fn`."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def build(tree: Path, cases: list[tuple]) -> dict:
    """Each case's callable, built and warmed up (compiled) with `tree`'s own code."""
    sys.path[:0] = [str(tree), str(tree / "benchmarks")]
    import bench_speed as bench
    import torch
    from transformers import AutoTokenizer

    import modeling_par
    from modeling_par import ParLoopedQwenForStateTracking
    from state_tracking import evaluate_length_generalization, load_task_from_dir

    for module in (bench, modeling_par):  # this checkout's code, not an installed copy
        assert tree.resolve() in Path(module.__file__).resolve().parents, module.__file__
    torch._dynamo.config.recompile_limit = 64  # every case's compiled graphs stay live side by side
    views = {"recipe": next(v for k, v in bench.VIEWS.items() if k.startswith("recipe")),
             "paper": next(v for k, v in bench.VIEWS.items() if k.startswith("paper"))}
    tokenizer = AutoTokenizer.from_pretrained(bench.CHECKPOINT)
    task = load_task_from_dir(bench.CHECKPOINT)
    calls = {}
    for name, section, view, depth, mode, attn, compiled in cases:
        if section == "train":
            model, ids = bench.default_model(views[view], attn=attn)
            fn = bench.make_step(model, bench.training_batch(depth, 64, ids), depth)
        else:
            if view == "recipe":
                model = ParLoopedQwenForStateTracking.from_pretrained(bench.CHECKPOINT, dtype=torch.float32,
                                                                      attn_implementation=attn).eval()
            else:
                model = bench.default_model(views[view], attn=attn)[0].eval()

            def fn(model=model, mode=mode, depth=depth):
                evaluate_length_generalization(model, tokenizer, task, [depth], n_per_depth=256, mode=mode,
                                               batch_size=256, progress=False, workers=1)
        if compiled:
            model.compile_core()
        for _ in range(3 if section == "train" else 1):
            fn()
        calls[name] = fn
    return calls


def serve(tree: Path, cases: list[tuple]) -> None:
    """Build the cases, print "ready", then time `count` calls of a case per request line "name\tcount"."""
    calls = build(tree, cases)
    print("ready", flush=True)
    for line in sys.stdin:
        name, count = line.rstrip("\n").split("\t")
        print(json.dumps(timed(calls[name], int(count))), flush=True)


def interleaved(trees: dict, cases: list[tuple], rounds: int, repeats: int) -> dict:
    """Both checkouts built once, in two live processes, then timed in turn: per round and case, `repeats` calls
    of one, then of the other (the order alternating), so both see the same drift at a few seconds' scale."""
    servers = {label: subprocess.Popen([sys.executable, __file__, "--serve", str(tree), "--cases",
                                        ",".join(c[0] for c in cases)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, cwd=tree)
               for label, tree in trees.items()}
    for label, server in servers.items():
        if server.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {label} server did not start")
    runs = {label: [] for label in trees}
    for r in range(rounds):
        for label in trees:
            runs[label].append({})
        for n, (name, *_) in enumerate(cases):
            order = list(trees) if (r + n) % 2 == 0 else list(trees)[::-1]
            for label in order:
                servers[label].stdin.write(f"{name}\t{repeats}\n")
                servers[label].stdin.flush()
                runs[label][-1][name] = statistics.median(json.loads(servers[label].stdout.readline()))
        print(f"round {r + 1}: " + ", ".join(f"{c[0]} {runs['before'][-1][c[0]]:.3f} / {runs['after'][-1][c[0]]:.3f} s"
                                             for c in cases), flush=True)
    for server in servers.values():
        server.stdin.close()
        server.wait()
    return runs


def git_commit(tree: Path) -> str | None:
    result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="checkout of the code before the change")
    parser.add_argument("--after", type=Path, help="checkout of the code after the change")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case in one process (median)")
    parser.add_argument("--cases", default=None, help="only the cases whose name contains one of these "
                        "comma-separated words, e.g. recipe")
    parser.add_argument("--out", default=None, help="JSON report (and a .md table beside it)")
    parser.add_argument("--interleaved", action="store_true", help="one live process per checkout, timed in turn "
                        "per case (instead of one fresh process per checkout and round)")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)  # internal: one process
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)  # internal: one live process
    return parser


def fresh_processes(trees: dict, args) -> dict:
    """Per round, one measuring process per checkout (the order alternating between rounds)."""
    runs = {"before": [], "after": []}
    for r in range(args.rounds):
        for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
            proc = subprocess.run([sys.executable, __file__, "--measure", str(trees[label]), "--repeats",
                                   str(args.repeats)] + ([] if args.cases is None else ["--cases", args.cases]),
                                  capture_output=True, text=True, cwd=trees[label])
            if proc.returncode != 0:
                raise SystemExit(f"measuring {label} failed:\n{proc.stderr[-3000:]}")
            runs[label].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {label}: " + ", ".join(f"{k} {v:.3f} s" for k, v in runs[label][-1].items()),
                  flush=True)
    return runs


def summary(runs: dict, cases: list[tuple]) -> tuple[list[dict], str]:
    """Per case the median over rounds of each checkout and after / before: (rows, markdown table)."""
    rows = []
    for name, section, *_ in cases:
        before = statistics.median(run[name] for run in runs["before"])
        after = statistics.median(run[name] for run in runs["after"])
        unit, work = ("samples/s", 64) if section == "train" else ("seq/s", 256)
        rows.append(dict(case=name, before_s=before, after_s=after, before_rate=work / before,
                         after_rate=work / after, unit=unit, after_over_before=before / after))
    lines = ["| case | before | after | after / before (throughput) |", "|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['before_rate']:.1f} {r['unit']} | {r['after_rate']:.1f} {r['unit']} | "
              f"{r['after_over_before']:.3f} |" for r in rows]
    return rows, "\n".join(lines)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, selected(args.cases))
        return None
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.repeats, selected(args.cases))))
        return None
    if args.before is None or args.after is None:
        parser.error("--before and --after are required")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    started = time.time()
    if args.interleaved:
        runs = interleaved(trees, selected(args.cases), args.rounds, args.repeats)
    else:
        runs = fresh_processes(trees, args)
    rows, table = summary(runs, selected(args.cases))
    print(table)
    report = {
        "command": "python " + " ".join(["benchmarks/compare_worktrees.py"] + (sys.argv[1:] if argv is None else argv)),
        "before_commit": git_commit(trees["before"]), "after_commit": git_commit(trees["after"]),
        "rounds": args.rounds, "repeats": args.repeats, "interleaved": args.interleaved, "rows": rows, "runs": runs,
        "wall_seconds": round(time.time() - started, 1),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        Path(args.out).with_suffix(".md").write_text(table + "\n")
    return report

if __name__ == "__main__":
    main()
