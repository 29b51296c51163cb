"""Length generalization: accuracy at test depths beyond training, and the extrapolation factor.

The model is used only through ``model.predict`` (no import of ``modeling_par``)::

    pred = model.predict(input_ids, attention_mask=..., query_positions=..., num_iterations=R)  # forced
    pred = model.predict(input_ids, attention_mask=..., query_positions=..., halting=True)      # learned halting
    pred.answers (batch, queries)  pred.iterations (batch,)  pred.halted (batch,)

Forced mode runs R = ⌈d / c⌉ iterations (c = step size); halting mode lets the model decide.
Test problems for depth d are drawn from ``derive_seed("eval", seed, d)``, apart from any
training stream ``default_rng(seed)`` and independent of which other depths are tested.
"""

from __future__ import annotations

import datetime
import inspect
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from .accuracy import overall_state_accuracy, per_query_accuracy
from .data import StateTrackingCollator, derive_seed
from .prompts import check_rendering
from .tasks import Task
from .tokenization import encode_batch, model_token_ids

MODES = ("forced", "halting")
ACCURACY_THRESHOLD = 0.5
STATE_ACCURACY_METRIC_PATH = os.path.join(os.path.dirname(__file__), "metrics", "state_accuracy")


def longest_accurate_depth(
    depths: Sequence[int], accuracies: Sequence[float], threshold: float = ACCURACY_THRESHOLD
) -> int:
    """d50: the largest tested depth d such that accuracy >= threshold at d *and at every smaller
    tested depth* (the curve is cut at its first failure, so a lucky long depth after a failure
    does not count). 0 if the smallest tested depth already fails."""
    depths, accuracies = _check_curve(depths, accuracies)
    order = np.argsort(depths)
    longest = 0
    for depth, accuracy in zip(depths[order], accuracies[order]):
        if accuracy < threshold:
            break
        longest = int(depth)
    return longest


def extrapolation_factor(
    depths: Sequence[int], accuracies: Sequence[float], train_max_depth: int, threshold: float = ACCURACY_THRESHOLD
) -> float:
    """G = d50 / d_train with d50 from :func:`longest_accurate_depth`.

    G is a lower bound when every tested depth passes (the curve was not followed further),
    and 0 when even the shortest tested depth is below the threshold.
    """
    if not isinstance(train_max_depth, (int, np.integer)) or train_max_depth < 1:
        raise ValueError(f"train_max_depth must be a positive integer, got {train_max_depth!r}")
    return longest_accurate_depth(depths, accuracies, threshold) / int(train_max_depth)


def _check_curve(depths, accuracies) -> tuple[np.ndarray, np.ndarray]:
    depths, accuracies = np.asarray(depths), np.asarray(accuracies, dtype=np.float64)
    if depths.ndim != 1 or depths.shape != accuracies.shape or len(depths) == 0:
        raise ValueError(f"depths and accuracies must be non-empty 1-d and of equal length, got {depths.shape} and "
                         f"{accuracies.shape}")
    if len(set(depths.tolist())) != len(depths):
        raise ValueError(f"depths must be distinct, got {depths.tolist()}")
    return depths, accuracies


def check_test_depths(depths: Sequence[int]) -> list[int]:
    """Test depths as a sorted list; ValueError unless they are distinct integers >= 1."""
    depths = sorted(int(d) for d in depths)
    if not depths or depths[0] < 1 or len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct integers >= 1, got {depths}")
    return depths


def phrasing_rng(phrasing: str, seed: int, depth: int) -> np.random.Generator:
    """The generator that draws the test prompts' sentences at `depth` for `phrasing` and `seed`
    (`derive_seed("phrasing", phrasing, seed, depth)`): the evaluator's and the training probe's, so that both score
    the same prompts."""
    return np.random.default_rng(derive_seed("phrasing", phrasing, seed, depth))


