"""Explicit chain-of-thought baseline, trained with TRL's SFTTrainer (the comparisons study's first row).

A plain (non-looped) from-scratch ``Qwen2ForCausalLM`` of the default PAR model's size (hidden 128, MLP 256,
4 heads, 4 KV heads, 4 layers = prelude 1 + core 2 + coda 1, tied embeddings) learns to write the state after
every operation and then the answer (format: ``state_tracking/cot.py``); at test it generates greedily with the
KV cache. Training problems are PAR's (``build_dataset`` with the same seed: depths uniform in
min..max_train_depth), test problems are the package evaluator's (``derive_seed("eval", seed, d)``).

    python examples/baselines/cot_trl.py --seed 0 --results_json results/cot_trl/seed0.json
    python examples/baselines/cot_trl.py --task s5 --max_steps 500 --eval_depths 8,16
    python examples/baselines/cot_trl.py --task_file lamp.json

Writes one JSON (``--results_json``, default ``<output_dir>/results.json``): the command, seed, steps, wall times
(data, train, eval), machine, date, versions, the loss curve at every logging step, and per depth the final-answer
accuracy, the intermediate-state accuracy and the tokens generated per problem.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from par_cli.flag_values import true_or_false  # noqa: E402
from state_tracking import get_task, load_task  # noqa: E402
from state_tracking.cot import build_cot_dataset, build_cot_tokenizer, cot_token_ids, evaluate_cot  # noqa: E402
from state_tracking.evaluation import repo_relative  # noqa: E402

METHOD = "cot_trl"
CURVE_KEYS = ("step", "loss", "learning_rate", "grad_norm", "mean_token_accuracy", "entropy", "num_tokens")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    task = parser.add_argument_group("task")
    task.add_argument("--task", default="swap_s5", choices=["swap_s5", "s5", "a5"])
    task.add_argument("--task_file", default=None, help="a user state-machine task (JSON); overrides --task")
    task.add_argument("--random_initial", type=true_or_false, nargs="?", const=True, default=False,
                      help="random start states (written in the prompt)")
    task.add_argument("--min_train_depth", type=int, default=1)
    task.add_argument("--max_train_depth", type=int, default=8)
    task.add_argument("--train_size", type=int, default=None, help="training problems (default: steps × batch)")
    task.add_argument("--eval_depths", default="8,16,32,64", help="comma-separated test depths")
    task.add_argument("--eval_n", type=int, default=256, help="test problems per depth")
    task.add_argument("--eval_batch_size", type=int, default=256)
    model = parser.add_argument_group("model (defaults: the default PAR model's size)")
    model.add_argument("--hidden_size", type=int, default=128)
    model.add_argument("--intermediate_size", type=int, default=256)
    model.add_argument("--num_attention_heads", type=int, default=4)
    model.add_argument("--num_key_value_heads", type=int, default=4)
    model.add_argument("--num_hidden_layers", type=int, default=4, help="prelude 1 + core 2 + coda 1")
    model.add_argument("--max_position_embeddings", type=int, default=4096)
    train = parser.add_argument_group("training (SFTConfig)")
    train.add_argument("--max_steps", type=int, default=2000)
    train.add_argument("--per_device_train_batch_size", type=int, default=64)
    train.add_argument("--learning_rate", type=float, default=1e-3)
    train.add_argument("--warmup_steps", type=int, default=100)
    train.add_argument("--lr_scheduler_type", default="cosine")
    train.add_argument("--weight_decay", type=float, default=0.01)
    train.add_argument("--max_grad_norm", type=float, default=1.0)
    train.add_argument("--logging_steps", type=int, default=50)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--torch_threads", type=int, default=1, help="torch.set_num_threads")
    out = parser.add_argument_group("output")
    out.add_argument("--output_dir", default="runs/cot-trl")
    out.add_argument("--results_json", default=None, help="default: <output_dir>/results.json")
    out.add_argument("--save_model", type=true_or_false, nargs="?", const=True, default=False,
                     help="save the final model and tokenizer to --output_dir")
    args = parser.parse_args(argv)
    args.eval_depths = [int(d) for d in args.eval_depths.split(",") if d.strip()]
    for name in ("min_train_depth", "max_train_depth", "max_steps", "per_device_train_batch_size", "eval_n",
                 "eval_batch_size", "logging_steps", "torch_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.min_train_depth > args.max_train_depth:
        parser.error(f"--min_train_depth {args.min_train_depth} > --max_train_depth {args.max_train_depth}")
    return args


def build_model(args: argparse.Namespace, tokenizer, task):
    """A from-scratch Qwen2ForCausalLM sized like the default PAR model, with the CoT tokenizer's special ids."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    ids = cot_token_ids(tokenizer, task)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_hidden_layers, num_attention_heads=args.num_attention_heads,
        num_key_value_heads=args.num_key_value_heads, max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=ids.pad, bos_token_id=ids.bos, eos_token_id=ids.eos,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = ids.pad
    model.generation_config.bos_token_id = ids.bos
    model.generation_config.eos_token_id = ids.eos
    return model


