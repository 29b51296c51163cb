"""The FLOP and memory model of the paper's retrofit (`examples/reproduce/paper_retrofit.py`), and the GPU-scale
arithmetic built on it: the analytic FLOPs of a batch (checked against torch's FlopCounterMode by the dry run), the
layer passes that keep activations for backward, the evaluation extrapolated to R = d from two measured R, and the
H200 hours and memory of the real run at Qwen2.5-0.5B, 1.5B and 7B (`scale_estimates`; docs/paper_scale.md)."""

from __future__ import annotations

from collections.abc import Callable

# The paper's training budget: "~400k samples in one epoch" at 64 samples per optimizer step (the preset,
# examples/reproduce/paper_retrofit.py, says how 64 was chosen): 400,000 / 64 = 6,250 steps.
BATCH, SAMPLES = 64, 400_000
PAPER_SPLIT = (8, 8, 8)  # Qwen2.5-0.5B's 24 layers: prelude 1-8, core 9-16, coda 17-24 (paper §3)

# Published shapes (the models' config.json on the Hub): hidden, MLP, layers, heads / KV heads, vocabulary, tied.
QWEN25 = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152_064, tie_word_embeddings=False),
}


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


def grad_layer_passes(split, depth: int, window: int) -> int:
    """Decoder-layer passes that keep activations for backward in one training batch: the prelude, the window's core
    iterations, and every readout's coda (the window's plus, past the window, the extra halting negative)."""
    P, C, Q = split
    reads = min(window, depth) + (1 if depth > window else 0)
    return P + min(window, depth) * C + reads * Q



def train_reads(depth: int, iterations: int, window: int = 8) -> int:
    """Readouts of a training batch: the window, plus the extra halting negative when the window starts past 1."""
    return min(window, iterations) + (1 if iterations > window and depth > 1 else 0)


def extrapolate(results: list[dict], split, shape: dict, tokens: dict) -> dict:
    """Evaluation at R = d from the measured R (per-iteration slope), and per-sample training FLOPs with the hold tail
    (R = d + X, X ~ U{0..7}: 3.5 more no-grad iterations on average)."""
    out = {"evaluation": {}, "training": {}}
    for entry in results:
        if entry.get("status") != "measured":
            continue
        case = entry["case"]
        if case["kind"] == "eval" and len(entry["runs"]) >= 2:
            out["evaluation"][str(case["depth"])] = evaluation_at_depth(entry, split, shape)
        if case["kind"] == "train" and case.get("bf16"):
            bf16 = bf16_activation_ratio(entry, results)
            if bf16 is not None:
                out["bf16_autocast"] = bf16
            continue
        if case["kind"] == "train" and case.get("window") == 8 and not case.get("checkpoint_core"):
            out["training"][str(case["depth"])] = training_with_tail(entry, split, shape)
    return out


