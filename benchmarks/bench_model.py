"""Speed figures (printed, never asserted): a forward of R = 64 on the tiny test config, and samples/s of one
training step of the default `train_par.py` model at depth d = 32 (the full PAR loss over the gradient window).

    python benchmarks/bench_model.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_speed import default_model, make_step, seconds_per_call, training_batch  # noqa: E402 (bench_speed's step)

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking  # noqa: E402


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")

    torch.manual_seed(0)
    tiny = ParLoopedQwenForStateTracking(ParLoopedQwenConfig(
        vocab_size=40, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        prelude_layers=2, core_layers=2, coda_layers=2, answer_token_ids=[10, 11, 12, 13, 14])).eval()
    x = torch.randint(1, 40, (1, 70))
    with torch.no_grad():
        seconds = seconds_per_call(lambda: tiny(x, num_iterations=64), args.repeats)
    print(f"tiny config (hidden 64, 2+2+2), one 70-token prompt, forward R = 64: {1000 * seconds:.1f} ms")

    for depth, batch_size in ((8, 64), (32, 64)):
        model, ids = default_model({"loop_view": "full"})
        step = make_step(model, training_batch(depth, batch_size, ids), depth)
        seconds = seconds_per_call(step, args.repeats)
        print(f"default train_par.py model, full view (hidden 128, 1+2+1), batch {batch_size}, d = {depth}: "
              f"{1000 * seconds:.0f} ms/step, {batch_size / seconds:.0f} samples/s")


if __name__ == "__main__":
    main()
