"""Looking inside the loop: the progress profile and the padding control.

A looped model trained with progress-aligned targets should, at iteration k, read out z_min(c·k, d), the state
after the first c·k operations. The **progress profile** measures exactly that on fresh problems, for every
iteration k of every test depth d:

    profile[d][k] = mean over sequences of 1[ all queries of readout k == z_min(c·k, d) ]      (k = 1..R)

It tells two failures apart: a *positional* one (early iterations already wrong on a long prompt: the model reads
operation k differently when the prompt is longer) and an *iteration-count* one (right until k passes the
iterations seen in training, then wrong).

The **padding control** writes ``d0`` random operations followed by identity operations up to length d: the answer
is z_{d0} whatever d is, so a model that fails there fails because the prompt is longer (or it runs longer), not
because the problem is harder.

**Which state each iteration reads** (`prefix_state_alignment`, in every profile): where iteration k is wrong, is it
reading another prefix state z_j (ahead, behind: the loop lost its place in the prompt) or no state of the problem at
all? For each k, the j whose z_j most sequences' readout equals, that fraction, and the fraction equal to no z_j.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .data import StateTrackingCollator, derive_seed
from .evaluation import check_test_depths, interpolated_position_ids, interpolation_scale
from .prompts import check_rendering
from .tasks import Task
from .tokenization import encode_batch


def identity_operation(task: Task) -> int:
    """Index of an operation that leaves every state unchanged (swap-S5's and S5's ``identity``).

    Raises ValueError naming the task when it has none (A5: every op is a 3-cycle)."""
    if task.num_queries == 1:  # a state machine: every state
        probes = np.arange(task.num_candidates, dtype=np.int64)[:, None]
    else:  # every item in its own box: a non-identity permutation moves at least one of 64 random states
        probes = np.concatenate([task.default_initial(1), task.sample_initial(np.random.default_rng(0), 64)])
    for op in range(task.num_ops):
        if (task.apply(probes, np.full(len(probes), op)) == probes).all():
            return op
    raise ValueError(f"task {task.name!r} has no identity operation, so it has no padding control")


def padded_operations(task: Task, rng: np.random.Generator, n: int, real_depth: int, depth: int) -> np.ndarray:
    """``real_depth`` random operations, then identity operations up to ``depth``.  # (n, depth)"""
    if not 1 <= real_depth <= depth:
        raise ValueError(f"padding control needs 1 <= real_depth <= depth, got real_depth={real_depth}, depth={depth}")
    ops = np.full((n, depth), identity_operation(task), dtype=np.int64)
    ops[:, :real_depth] = task.sample_ops(rng, n, real_depth)
    return ops


def collated_batches(encoded: dict, collate, n: int, batch_size: int, device):
    """(start, batch) over `n` encoded problems (`encode_batch`'s columns), `batch_size` at a time, collated and on
    `device`."""
    for start in range(0, n, batch_size):
        batch = collate({key: column[start : start + batch_size] for key, column in encoded.items()})
        yield start, {key: value.to(device) for key, value in batch.items()}


