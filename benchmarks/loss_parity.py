"""200-step loss-curve parity of each faster path against fp32 eager, through `examples/train_par.py` (the Trainer).

    python benchmarks/loss_parity.py --path recipe_eager      # one training run (the reference of its group)
    python benchmarks/loss_parity.py --path recipe_compile    # … every path in PATHS
    python benchmarks/loss_parity.py --collect                # compare each path with its group's reference

Each run: the default model (hidden 128, 1 + 2 + 1), seed 0, 200 steps, loss logged every 10 steps, one torch thread
(DDP: 2 processes × 1 thread). bf16 autocast is checked on a smaller model (hidden 64, intermediate 128) against its own
fp32 reference: on a CPU without bf16 matmul units a bf16 step of the default model costs ~10× an fp32 one.
Writes results/speed_cpu/loss_parity/<path>.json (command, wall time, curve) and loss_parity.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "speed_cpu" / "loss_parity"
COMMON = ["--max_steps", "200", "--logging_steps", "10", "--seed", "0", "--eval_depths", "8", "--eval_n", "64"]
LOCAL = ["--loop_view", "local", "--progress_positions", "true", "--bidirectional_queries", "true"]
FULL = ["--loop_view", "full", "--progress_positions", "false", "--bidirectional_queries", "false"]
SMALL = ["--hidden_size", "64", "--intermediate_size", "128"]
SDPA = ["--attn_implementation", "sdpa", "--compile_core", "false"]  # before the CPU fast paths (the default is now
# par_eager attention + compile_core for the recipe; these runs name the path they measure)
DEEP = ["--max_train_depth", "16", "--curriculum_start_depth", "16"]  # d = 16: no-grad iterations before the
# gradient window, so `block_iterations` units run (at d <= 8 with the recipe's hold they rarely do)
TRAIN = ["examples/train_par.py"]
DDP = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29577", "examples/train_par.py",
       "--use_cpu", "true"]

# path -> (group, reference path of the group, python args)
PATHS = {
    "recipe_eager": ("recipe", "recipe_eager", TRAIN + LOCAL + SDPA),
    "recipe_compile": ("recipe", "recipe_eager",
                       TRAIN + LOCAL + ["--attn_implementation", "sdpa", "--compile_core", "true"]),
    "recipe_ddp_2x1": ("recipe", "recipe_eager", DDP + LOCAL + SDPA + ["--per_device_train_batch_size", "32"]),
    "recipe_eager_attention_compile": ("recipe", "recipe_eager", TRAIN + LOCAL + ["--attn_implementation", "eager",
                                                                                  "--compile_core", "true"]),
    "recipe_par_eager_compile": ("recipe", "recipe_eager", TRAIN + LOCAL + ["--attn_implementation", "par_eager",
                                                                            "--compile_core", "true"]),
    "deep_eager": ("recipe, d = 16", "deep_eager", TRAIN + LOCAL + DEEP + SDPA + ["--block_iterations", "1"]),
    "deep_eager_blocks": ("recipe, d = 16", "deep_eager", TRAIN + LOCAL + DEEP + SDPA + ["--block_iterations", "4"]),
    "deep_eager_attention_compile": ("recipe, d = 16", "deep_eager", TRAIN + LOCAL + DEEP + [
        "--attn_implementation", "eager", "--compile_core", "true"]),
    "deep_par_eager_compile": ("recipe, d = 16", "deep_eager", TRAIN + LOCAL + DEEP + [
        "--attn_implementation", "par_eager", "--compile_core", "true"]),
    "paper_masked": ("paper", "paper_masked", TRAIN + FULL + SDPA + ["--causal_fast_path", "false"]),
    "paper_causal_fast_path": ("paper", "paper_masked", TRAIN + FULL + SDPA + ["--causal_fast_path", "true"]),
    "small_fp32": ("small (hidden 64)", "small_fp32", TRAIN + LOCAL + SMALL + SDPA + ["--use_cpu", "true"]),
    "small_bf16_autocast": ("small (hidden 64)", "small_fp32", TRAIN + LOCAL + SMALL + SDPA + ["--use_cpu", "true",
                                                                                             "--bf16", "true"]),
}


def run(path: str) -> dict:
    group, reference, args = PATHS[path]
    output_dir = REPO / "runs" / "loss_parity" / path
    args = [*args, *COMMON, "--output_dir", str(output_dir.relative_to(REPO))]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1")
    started = time.time()
    subprocess.run([sys.executable, *args], cwd=REPO, env=env, check=True)
    summary = json.loads((output_dir / "summary.json").read_text())
    row = dict(path=path, group=group, reference=reference, command="python " + " ".join(args),
               wall_seconds=round(time.time() - started, 1), train_seconds=summary["train_seconds"],
               curve=[{k: e[k] for k in ("step", "loss") if k in e} for e in summary["curve"]],
               accuracy_d8=summary["accuracy"]["forced"], environment=summary["environment"])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{path}.json").write_text(json.dumps(row, indent=1))
    return row


def compare(curve: list[dict], reference: list[dict]) -> dict:
    """Loss-curve distance on the shared logged steps: max and mean |Δ| / reference, and the last logged losses."""
    ref = {e["step"]: e["loss"] for e in reference}
    steps = [e["step"] for e in curve if e["step"] in ref]
    a = np.array([e["loss"] for e in curve if e["step"] in ref])
    b = np.array([ref[s] for s in steps])
    relative = np.abs(a - b) / np.abs(b)
    return dict(steps=len(steps), max_relative=float(relative.max()), mean_relative=float(relative.mean()),
                final=float(a[-1]), final_reference=float(b[-1]))


def collect() -> str:
    rows = {p.stem: json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))}
    lines = ["| path | group | vs | logged steps | mean |Δloss|/loss | max | final loss (ref) | acc d=8 | train s "
             "| command |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for path, (group, reference, _) in PATHS.items():
        if path not in rows:
            lines.append(f"| {path} | {group} | {reference} | not run | | | | | | |")
            continue
        row = rows[path]
        if reference not in rows:
            continue
        c = compare(row["curve"], rows[reference]["curve"])
        acc = list(row["accuracy_d8"].values())[0]
        lines.append(f"| {path} | {group} | {reference} | {c['steps']} | {100 * c['mean_relative']:.2f}% | "
                     f"{100 * c['max_relative']:.2f}% | {c['final']:.4f} ({c['final_reference']:.4f}) | {acc:.3f} | "
                     f"{row['train_seconds']:.0f} | `{row['command']}` |")
    table = "\n".join(lines)
    (OUT.parent / "loss_parity.md").write_text(table + "\n")
    print(table)
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=list(PATHS))
    parser.add_argument("--collect", action="store_true")
    args = parser.parse_args(argv)
    if args.path:
        run(args.path)
    if args.collect:
        collect()


if __name__ == "__main__":
    main()
