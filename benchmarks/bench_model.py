"""Speed figures (printed, never asserted): a forward of R = 64 on the tiny test config, and samples/s of one
training step of the default `train_par.py` model at depth d = 32 (the full PAR loss over the gradient window).

    python benchmarks/bench_model.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking  # noqa: E402
from state_tracking import StateTrackingCollator, build_dataset, build_tokenizer, get_task, model_token_ids  # noqa: E402
from trainers import answer_loss, progress_targets  # noqa: E402


def timed(fn, repeats):
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")

    torch.manual_seed(0)
    tiny = ParLoopedQwenForStateTracking(ParLoopedQwenConfig(
        vocab_size=40, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        prelude_layers=2, core_layers=2, coda_layers=2, answer_token_ids=[10, 11, 12, 13, 14])).eval()
    x = torch.randint(1, 40, (1, 70))
    with torch.no_grad():
        seconds = timed(lambda: tiny(x, num_iterations=64), args.repeats)
    print(f"tiny config (hidden 64, 2+2+2), one 70-token prompt, forward R = 64: {1000 * seconds:.1f} ms")

    task = get_task("swap_s5")
    tokenizer = build_tokenizer(task, "symbolic")
    ids = model_token_ids(tokenizer, task)
    model = ParLoopedQwenForStateTracking(ParLoopedQwenConfig(
        vocab_size=ids["vocab_size"], pad_token_id=ids["pad_token_id"], hidden_size=128, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=4, prelude_layers=1, core_layers=2, coda_layers=1,
        answer_token_ids=ids["answer_token_ids"], halt_token_ids=ids["halt_token_ids"])).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for depth, batch_size in ((8, 64), (32, 64)):
        data = build_dataset(task, tokenizer, n=batch_size, depths=depth, seed=0)
        batch = StateTrackingCollator(ids["pad_token_id"])([data[i] for i in range(batch_size)])
        window = list(range(max(1, depth - 7), depth + 1))

        def step():
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], num_iterations=depth, readout_iterations=window)
            targets = progress_targets(batch["step_labels"], batch["depth"], torch.tensor(window), 1)
            answer_loss(out.answer_logits, targets).backward()
            optimizer.step()
            optimizer.zero_grad()

        seconds = timed(step, args.repeats)
        print(f"default train_par.py model (hidden 128, 1+2+1), batch {batch_size}, d = {depth}: "
              f"{1000 * seconds:.0f} ms/step, {batch_size / seconds:.0f} samples/s")


if __name__ == "__main__":
    main()