def iteration_readouts(model: Any, tokenizer: Any, task: Task, ops: np.ndarray, initial: np.ndarray | None,
                       num_iterations: int, rendering: str = "symbolic", batch_size: int = 256,
                       device: str | torch.device | None = None, phrasing: str = "canonical",
                       rng: np.random.Generator | None = None,
                       position_interpolation: float | None = None) -> np.ndarray:
    """Every iteration's answer for each problem: the readouts y_1 … y_R of a forward with R = `num_iterations`.
    ops (n, d), initial (n, Q) or None; phrasing / rng as in `encode_batch`; `position_interpolation` λ: positions
    λ times the ordinary ones (`evaluation.interpolated_position_ids`).  # (n, R, Q) candidate indices"""
    device = torch.device(device) if device is not None else getattr(model, "device", torch.device("cpu"))
    collate = StateTrackingCollator(tokenizer.pad_token_id, padding_side="right")
    takes_operation_ends = "operation_ends" in inspect.signature(model.forward).parameters
    if hasattr(model, "eval"):
        model.eval()
    encoded = encode_batch(task, tokenizer, rendering, ops, initial, phrasing, rng)
    reads = list(range(1, num_iterations + 1))
    answers = []
    for _, batch in collated_batches(encoded, collate, len(ops), batch_size, device):
        kwargs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"],
                      num_iterations=num_iterations, readout_iterations=reads)
        if takes_operation_ends:
            kwargs["operation_ends"] = batch["operation_ends"]
        kwargs.update(interpolated_position_ids(batch["attention_mask"], position_interpolation))
        with torch.inference_mode():
            out = model(batch["input_ids"], **kwargs)
        answers.append(out.answer_logits.argmax(-1).cpu().numpy().transpose(1, 0, 2))  # (b, R, Q)
    return np.concatenate(answers)


def wavefront_profile(model: Any, tokenizer: Any, task: Task, depths: Sequence[int], n_per_depth: int = 256,
                      seed: int = 0, batch_size: int = 256, rendering: str = "text",
                      device: str | torch.device | None = None) -> dict[str, Any]:
    """Inside the loop of a model trained with dense prefix targets (a state head, `config.prefix_state_queries`):
    after R = ⌈d / c⌉ iterations, whether the last token of each operation j holds z_j,

        wavefront[d][j − 1] = mean over problems of 1[ argmax W_z s_R[t_j] == z_j ]      (j = 1..d),

    t_j operation j's last token. The wavefront training asks for (`trainers.objectives.prefix_state_targets`) holds
    where it is 1 up to j = d; a fall past the training range tells whether the operations' own states fail, or only
    the query's reading of them (the progress profile). Returns ``depths``, ``wavefront`` and the settings."""
    if not getattr(model.config, "prefix_state_queries", 0):
        raise ValueError("wavefront_profile needs a model with a state head (config.prefix_state_queries > 0).")
    depths = check_test_depths(depths)
    device = torch.device(device) if device is not None else getattr(model, "device", torch.device("cpu"))
    collate = StateTrackingCollator(tokenizer.pad_token_id, padding_side="right")
    c, rows = int(model.config.step_size), []
    model.eval()
    for depth in depths:
        rng = np.random.default_rng(derive_seed("wavefront", seed, depth))
        ops = task.sample_ops(rng, n_per_depth, depth)
        states = task.prefix_states(ops, None)  # (n, d + 1, Q)
        encoded = encode_batch(task, tokenizer, rendering, ops, None)
        right = np.zeros(depth)
        for start, batch in collated_batches(encoded, collate, len(ops), batch_size, device):
            with torch.inference_mode():
                out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            query_positions=batch["query_positions"], num_iterations=math.ceil(depth / c),
                            output_loop_states=True)
                read = model.state_logits(out.loop_states[-1], batch["operation_ends"][:, 1:]).argmax(-1)
            targets = states[start : start + batch_size, 1:]  # (b, d, Q)
            right += (read.cpu().numpy() == targets).all(-1).sum(0)
        rows.append((right / len(ops)).round(4).tolist())
    return {"depths": list(depths), "wavefront": rows, "n_per_depth": n_per_depth, "seed": seed,
            "rendering": rendering}


def operation_attention(weights: torch.Tensor, query_positions: torch.Tensor,
                        operation_ends: torch.Tensor) -> torch.Tensor:
    """The attention mass the query tokens put on each operation's tokens. weights (b, heads, T, T) of one layer at one
    iteration; query_positions (b, Q); operation_ends (b, d + 1), entry 0 the preamble's last token:

        mass[b, j − 1] = mean over heads h and queries q of Σ_{t_{j−1} < t ≤ t_j} weights[b, h, pos_q, t]   (j = 1..d)

    Returns (b, d)."""
    rows = torch.arange(weights.shape[0], device=weights.device)[:, None]
    read = weights.mean(1)[rows, query_positions].mean(1)  # (b, T): the queries' attention, heads and queries averaged
    cumulative = torch.cat([torch.zeros_like(read[:, :1]), read.cumsum(-1)], dim=-1)  # (b, T + 1)
    at_end = cumulative.gather(1, operation_ends + 1)  # mass on tokens 0..t_j
    return at_end[:, 1:] - at_end[:, :-1]