def evaluation_at_depth(entry: dict, split, shape: dict) -> dict:
    """A measured evaluation case (two or more R) extrapolated to R = d: the per-iteration FLOPs and seconds, the fixed
    part, and the linearity checks."""
    case = entry["case"]
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
    return {
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


def bf16_activation_ratio(entry: dict, results: list[dict]) -> dict | None:
    """A measured bf16-autocast training case against the fp32 case of the same depth and window (None without
    one): the saved-activation bytes of each and their ratio."""
    case = entry["case"]
    fp32 = next((e for e in results if e.get("status") == "measured" and e["case"]["kind"] == "train"
                 and e["case"]["depth"] == case["depth"] and e["case"]["window"] == case["window"]
                 and not e["case"].get("bf16") and not e["case"].get("checkpoint_core")), None)
    if fp32 is None:
        return None
    return {
        "depth": case["depth"], "saved_activation_bytes": entry["steps"][-1]["saved_activation_bytes"],
        "fp32_saved_activation_bytes": fp32["steps"][-1]["saved_activation_bytes"],
        "activation_ratio": entry["steps"][-1]["saved_activation_bytes"]
        / fp32["steps"][-1]["saved_activation_bytes"],
        "status": "measured (CPU autocast; CUDA autocast's cast lists differ in detail: an estimate "
                  "for the GPU)"}


def training_with_tail(entry: dict, split, shape: dict) -> dict:
    """A measured window-8 training case: its counted FLOPs at R = d (first step) plus the hold tail's mean 3.5
    no-grad iterations (analytic), and the timed last step."""
    first, last = entry["steps"][0], entry["steps"][-1]
    iteration = analytic_flops(shape, split, first["tokens"], 1)["core_iteration"]
    return {
        "tokens": first["tokens"], "flops_forced": first["flops"],
        "flops_with_mean_tail": first["flops"] + 3.5 * iteration, "tail_iteration_flops": iteration,
        "timed_step": {"tokens": last["tokens"], "seconds": round(last["seconds"], 2),
                       "flops_analytic": last["analytic_flops"]["total"]},
        "status": "counted (forced R = d, first step) + analytic tail; seconds of the last step",
    }



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
    check = activation_model_check(measured, record["shape"])
    out = {"tokens_of_depth": {"a": round(a, 2), "b": round(b, 3)}, "counted_over_analytic": ratios,
           "bf16_activation_ratio": bf16, "activation_model_check": check, "peak_flops": H200_BF16_DENSE,
           "mfu_range": list(MFU_RANGE), "backbones": {}}
    for name, shape in QWEN25.items():
        out["backbones"][name] = backbone_estimates(name, shape, tokens, bf16)
    return out


def activation_model_check(measured: dict, shape: dict) -> dict:
    """`saved_bytes_per_token_pass` against the measured 'train d=32 window=8' case ({} when it was not measured)."""
    ref = measured.get("train d=32 window=8")
    if ref is None:
        return {}
    step = ref["steps"][-1]
    passes = grad_layer_passes(tuple(shape["split"]), 32, 8)
    per_token_pass = step["saved_activation_bytes"] / (passes * step["tokens"])
    return {"measured_bytes_per_token_pass": round(per_token_pass),
            "model_bytes_per_token_pass": saved_bytes_per_token_pass(shape),
            "ratio": round(per_token_pass / saved_bytes_per_token_pass(shape), 3)}


def backbone_estimates(name: str, shape: dict, tokens: Callable[[int], float], bf16: float | None) -> dict:
    """One backbone's FLOPs (training, evaluation), H200 hours and memory; `tokens(d)` the prompt tokens at depth d,
    `bf16` the measured bf16-autocast activation ratio (None: fp32 bytes)."""
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
    return {
        "shape": shape, "split": list(split), "parameters": params,
        "train_flops_per_sample_by_depth": {str(d): per_d[d] for d in (1, 8, 16, 32)},
        "train_flops_per_sample_mean": train_per_sample, "train_flops_400k": train_total,
        "eval_flops_per_sequence_forced": {str(k): v for k, v in forced.items()},
        "eval_flops_per_sequence_halting": {str(k): v for k, v in halting.items()},
        "eval_flops_forced_six_seeds": eval_forced, "eval_flops_halting_six_seeds": eval_halting,
        "h200_hours": h200_hours(train_total, eval_forced, eval_halting),
        "memory": memory_estimate(name, shape, split, params, tokens, bf16),
    }


def h200_hours(train_total: float, eval_forced: float, eval_halting: float) -> dict:
    """H200 hours at each MFU of MFU_RANGE: training (one seed, six), evaluation (forced, halting) and all."""
    hours = {f"{int(m * 100)}%": {
        "train_one_seed": train_total / (m * H200_BF16_DENSE) / 3600,
        "train_six_seeds": SEEDS * train_total / (m * H200_BF16_DENSE) / 3600,
        "eval_forced_six_seeds": eval_forced / (m * H200_BF16_DENSE) / 3600,
        "eval_halting_six_seeds": eval_halting / (m * H200_BF16_DENSE) / 3600,
    } for m in MFU_RANGE}
    for row in hours.values():
        row["all"] = row["train_six_seeds"] + row["eval_forced_six_seeds"] + row["eval_halting_six_seeds"]
    return hours


def memory_estimate(name: str, shape: dict, split, params: int, tokens: Callable[[int], float],
                    bf16: float | None) -> dict:
    """GPU memory of one backbone in its placement (PLACEMENT): weights, gradients and Adam states per GPU, the
    activations per sample at d = 32, and the largest per-device batch (a power of two) that fits USABLE · 141 GB."""
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
    return {"setting": setting, "gpus": gpus, "weights_grads_adam_bytes": states,
            "states_per_gpu_bytes": states_per_gpu, "activation_bytes_per_sample_d32": per_sample,
            "per_device_batch": batch, "gradient_accumulation_steps": BATCH // (batch * gpus),
            "activations_bytes": activations, "per_gpu_bytes": states_per_gpu + activations,
            "fits": states_per_gpu + activations <= USABLE * H200_MEMORY}
