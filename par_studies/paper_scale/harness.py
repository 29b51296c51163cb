"""The CPU dry run of the paper's retrofit at the backbone's shape (`examples/reproduce/paper_retrofit.py --dry_run`):
a randomly initialised Qwen2 folder of the published shape with a Qwen2Tokenizer over the task's words, retrofitted
through train_par.py's own path (its parser on the preset's command, `build_tokenizer_for`, `build_model`,
`ParTrainer`'s optimizer and loss), and each case measured in a fresh process (its peak memory its own): seconds, peak
resident memory per phase, parameter / gradient / optimizer-state bytes, the bytes autograd saves for backward, FLOPs
(`torch.utils.flop_counter.FlopCounterMode` with CPU flash attention registered).

    python -m par_studies.paper_scale.harness CASE_JSON     # one case, its result as a CASE_RESULT line (run_isolated)
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..runs import REPO, load_train_par
from .flops import PAPER_SPLIT, QWEN25, analytic_flops, extrapolate, grad_layer_passes, part_flops
from .measure import (
    SavedTensorBytes,
    available_memory,
    current_rss,
    optimizer_state_bytes,
    parameter_counts,
    peak_rss,
    register_cpu_flash_attention,
    reset_peak_rss,
    tensor_bytes,
)

# ------------------------------------------------------------------------------------------------------ shapes
COMMON_QWEN2 = dict(rope_theta=1_000_000.0, max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu",
                    use_sliding_window=False, attention_dropout=0.0, bos_token_id=None)
SHAPES = {
    "0.5b": dict(config=QWEN25["0.5b"], split=PAPER_SPLIT),
    # the same code in seconds: Qwen2.5-0.5B's proportions (GQA 2 KV heads, tied embeddings), 2 + 2 + 2 layers
    "tiny": dict(config=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=6, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True), split=(2, 2, 2)),
}
EOS = "<|endoftext|>"  # Qwen2.5's eos and pad token


def qwen_like_tokenizer(task):
    """A `Qwen2Tokenizer` — Qwen's own class: its regex pre-tokenizer (words keep their leading space, every digit is
    its own piece), byte-level BPE, eos / pad "<|endoftext|>" — whose small vocabulary is trained (tokenizers'
    BpeTrainer) on the task's text sentences until every word piece is one token: " Box", " ", "3", " contents",
    ".", " apple", " Yes". Qwen2.5's 151k vocabulary holds these common English words and single digits whole too,
    so prompt lengths approximate Qwen2.5's token counts (an approximation: no download is possible here to check).
    A real run reads Qwen's own tokenizer from its folder."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    from state_tracking.prompts import text_sentences

    texts = []
    for text in [*text_sentences(task), "Yes", "No", *task.candidate_names]:
        texts += [text, " " + text]  # a sentence's first word with and without the space before it
    bpe = Tokenizer(BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=100_000, min_frequency=1, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, model_max_length=32768)
    pieces = {piece for text in texts for piece, _ in bpe.pre_tokenizer.pre_tokenize_str(text)}
    split = sorted(piece for piece in pieces if piece not in tokenizer.get_vocab())
    if split:
        raise RuntimeError(f"qwen_like_tokenizer: pieces {split} are not single tokens")
    return tokenizer


def make_parent(folder: Path, shape: str, seed: int = 0) -> dict:
    """Save a random Qwen2ForCausalLM of `shape` (bf16, as the Hub's Qwen2.5 checkpoints) and the tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from state_tracking import get_task

    started = time.time()
    config = Qwen2Config(**SHAPES[shape]["config"], **COMMON_QWEN2, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    qwen_like_tokenizer(get_task("swap_s5")).save_pretrained(folder)
    return {"folder": str(folder), "parameters": sum(p.numel() for p in model.parameters()),
            "saved_dtype": "bfloat16", "seconds": round(time.time() - started, 1)}


def case_overrides(case: dict) -> list[str]:
    """The flags a dry-run case gives over the preset's command: batch 1, the case's depth and window, fp32 (bf16
    autocast where the case says), a scratch output folder, the case's split."""
    P, C, Q = case["split"]
    return ["--output_dir", case["scratch"], "--per_device_train_batch_size", "1",
            "--gradient_accumulation_steps", "1", "--max_steps", str(case.get("steps", 1)),
            "--min_train_depth", str(case["depth"]), "--max_train_depth", str(case["depth"]),
            "--curriculum_start_depth", str(case["depth"]), "--grad_window", str(case.get("window", 8)),
            "--checkpoint_core", str(case.get("checkpoint_core", False)).lower(),
            "--bf16", str(case.get("bf16", False)).lower(), "--use_cpu", "true", "--save_strategy", "no",
            "--logging_steps", "1000000", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
            "--prelude_layers", str(P), "--core_layers", str(C), "--coda_layers", str(Q),
            "--max_iterations", str(max(1100, case["depth"] + 16))]