def attention_pointer_profile(model: Any, tokenizer: Any, task: Task, depths: Sequence[int], n_per_depth: int = 64,
                              seed: int = 0, batch_size: int = 64, rendering: str = "text",
                              device: str | torch.device | None = None) -> dict[str, Any]:
    """Where the full view's loop looks: at iteration k of a forward with R = ⌈d / c⌉, which operation the query
    tokens attend to most in each core layer (`operation_attention`),

        on_target[d][layer][k − 1] = mean over problems of 1[ argmax_j mass_k[j] == min(c·k, d) ]
        pointer[d][layer][k − 1]   = mean over problems of argmax_j mass_k[j]            (operations 1..d)
        mass[d][layer][k − 1]      = mean over problems of mass_k[min(c·k, d)]

    A loop that finds operation k by its place follows the diagonal (pointer ≈ k); one whose counter drifts past the
    iterations it trained on falls behind or jumps; a positional failure misses from k = 1. The model runs with eager
    attention for the call (its setting restored after). Returns ``depths``, ``on_target``, ``pointer``, ``mass``
    (per depth, per core layer, per iteration) and the settings."""
    if getattr(model.config, "loop_view", "full") != "full":
        raise ValueError("attention_pointer_profile reads the full view's attention over the prompt; this model's "
                         f"loop_view is {model.config.loop_view!r}.")
    depths = check_test_depths(depths)
    device = torch.device(device) if device is not None else getattr(model, "device", torch.device("cpu"))
    collate = StateTrackingCollator(tokenizer.pad_token_id, padding_side="right")
    c, layers = int(model.config.step_size), len(model.core)
    caught: list[torch.Tensor] = []
    hooks = [layer.self_attn.register_forward_hook(lambda module, args, out: caught.append(out[1]))
             for layer in model.core]
    before, model.config._attn_implementation = model.config._attn_implementation, "eager"
    results = {"on_target": [], "pointer": [], "mass": []}
    model.eval()
    try:
        for depth in depths:
            rng = np.random.default_rng(derive_seed("attention_pointer", seed, depth))
            ops = task.sample_ops(rng, n_per_depth, depth)
            encoded = encode_batch(task, tokenizer, rendering, ops, None)
            R = math.ceil(depth / c)
            target = np.minimum(c * np.arange(1, R + 1), depth)  # operation k reads (1-based)
            sums = {key: np.zeros((layers, R)) for key in results}
            for _, batch in collated_batches(encoded, collate, len(ops), batch_size, device):
                caught.clear()
                with torch.inference_mode():
                    model(batch["input_ids"], attention_mask=batch["attention_mask"],
                          query_positions=batch["query_positions"], num_iterations=R)
                for call, weights in enumerate(caught[: layers * R]):  # iteration k runs core layers 0..L-1
                    layer, k = call % layers, call // layers
                    mass = operation_attention(weights.float(), batch["query_positions"], batch["operation_ends"])
                    best = mass.argmax(-1).cpu().numpy() + 1
                    sums["on_target"][layer, k] += (best == target[k]).sum()
                    sums["pointer"][layer, k] += best.sum()
                    sums["mass"][layer, k] += mass[:, target[k] - 1].sum().item()
            for key in results:
                results[key].append((sums[key] / len(ops)).round(4).tolist())
    finally:
        model.config._attn_implementation = before
        for hook in hooks:
            hook.remove()
    return {"depths": list(depths), **results, "n_per_depth": n_per_depth, "seed": seed, "rendering": rendering}


