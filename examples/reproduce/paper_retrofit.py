"""The paper's own run as one command — Qwen2.5-0.5B retrofitted 8 / 8 / 8 on swap-S5 text prompts — and a
shape-exact dry run of it on CPU.

    python examples/reproduce/paper_retrofit.py --init_from_qwen2 PATH              # the run (seed 0), on a GPU
    python examples/reproduce/paper_retrofit.py --init_from_qwen2 PATH --seed 3     # another of the paper's 6 seeds
    python examples/reproduce/paper_retrofit.py --init_from_qwen2 PATH --print_command   # the train_par.py command
    accelerate launch --config_file examples/reproduce/accelerate_ddp.yaml \\
        examples/reproduce/paper_retrofit.py --init_from_qwen2 PATH                 # several GPUs (docs/paper_scale.md)
    python examples/reproduce/paper_retrofit.py --dry_run                           # 0.5B shape, random weights, CPU
    python examples/reproduce/paper_retrofit.py --dry_run --shape tiny --depths 2,4 --eval_depths 8 --out DIR

The run is `examples/train_par.py` with `PRESET` (every flag written out, one comment per hyperparameter with the
paper's value, docs/paper_scale.md for the arithmetic); flags after the script's own replace the preset's (e.g.
`--max_steps 100` for a smoke test; each flag once). PATH is a local Qwen2 folder (no download happens here):
`huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir PATH`.

`--dry_run` (22 min on 2 CPU cores) builds a randomly initialised Qwen2ForCausalLM with Qwen2.5-0.5B's published
shape, saves it as a Qwen2 folder (bf16, as the Hub checkpoint) with a Qwen2Tokenizer over the task's words, and
retrofits it through the same path as the run (`train_par.parse_all_args` of the preset's command,
`build_tokenizer_for`, `build_model`, `ParTrainer`'s optimizer and loss). It measures, each case in a fresh process (so
its peak memory is its own), fp32 on CPU, batch 1: two optimizer steps at d = 8, 16, 32 (window 8; at d = 32 also
window 32 — predicted, not run, where memory is short — and `--checkpoint_core`; at d = 8 also bf16 autocast) and
forced-depth evaluation forwards at d = 256, 512 for R = 1, 2 iterations, extrapolated linearly to R = d (under the full
view every iteration is the same computation). Per case: seconds, peak resident memory per phase (VmHWM), parameter /
gradient / optimizer-state bytes, the bytes autograd saves for backward (activations), FLOPs of the first step
(`torch.utils.flop_counter.FlopCounterMode`, with CPU flash attention registered) beside an analytic count, prompt
tokens; then the GPU-scale estimates (`scale_estimates`). Writes results/paper_scale_cpu/dry_run.json,
peak_memory.png and README.md (`--render` rewrites them from the JSON).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repository's packages without an install
from state_tracking.flag_values import true_or_false  # noqa: E402

TRAIN_PAR = REPO / "examples" / "train_par.py"
RESULTS = REPO / "results" / "paper_scale_cpu"
WORK = REPO / "runs" / "paper_retrofit_dry"  # the random Qwen2 folder and scratch outputs (git-ignored)

# ------------------------------------------------------------------------------------------------------------ preset
# The batch: the paper gives "~400k samples in one epoch" but no batch size (../shared/docs/par_method.md §4). 64
# samples per optimizer step -> 400,000 / 64 = 6,250 steps. Inside the 8-iteration window a d = 32 sample keeps ~6.5 GB
# of activations for backward (dry run: 108.7 KB per token per kept layer pass in fp32, x 144 passes — the prelude,
# 8 core iterations, 9 coda readouts — x 433 tokens, x 0.93 under bf16 autocast), so one H200 (141 GB) takes 16 at a
# time next to the 8 GB of fp32 weights, gradients and AdamW states: 16 x 4 accumulation steps. With N GPUs
# (accelerate DDP) pass --gradient_accumulation_steps 4/N so that the global batch stays 64 (docs/paper_scale.md).
BATCH, SAMPLES = 64, 400_000
PRESET = {
    # --- model: Qwen2.5-0.5B's 24 layers as prelude 1-8, weight-shared core 9-16, coda 17-24 (paper §3)
    "--prelude_layers": 8,
    "--core_layers": 8,
    "--coda_layers": 8,
    "--step_size": 1,  # c = 1: iteration k is supervised with the state after k operations (paper default)
    "--norm_anchoring": "true",  # state-norm anchoring, s_k <- s_k rms(s_1)/rms(s_k) (paper)
    "--grad_window": 8,  # the last 8 iterations carry gradient, earlier ones run without (paper §4)
    "--loop_view": "full",  # every iteration sees the whole prompt with the parent's causal attention (paper)
    "--progress_positions": "false",  # ordinary positions (paper; the local-view recipe's option is off)
    "--bidirectional_queries": "false",  # causal queries, as the parent was trained (paper)
    # --- task: swap-S5, natural-language prompts read by the pretrained tokenizer (paper §2)
    "--task": "swap_s5",
    "--rendering": "text",
    "--min_train_depth": 1,  # train d <= 32 (paper), depths uniform over 1..32 ...
    "--max_train_depth": 32,
    "--curriculum_start_depth": 32,  # ... from step 0: d_max = 32 from the start is no curriculum (paper)
    # --- objective: progress-aligned targets (PAR) with learned halting (paper §4)
    "--objective": "par",
    "--depth_schedule": "hold",  # R = d + X, X ~ U{0..7}: forced depth plus a tail past d; X = 0 is forced depth.
    #   The paper trains forced depth with halting labels; this trainer trains Yes labels only on iterations past d
    #   (the halting rule reads P(Yes) on R..R+m-1, m = 8), so the halting row needs the tail (trainers/par_trainer.py)
    "--hold_tail": "additive",
    "--hold_extra_iterations": 7,  # m - 1 = 7: the halting window's length minus one (paper: m = 8)
    "--halting_loss_weight": 0.5,  # class-balanced halting CE, weight 0.5, one earlier iteration as an extra "No"
    "--halt_label_offset": 0,  # Yes when c k >= d (paper)
    # --- optimisation (paper §4: AdamW, lr 2e-5, adapter 1e-4, 200 warm-up steps, ~400k samples in one epoch)
    "--optim": "adamw_torch",  # AdamW (paper)
    "--learning_rate": 2e-5,  # paper
    "--adapter_learning_rate": 1e-4,  # paper
    "--warmup_steps": 200,  # paper
    "--lr_scheduler_type": "cosine",  # not stated by the paper: the project's default decay after warm-up
    "--weight_decay": 0.01,  # not stated by the paper: the project's default
    "--max_grad_norm": 1.0,  # not stated by the paper: transformers' default clipping
    "--per_device_train_batch_size": 16,  # not stated by the paper: 16 x 4 accumulation = 64 per step (see BATCH)
    "--gradient_accumulation_steps": 4,
    "--max_steps": SAMPLES // BATCH,  # 6,250 steps x 64 = 400,000 samples, one epoch (paper: ~400k)
    "--bf16": "true",  # not stated by the paper: bf16 autocast over fp32 master weights (train_par loads fp32)
    # --- evaluation: 1,024 fresh sequences per length, 1x to 16x, forced depth and learned halting (paper §2, §5)
    "--eval_depths": "32,64,128,256,512",
    "--eval_n": 1024,
    "--eval_halting": "true",
    "--eval_batch_size": 64,
    # --- bookkeeping: resumable (run the same command again after an interruption), seed per run (paper: 6 seeds)
    "--seed": 0,
    "--output_dir": "runs/paper_retrofit/s0",
    "--logging_steps": 50,
    "--save_strategy": "steps",
    "--save_steps": 500,
    "--save_total_limit": 2,
    "--report_to": "none",
}
PAPER_SPLIT = (8, 8, 8)


def flag_value(value) -> str:
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


def train_argv(init_from_qwen2: str, seed: int = 0, extra: list[str] | None = None) -> list[str]:
    """train_par.py's arguments of the paper's run: the preset (seed and output folder per seed), each flag once;
    a flag in `extra` replaces the preset's value, a new one is added after them."""
    flags = dict(PRESET, **{"--seed": seed, "--output_dir": f"runs/paper_retrofit/s{seed}"})
    flags = {"--init_from_qwen2": str(init_from_qwen2), **{k: flag_value(v) for k, v in flags.items()}}
    flags.update(parse_flags(extra or []))
    return [token for flag, value in flags.items() for token in (flag, value)]