def draw_test_problems(task: Task, depth: int, n: int, seed: int,
                       random_initial: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The test problems at `depth`: ops (n, d) then, with `random_initial`, start states (n, Q), from
    `derive_seed("eval", seed, depth)` (apart from training data). Every method is scored on these."""
    rng = np.random.default_rng(derive_seed("eval", seed, depth))
    ops = task.sample_ops(rng, n, depth)  # (n, d)
    initial = task.sample_initial(rng, n) if random_initial else None
    return ops, initial


def worker_slices(start: int, stop: int, workers: int) -> list[slice]:
    """Rows [start, stop) cut into at most `workers` contiguous, near-equal, non-empty parts."""
    bounds = np.linspace(start, stop, min(workers, stop - start) + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "par_eager")
EAGER_ATTENTION = ("eager", "par_eager")  # matmul, softmax, matmul when uncompiled


def default_workers(device: str | torch.device, attn_implementation: str | None = None) -> int:
    """The evaluator's `workers` when the caller says "auto": on a CPU, one per intra-op thread (at most 4: the gain was
    measured with 2), except with eager attention (the local window's CPU default), where two workers measured
    0.94-1.02× of one in two runs (no gain: their many small ops contend for the GIL); on an accelerator 1.
    benchmarks/bench_speed.py, results/speed_cpu."""
    if torch.device(device).type != "cpu" or attn_implementation in EAGER_ATTENTION:
        return 1
    return max(1, min(4, torch.get_num_threads()))


def default_attn_implementation(loop_view: str, device: str | torch.device, local_window: bool = True,
                                current: str | None = None) -> str:
    """The attention kernel "auto" picks (train_par.py and evaluate_par.py alike): on a CPU, "par_eager" for the local
    view's window path, whose attention blocks are a few rows each (span + query region) and where sdpa's CPU flash
    kernel costs more than the whole MLP. "par_eager" is "eager" (matmul, softmax, matmul) uncompiled; under
    `compile_core` its few-key blocks are broadcast products that inductor fuses (modeling_par's
    `par_eager_attention`), 4-10% faster than compiled "eager". Otherwise `current` (the implementation a
    loaded model already runs, e.g. remote code without sdpa) or, for a new model, "sdpa" (its causal kernel never
    materializes a full view's (t × t) scores). Measured in benchmarks/bench_speed.py (results/speed_cpu)."""
    window = loop_view == "local" and local_window
    if window and torch.device(device).type == "cpu":
        return "par_eager"
    return "sdpa" if current is None else current


def check_attn_implementation(value: str, name: str = "attn_implementation") -> str:
    if value not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"{name} must be one of {list(ATTN_IMPLEMENTATIONS)}; got {value!r}.")
    return value


def _run_threaded(fn, items: list) -> list:
    """`[fn(x) for x in items]`, one Python thread per item, each op single-threaded (torch's intra-op thread count
    is process-wide: set to 1 for the call and restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            return list(pool.map(fn, items))
    finally:
        torch.set_num_threads(threads)


def check_evaluation_arguments(model, task: Task, depths, n_per_depth, mode, batch_size, rendering, train_max_depth,
                               step_size, workers, fixed_iterations, phrasing,
                               interpolate_positions) -> tuple[list[int], int]:
    """One `ValueError` naming the first bad argument of `evaluate_length_generalization`; returns the checked depths
    (`check_test_depths`) and the step size c."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    check_rendering(rendering)
    task.phrasing_options(phrasing)  # checks the name
    depths = check_test_depths(depths)
    for name, value in (("n_per_depth", n_per_depth), ("batch_size", batch_size), ("workers", workers)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if fixed_iterations is not None and (mode != "forced" or isinstance(fixed_iterations, bool)
                                         or not isinstance(fixed_iterations, (int, np.integer))
                                         or fixed_iterations < 1):
        raise ValueError(f"fixed_iterations must be None or a positive integer with mode='forced', got "
                         f"{fixed_iterations!r} (mode={mode!r})")
    if interpolate_positions and train_max_depth is None:
        raise ValueError("interpolate_positions=True needs train_max_depth (the scale is train_max_depth / depth)")
    step_size = int(model.config.step_size if step_size is None else step_size)
    if step_size < 1:
        raise ValueError(f"step_size must be >= 1, got {step_size}")
    return depths, step_size


def model_matches_tokenizer(model, tokenizer, task: Task) -> dict:
    """The task's token ids under `tokenizer` (`model_token_ids`), refused when the model's answer ids differ (the
    wrong tokenizer or task for this model)."""
    token_ids = model_token_ids(tokenizer, task)
    config_answer_ids = getattr(model.config, "answer_token_ids", None)
    if config_answer_ids is not None and list(config_answer_ids) != token_ids["answer_token_ids"]:
        raise ValueError(
            f"model.config.answer_token_ids {list(config_answer_ids)} differ from the tokenizer's ids for the task's "
            f"candidates {token_ids['answer_token_ids']}: wrong tokenizer or task for this model"
        )
    return token_ids


def evaluation_record(model, tokenizer, task: Task, token_ids: dict, depths: list, per_depth: list, settings: dict,
                      device) -> dict[str, Any]:
    """The JSON-ready result of `evaluate_length_generalization`: the settings, accuracy per depth, d50, the
    extrapolation factor, and what is needed to rerun (task spec, model config, tokenizer, environment)."""
    accuracies = [row["accuracy"] for row in per_depth]
    train_max_depth = settings["train_max_depth"]
    return {
        "task": task.name,
        "task_spec": task.to_dict(),
        **settings,
        "depths": depths,
        "accuracy": accuracies,
        "per_depth": per_depth,
        "d50": longest_accurate_depth(depths, accuracies),
        "extrapolation_factor": (None if train_max_depth is None
                                 else extrapolation_factor(depths, accuracies, train_max_depth)),
        "extrapolation_factor_is_lower_bound": bool(min(accuracies) >= ACCURACY_THRESHOLD),
        "model_config": to_json(model.config.to_dict()),
        "tokenizer": {"name_or_path": getattr(tokenizer, "name_or_path", None), **to_json(token_ids)},
        "environment": environment_info(device),
    }


def evaluate_length_generalization(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    depths: Sequence[int],
    n_per_depth: int = 1024,
    mode: str = "forced",
    seed: int = 0,
    batch_size: int = 256,
    rendering: str = "symbolic",
    train_max_depth: int | None = None,
    step_size: int | None = None,
    random_initial: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
    workers: int = 1,
    fixed_iterations: int | None = None,
    phrasing: str = "canonical",
    interpolate_positions: bool = False,
) -> dict[str, Any]:
    """Accuracy of ``model`` on fresh problems at each depth.

    Args:
        depths: test depths (distinct integers >= 1), evaluated in ascending order.
        mode: ``"forced"`` (R = ⌈d / c⌉ iterations) or ``"halting"`` (the model's halting rule).
        step_size: c; default ``model.config.step_size``.
        train_max_depth: longest training depth; enables ``extrapolation_factor``.
        device: where the batches go; default ``model.device``.
        fixed_iterations: forced mode only: run R = this at every depth instead of ⌈d / c⌉ (models trained with a
            fixed R whatever d: the plain Transformer is R = 1; the fixed-depth loop ablation).
        phrasing: the text rendering's sentences: ``canonical`` (first forms), ``seen`` (drawn among the phrasings
            training may see) or ``held_out`` (the task's held-out phrasings; see ``Task.phrasing_options``).
        workers: split each batch into this many parts and run them at once, one Python thread and one intra-op
            thread each (``torch.set_num_threads(1)`` for the call, restored after). On a small CPU this keeps every
            core busy where one batch's small matrices leave intra-op threads idle; the answers are the same.
        interpolate_positions: test-time position interpolation, a diagnostic: at depth d the positions are scaled
            by λ = min(1, train_max_depth / d) (`interpolated_position_ids`; needs ``train_max_depth``), so a longer
            prompt spans the training range of positions.
    Returns:
        A JSON-ready dict: ``depths``, ``accuracy`` (overall state accuracy per depth, aligned with ``depths``),
        ``per_depth`` (accuracy, ``per_query_accuracy`` by query name, ``mean_iterations`` (all samples; never-halted
        ones count at the limit), ``fraction_not_halted``, ``mean_iterations_halted`` and ``accuracy_halted``
        (confirmed halts only; None if none), ``num_iterations`` (forced R)), ``d50``, ``extrapolation_factor``
        (None without ``train_max_depth``), and everything needed to rerun: task spec, n, seed, mode, rendering,
        model config, tokenizer, versions, date and machine.
    """
    depths, step_size = check_evaluation_arguments(model, task, depths, n_per_depth, mode, batch_size, rendering,
                                                   train_max_depth, step_size, workers, fixed_iterations, phrasing,
                                                   interpolate_positions)
    token_ids = model_matches_tokenizer(model, tokenizer, task)
    device = torch.device(device) if device is not None else model.device
    settings = dict(mode=mode, rendering=rendering, phrasing=phrasing, random_initial=random_initial, seed=seed,
                    n_per_depth=n_per_depth, batch_size=batch_size, workers=workers,
                    fixed_iterations=fixed_iterations, interpolate_positions=interpolate_positions,
                    step_size=step_size, train_max_depth=train_max_depth)
    per_depth = _evaluate_depths(model, tokenizer, task, token_ids, depths, settings, device, progress)
    return evaluation_record(model, tokenizer, task, token_ids, depths, per_depth, settings, device)


def _evaluate_depths(model: Any, tokenizer: PreTrainedTokenizerBase, task: Task, token_ids: dict, depths: list[int],
                    settings: dict, device: torch.device, progress: bool) -> list[dict[str, Any]]:
    """The `per_depth` rows of `evaluate_length_generalization` (`depth_result`), one per depth in order, with its
    checked `settings` (mode, rendering, phrasing, seed, ...); a progress bar over the batches unless `progress` is
    False."""
    mode, batch_size, seed = settings["mode"], settings["batch_size"], settings["seed"]
    collate = StateTrackingCollator(token_ids["pad_token_id"], padding_side="right")
    if hasattr(model, "eval"):
        model.eval()
    per_depth = []
    batches_per_depth = math.ceil(settings["n_per_depth"] / batch_size)
    bar = tqdm(total=batches_per_depth * len(depths), desc=f"eval {task.name} ({mode})", disable=not progress)
    for depth in depths:
        ops, initial = draw_test_problems(task, depth, settings["n_per_depth"], seed, settings["random_initial"])
        targets = task.final_states(ops, initial)  # (n, Q)
        encoded = encode_batch(task, tokenizer, settings["rendering"], ops, initial, settings["phrasing"],
                               phrasing_rng(settings["phrasing"], seed, depth))
        num_iterations = math.ceil(depth / settings["step_size"]) if mode == "forced" else None
        if settings["fixed_iterations"] is not None:
            num_iterations = int(settings["fixed_iterations"])

        scale = (interpolation_scale(settings["train_max_depth"], depth) if settings["interpolate_positions"]
                 else None)
        answers, iterations, halted = predict_encoded(model, encoded, collate, mode, num_iterations, batch_size,
                                                      settings["workers"], device, on_batch=lambda: bar.update(1),
                                                      position_interpolation=scale)
        if answers.shape != targets.shape:
            raise ValueError(f"model.predict returned answers of shape {answers.shape[1:]} per batch row, "
                             f"expected ({task.num_queries},)")
        per_depth.append(depth_result(depth, answers, targets, iterations, halted, num_iterations, task.query_names))
        accuracy = per_depth[-1]["accuracy"]
        bar.set_postfix(depth=depth, accuracy=f"{accuracy:.3f}")
    bar.close()
    return per_depth


def interpolation_scale(train_max_depth: int, depth: int) -> float:
    """Test-time position interpolation's λ = min(1, d_train / d)."""
    return min(1.0, train_max_depth / depth)


def interpolated_position_ids(attention_mask: torch.Tensor, scale: float | None) -> dict:
    """Test-time position interpolation (Chen et al. 2023; a diagnostic of positional failure): {"position_ids":
    λ · p} for a forward / predict call, p = cumsum(mask) − 1 the ordinary positions and λ = d_train / d ≤ 1
    (`interpolation_scale`), so a longer prompt's positions span the training range; {} when `scale` is None."""
    if scale is None:
        return {}
    if not 0.0 < scale <= 1.0:
        raise ValueError(f"position interpolation scale must be in (0, 1] (d_train / d for d ≥ d_train); got {scale}")
    return {"position_ids": (attention_mask.long().cumsum(-1) - 1).clamp_min(0).float() * scale}


def predict_encoded(model: Any, encoded: dict[str, list], collate: StateTrackingCollator, mode: str,
                    num_iterations: int | None, batch_size: int, workers: int, device: torch.device,
                    on_batch=None, position_interpolation: float | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`model.predict` over encoded problems (columns of lists: input_ids, query_positions, operation_ends) in batches
    of `batch_size`, each cut into `workers` parts run at once (`_run_threaded`): forced R = `num_iterations`, or the
    halting rule (``mode="halting"``); with `position_interpolation` λ the positions are λ times the ordinary ones
    (`interpolated_position_ids`). Returns answers (n, Q), iterations (n,), halted (n,)."""
    takes_operation_ends = "operation_ends" in inspect.signature(model.predict).parameters
    n = len(encoded["input_ids"])

    def predict_rows(rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        batch = collate({key: column[rows] for key, column in encoded.items()})
        batch = {key: value.to(device) for key, value in batch.items()}
        with torch.inference_mode():
            inputs = dict(attention_mask=batch["attention_mask"], query_positions=batch["query_positions"])
            if takes_operation_ends:
                inputs["operation_ends"] = batch["operation_ends"]
            inputs.update(interpolated_position_ids(batch["attention_mask"], position_interpolation))
            if mode == "forced":
                pred = model.predict(batch["input_ids"], **inputs, num_iterations=num_iterations)
            else:
                pred = model.predict(batch["input_ids"], **inputs, halting=True)
        return pred.answers.cpu().numpy(), pred.iterations.cpu().numpy(), pred.halted.cpu().numpy()

    parts = []
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        slices = worker_slices(start, stop, workers)
        parts += _run_threaded(predict_rows, slices) if len(slices) > 1 else [predict_rows(slices[0])]
        if on_batch is not None:
            on_batch()
    answers, iterations, halted = (np.concatenate(column) for column in zip(*parts))
    return answers, iterations, halted.astype(bool)


def depth_result(depth: int, answers: np.ndarray, targets: np.ndarray, iterations: np.ndarray, halted: np.ndarray,
                 num_iterations: int | None, query_names: Sequence[str]) -> dict[str, Any]:
    """One `per_depth` entry of the results JSON: accuracy, per-query accuracy, iterations and halting figures."""
    return {
        "depth": int(depth),
        "accuracy": overall_state_accuracy(answers, targets),
        "per_query_accuracy": dict(zip(query_names, per_query_accuracy(answers, targets).tolist())),
        "mean_iterations": float(iterations.mean()),
        "fraction_not_halted": float(1.0 - halted.mean()),
        # halting: the confirmed samples alone (never-halted ones ran to the limit and are flagged above)
        "mean_iterations_halted": float(iterations[halted].mean()) if halted.any() else None,
        "accuracy_halted": overall_state_accuracy(answers[halted], targets[halted]) if halted.any() else None,
        "num_iterations": num_iterations,
        "n": int(len(answers)),
    }


STOP_BELOW = 0.02  # the stop rule: two consecutive depths under this end a grid (d50 is already placed)


def evaluate_until_failed(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    depths: Sequence[int],
    mode: str = "forced",
    train_max_depth: int | None = None,
    stop_below: float = STOP_BELOW,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`evaluate_length_generalization` depth by depth in ascending order, stopping after two consecutive
    depths whose accuracy is under `stop_below` (longer depths of a dead curve cost time and cannot move d50).

    Each depth's problems are the same as in a one-call evaluation (they depend on (seed, depth) only).
    Returns the same keys as :func:`evaluate_length_generalization` over the depths run, plus ``grid`` (the depths
    asked for) and ``stopped_early`` (True when the rule cut the grid).
    """
    if not 0 <= stop_below < 1:
        raise ValueError(f"stop_below must be in [0, 1), got {stop_below!r}")
    grid = check_test_depths(depths)
    rows, results, low = [], None, 0
    for depth in grid:
        results = evaluate_length_generalization(model, tokenizer, task, [depth], mode=mode,
                                                 train_max_depth=train_max_depth, **kwargs)
        rows.append(results["per_depth"][0])
        low = low + 1 if rows[-1]["accuracy"] < stop_below else 0
        if low == 2:
            break
    done = [row["depth"] for row in rows]
    accuracies = [row["accuracy"] for row in rows]
    results.update(
        depths=done, accuracy=accuracies, per_depth=rows, d50=longest_accurate_depth(done, accuracies),
        extrapolation_factor=(None if train_max_depth is None
                              else extrapolation_factor(done, accuracies, train_max_depth)),
        extrapolation_factor_is_lower_bound=bool(min(accuracies) >= ACCURACY_THRESHOLD),
        grid=grid, stopped_early=len(done) < len(grid), stop_below=stop_below,
    )
    return results


def environment_info(device: str | torch.device | None = None) -> dict[str, Any]:
    """Versions, date and machine, for the record."""
    import datasets
    import tokenizers
    import transformers

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "datasets": datasets.__version__,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "device": str(device),
        "git_commit": _git_commit(),
    }
    if device is not None and torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def repo_relative(path: str | os.PathLike) -> str:
    """`path` relative to the repository holding this package when it lies inside it, else as given: recorded
    commands and paths carry no machine-specific prefix."""
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def command_line(script: str | os.PathLike, argv) -> str:
    """The command that ran `script` with `argv`, shell-quoted (``shlex.join``) so that it runs again as recorded:
    ``python examples/train_par.py --operation_delimiter ';' ...``."""
    import shlex

    return "python " + shlex.join([repo_relative(script), *(str(a) for a in argv)])


def _git_commit() -> str | None:
    """HEAD of the repository holding this package, or None outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def to_json(value: Any) -> Any:
    """Plain-Python copy of nested config values (tuples -> lists, numpy/torch scalars -> numbers)."""
    return json.loads(json.dumps(value, default=lambda x: x.item() if hasattr(x, "item") else str(x)))


def save_results(results: dict[str, Any], path: str | os.PathLike) -> None:
    """Write results as indented JSON (creating the folder)."""
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def legend_label(label: str, results: list[dict]) -> str:
    """A plot line's legend: what `label` is an average of — one records evaluation's record count ("test (100
    records)"), else the number of seeds ("PAR (3 seeds)")."""
    if len(results) == 1 and "n_records" in results[0]:
        return f"{label} ({results[0]['n_records']} records)"
    return f"{label} ({len(results)} seed{'s' if len(results) > 1 else ''})"


def plot_accuracy_vs_depth(
    runs: dict[str, list[dict[str, Any]]], path: str | os.PathLike, title: str | None = None
) -> None:
    """Accuracy vs depth (log x), one curve per run: mean over its seeds with a ± sd band.

    Args:
        runs: label -> result dicts of :func:`evaluate_length_generalization` (one per seed),
            all with the same depths.
        path: PNG file to write.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not runs:
        raise ValueError("runs must map at least one label to a list of results")
    figure = Figure(figsize=(6.0, 4.0))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    train_depths = set()
    for label, results in runs.items():
        if not results:
            raise ValueError(f"run {label!r} has no results")
        depths = results[0]["depths"]
        if any(r["depths"] != depths for r in results):
            raise ValueError(f"all results of run {label!r} must share the same depths")
        accuracy = np.array([r["accuracy"] for r in results])  # (seeds, depths)
        mean = accuracy.mean(axis=0)
        sd = accuracy.std(axis=0, ddof=1) if len(results) > 1 else np.zeros_like(mean)
        line = axes.plot(depths, mean, marker="o", label=legend_label(label, results))[0]
        axes.fill_between(depths, np.clip(mean - sd, 0, 1), np.clip(mean + sd, 0, 1), color=line.get_color(), alpha=0.2)
        train_depths.update(r["train_max_depth"] for r in results if r.get("train_max_depth"))
    for depth in sorted(train_depths):
        axes.axvline(depth, color="gray", linestyle="--", linewidth=1)
    axes.axhline(ACCURACY_THRESHOLD, color="gray", linestyle=":", linewidth=1)
    axes.set_xscale("log", base=2)
    axes.set_ylim(-0.02, 1.02)
    axes.set_xlabel("depth d (operations)")
    axes.set_ylabel("overall state accuracy")
    if title:
        axes.set_title(title)
    axes.legend(loc="lower left", fontsize="small")
    axes.grid(True, which="both", alpha=0.3)
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