def readout_margins(model: Any, tokenizer: Any, task: Task, depth: int, n: int = 128, seed: int = 0,
                    rendering: str = "text", batch_size: int = 64) -> dict[str, Any]:
    """Inside the loop at one depth: per iteration k = 1..d, on `n` fresh problems, the share whose readout is z_k,
    the margin of the readout, m_k = min over queries q of (y_{k,q}[z_{k,q}] − max_{c ≠ z_{k,q}} y_{k,q}[c]) (median
    and 10th percentile over problems; > 0 iff every query is right), and the state's norm drift before anchoring,
    mean over problems of `state_rms_k / state_rms_1` (`ParLoopedOutput.state_rms`). A margin that shrinks step by
    step says the carried state drifts; a flat margin that collapses says a step breaks."""
    check_rendering(rendering)
    rng = np.random.default_rng(derive_seed("margins", seed, depth))
    ops = task.sample_ops(rng, n, depth)
    targets = torch.as_tensor(task.prefix_states(ops, None)[:, 1:])  # (n, d, Q) candidate indices
    collate = StateTrackingCollator(tokenizer.pad_token_id, padding_side="right")
    model.eval()
    margins, drift = [], []
    for start, batch in collated_batches(encode_batch(task, tokenizer, rendering, ops, None), collate, n, batch_size,
                                         model.device):
        with torch.inference_mode():
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], num_iterations=depth,
                        readout_iterations=list(range(1, depth + 1)))
        logits = out.answer_logits.float().permute(1, 0, 2, 3)  # (b, d, Q, C)
        target = targets[start : start + logits.shape[0]].to(logits.device)
        right = logits.gather(-1, target[..., None]).squeeze(-1)
        other = logits.scatter(-1, target[..., None], float("-inf")).amax(-1)
        margins.append((right - other).amin(-1).cpu())  # (b, d)
        rms = out.state_rms.float()  # (R, b)
        drift.append((rms / rms[:1]).T.cpu())
    margin, ratio = torch.cat(margins), torch.cat(drift)
    return {"depth": depth, "n": n, "seed": seed,
            "accuracy": (margin > 0).float().mean(0).tolist(),
            "margin_median": margin.median(0).values.tolist(),
            "margin_p10": margin.quantile(0.1, dim=0).tolist(),
            "state_rms_ratio": ratio.mean(0).tolist()}


def prefix_state_alignment(answers: np.ndarray, states: np.ndarray) -> dict[str, list]:
    """Which prefix state each iteration reads. answers (n, R, Q): the readouts y_1 … y_R; states (n, d + 1, Q): the
    states z_0 … z_d of the same problems.

        match[k][j] = mean over sequences of 1[ y_k == z_j ]            (k = 1..R, j = 0..d)

    Returns ``read_state`` (per k the j of the largest match[k][j], the smallest such j on a tie), ``read_fraction``
    (that largest match) and ``no_prefix_state`` (per k the fraction of sequences whose y_k equals no z_j). A loop on
    track reads j = min(c·k, d); one that lost its place in a longer prompt reads another j, or no state of the problem.
    Prefix states can coincide (an identity operation, a swap undone), so a row's matches may sum past 1."""
    if answers.ndim != 3 or states.ndim != 3 or answers.shape[::2] != states.shape[::2]:
        raise ValueError(f"answers must be (n, R, Q) and states (n, d + 1, Q); got {answers.shape} and {states.shape}")
    match = (answers[:, :, None, :] == states[:, None, :, :]).all(-1)  # (n, R, d + 1)
    per_state = match.mean(0)  # (R, d + 1)
    return {"read_state": per_state.argmax(1).tolist(), "read_fraction": per_state.max(1).tolist(),
            "no_prefix_state": (~match.any(-1)).mean(0).tolist()}