def sft_config(args, max_length: int):
    """TRL's `SFTConfig` of the run: the script's schedule, with the TRL defaults that do not fit here turned off."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=args.output_dir, max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, lr_scheduler_type=args.lr_scheduler_type,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, logging_steps=args.logging_steps,
        seed=args.seed, data_seed=args.seed,
        # TRL defaults that do not fit here: bf16 (default on) and gradient (activation) checkpointing (default on)
        bf16=False, activation_checkpointing=False,
        completion_only_loss=True,  # must be explicit: TRL infers it only for string prompt/completion columns
        packing=False, padding_free=False, max_length=max_length,  # max_length = longest example: nothing truncated
        save_strategy="no", report_to="none", dataloader_num_workers=0, dataloader_pin_memory=torch.cuda.is_available(),
        disable_tqdm=True,
    )


def results_record(args, task, tokenizer, model, trainer, train_output, evaluation: dict, command: str, n: int,
                   max_length: int, seconds: dict) -> dict:
    """results.json: the run's settings, timings, machine, versions, model, loss curve and evaluation."""
    import datasets
    import transformers
    import trl

    curve = [{k: row[k] for k in CURVE_KEYS if k in row} for row in trainer.state.log_history if "loss" in row]
    per_depth = {
        str(row["depth"]): {k: row[k] for k in ("accuracy", "intermediate_accuracy", "mean_generated_tokens",
                                                 "expected_tokens", "fraction_malformed", "fraction_wrong_state_count",
                                                 "mean_states_written", "n")}
        for row in evaluation["per_depth"]
    }
    return {
        "method": METHOD,
        "command": command,
        "seed": args.seed,
        "task": task.name,
        "task_spec": task.to_dict(),
        "steps": trainer.state.global_step,
        "max_steps": args.max_steps,
        "train_examples": n,
        "train_depths": [args.min_train_depth, args.max_train_depth],
        "max_train_depth": args.max_train_depth,
        "max_length": max_length,
        "wall_time_seconds": {k: round(v, 2) for k, v in seconds.items()},
        "seconds_per_step": round(seconds["train"] / max(1, trainer.state.global_step), 4),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or None,
                    "cpu_count": os.cpu_count(), "torch_num_threads": torch.get_num_threads(),
                    "device": str(model.device)},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                     "datasets": datasets.__version__, "python": platform.python_version()},
        "model": {"class": type(model).__name__, "num_parameters": sum(p.numel() for p in model.parameters()),
                  "hidden_size": args.hidden_size, "intermediate_size": args.intermediate_size,
                  "num_hidden_layers": args.num_hidden_layers, "num_attention_heads": args.num_attention_heads,
                  "num_key_value_heads": args.num_key_value_heads, "tie_word_embeddings": True,
                  "vocab_size": len(tokenizer)},
        "training": {"learning_rate": args.learning_rate, "warmup_steps": args.warmup_steps,
                     "lr_scheduler_type": args.lr_scheduler_type, "weight_decay": args.weight_decay,
                     "batch_size": args.per_device_train_batch_size, "max_grad_norm": args.max_grad_norm,
                     "completion_only_loss": True, "packing": False, "logging_steps": args.logging_steps},
        "train_loss": train_output.training_loss,
        "final_loss": curve[-1]["loss"] if curve else None,
        "loss_curve": curve,
        "eval": {"depths": evaluation["depths"], "accuracy": evaluation["accuracy"],
                 "intermediate_accuracy": evaluation["intermediate_accuracy"],
                 "mean_generated_tokens": evaluation["mean_generated_tokens"], "n": evaluation["n"],
                 "d50": evaluation["d50"], "extrapolation_factor": evaluation["extrapolation_factor"],
                 "per_depth": per_depth},
        "evaluation": evaluation,
    }


def main(argv=None) -> dict:
    from transformers import set_seed
    from trl import SFTTrainer

    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    argv_list = sys.argv[1:] if argv is None else [str(a) for a in argv]
    command = "python " + " ".join([repo_relative(__file__)] + argv_list)
    task = load_task(args.task_file) if args.task_file else get_task(args.task)
    tokenizer = build_cot_tokenizer(task)

    started = time.time()
    n = args.train_size or args.max_steps * args.per_device_train_batch_size
    dataset = build_cot_dataset(task, tokenizer, n=n, depths=(args.min_train_depth, args.max_train_depth),
                                seed=args.seed, random_initial=args.random_initial)
    max_length = max(len(row) for row in dataset["input_ids"])
    set_seed(args.seed)
    model = build_model(args, tokenizer, task)
    config = sft_config(args, max_length)
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    data_seconds = time.time() - started

    started = time.time()
    train_output = trainer.train()
    train_seconds = time.time() - started
    if args.save_model:
        trainer.save_model(args.output_dir)
        tokenizer.save_pretrained(args.output_dir)

    started = time.time()
    evaluation = evaluate_cot(model, tokenizer, task, args.eval_depths, n_per_depth=args.eval_n, seed=args.seed,
                              batch_size=args.eval_batch_size, random_initial=args.random_initial,
                              train_max_depth=args.max_train_depth)
    eval_seconds = time.time() - started

    seconds = {"data": data_seconds, "train": train_seconds, "eval": eval_seconds}
    results = results_record(args, task, tokenizer, model, trainer, train_output, evaluation, command, n, max_length,
                             seconds)
    per_depth = results["eval"]["per_depth"]
    path = Path(args.results_json) if args.results_json else Path(args.output_dir) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"{METHOD} {task.name} seed {args.seed}: {trainer.state.global_step} steps in {train_seconds:.0f}s, "
          f"eval {eval_seconds:.0f}s")
    for depth, row in per_depth.items():
        marker = " (train)" if int(depth) <= args.max_train_depth else ""
        print(f"  d={depth}{marker}: accuracy {row['accuracy']:.3f}  intermediate {row['intermediate_accuracy']:.3f}  "
              f"tokens/problem {row['mean_generated_tokens']:.1f} (well-formed: {row['expected_tokens']})")
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
