"""Issue 68: where does the shipped full view (`pose_conv` s0, `checkpoints/par-swap-s5-full`) break past its range —
at an iteration count, whatever the prompt's length, or at a prompt length? And how much noise on its loop state does
it tolerate in range?

1. The progress profile (every iteration k's readout against z_k) on prompts of d = 24, 32, 48, 64 operations: if the
   first k under 90% / 50% is the same at every d, the iteration count breaks, not the positions.
2. The skip-prefix control: d = 32 prompts whose first m = 8 / 16 operations are "skip." (the identity), then random
   ones: if the break moves later by m, what breaks is the number of real updates carried; if it stays, the count.
   The repeat-prefix control: the same with one swap repeated m times (is it the identity, or any run of repeats?).
3. Loop-state noise at test time (`config.loop_state_noise` σ, `perturb_loop_state`, applied in training mode with
   no gradient): the profile at d = 8 and 16 for each σ, so a fine-tune's σ is chosen where the model starts to fail.

    python examples/studies/full_view_break_depth.py [--checkpoint checkpoints/par-swap-s5-full] [--n 128]

Writes results/full_view_positions/break_depth.json (the command, the profiles, the environment).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from par_studies.tables import save_record  # noqa: E402

OUT = REPO / "results" / "full_view_positions" / "break_depth.json"
TASK_FILE = "examples/tasks/swap_s5_short.json"
DEPTHS, NOISE_DEPTHS, SIGMAS = (24, 32, 48, 64), (8, 16), (0.0, 0.1, 0.3, 0.6, 1.0)
SKIP_DEPTH, SKIPS = 32, (8, 16)


def first_below(profile: list[float], level: float) -> int | None:
    """The first iteration k (1-based) whose accuracy is under `level`, or None."""
    return next((k for k, accuracy in enumerate(profile, start=1) if accuracy < level), None)


def breaks(profile: list[float]) -> dict:
    """A profile with its first iterations under 90% and 50%."""
    return {"profile": profile, "first_below_90": first_below(profile, 0.9),
            "first_below_50": first_below(profile, 0.5)}


def skip_prefix_profile(model, tokenizer, task, skips: int, n: int, seed: int, op: int | None = None) -> list[float]:
    """Accuracy of iteration k = 1..SKIP_DEPTH against z_k on prompts of SKIP_DEPTH operations whose first `skips` are
    operation `op` (None: the identity) and the rest random (`task.sample_ops`, seeded by `seed`)."""
    import numpy as np

    from state_tracking.diagnostics import identity_operation, iteration_readouts

    rng = np.random.default_rng(seed)
    ops = np.full((n, SKIP_DEPTH), identity_operation(task) if op is None else op, dtype=np.int64)
    ops[:, skips:] = task.sample_ops(rng, n, SKIP_DEPTH - skips)
    states = task.prefix_states(ops, None)  # (n, d + 1, Q)
    answers = iteration_readouts(model, tokenizer, task, ops, None, SKIP_DEPTH, rendering="text", batch_size=64)
    return (answers == states[:, 1:]).all(-1).mean(0).tolist()


def noisy_profile(model, tokenizer, task, sigma: float, n: int, seed: int) -> list[list[float]]:
    """The progress profile at NOISE_DEPTHS with the loop state perturbed by σ at every iteration (training mode, so
    `perturb_loop_state` acts; the diagnostics' own model.eval() is held off; no gradient)."""
    import torch

    from state_tracking.diagnostics import progress_profile

    model.config.loop_state_noise = sigma
    model.train()
    model.eval = lambda *args, **kwargs: model  # progress_profile calls model.eval(), which would turn the noise off
    try:
        torch.manual_seed(seed)
        with torch.no_grad():
            return progress_profile(model, tokenizer, task, NOISE_DEPTHS, n_per_depth=n, seed=seed, batch_size=n,
                                    rendering="text")["profile"]
    finally:
        del model.eval
        model.config.loop_state_noise = 0.0
        model.train(False)


def main(argv=None) -> dict:
    import torch

    from modeling_par import ParLoopedQwenForStateTracking
    from state_tracking import build_tokenizer, load_task
    from state_tracking.diagnostics import identity_operation, progress_profile
    from state_tracking.evaluation import environment_info

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--checkpoint", default="checkpoints/par-swap-s5-full")
    parser.add_argument("--n", type=int, default=128, help="problems per depth")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()
    model = ParLoopedQwenForStateTracking.from_pretrained(REPO / args.checkpoint).eval()
    task = load_task(TASK_FILE)
    tokenizer = build_tokenizer(task, "text")
    with torch.no_grad():
        lengths = progress_profile(model, tokenizer, task, DEPTHS, n_per_depth=args.n, seed=args.seed,
                                   batch_size=64, rendering="text")
        by_length = [{"depth": d, **breaks(p)} for d, p in zip(lengths["depths"], lengths["profile"])]
        skip_prefix = [{"depth": SKIP_DEPTH, "skips": m,
                        **breaks(skip_prefix_profile(model, tokenizer, task, m, args.n, args.seed))} for m in SKIPS]
        swap = next(op for op in range(task.num_ops) if op != identity_operation(task))
        repeat_prefix = [{"depth": SKIP_DEPTH, "repeats": m, "operation": task.op_names[swap],
                          **breaks(skip_prefix_profile(model, tokenizer, task, m, args.n, args.seed, swap))}
                         for m in SKIPS]
    noise = [{"sigma": s, "profiles": dict(zip(map(str, NOISE_DEPTHS), noisy_profile(model, tokenizer, task, s,
                                                                                       args.n, args.seed)))}
             for s in SIGMAS]
    record = {"command": "python examples/studies/full_view_break_depth.py " + " ".join(argv or sys.argv[1:]),
              "checkpoint": args.checkpoint, "n_per_depth": args.n, "seed": args.seed, "by_length": by_length,
              "skip_prefix": skip_prefix, "repeat_prefix": repeat_prefix, "noise": noise,
              "environment": environment_info(),
              "seconds": round(time.time() - started, 1)}
    save_record(record, OUT)
    for row in by_length:
        print(f"d={row['depth']}: first k < 90% {row['first_below_90']}, < 50% {row['first_below_50']}: "
              + " ".join(f"{100 * a:.0f}" for a in row["profile"]))
    for row in skip_prefix:
        print(f"{row['skips']} skips, d={row['depth']}: first k < 90% {row['first_below_90']}, < 50% "
              f"{row['first_below_50']}: " + " ".join(f"{100 * a:.0f}" for a in row["profile"]))
    for row in repeat_prefix:
        print(f"{row['repeats']} x {row['operation']}, d={row['depth']}: first k < 90% {row['first_below_90']}: "
              + " ".join(f"{100 * a:.0f}" for a in row["profile"]))
    for row in noise:
        print(f"sigma={row['sigma']}: " + " | ".join(" ".join(f"{100 * a:.0f}" for a in p)
                                                     for p in row["profiles"].values()))
    return record


if __name__ == "__main__":
    main()