def progress_profile(
    model: Any,
    tokenizer: Any,
    task: Task,
    depths: Sequence[int],
    n_per_depth: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    rendering: str = "symbolic",
    random_initial: bool = False,
    padding_control_depth: int | None = None,
    extra_iterations: int = 0,
    device: str | torch.device | None = None,
    phrasing: str = "canonical",
    interpolate_from_depth: int | None = None,
) -> dict[str, Any]:
    """Accuracy of every iteration's readout against z_min(c·k, d) on fresh problems at each depth.

    Args:
        depths: test depths d; the loop runs R = ⌈d / c⌉ + ``extra_iterations`` iterations (readouts past ⌈d/c⌉
            are scored against z_d).
        padding_control_depth: d0; if set, problems are d0 random operations then identity operations up to d
            (see :func:`padded_operations`), so the targets are z_min(c·k, d0).
        phrasing: the text rendering's sentences (``canonical``, ``seen`` or ``held_out``, as in ``encode_batch``;
            drawn with a generator derived from ``seed`` and the depth).
        interpolate_from_depth: d_train; if set, test-time position interpolation: positions scaled by
            λ = min(1, d_train / d) (``evaluation.interpolation_scale``), a diagnostic of positional failure.
    Returns:
        JSON-ready dict: ``depths``, ``profile`` (one list per depth: accuracy at k = 1..R), ``final_accuracy``
        (the readout at R = ⌈d/c⌉), ``first_failure`` (per depth the first k below 50%, or None), ``read_state`` /
        ``read_fraction`` / ``no_prefix_state`` (per depth, per k: :func:`prefix_state_alignment`), and the settings.
    """
    check_rendering(rendering)
    depths = _check_profile_arguments(depths, extra_iterations, padding_control_depth)
    c = int(model.config.step_size)
    profiles, finals, first_failure, alignments = [], [], [], []
    for depth in depths:
        completing = math.ceil(depth / c)
        num_iterations = completing + extra_iterations
        ops, initial, states, targets = _profile_problems(task, depth, c, num_iterations, n_per_depth, seed,
                                                          random_initial, padding_control_depth)
        words = np.random.default_rng(derive_seed("profile_phrasing", seed, depth))
        scale = None if interpolate_from_depth is None else interpolation_scale(interpolate_from_depth, depth)
        answers = iteration_readouts(model, tokenizer, task, ops, initial, num_iterations, rendering=rendering,
                                     batch_size=batch_size, device=device, phrasing=phrasing, rng=words,
                                     position_interpolation=scale)  # (n, R, Q)
        correct = (answers == targets).all(-1).sum(0)  # (R,)
        alignments.append(prefix_state_alignment(answers, states))
        accuracy = (correct / n_per_depth).tolist()
        profiles.append(accuracy)
        finals.append(accuracy[completing - 1])
        below = [i + 1 for i, a in enumerate(accuracy) if a < 0.5]
        first_failure.append(below[0] if below else None)
    return _profile_result(task, padding_control_depth, depths, profiles, finals, first_failure, alignments, c,
                           extra_iterations=extra_iterations, n_per_depth=n_per_depth, seed=seed, rendering=rendering,
                           random_initial=random_initial, phrasing=phrasing,
                           interpolate_from_depth=interpolate_from_depth)


def _check_profile_arguments(depths: Sequence[int], extra_iterations: int,
                             padding_control_depth: int | None) -> list[int]:
    """The checked test depths of :func:`progress_profile` (`check_test_depths`); `ValueError` on a bad
    ``extra_iterations`` or ``padding_control_depth``."""
    depths = check_test_depths(depths)
    if not isinstance(extra_iterations, int) or extra_iterations < 0:
        raise ValueError(f"extra_iterations must be an integer >= 0, got {extra_iterations!r}")
    if padding_control_depth is not None and not 1 <= padding_control_depth <= depths[0]:
        raise ValueError(f"padding_control_depth must lie in [1, smallest depth={depths[0]}], "
                         f"got {padding_control_depth}")
    return depths


