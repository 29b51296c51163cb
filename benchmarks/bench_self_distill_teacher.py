"""Time the prefix self-distillation teacher: one pass over the whole prompt (prefix-invariant views) against one
run per prefix, on S5 batches of one depth, the recipe's model size (hidden 128, 1 + 2 + 1 layers), one thread.

    python benchmarks/bench_self_distill_teacher.py [--depths 4,8,16 --batch 64 --repeats 3]

Prints, per depth, the seconds per teacher call of each path and the largest difference of their logits.
"""

import argparse
import tempfile
import time

import torch

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking
from state_tracking import StateTrackingCollator, build_dataset, build_tokenizer, get_task, model_token_ids
from trainers import PrefixSelfDistillationTrainer, SelfDistillationArguments

parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
parser.add_argument("--depths", default="4,8,16")
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()
torch.set_num_threads(args.threads)

task = get_task("s5")
tokenizer = build_tokenizer(task, "symbolic")
ids = model_token_ids(tokenizer, task)
depths = [int(d) for d in args.depths.split(",")]
dataset = build_dataset(task, tokenizer, n=args.batch * len(depths) * 8, depths=(min(depths), max(depths)), seed=0)
collator = StateTrackingCollator(pad_token_id=ids["pad_token_id"])
torch.manual_seed(0)
config = ParLoopedQwenConfig(
    vocab_size=ids["vocab_size"], pad_token_id=ids["pad_token_id"], hidden_size=128, intermediate_size=256,
    num_attention_heads=4, num_key_value_heads=4, prelude_layers=1, core_layers=2, coda_layers=1,
    answer_token_ids=ids["answer_token_ids"], halt_token_ids=ids["halt_token_ids"], max_position_embeddings=512,
    loop_view="local", progress_positions=True, bidirectional_queries=True, grad_window=16,
)
model = ParLoopedQwenForStateTracking(config)
with tempfile.TemporaryDirectory() as out:
    training_args = SelfDistillationArguments(output_dir=out, max_steps=1, report_to="none", use_cpu=True,
                                              max_train_depth=max(depths))
    trainer = PrefixSelfDistillationTrainer(model=model, args=training_args, train_dataset=dataset,
                                            data_collator=collator, processing_class=tokenizer, task=task)
    print(f"S5, batch {args.batch}, hidden 128, {args.threads} thread(s); teacher readouts at iterations 1..d-1")
    print("| d | one pass (s) | per prefix (s) | speed-up | max |logit difference| |")
    print("|---|---|---|---|---|")
    for d in depths:
        rows = [dataset[i] for i in range(len(dataset)) if dataset[i]["depth"] == d][: args.batch]
        batch = collator(rows)
        iterations = list(range(1, d))
        timings = {}
        for name, call in (("one pass", trainer.teacher_logits), ("per prefix", trainer.prefix_teacher_logits)):
            call(batch, batch["depth"], iterations)  # warm-up
            start = time.perf_counter()
            for _ in range(args.repeats):
                logits = call(batch, batch["depth"], iterations)
            timings[name] = ((time.perf_counter() - start) / args.repeats, logits)
        fast, slow = timings["one pass"], timings["per prefix"]
        print(f"| {d} | {fast[0]:.3f} | {slow[0]:.3f} | {slow[0] / fast[0]:.1f}× | "
              f"{(fast[1] - slow[1]).abs().max().item():.1e} |")