def parse_flags(argv: list[str]) -> dict[str, str]:
    """flag -> value of `--flag value`, `--flag=value` or a bare `--flag` (true); a flag given twice is an error."""
    flags, i = {}, 0
    while i < len(argv):
        if not argv[i].startswith("--"):
            raise SystemExit(f"train_par.py flags must be --name value pairs; {argv[i]!r} follows no flag")
        name, eq, inline = argv[i].partition("=")
        if eq:
            value = inline
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
        else:
            value = "true"
        if name in flags:
            raise SystemExit(f"{name} is given twice ({flags[name]!r} and {value!r}); give it once")
        flags[name] = value
        i += 1
    return flags


def print_command(argv: list[str]) -> str:
    return "python examples/train_par.py " + shlex.join(argv)


def check_qwen2_folder(path: str | None, split: tuple[int, int, int]) -> Path:
    """A local Qwen2 checkpoint folder whose layer count is the split's sum; else one clear error."""
    if not path:
        raise SystemExit("--init_from_qwen2 is required for a run: a local Qwen2 folder (e.g. "
                         "`huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir PATH`), or --dry_run.")
    folder = Path(path)
    if not folder.is_dir():
        raise SystemExit(f"--init_from_qwen2: {path} is not a folder (a local Qwen2 checkpoint folder with config.json "
                         "is required; download it first, e.g. `huggingface-cli download Qwen/Qwen2.5-0.5B "
                         "--local-dir PATH`).")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise SystemExit(f"--init_from_qwen2: {path} has no config.json (a Qwen2 checkpoint folder is required).")
    config = json.loads(config_file.read_text())
    if config.get("model_type") != "qwen2":
        raise SystemExit(f"--init_from_qwen2: {path} holds model_type {config.get('model_type')!r}; the retrofit "
                         "needs a Qwen2 checkpoint (model_type 'qwen2', e.g. Qwen2.5-0.5B).")
    layers = config.get("num_hidden_layers")
    if layers != sum(split):
        raise SystemExit(f"--init_from_qwen2: {path} has num_hidden_layers = {layers}; the split --prelude_layers "
                         f"{split[0]} --core_layers {split[1]} --coda_layers {split[2]} needs {sum(split)} (the preset "
                         "is Qwen2.5-0.5B's 24 = 8 + 8 + 8; give the three flags for another backbone).")
    return folder


def load_train_par():
    """examples/train_par.py as a module (registered under the name tests' `load_example` gives it)."""
    name = "example_train_par"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TRAIN_PAR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------------ shapes
# Published shapes (the models' config.json on the Hub): hidden, MLP, layers, heads / KV heads, vocabulary, tied.
QWEN25 = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152_064, tie_word_embeddings=False),
}
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


# ----------------------------------------------------------------------------------------------- FLOP counting
def _register_cpu_flash_attention() -> None:
    """torch's FLOP counter knows the CUDA sdpa kernels; on a CPU sdpa runs `_scaled_dot_product_flash_attention_for
    _cpu`, which it would count as 0. The same formula as the others: 4·b·h·s_q·s_k·d forward (QKᵀ and AV, the full
    square whatever the causal mask, as torch counts every sdpa kernel), twice that backward (dQ, dK, dV, dP)."""
    import torch
    from torch.utils import flop_counter

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is None or forward in flop_counter.flop_registry or forward.default in flop_counter.flop_registry:
        return  # not in this torch, or registered already (by torch or an earlier call)

    def fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        b, h, s_q, d = query_shape
        return 4 * b * h * s_q * key_shape[2] * d

    def bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        b, h, s_q, d = query_shape
        return 8 * b * h * s_q * key_shape[2] * d

    flop_counter.register_flop_formula(forward)(fwd)
    if backward is not None:
        flop_counter.register_flop_formula(backward)(bwd)


def layer_flops(shape: dict, tokens: int, batch: int = 1) -> dict:
    """FLOPs of one Qwen2 decoder layer's forward over `tokens` tokens: the matmuls (q, k, v, o, gate, up, down) and
    the attention products (full square, as counted)."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    head = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * head
    linear = 2 * batch * tokens * (h * h + 2 * h * kv + h * h + 3 * h * i)
    attention = 4 * batch * shape["num_attention_heads"] * tokens * tokens * head
    return {"linear": linear, "attention": attention, "total": linear + attention}


def analytic_flops(shape: dict, split: tuple[int, int, int], tokens: int, iterations: int, reads: int = 1,
                   window: int = 8, train: bool = False, checkpoint_core: bool = False, queries: int = 5,
                   candidates: int = 5, halt: bool = True, batch: int = 1) -> dict:
    """The matmul FLOPs `FlopCounterMode` counts for one batch: prelude once, the adapter's e-half once, R core
    iterations (8 layers + the adapter's s-half each), `reads` coda readouts (8 layers + the candidate rows of the LM
    head), and for training the backward: twice the forward of everything with gradient (prelude, the iterations in
    the window, every readout; the adapter's s-half at the window's first iteration takes no input gradient when its
    input came from a no-grad iteration), plus the window's forward again under `checkpoint_core`."""
    P, C, Q = split
    h = shape["hidden_size"]
    layer = layer_flops(shape, tokens, batch)["total"]
    adapter = 2 * batch * tokens * h * h  # one half of W [e ; s]
    head = 2 * batch * h * (queries * candidates + (2 if halt else 0))
    prelude, core, coda = P * layer, C * layer + adapter, Q * layer + head
    forward = prelude + adapter + iterations * core + reads * coda
    out = {"forward": forward, "prelude": prelude, "core_iteration": core, "coda_readout": coda}
    if train:
        in_window = min(window, iterations)
        backward = 2 * (prelude + adapter + in_window * core + reads * coda)
        if iterations > window:
            backward -= adapter  # no dX for W_s s at the window's first iteration: that s came without gradient
        recompute = in_window * core if checkpoint_core else 0
        out.update(backward=backward, recompute=recompute)
    out["total"] = forward + out.get("backward", 0) + out.get("recompute", 0)
    return out