def _profile_problems(task: Task, depth: int, c: int, num_iterations: int, n: int, seed: int, random_initial: bool,
                      padding_control_depth: int | None) -> tuple[np.ndarray, Any, np.ndarray, np.ndarray]:
    """The problems of one depth of :func:`progress_profile`, from ``derive_seed("profile", seed, depth, d0)``: ops
    (n, d), start states (None without ``random_initial``), prefix states (n, d + 1, Q) and the targets z_min(c·k, d)
    of k = 1..R (n, R, Q)."""
    rng = np.random.default_rng(derive_seed("profile", seed, depth, padding_control_depth))
    if padding_control_depth is None:
        ops = task.sample_ops(rng, n, depth)
    else:
        ops = padded_operations(task, rng, n, padding_control_depth, depth)
    initial = task.sample_initial(rng, n) if random_initial else None
    states = task.prefix_states(ops, initial)  # (n, d + 1, Q)
    k = np.arange(1, num_iterations + 1)
    targets = states[:, np.minimum(c * k, depth)]  # (n, R, Q)
    return ops, initial, states, targets


def _profile_result(task: Task, padding_control_depth: int | None, depths: list[int], profiles: list,
                    finals: list, first_failure: list, alignments: list[dict], c: int,
                    **settings: Any) -> dict[str, Any]:
    """The JSON-ready result of :func:`progress_profile`: the profiles per depth, then the step size and
    ``settings`` in the order given."""
    return {
        "task": task.name,
        "kind": "padding_control" if padding_control_depth is not None else "progress_profile",
        "padding_control_depth": padding_control_depth,
        "depths": depths,
        "profile": profiles,
        "final_accuracy": finals,
        "first_failure": first_failure,
        # per depth, per iteration k: the prefix state z_j read most often, that fraction, the fraction reading none
        "read_state": [a["read_state"] for a in alignments],
        "read_fraction": [a["read_fraction"] for a in alignments],
        "no_prefix_state": [a["no_prefix_state"] for a in alignments],
        "step_size": c,
        **settings,
    }


def format_profile(result: dict[str, Any]) -> str:
    """The profile as a markdown table: one row per depth, accuracy (%) at k = 1, 2, …"""
    lines = ["| d | accuracy of iteration k = 1, 2, … (%) |", "|---|---|"]
    for depth, row in zip(result["depths"], result["profile"]):
        lines.append(f"| {depth} | " + " ".join(f"{100 * a:.0f}" for a in row) + " |")
    return "\n".join(lines)


def plot_progress_profile(results: dict[str, dict[str, Any]], path: str | os.PathLike,
                          train_max_depth: int | None = None) -> None:
    """Heatmaps of depth × iteration accuracy, one panel per result (e.g. progress profile, padding control)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not results:
        raise ValueError("results must map at least one title to a progress_profile result")
    figure = Figure(figsize=(6.5 * len(results), 0.45 * max(len(r["depths"]) for r in results.values()) + 1.8))
    FigureCanvasAgg(figure)
    image = None
    for i, (title, result) in enumerate(results.items()):
        axes = figure.add_subplot(1, len(results), i + 1)
        width = max(len(row) for row in result["profile"])
        grid = np.full((len(result["depths"]), width), np.nan)
        for r, row in enumerate(result["profile"]):
            grid[r, : len(row)] = row
        image = axes.imshow(grid, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest",
                            extent=(0.5, width + 0.5, len(result["depths"]) - 0.5, -0.5))
        axes.set_yticks(range(len(result["depths"])), [str(d) for d in result["depths"]])
        axes.set_xlabel("iteration k")
        axes.set_ylabel("prompt depth d")
        if train_max_depth:
            axes.axvline(train_max_depth / result["step_size"] + 0.5, color="white", linestyle="--", linewidth=1)
        axes.set_title(title, fontsize="small")
    figure.colorbar(image, ax=figure.axes, label="accuracy of readout k vs z_min(c·k, d)")
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