def build_case_model(case: dict):
    """The tokenizer, task, dataset (one depth-d problem per step) and retrofitted model of a case, built from its
    train_par.py command (`case["argv"]`: the preset's, with `case_overrides`) as train_par.py's main builds them."""
    import torch
    from transformers import set_seed

    from par_cli.training_data import build_task
    from state_tracking import build_dataset, model_token_ids
    from trainers.model_setup import build_model, build_tokenizer_for, use_tokenizer_special_tokens

    model_args, task_args, _, train_args, _ = load_train_par().parse_all_args(case["argv"])
    torch.set_num_threads(case["threads"])
    task = build_task(task_args)
    tokenizer = build_tokenizer_for(task, task_args, model_args)
    token_ids = model_token_ids(tokenizer, task)
    dataset = build_dataset(task, tokenizer, task_args.rendering, n=max(1, case.get("steps", 1)),
                            depths=(case["depth"], case["depth"]), seed=case.get("seed", 0))
    set_seed(0)
    model = build_model(model_args, token_ids, train_args)
    use_tokenizer_special_tokens(model.config, tokenizer)
    return train_args, tokenizer, token_ids, dataset, model


def loaded_train_case(case: dict) -> tuple:
    """A train case's model built (`build_case_model`), then the peak memory reset: (train_args, tokenizer, token_ids,
    dataset, model, the record's first fields: parameters by part and their bytes, what loading cost, the attention
    implementation, the prompts' tokens)."""
    started = time.time()
    train_args, tokenizer, token_ids, dataset, model = build_case_model(case)
    load_seconds = time.time() - started
    load_peak = peak_rss()
    gc.collect()
    reset = reset_peak_rss()
    record = {"param_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
              "parameters": parameter_counts(model, case["split"]),
              "param_bytes": tensor_bytes(p for p in {id(p): p for p in model.parameters()}.values()),
              "load_seconds": round(load_seconds, 1), "load_peak_rss_bytes": load_peak, "peak_reset": reset,
              "attn_implementation": model.config._attn_implementation,
              "tokens": [len(row) for row in dataset["input_ids"]]}
    return train_args, tokenizer, token_ids, dataset, model, record