def part_flops(counts: dict, split: tuple[int, int, int]) -> dict:
    """FlopCounterMode's per-module counts summed into prelude, core (all iterations), coda (all readouts)."""
    P, C, Q = split
    parts = {"prelude": 0, "core": 0, "coda": 0}
    for name, ops in counts.items():
        tail = name.rsplit(".layers.", 1)
        if len(tail) != 2 or not tail[1].isdigit():
            continue
        index = int(tail[1])
        part = "prelude" if index < P else "core" if index < P + C else "coda"
        parts[part] += sum(ops.values())
    return parts


# ------------------------------------------------------------------------------------------------ measurements
def peak_rss() -> int:
    """Peak resident memory of this process (VmHWM), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return -1


def current_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return -1


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: `5` to /proc/self/clear_refs); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return -1


class SavedTensorBytes:
    """Bytes autograd holds for backward at the end of the context (activations): the storages of the tensors saved
    inside it that are still alive when it closes (a graph branch freed during the forward, e.g. an unused output's,
    releases its saves), each storage counted once, parameters (and views of them) left out. Deterministic for a
    given graph, unlike RSS."""

    def __init__(self, model):
        import torch

        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.saved: list[tuple] = []
        self.total = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)

    def _pack(self, tensor):
        try:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in self.params:
                self.saved.append((weakref.ref(tensor), storage.data_ptr(), storage.nbytes()))
        except (RuntimeError, NotImplementedError, TypeError):  # e.g. sparse or wrapper tensors: not counted
            pass
        return tensor

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        alive = {ptr: nbytes for ref, ptr, nbytes in self.saved if ref() is not None}
        self.total = sum(alive.values())
        self.saved = []
        return self._hooks.__exit__(*exc)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def optimizer_state_bytes(optimizer) -> int:
    import torch

    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))


def parameter_counts(model, split) -> dict:
    P, C, _ = split
    counts = {"total": 0, "embedding": 0, "prelude": 0, "core": 0, "coda": 0, "adapter": 0, "other": 0}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        counts["total"] += p.numel()
        if "embed_tokens" in name or "lm_head" in name:
            counts["embedding"] += p.numel()
        elif "adapter" in name:
            counts["adapter"] += p.numel()
        elif ".layers." in name:
            index = int(name.split(".layers.")[1].split(".")[0])
            counts["prelude" if index < P else "core" if index < P + C else "coda"] += p.numel()
        else:
            counts["other"] += p.numel()
    return counts


def case_args(case: dict) -> tuple:
    """train_par's parsed arguments of a dry-run case: the preset's command on the dry-run folder, with the case's
    overrides (batch 1, the case's depth and window, fp32, a scratch output folder)."""
    train_par = load_train_par()
    P, C, Q = case["split"]
    overrides = ["--output_dir", case["scratch"], "--per_device_train_batch_size", "1",
                 "--gradient_accumulation_steps", "1", "--max_steps", str(case.get("steps", 1)),
                 "--min_train_depth", str(case["depth"]), "--max_train_depth", str(case["depth"]),
                 "--curriculum_start_depth", str(case["depth"]), "--grad_window", str(case.get("window", 8)),
                 "--checkpoint_core", str(case.get("checkpoint_core", False)).lower(),
                 "--bf16", str(case.get("bf16", False)).lower(), "--use_cpu", "true", "--save_strategy", "no",
                 "--logging_steps", "1000000", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
                 "--prelude_layers", str(P), "--core_layers", str(C), "--coda_layers", str(Q),
                 "--max_iterations", str(max(1100, case["depth"] + 16))]
    argv = train_argv(case["folder"], seed=0, extra=overrides)
    return train_par, argv, train_par.parse_all_args(argv)


def build_case_model(case: dict):
    """The tokenizer, task, dataset (one depth-d problem per step) and retrofitted model of a case, built as
    train_par.main builds them."""
    import torch

    from state_tracking import build_dataset, model_token_ids

    train_par, argv, (model_args, task_args, _, train_args, _) = case_args(case)
    torch.set_num_threads(case["threads"])
    task = train_par.build_task(task_args)
    tokenizer = train_par.build_tokenizer_for(task, task_args, model_args)
    token_ids = model_token_ids(tokenizer, task)
    dataset = build_dataset(task, tokenizer, task_args.rendering, n=max(1, case.get("steps", 1)),
                            depths=(case["depth"], case["depth"]), seed=case.get("seed", 0))
    from transformers import set_seed

    set_seed(0)
    model = train_par.build_model(model_args, token_ids, train_args)
    train_par.use_tokenizer_special_tokens(model.config, tokenizer)
    return train_par, argv, model_args, task_args, train_args, task, tokenizer, token_ids, dataset, model


def run_train_case(case: dict) -> dict:
    """Optimizer steps at depth d (R = d, the forced depth: the hold schedule's tail X = 0) through ParTrainer.

    The first step is counted (FlopCounterMode, through its backward); the others are timed and their memory
    measured without the counter: its module tracker keeps tensors of checkpoint_core's recomputation alive until it
    exits (pytorch PR 139214), which would add them to the memory, and its dispatch costs time."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import TrainerCallback

    from state_tracking import StateTrackingCollator
    from trainers import ParTrainer

    _register_cpu_flash_attention()
    started = time.time()
    (train_par, argv, model_args, task_args, train_args, task, tokenizer, token_ids, dataset,
     model) = build_case_model(case)
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
    steps: list[dict] = []
    counter = FlopCounterMode(display=False)
    counted: dict = {}  # the counted step's per-module FLOPs

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
                counted.update(part_flops(counter.get_flop_counts(), case["split"]))
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

    collator = StateTrackingCollator(pad_token_id=token_ids["pad_token_id"])
    trainer = DryRunTrainer(model=model, args=train_args, train_dataset=dataset, data_collator=collator,
                            processing_class=tokenizer, callbacks=[Measure()])
    trainer.train()
    optimizer = trainer.optimizer
    groups = [{"lr": g.get("initial_lr", g["lr"]), "weight_decay": g["weight_decay"],
               "parameters": sum(p.numel() for p in g["params"])} for g in optimizer.param_groups]
    for step in steps:
        step["analytic_flops"] = analytic_flops(model.config.to_dict(), case["split"], step["tokens"], step["R"],
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


def run_eval_case(case: dict) -> dict:
    """Forced-depth forwards (`model.predict`, no grad) of one depth-d prompt at each R of `case["iterations"]`: time
    per stage (prelude, each core iteration, readout) from forward hooks, FLOPs per stage from FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    from state_tracking import StateTrackingCollator

    _register_cpu_flash_attention()
    started = time.time()
    (train_par, argv, model_args, task_args, train_args, task, tokenizer, token_ids, dataset,
     model) = build_case_model(dict(case, steps=1))
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
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_case", json.dumps(case)], cwd=REPO,
                          env=env, stdout=subprocess.PIPE, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CASE_RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"status": "failed", "returncode": proc.returncode,
                "reason": f"the case's process exited with code {proc.returncode} (its stderr is above)"}
    return json.loads(lines[-1][len("CASE_RESULT "):])