def dry_run_trainer(steps: list[dict], counter):
    """ParTrainer at the forced depth, noting on the step being measured (`steps[-1]`) its R and readouts, the
    prompt's tokens, the bytes autograd saves, the forward's seconds and, on the counted step, its FLOPs so far."""
    from trainers import ParTrainer

    class DryRunTrainer(ParTrainer):
        def num_iterations(self, depth):  # forced depth: R = ⌈d/c⌉ (the hold tail's X = 0)
            return -(-depth // self.model.config.step_size)

        def readout_iterations(self, num_iterations, depth):
            reads, extra = super().readout_iterations(num_iterations, depth)
            steps[-1].update(R=num_iterations, readouts=len(reads) + (extra is not None), extra_negative=extra)
            return reads, extra

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            row = steps[-1]
            row["tokens"] = int(inputs["input_ids"].shape[1])
            with SavedTensorBytes(model) as saved:
                result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            row.update(saved_activation_bytes=saved.total, forward_seconds=time.perf_counter() - row["t0"],
                       forward_flops=counter.get_total_flops() if row["counted"] else None)
            return result

    return DryRunTrainer


def step_measure(steps: list[dict], counter, counted: dict, model, split):
    """The callback that appends each step's measurements to `steps` (and the counted step's per-module FLOPs to
    `counted`)."""
    from transformers import TrainerCallback

    class Measure(TrainerCallback):
        """Per step: time, the peak resident memory of each phase — forward + backward (VmHWM from the step's start
        to the optimizer step) and the optimizer step (AdamW's foreach temporaries), each phase's high-water mark
        reset at its start — and, for the first step, FLOPs."""

        def on_step_begin(self, args, state, control, **kwargs):
            gc.collect()
            reset_peak_rss()
            first = not steps
            steps.append({"counted": first, "t0": time.perf_counter(), "rss_at_start_bytes": current_rss()})
            if first:
                counter.__enter__()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            row = steps[-1]
            row["grad_bytes"] = tensor_bytes(p.grad for p in model.parameters())
            row["peak_rss_forward_backward_bytes"] = peak_rss()
            if row["counted"]:  # forward and backward are done: AdamW and the clipping have no matmul to count
                row["flops"] = counter.get_total_flops()
                counted.update(part_flops(counter.get_flop_counts(), split))
                counter.__exit__(None, None, None)
            gc.collect()
            reset_peak_rss()

        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            steps[-1]["optimizer_state_bytes"] = optimizer_state_bytes(optimizer) if optimizer is not None else None
            steps[-1]["peak_rss_optimizer_bytes"] = peak_rss()

        def on_step_end(self, args, state, control, **kwargs):
            row = steps[-1]
            row["seconds"] = time.perf_counter() - row.pop("t0")
            row["backward_seconds"] = row["seconds"] - row["forward_seconds"]

    return Measure()


def train_record(record: dict, steps: list[dict], counted: dict, trainer, model, split) -> dict:
    """The train case's record completed from its measured steps: the optimizer and its groups, each step's analytic
    FLOPs beside the counted ones, the last step's peak memory, the seconds per step."""
    optimizer = trainer.optimizer
    groups = [{"lr": g.get("initial_lr", g["lr"]), "weight_decay": g["weight_decay"],
               "parameters": sum(p.numel() for p in g["params"])} for g in optimizer.param_groups]
    for step in steps:
        step["analytic_flops"] = analytic_flops(model.config.to_dict(), split, step["tokens"], step["R"],
                                                reads=step["readouts"], window=model.config.grad_window, train=True,
                                                checkpoint_core=model.config.checkpoint_core)
    last = steps[-1]
    record.update(
        kind="train", steps=steps, optimizer=type(optimizer).__name__, param_groups=groups,
        module_flops_counted_step=counted,
        peak_rss_bytes=max(last["peak_rss_forward_backward_bytes"], last["peak_rss_optimizer_bytes"]),
        seconds_per_step=[round(s["seconds"], 2) for s in steps], trained=trainer.state.global_step,
    )
    return record


def run_train_case(case: dict) -> dict:
    """Optimizer steps at depth d (R = d, the forced depth: the hold schedule's tail X = 0) through ParTrainer.

    The first step is counted (FlopCounterMode, through its backward); the others are timed and their memory
    measured without the counter: its module tracker keeps tensors of checkpoint_core's recomputation alive until it
    exits (pytorch PR 139214), which would add them to the memory, and its dispatch costs time."""
    from torch.utils.flop_counter import FlopCounterMode

    from state_tracking import StateTrackingCollator

    register_cpu_flash_attention()
    train_args, tokenizer, token_ids, dataset, model, record = loaded_train_case(case)
    steps: list[dict] = []
    counter = FlopCounterMode(display=False)
    counted: dict = {}  # the counted step's per-module FLOPs
    collator = StateTrackingCollator(pad_token_id=token_ids["pad_token_id"])
    trainer = dry_run_trainer(steps, counter)(
        model=model, args=train_args, train_dataset=dataset, data_collator=collator, processing_class=tokenizer,
        callbacks=[step_measure(steps, counter, counted, model, case["split"])])
    trainer.train()
    return train_record(record, steps, counted, trainer, model, case["split"])


def run_eval_case(case: dict) -> dict:
    """Forced-depth forwards (`model.predict`, no grad) of one depth-d prompt at each R of `case["iterations"]`: time
    per stage (prelude, each core iteration, readout) from forward hooks, FLOPs per stage from FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    from state_tracking import StateTrackingCollator

    register_cpu_flash_attention()
    started = time.time()
    _, tokenizer, token_ids, dataset, model = build_case_model(dict(case, steps=1))
    load_seconds = time.time() - started
    load_peak = peak_rss()
    model.eval()
    gc.collect()
    reset = reset_peak_rss()
    batch = StateTrackingCollator(pad_token_id=token_ids["pad_token_id"])([dataset[0]])
    P, C, Q = case["split"]
    layers = model.model.layers
    marks: list[tuple[str, float, int]] = []  # (stage boundary, time, FLOPs counted so far)
    counter = None

    def mark(name):
        return lambda *_: marks.append((name, time.perf_counter(), counter.get_total_flops()))

    hooks = [layers[P].register_forward_pre_hook(mark("core_start")),
             layers[P + C - 1].register_forward_hook(mark("core_end")),
             layers[P + C].register_forward_pre_hook(mark("coda_start"))]
    runs = []
    for R in case["iterations"]:
        marks.clear()
        counter = FlopCounterMode(display=False)
        t0 = time.perf_counter()
        with counter:
            model.predict(batch["input_ids"], attention_mask=batch["attention_mask"],
                          query_positions=batch["query_positions"], num_iterations=R)
        total, flops = time.perf_counter() - t0, counter.get_total_flops()
        at = {name: [(t, f) for n, t, f in marks if n == name] for name in ("core_start", "core_end", "coda_start")}
        # each iteration's core layers timed and counted on their own (start of its first core layer to the end of
        # its last); the prelude stage runs from the start to the first core layer, the readout from the coda on
        runs.append({
            "R": R, "seconds": round(total, 3), "flops": flops,
            "iteration_seconds": [round(e[0] - b[0], 3) for b, e in zip(at["core_start"], at["core_end"])],
            "iteration_layer_flops": [e[1] - b[1] for b, e in zip(at["core_start"], at["core_end"])],
            "prelude_seconds": round(at["core_start"][0][0] - t0, 3), "prelude_flops": at["core_start"][0][1],
            "readout_seconds": round(t0 + total - at["coda_start"][-1][0], 3),
            "readout_flops": flops - at["coda_start"][-1][1],
        })
    for hook in hooks:
        hook.remove()
    tokens = len(dataset[0]["input_ids"])
    return {"kind": "eval", "runs": runs, "tokens": [tokens], "load_seconds": round(load_seconds, 1),
            "load_peak_rss_bytes": load_peak, "peak_reset": reset, "peak_rss_bytes": peak_rss(),
            "param_bytes": tensor_bytes(p for p in {id(p): p for p in model.parameters()}.values()),
            "param_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "attn_implementation": model.config._attn_implementation,
            "analytic_flops": {str(R): analytic_flops(model.config.to_dict(), case["split"], tokens, R)
                               for R in case["iterations"]}}



def run_case(case: dict) -> dict:
    if case["kind"] == "make_parent":
        return make_parent(Path(case["folder"]), case["shape"])
    if case["kind"] == "train":
        return run_train_case(case)
    return run_eval_case(case)


# glibc malloc serves tensors above this size with mmap and gives them back to the OS when freed, so that VmHWM follows
# the live memory (its default threshold grows with the freed sizes and keeps freed activations in the heap, where the
# high-water mark then counts them twice); the cost is page faults: steps ~30% slower than with the default
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "262144"}


def run_isolated(case: dict, inline: bool) -> dict:
    """A case in a fresh Python process (its own peak memory), or in this one (`inline`, for tests)."""
    if inline:
        return run_case(case)
    env = dict(os.environ, OMP_NUM_THREADS=str(case.get("threads", 1)), TQDM_DISABLE="1",
               TOKENIZERS_PARALLELISM="false", **ALLOCATOR_ENV)
    proc = subprocess.run([sys.executable, "-m", __spec__.name, json.dumps(case)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CASE_RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"status": "failed", "returncode": proc.returncode,
                "reason": f"the case's process exited with code {proc.returncode} (its stderr is above)"}
    return json.loads(lines[-1][len("CASE_RESULT "):])



# --------------------------------------------------------------------------------------------------- the dry run
def prompt_tokens(tokenizer, task, depths, n: int = 64, seed: int = 0) -> dict:
    """Mean / min / max tokens of n text prompts per depth (identity steps are shorter sentences than swaps)."""
    import numpy as np

    from state_tracking.prompts import text_prompt

    rng = np.random.default_rng(seed)
    out = {}
    for d in depths:
        lengths = [len(tokenizer(text_prompt(task, rng.integers(0, len(task.op_names), size=d), None)[0])["input_ids"])
                   for _ in range(n)]
        out[str(d)] = {"mean": round(float(np.mean(lengths)), 1), "min": int(min(lengths)), "max": int(max(lengths))}
    return out


def plan_cases(args, folder: Path, split) -> list[dict]:
    base = dict(folder=str(folder), split=list(split), threads=args.threads)
    cases = []
    for d in args.depths:
        cases.append(dict(base, kind="train", depth=d, window=8, steps=args.steps))
    top = max(args.depths)
    for w in args.windows:
        if w != 8:
            cases.append(dict(base, kind="train", depth=top, window=w, steps=args.steps))
    cases.append(dict(base, kind="train", depth=top, window=8, checkpoint_core=True, steps=args.steps))
    for d in args.bf16_depths:  # bf16 autocast over the fp32 weights, as the preset's GPU run: activations' bytes
        cases.append(dict(base, kind="train", depth=d, window=8, bf16=True, steps=args.steps))
    for d in args.eval_depths:
        cases.append(dict(base, kind="eval", depth=d, iterations=args.eval_iterations))
    return cases


def case_name(case: dict) -> str:
    if case["kind"] == "eval":
        return f"eval d={case['depth']} R={','.join(map(str, case['iterations']))}"
    extra = (" checkpoint_core" if case.get("checkpoint_core") else "") + (" bf16" if case.get("bf16") else "")
    return f"train d={case['depth']} window={case['window']}{extra}"


def predicted_train_peak(case: dict, done: list[dict], split) -> dict | None:
    """A training case's peak memory from a measured one at the same depth: its peak plus the saved activations of
    the extra layer passes (saved bytes per layer pass of the measured case)."""
    if case.get("checkpoint_core") or case.get("bf16"):
        return None
    for other in done:
        if (other["case"]["kind"] == "train" and other["case"]["depth"] == case["depth"]
                and other.get("status") == "measured" and not other["case"].get("checkpoint_core")
                and not other["case"].get("bf16")):
            step = other["steps"][-1]
            saved = step["saved_activation_bytes"]
            per_pass = saved / grad_layer_passes(split, case["depth"], other["case"]["window"])
            mine = per_pass * grad_layer_passes(split, case["depth"], case["window"])
            return {"from": case_name(other["case"]), "saved_activation_bytes": int(mine),
                    "peak_rss_forward_backward_bytes": int(step["peak_rss_forward_backward_bytes"] - saved + mine),
                    "peak_rss_bytes": int(max(step["peak_rss_forward_backward_bytes"] - saved + mine,
                                              step["peak_rss_optimizer_bytes"]))}
    return None


def machine_info(threads: int) -> dict:
    from state_tracking.evaluation import environment_info

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal:"))
    info = environment_info("cpu")
    info.pop("hostname", None)
    return dict(info, cpu=cpu, cpu_count=os.cpu_count(), memory_bytes=total, torch_threads=threads,
                load_average_at_start=list(os.getloadavg()))


def dry_run(args, argv: list[str], train_command: Callable[[str, list[str]], list[str]], preset_command: str) -> dict:
    """The dry run of `args` (paper_retrofit.py's parsed flags; `argv` as given): the random parent folder, then every
    planned case measured in its own process (or predicted where memory is short). `train_command(folder, flags)` is
    the preset's train_par.py command on a parent folder with `flags` over it; `preset_command` the run's, printed."""
    from state_tracking import get_task

    shape, split = SHAPES[args.shape]["config"], tuple(SHAPES[args.shape]["split"])
    work = Path(args.work_dir)
    folder = work / f"qwen2-{args.shape}-random"
    started = time.time()
    machine = machine_info(args.threads)
    ensure_random_parent(folder, args)
    from transformers import AutoTokenizer

    task = get_task("swap_s5")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lengths = sorted({*args.depths, *args.eval_depths, 8, 16, 32, 64, 128, 256, 512})
    tokens = prompt_tokens(tokenizer, task, lengths)
    results = []
    for case in plan_cases(args, folder, split):
        case = dict(case, scratch=str(work / "scratch"))
        case["argv"] = train_command(case["folder"], case_overrides(case))
        results.append(dry_run_case(case, results, split, args.inline))
    record = {
        "what": "shape-exact dry run of the paper's retrofit (examples/reproduce/paper_retrofit.py --dry_run): random "
                "weights, fp32 on CPU, batch 1 per measured step",
        "command": "python " + shlex.join(["examples/reproduce/paper_retrofit.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "shape": {"name": args.shape, **shape, **{k: v for k, v in COMMON_QWEN2.items() if k != "bos_token_id"},
                  "split": list(split), "saved_dtype": "bfloat16"},
        "tokenizer": DRY_RUN_TOKENIZER,
        "preset_command": preset_command,
        "prompt_tokens": tokens,
        "cases": results,
        "extrapolated": extrapolate(results, split, shape, tokens),
        "notes": dict(DRY_RUN_NOTES),
        "total_wall_seconds": round(time.time() - started, 1),
    }
    return record


def ensure_random_parent(folder: Path, args) -> None:
    """The random Qwen2 parent in `folder`, built in its own process unless it is there already."""
    if not (folder / "config.json").is_file():
        made = run_isolated(dict(kind="make_parent", folder=str(folder), shape=args.shape, threads=args.threads),
                            args.inline)
        if made.get("status") == "failed":
            raise SystemExit(f"--dry_run: building the random Qwen2 folder failed: {made['reason']}")


def dry_run_case(case: dict, done: list[dict], split, inline: bool) -> dict:
    """One planned case's entry: measured in its own process, or 'not run' when its peak predicted from a measured
    case in `done` exceeds the available memory less a margin."""
    name = case_name(case)
    print(f"[dry run] {name} ...", file=sys.stderr, flush=True)
    entry = {"name": name, "case": {k: v for k, v in case.items() if k not in ("folder", "scratch", "argv")}}
    prediction = predicted_train_peak(case, done, split) if case["kind"] == "train" else None
    if prediction is not None:
        entry["predicted"] = prediction
    margin = 2 * 1024**3
    if prediction is not None and prediction["peak_rss_bytes"] > available_memory() - margin:
        entry.update(status="not run", reason=(
            f"predicted peak {prediction['peak_rss_bytes'] / 1e9:.1f} GB (from {prediction['from']}: its peak "
            f"plus the activations of the extra layer passes) exceeds this machine's available memory "
            f"{available_memory() / 1e9:.1f} GB less a {margin / 1e9:.1f} GB margin"))
    else:
        t0 = time.time()
        measured = run_isolated(case, inline)
        entry.update(measured)
        entry.setdefault("status", "measured")
        entry["wall_seconds"] = round(time.time() - t0, 1)
    print(f"[dry run] {name}: {entry['status']} "
          f"({entry.get('wall_seconds', 0)} s, peak {entry.get('peak_rss_bytes', 0) / 1e9:.2f} GB)",
          file=sys.stderr, flush=True)
    return entry


# dry_run.json's description of the tokenizer, and its notes on what each figure is
DRY_RUN_TOKENIZER = (
    "Qwen2Tokenizer (Qwen's class: its regex pre-tokenizer and byte-level BPE) with a small "
    "vocabulary "
    "trained on the task's text until every word piece (' Box', ' ', '3', ' contents', '.') is one "
    "token, as in Qwen2.5's vocabulary for these common words and single digits: prompt lengths "
    "approximate Qwen2.5's"
)
DRY_RUN_NOTES = {
    "measured": "every case with status 'measured': seconds, peak resident memory (VmHWM of this case's "
                "process, reset after loading and at each phase: forward + backward, optimizer step, after "
                "a gc.collect() that frees what FlopCounterMode's module tracker keeps in a reference cycle "
                "with checkpoint_core's recomputation; glibc with MALLOC_MMAP_THRESHOLD_=262144 so that freed "
                "tensors leave the process), bytes of "
                "parameters / gradients / AdamW states / tensors saved for backward, FLOPs (FlopCounterMode, "
                "CPU flash attention registered; attention counted over the full square as torch counts every "
                "sdpa kernel)",
    "extrapolated": "'extrapolated' holds the evaluation at R = d from the two measured R (linear: every "
                    "full-view iteration is the same computation; the per-iteration FLOPs and seconds of the "
                    "two runs are compared in 'linearity') and the training cases' R = d + X tail",
    "predicted": "a case 'not run' carries the peak predicted from a measured case at the same depth",
    "training_R": "training cases run R = d (the hold schedule's tail X = 0, i.e. forced depth) with the "
                  "preset's loss: the window's readouts plus the extra halting negative",
}


if __name__ == "__main__":  # one case in this fresh process (run_isolated)
    print("CASE_RESULT " + json.dumps(run_case(json.loads(sys.argv[1]))), flush=True)