# --------------------------------------------------------------------------------------------------- the dry run
def grad_layer_passes(split, depth: int, window: int) -> int:
    """Decoder-layer passes that keep activations for backward in one training batch: the prelude, the window's core
    iterations, and every readout's coda (the window's plus, past the window, the extra halting negative)."""
    P, C, Q = split
    reads = min(window, depth) + (1 if depth > window else 0)
    return P + min(window, depth) * C + reads * Q


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


def dry_run(args, argv: list[str]) -> dict:
    from state_tracking import get_task

    shape, split = SHAPES[args.shape]["config"], tuple(SHAPES[args.shape]["split"])
    work = Path(args.work_dir)
    folder = work / f"qwen2-{args.shape}-random"
    started = time.time()
    machine = machine_info(args.threads)
    if not (folder / "config.json").is_file():
        made = run_isolated(dict(kind="make_parent", folder=str(folder), shape=args.shape, threads=args.threads),
                            args.inline)
        if made.get("status") == "failed":
            raise SystemExit(f"--dry_run: building the random Qwen2 folder failed: {made['reason']}")
    from transformers import AutoTokenizer

    task = get_task("swap_s5")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lengths = sorted({*args.depths, *args.eval_depths, 8, 16, 32, 64, 128, 256, 512})
    tokens = prompt_tokens(tokenizer, task, lengths)
    results = []
    for case in plan_cases(args, folder, split):
        case = dict(case, scratch=str(work / "scratch"))
        name = case_name(case)
        print(f"[dry run] {name} ...", file=sys.stderr, flush=True)
        entry = {"name": name, "case": {k: v for k, v in case.items() if k not in ("folder", "scratch")}}
        prediction = predicted_train_peak(case, results, split) if case["kind"] == "train" else None
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
            measured = run_isolated(case, args.inline)
            entry.update(measured)
            entry.setdefault("status", "measured")
            entry["wall_seconds"] = round(time.time() - t0, 1)
        results.append(entry)
        print(f"[dry run] {name}: {entry['status']} "
              f"({entry.get('wall_seconds', 0)} s, peak {entry.get('peak_rss_bytes', 0) / 1e9:.2f} GB)",
              file=sys.stderr, flush=True)
    record = {
        "what": "shape-exact dry run of the paper's retrofit (examples/reproduce/paper_retrofit.py --dry_run): random "
                "weights, fp32 on CPU, batch 1 per measured step",
        "command": "python " + shlex.join(["examples/reproduce/paper_retrofit.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "shape": {"name": args.shape, **shape, **{k: v for k, v in COMMON_QWEN2.items() if k != "bos_token_id"},
                  "split": list(split), "saved_dtype": "bfloat16"},
        "tokenizer": "Qwen2Tokenizer (Qwen's class: its regex pre-tokenizer and byte-level BPE) with a small vocabulary "
                     "trained on the task's text until every word piece (' Box', ' ', '3', ' contents', '.') is one "
                     "token, as in Qwen2.5's vocabulary for these common words and single digits: prompt lengths "
                     "approximate Qwen2.5's",
        "preset_command": print_command(train_argv("<Qwen2.5-0.5B folder>")),
        "prompt_tokens": tokens,
        "cases": results,
        "extrapolated": extrapolate(results, split, shape, tokens),
        "notes": {
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
        },
        "total_wall_seconds": round(time.time() - started, 1),
    }
    return record


def extrapolate(results: list[dict], split, shape: dict, tokens: dict) -> dict:
    """Evaluation at R = d from the measured R (per-iteration slope), and per-sample training FLOPs with the hold tail
    (R = d + X, X ~ U{0..7}: 3.5 more no-grad iterations on average)."""
    out = {"evaluation": {}, "training": {}}
    for entry in results:
        if entry.get("status") != "measured":
            continue
        case = entry["case"]
        if case["kind"] == "eval" and len(entry["runs"]) >= 2:
            a, b = entry["runs"][0], entry["runs"][-1]
            span = b["R"] - a["R"]
            flops_per_iteration = (b["flops"] - a["flops"]) / span
            fixed_flops = a["flops"] - a["R"] * flops_per_iteration
            slope_seconds = (b["seconds"] - a["seconds"]) / span
            d, tokens = case["depth"], entry["tokens"][0]
            layer_flops_each = [f for run in entry["runs"] for f in run["iteration_layer_flops"]]
            layer_seconds_each = [t for run in entry["runs"] for t in run["iteration_seconds"]]
            adapter = 2 * tokens * shape["hidden_size"] ** 2  # the adapter's s-half, W_s s, outside the core layers
            # seconds: each iteration's core layers timed on their own by hooks (the difference of two totals is
            # noisier on a shared machine), scaled by the iteration's FLOPs over its layers' (the adapter's share);
            # the fixed part (prelude, readout) measured likewise; the totals' slope is kept as a check
            seconds_per_iteration = (sum(layer_seconds_each) / len(layer_seconds_each)
                                     * flops_per_iteration / layer_flops_each[0])
            fixed_seconds = sum(run["prelude_seconds"] + run["readout_seconds"] for run in entry["runs"]) / len(
                entry["runs"])
            out["evaluation"][str(d)] = {
                "tokens": tokens, "measured_R": [r["R"] for r in entry["runs"]],
                "flops_per_iteration": flops_per_iteration, "flops_fixed": fixed_flops,
                "seconds_per_iteration": round(seconds_per_iteration, 3), "seconds_fixed": round(fixed_seconds, 3),
                "seconds_per_iteration_from_totals": round(slope_seconds, 3),
                "forced_R_equals_d": {"flops": fixed_flops + d * flops_per_iteration,
                                      "seconds": round(fixed_seconds + d * seconds_per_iteration, 1)},
                "linearity": {
                    "iteration_layer_flops_each": layer_flops_each,
                    "every_iteration_same_flops": len(set(layer_flops_each)) == 1,
                    "slope_minus_layer_flops": flops_per_iteration - layer_flops_each[0],
                    "adapter_s_half_flops": adapter,
                    "slope_is_one_iteration": flops_per_iteration - layer_flops_each[0] == adapter,
                    "iteration_seconds_each": layer_seconds_each,
                    "iteration_seconds_spread": round((max(layer_seconds_each) - min(layer_seconds_each))
                                                      / (sum(layer_seconds_each) / len(layer_seconds_each)), 3),
                    "analytic_core_iteration": analytic_flops(shape, split, tokens, 1)["core_iteration"],
                },
                "status": "extrapolated",
            }
        if case["kind"] == "train" and case.get("bf16"):
            fp32 = next((e for e in results if e.get("status") == "measured" and e["case"]["kind"] == "train"
                         and e["case"]["depth"] == case["depth"] and e["case"]["window"] == case["window"]
                         and not e["case"].get("bf16") and not e["case"].get("checkpoint_core")), None)
            if fp32 is not None:
                out["bf16_autocast"] = {
                    "depth": case["depth"], "saved_activation_bytes": entry["steps"][-1]["saved_activation_bytes"],
                    "fp32_saved_activation_bytes": fp32["steps"][-1]["saved_activation_bytes"],
                    "activation_ratio": entry["steps"][-1]["saved_activation_bytes"]
                    / fp32["steps"][-1]["saved_activation_bytes"],
                    "status": "measured (CPU autocast; CUDA autocast's cast lists differ in detail: an estimate "
                              "for the GPU)"}
            continue
        if case["kind"] == "train" and case.get("window") == 8 and not case.get("checkpoint_core"):
            d = case["depth"]
            first, last = entry["steps"][0], entry["steps"][-1]
            iteration = analytic_flops(shape, split, first["tokens"], 1)["core_iteration"]
            out["training"][str(d)] = {
                "tokens": first["tokens"], "flops_forced": first["flops"],
                "flops_with_mean_tail": first["flops"] + 3.5 * iteration, "tail_iteration_flops": iteration,
                "timed_step": {"tokens": last["tokens"], "seconds": round(last["seconds"], 2),
                               "flops_analytic": last["analytic_flops"]["total"]},
                "status": "counted (forced R = d, first step) + analytic tail; seconds of the last step",
            }
    return out


# ------------------------------------------------------------------------------------------ the GPU-scale arithmetic
H200_BF16_DENSE = 989e12  # FLOP/s: H100 / H200 SXM dense bf16 tensor-core peak (no sparsity)
MFU_RANGE = (0.25, 0.40)  # docs/paper_scale.md says why
H200_MEMORY = 141e9  # bytes (HBM3e)
EVAL_LENGTHS, EVAL_N, SEEDS, HALT_WINDOW, TAIL = [32, 64, 128, 256, 512], 1024, 6, 8, 7
# 28-layer backbones: thirds as the paper's 8 / 8 / 8 of 24 (the paper runs swap-S5 on 0.5B only)
SPLITS = {"0.5b": (8, 8, 8), "1.5b": (9, 10, 9), "7b": (9, 10, 9)}
# how each backbone is spread: one GPU holds 0.5B and 1.5B (DDP over several for speed); 7B's weights, gradients and
# Adam states (16 bytes per parameter, 122 GB) need FSDP, sharded over 8 GPUs, with the bf16 weights kept gathered
# during the step (accelerate_fsdp.yaml: fsdp_reshard_after_forward false, +2 bytes per parameter)
PLACEMENT = {"0.5b": ("one GPU or DDP", 1), "1.5b": ("one GPU or DDP", 1), "7b": ("FSDP over 8 GPUs", 8)}
USABLE = 0.85  # of the H200's 141 GB, for the allocator, CUDA context and the no-grad iterations' transients


def parameter_count(shape: dict) -> int:
    """Qwen2's parameters from its shape (q/k/v biases, RMSNorm weights, embeddings once if tied) + the adapter."""
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    layer = h * h + 2 * h * kv + h * h + (h + 2 * kv) + 3 * h * i + 2 * h
    embeddings = v * h * (1 if shape["tie_word_embeddings"] else 2)
    return shape["num_hidden_layers"] * layer + embeddings + h + 2 * h * h


def saved_bytes_per_token_pass(shape: dict) -> int:
    """fp32 bytes autograd keeps per token per decoder-layer pass (transformers' Qwen2 layer, sdpa): the two RMSNorms'
    input and normalized output (4h), q and k before and after rotary (2h + 2kv), v (kv) — k, v also as the
    attention's inputs (kv) —, the attention output and its contiguous copy for o_proj (2h), the MLP's gate, up,
    SiLU(gate) and product (4i): 9h + 4kv + 4i floats, less the shared ones. Checked against the dry run's
    measurement at the 0.5B shape (`estimates`' 'activation_model_check')."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    return 4 * (9 * h + 4 * kv + 4 * i)


def tokens_of_depth(prompt_tokens: dict):
    """Least-squares line through the mean prompt tokens per depth: T(d) = a + b·d."""
    import numpy as np

    d = np.array([int(k) for k in prompt_tokens], dtype=float)
    t = np.array([v["mean"] for v in prompt_tokens.values()])
    b, a = np.polyfit(d, t, 1)
    return float(a), float(b)


def train_reads(depth: int, iterations: int, window: int = 8) -> int:
    """Readouts of a training batch: the window, plus the extra halting negative when the window starts past 1."""
    return min(window, iterations) + (1 if iterations > window and depth > 1 else 0)


def scale_estimates(record: dict) -> dict:
    """The real run's arithmetic from the dry run: training FLOPs of 400k samples (d ~ U{1..32}, the hold tail
    X ~ U{0..7}), evaluation FLOPs (6 seeds × 1,024 × lengths, forced and halting), H200 hours at MFU_RANGE, GPU memory
    at the per-device batch in bf16 autocast over fp32 master weights, for 0.5B, 1.5B and 7B. FLOPs per sample come
    from `analytic_flops`, which equals the counted FLOPs of every measured case (their ratio is listed)."""
    a, b = tokens_of_depth(record["prompt_tokens"])

    def tokens(d: int) -> float:
        return a + b * d

    measured = {e["name"]: e for e in record["cases"] if e.get("status") == "measured"}
    ratios = {name: e["steps"][0]["flops"] / e["steps"][0]["analytic_flops"]["total"]
              for name, e in measured.items() if e["case"]["kind"] == "train"}
    bf16 = record["extrapolated"].get("bf16_autocast", {}).get("activation_ratio")
    check = {}
    ref = measured.get("train d=32 window=8")
    if ref is not None:
        step = ref["steps"][-1]
        passes = grad_layer_passes(tuple(record["shape"]["split"]), 32, 8)
        per_token_pass = step["saved_activation_bytes"] / (passes * step["tokens"])
        check = {"measured_bytes_per_token_pass": round(per_token_pass),
                 "model_bytes_per_token_pass": saved_bytes_per_token_pass(record["shape"]),
                 "ratio": round(per_token_pass / saved_bytes_per_token_pass(record["shape"]), 3)}
    out = {"tokens_of_depth": {"a": round(a, 2), "b": round(b, 3)}, "counted_over_analytic": ratios,
           "bf16_activation_ratio": bf16, "activation_model_check": check, "peak_flops": H200_BF16_DENSE,
           "mfu_range": list(MFU_RANGE), "backbones": {}}
    for name, shape in QWEN25.items():
        split = SPLITS[name]
        per_d = {}
        for d in range(1, 33):
            per_d[d] = sum(analytic_flops(shape, split, round(tokens(d)), d + x, reads=train_reads(d, d + x),
                                          train=True)["total"] for x in range(TAIL + 1)) / (TAIL + 1)
        train_per_sample = sum(per_d.values()) / len(per_d)
        train_total = SAMPLES * train_per_sample
        forced = {L: analytic_flops(shape, split, round(tokens(L)), L)["total"] for L in EVAL_LENGTHS}
        halting = {L: analytic_flops(shape, split, round(tokens(L)), L + HALT_WINDOW - 1,
                                     reads=L + HALT_WINDOW - 1)["total"] for L in EVAL_LENGTHS}
        eval_forced = SEEDS * EVAL_N * sum(forced.values())
        eval_halting = SEEDS * EVAL_N * sum(halting.values())
        params = parameter_count(shape)
        states = 16 * params  # fp32 weights 4 + gradients 4 + AdamW moments 8 bytes per parameter
        # activations per sample at d = 32 (the tail X keeps the window, so the same bytes): layer passes kept for
        # backward × tokens × bytes per token-pass, in bf16 autocast by the measured ratio
        per_sample = (saved_bytes_per_token_pass(shape) * grad_layer_passes(split, 32, 8) * round(tokens(32))
                      * (bf16 or 1.0))
        setting, gpus = PLACEMENT[name]
        states_per_gpu = states / gpus + (2 * params if gpus > 1 else 0)
        fits = int((USABLE * H200_MEMORY - states_per_gpu) // per_sample)
        batch = max(n for n in (1, 2, 4, 8, 16, 32, 64) if n <= max(fits, 1))  # a power of two dividing 64
        activations = batch * per_sample
        hours = {f"{int(m * 100)}%": {
            "train_one_seed": train_total / (m * H200_BF16_DENSE) / 3600,
            "train_six_seeds": SEEDS * train_total / (m * H200_BF16_DENSE) / 3600,
            "eval_forced_six_seeds": eval_forced / (m * H200_BF16_DENSE) / 3600,
            "eval_halting_six_seeds": eval_halting / (m * H200_BF16_DENSE) / 3600,
        } for m in MFU_RANGE}
        for row in hours.values():
            row["all"] = row["train_six_seeds"] + row["eval_forced_six_seeds"] + row["eval_halting_six_seeds"]
        out["backbones"][name] = {
            "shape": shape, "split": list(split), "parameters": params,
            "train_flops_per_sample_by_depth": {str(d): per_d[d] for d in (1, 8, 16, 32)},
            "train_flops_per_sample_mean": train_per_sample, "train_flops_400k": train_total,
            "eval_flops_per_sequence_forced": {str(k): v for k, v in forced.items()},
            "eval_flops_per_sequence_halting": {str(k): v for k, v in halting.items()},
            "eval_flops_forced_six_seeds": eval_forced, "eval_flops_halting_six_seeds": eval_halting,
            "h200_hours": hours,
            "memory": {"setting": setting, "gpus": gpus, "weights_grads_adam_bytes": states,
                       "states_per_gpu_bytes": states_per_gpu, "activation_bytes_per_sample_d32": per_sample,
                       "per_device_batch": batch, "gradient_accumulation_steps": BATCH // (batch * gpus),
                       "activations_bytes": activations, "per_gpu_bytes": states_per_gpu + activations,
                       "fits": states_per_gpu + activations <= USABLE * H200_MEMORY},
        }
    return out


# --------------------------------------------------------------------------------------------- outputs (json, plot)
def gb(x) -> str:
    return "—" if x is None else f"{x / 1e9:.2f}"


def write_outputs(record: dict, out: Path) -> None:
    """dry_run.json (with the extrapolations and the GPU-scale estimates recomputed from its cases), the plot, the
    README."""
    shape = {k: record["shape"][k] for k in QWEN25["0.5b"]}
    record["extrapolated"] = extrapolate(record["cases"], tuple(record["shape"]["split"]), shape,
                                         record["prompt_tokens"])
    record["estimates"] = scale_estimates(record)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dry_run.json").write_text(json.dumps(record, indent=2) + "\n")
    plot_memory(record, out / "peak_memory.png")
    (out / "README.md").write_text(readme(record))


def plot_memory(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[str, list] = {}
    optimizer_peaks: list[int] = []
    for entry in record["cases"]:
        case = entry["case"]
        if case["kind"] != "train":
            continue
        label = (f"window {case['window']}" + (" + checkpoint_core" if case.get("checkpoint_core") else "")
                 + (" (bf16 autocast)" if case.get("bf16") else ""))
        if entry.get("status") == "measured":
            step = entry["steps"][-1]
            series.setdefault(label, []).append((case["depth"], step["peak_rss_forward_backward_bytes"],
                                                 step["saved_activation_bytes"], False))
            optimizer_peaks.append(step["peak_rss_optimizer_bytes"])
        elif "predicted" in entry:
            series.setdefault(label, []).append((case["depth"], entry["predicted"]["peak_rss_forward_backward_bytes"],
                                                 entry["predicted"]["saved_activation_bytes"], True))
    for label, rows in sorted(series.items()):
        rows.sort()
        for ax, index in ((axes[0], 1), (axes[1], 2)):
            xs = [r[0] for r in rows]
            ys = [r[index] / 1e9 for r in rows]
            line = ax.plot(xs, ys, marker="o", label=label)[0]
            for x, y, r in zip(xs, ys, rows):
                if r[3]:
                    ax.plot([x], [y], marker="o", markerfacecolor="white", color=line.get_color(), markersize=9)
    if optimizer_peaks:
        axes[0].axhline(max(optimizer_peaks) / 1e9, color="gray", linestyle="--", linewidth=1,
                        label="AdamW step's peak (any d)")
    shape = record["shape"]["name"]
    axes[0].set_title(f"peak RSS, forward + backward, steady step ({shape}, fp32, batch 1)", fontsize=9)
    axes[1].set_title("bytes autograd saves for backward (activations)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("depth d (R = d iterations)")
        ax.set_ylabel("GB")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="open marker: predicted, not run", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def readme(record: dict) -> str:
    m = record["machine"]
    lines = [
        "# The paper's retrofit at Qwen2.5-0.5B's shape: a dry run on CPU",
        "",
        "Random weights in Qwen2.5-0.5B's published shape (hidden 896, MLP 4,864, 24 layers, 14 heads / 2 KV heads, "
        "vocabulary 151,936, tied embeddings), saved as a Qwen2 folder and retrofitted 8 / 8 / 8 through "
        "`examples/train_par.py`'s own path, then measured step by step in fp32 on CPU, batch 1, each case in a "
        "fresh process. What the figures mean for the real run (GPU hours, memory, 1.5B / 7B, DDP / FSDP): "
        "[docs/paper_scale.md](../../docs/paper_scale.md).",
        "",
        f"Command: `{record['command']}`  ",
        f"Machine: {m['cpu']}, {m['cpu_count']} cores (shared with other jobs: load average "
        f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'])} at the start), {m['memory_bytes'] / 2**30:.0f} "
        f"GiB memory, torch {m['torch']} with {m['torch_threads']} thread(s), transformers {m['transformers']}; "
        f"{record['date']}; {record['total_wall_seconds'] / 60:.1f} min in all.",
        "",
        "Prompt tokens (Qwen2-style pieces, 64 prompts per depth): " + ", ".join(
            f"d = {d}: {v['mean']:.0f}" for d, v in record["prompt_tokens"].items()) + ".",
        "",
        "## Training steps (R = d, the window's readouts + one extra halting negative, AdamW with the preset's groups)",
        "",
        "Per case two steps on two depth-d problems. FLOPs: the first step, counted by FlopCounterMode through its "
        "backward, beside the analytic count for its tokens. Time, memory and bytes: the second step, without the "
        "counter (AdamW's states exist during it). Peak RSS: VmHWM of the forward + backward, and of the optimizer step (AdamW's temporaries), "
        "each reset at the phase's start, with glibc serving tensors by mmap (`MALLOC_MMAP_THRESHOLD_=262144`) so that "
        "freed memory leaves the process and the mark follows live memory.",
        "",
        "| case | tokens (step 1 / 2) | s / step | peak RSS GB fwd+bwd / optimizer | params GB | grads GB | Adam state GB "
        "| saved activations GB | FLOPs / sample (counted) | analytic | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in record["cases"]:
        case = entry["case"]
        if case["kind"] != "train":
            continue
        if entry.get("status") != "measured":
            p = entry.get("predicted", {})
            lines.append(f"| {entry['name']} | | | {gb(p.get('peak_rss_forward_backward_bytes'))} (predicted) | | | | "
                         f"{gb(p.get('saved_activation_bytes'))} (predicted) | | | {entry['status']}: "
                         f"{entry.get('reason', '')} |")
            continue
        step, first = entry["steps"][-1], entry["steps"][0]
        lines.append(
            f"| {entry['name']} | {' / '.join(str(s['tokens']) for s in entry['steps'])} | "
            f"{', '.join(f'{s:.1f}' for s in entry['seconds_per_step'])} "
            f"| {gb(step['peak_rss_forward_backward_bytes'])} / {gb(step['peak_rss_optimizer_bytes'])} | "
            f"{gb(entry['param_bytes'])} | {gb(step.get('grad_bytes'))} | "
            f"{gb(step.get('optimizer_state_bytes'))} | {gb(step['saved_activation_bytes'])} | "
            f"{first['flops'] / 1e12:.3f} T | {first['analytic_flops']['total'] / 1e12:.3f} T | measured |")
    lines += ["", "## Forced-depth evaluation forwards (no grad), extrapolated to R = d", "",
              "| d | tokens | R | seconds | FLOPs (counted) | analytic | seconds per iteration (hooks) |",
              "|---|---|---|---|---|---|---|"]
    for entry in record["cases"]:
        if entry["case"]["kind"] != "eval":
            continue
        if entry.get("status") != "measured":
            lines.append(f"| {entry['case']['depth']} | | | | | | {entry['status']}: {entry.get('reason', '')} |")
            continue
        for run in entry["runs"]:
            lines.append(f"| {entry['case']['depth']} | {entry['tokens'][0]} | {run['R']} | {run['seconds']:.1f} | "
                         f"{run['flops'] / 1e12:.3f} T | {entry['analytic_flops'][str(run['R'])]['total'] / 1e12:.3f} T "
                         f"| {', '.join(f'{t:.1f}' for t in run['iteration_seconds'])} |")
    for d, e in record["extrapolated"]["evaluation"].items():
        lines.append(f"| {d} | {e['tokens']} | **{d}** (extrapolated) | {e['forced_R_equals_d']['seconds']:.0f} | "
                     f"{e['forced_R_equals_d']['flops'] / 1e12:.1f} T | | {e['seconds_per_iteration']:.1f} per "
                     "iteration (slope) |")
    est = record.get("estimates")
    if est:
        lines += ["", "## What this means on an H200 (the arithmetic: docs/paper_scale.md)", "",
                  f"FLOPs per sample from the analytic count (equal to the counted FLOPs of every measured step: ratios "
                  f"{sorted({round(r, 4) for r in est['counted_over_analytic'].values()})}), prompt tokens T(d) = "
                  f"{est['tokens_of_depth']['a']:.0f} + {est['tokens_of_depth']['b']:.2f}·d; hours at "
                  f"{' / '.join(f'{int(m * 100)}%' for m in est['mfu_range'])} of {est['peak_flops'] / 1e12:.0f} "
                  "TFLOP/s (dense bf16); memory in bf16 autocast over fp32 master weights at the per-device batch.", "",
                  "| backbone | split | parameters | training FLOPs (400k samples) | evaluation FLOPs (6 seeds, forced "
                  "+ halting) | H200-hours, 6 seeds, train + eval | memory |",
                  "|---|---|---|---|---|---|---|"]
        for name, b in est["backbones"].items():
            hours = " / ".join(f"{row['all']:.0f}" for row in b["h200_hours"].values())
            mem = b["memory"]
            lines.append(
                f"| Qwen2.5-{name.upper()} | {'/'.join(map(str, b['split']))} | {b['parameters'] / 1e9:.2f} B | "
                f"{b['train_flops_400k']:.2e} | {b['eval_flops_forced_six_seeds'] + b['eval_flops_halting_six_seeds']:.2e}"
                f" | {hours} | {mem['per_gpu_bytes'] / 1e9:.0f} GB per GPU at {mem['per_device_batch']} sequences "
                f"({mem['setting']}) |")
    lines += ["", "![peak memory against depth](peak_memory.png)", "",
              "Reading: the gradient window bounds what is kept for backward — the iterations before the window run "
              "without grad, so the saved activations grow with the window and the prompt's length, not with R; "
              "`--checkpoint_core` keeps only each windowed iteration's input (the prelude and the nine coda readouts "
              "still keep theirs). The forward + backward peak is weights, AdamW states, the activations and the "
              "gradients as they fill; the optimizer step has its own peak (weights, gradients, states and AdamW's "
              "foreach temporaries), which no window changes. The saved-activation bytes are the deterministic "
              "figure. FLOPs grow linearly in R (and the prompt's attention quadratically in its length). Full "
              "figures: dry_run.json.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------- CLI
def parse_ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{name} must be comma-separated integers >= 1; got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{name} must be comma-separated integers >= 1; got {text!r}")
    return values


RUN_FLAGS = ("--init_from_qwen2", "--seed", "--print_command")  # what the wrapper owns in a run; the rest is train_par's
RUN_BOOLEAN_FLAGS = ("--print_command",)  # bare, or with a value (true / false) as argparse's nargs="?" reads it


def build_parser(run: bool = False) -> argparse.ArgumentParser:
    """The wrapper's flags. `run=True`: only those a run owns (`RUN_FLAGS`; every other flag passes to train_par.py
    unchanged, so a run's --eval_depths or --bf16 is train_par's); otherwise the dry run's and --render's too."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init_from_qwen2", help="a local Qwen2 folder (Qwen2.5-0.5B); required for a run")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (output runs/paper_retrofit/s<seed>)")
    parser.add_argument("--print_command", type=true_or_false, nargs="?", const=True, default=False, help="print the train_par.py command, run nothing")
    if run:
        return parser
    parser.add_argument("--dry_run", type=true_or_false, nargs="?", const=True, default=False, help="the CPU dry run at the backbone's shape")
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES), help="dry run: the backbone's shape")
    parser.add_argument("--depths", default="8,16,32", help="dry run: training depths (window 8)")
    parser.add_argument("--windows", default="8,32", help="dry run: windows compared at the largest training depth")
    parser.add_argument("--eval_depths", default="256,512", help="dry run: evaluation depths")
    parser.add_argument("--eval_iterations", default="1,2", help="dry run: the R measured per evaluation depth")
    parser.add_argument("--bf16_depths", default="8", help="dry run: training depths also measured under bf16 "
                                                           "autocast (the GPU run's precision; '' for none)")
    parser.add_argument("--steps", type=int, default=2, help="dry run: optimizer steps per training case (from the "
                                                             "second on, AdamW's states are there during the step)")
    parser.add_argument("--threads", type=int, default=1, help="dry run: torch threads per case")
    parser.add_argument("--out", default=str(RESULTS), help="dry run: where dry_run.json, the plot and README go")
    parser.add_argument("--work_dir", default=str(WORK), help="dry run: the random Qwen2 folder and scratch")
    parser.add_argument("--render", type=true_or_false, nargs="?", const=True, default=False, help="rewrite --out's README, plot and estimates from its "
                                                               "dry_run.json (no measurement)")
    parser.add_argument("--inline", type=true_or_false, nargs="?", const=True, default=False, help=argparse.SUPPRESS)  # cases in this process (tests)
    parser.add_argument("--_case", help=argparse.SUPPRESS)
    return parser


def split_run_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the wrapper's own flags of a run, train_par.py's): a run owns only `RUN_FLAGS`; each flag is matched by its
    whole name (no abbreviations). A boolean flag (`RUN_BOOLEAN_FLAGS`) takes the next argument as its value unless
    that is a flag, as argparse does (``--print_command false``)."""
    own, rest, i = [], [], 0
    while i < len(argv):
        name, given_value = argv[i].partition("=")[0], "=" in argv[i]
        (own if name in RUN_FLAGS else rest).append(argv[i])
        following = argv[i + 1] if i + 1 < len(argv) else None
        if name in RUN_FLAGS and not given_value and following is not None and (
                name not in RUN_BOOLEAN_FLAGS or not following.startswith("-")):
            own.append(following)
            i += 1
        i += 1
    return own, rest


def resume_flags(command: list[str]) -> list[str]:
    """A run continues where it stopped: with a checkpoint in its --output_dir (transformers' get_last_checkpoint)
    and no --resume_from_checkpoint given, the command gains one (so save_total_limit rotates the continued run's
    checkpoints instead of a fresh run's deleting the earlier ones); a finished run (summary.json) is an error."""
    from transformers.trainer_utils import get_last_checkpoint

    flags = parse_flags(command)
    output_dir = Path(flags["--output_dir"])
    if (output_dir / "summary.json").is_file():
        raise SystemExit(f"{output_dir} holds a finished run (summary.json); give another --output_dir or --seed.")
    if "--resume_from_checkpoint" in flags or not output_dir.is_dir():
        return command
    last = get_last_checkpoint(str(output_dir))
    return command if last is None else [*command, "--resume_from_checkpoint", last]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if not any(a.partition("=")[0] in ("--dry_run", "--render", "--_case") for a in argv):
        return run(argv)
    args, extra = build_parser().parse_known_args(argv)  # abbreviations refused (allow_abbrev=False)
    if extra:
        raise SystemExit(f"--dry_run takes no train_par.py flags; got {extra}")
    if args._case:
        print("CASE_RESULT " + json.dumps(run_case(json.loads(args._case))), flush=True)
        return None
    if args.render:
        path = Path(args.out) / "dry_run.json"
        if not path.is_file():
            raise SystemExit(f"--render: {path} does not exist (run --dry_run first)")
        record = json.loads(path.read_text())
        write_outputs(record, Path(args.out))
        return record
    if args.dry_run:
        if args.steps < 1 or args.threads < 1:
            raise SystemExit("--steps and --threads must be integers >= 1")
        args.depths = parse_ints(args.depths, "--depths")
        args.windows = parse_ints(args.windows, "--windows")
        args.eval_depths = parse_ints(args.eval_depths, "--eval_depths") if args.eval_depths else []
        args.eval_iterations = parse_ints(args.eval_iterations, "--eval_iterations")
        args.bf16_depths = parse_ints(args.bf16_depths, "--bf16_depths") if args.bf16_depths else []
        if len(args.eval_iterations) < 2:
            raise SystemExit("--eval_iterations needs two or more R (the slope per iteration comes from them)")
        record = dry_run(args, argv)
        write_outputs(record, Path(args.out))
        print(f"wrote {Path(args.out) / 'dry_run.json'}", file=sys.stderr)
        return record
    raise SystemExit("give --dry_run or --render (or neither, for a run)")


def run(argv: list[str]):
    """The paper's run: the preset with every flag the wrapper does not own passed to train_par.py unchanged,
    resumed from the newest checkpoint of its output folder."""
    own, extra = split_run_argv(argv)
    args = build_parser(run=True).parse_args(own)
    flags = parse_flags(train_argv("x", args.seed, extra))
    split = tuple(int(flags[f"--{part}_layers"]) for part in ("prelude", "core", "coda"))
    folder = check_qwen2_folder(args.init_from_qwen2, split)
    command = train_argv(str(folder), args.seed, extra)
    if args.print_command:
        print(print_command(command))
        return command
    return load_train_par().main(resume_flags(command))


if __name__ == "__main__":
    main()
