"""Small Trainer callbacks."""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from state_tracking import StateTrackingCollator, encode_batch, model_token_ids, overall_state_accuracy
from state_tracking.evaluation import draw_test_problems, phrasing_rng
from state_tracking.records import longest_records

from .arguments import PROBE_METRIC
from .distributed import distributed_running
from .schedules import curriculum_done

logger = logging.getLogger(__name__)


def any_rank(flag: bool, device) -> bool:
    """Whether `flag` holds on any rank (itself outside DDP): a stop every rank takes at the same step, or DDP hangs."""
    value = torch.tensor([float(flag)], device=device)
    if distributed_running():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item() > 0


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Stop training (cleanly, with the usual end-of-training save) once `seconds` of training wall time have passed.
    Pair it with a constant or warmup-only learning-rate schedule: a budget cuts any schedule that is defined over
    `max_steps`.

    The budget spans resumed segments: the time trained so far is saved in each checkpoint (`trainer_state.json`,
    `stateful_callbacks`), and a run resumed with `restore_callback_states_from_checkpoint=True` (train_par.py's
    default) goes on counting from it; under ParTrainer the resumed run's `max_train_seconds` is the budget (a plain
    Trainer restores the checkpoint's). Time after the last checkpoint of an interrupted segment is not counted (its
    steps are redone).

    A stop is said: logged as {"step", "time_budget_stop": seconds} (summary.json's `stopped_by`:
    "max_train_seconds") and printed, since a run cut by wall time trains fewer steps on a busier machine. A budget
    reached at the last step of `max_steps` is not a stop of its own (the step budget ended the run)."""

    def __init__(self, seconds: float, elapsed_before: float = 0.0):
        if seconds <= 0:
            raise ValueError(f"TimeBudgetCallback.seconds must be > 0; got {seconds!r}.")
        if elapsed_before < 0:
            raise ValueError(f"TimeBudgetCallback.elapsed_before must be >= 0; got {elapsed_before!r}.")
        self.seconds = seconds
        self.elapsed_before = float(elapsed_before)  # trained in earlier segments (restored from a checkpoint)
        self.started = None

    def elapsed(self) -> float:
        """Training seconds so far, earlier segments included."""
        return self.elapsed_before + (0.0 if self.started is None else time.monotonic() - self.started)

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if any_rank(self.elapsed() >= self.seconds, args.device):
            control.should_training_stop = True
            if state.is_world_process_zero and state.global_step < state.max_steps:
                state.log_history.append({"step": state.global_step, "time_budget_stop": self.seconds})
                print(f"max_train_seconds: {self.seconds:g} s of training reached at step {state.global_step} of "
                      f"{state.max_steps}: stopping (a wall-clock cap: on a busier machine the same command trains "
                      "fewer steps)", flush=True)
        return control

    def state(self) -> dict:
        return {"args": {"seconds": self.seconds, "elapsed_before": round(self.elapsed(), 3)}, "attributes": {}}


def freeze_prelude_weights(model) -> None:
    """Stop training the prelude P's layers: requires_grad off and their gradients dropped, so AdamW (which skips
    parameters without a gradient) leaves them as they are from here on."""
    prelude = getattr(model, "module", model).prelude
    prelude.requires_grad_(False)
    for parameter in prelude.parameters():
        parameter.grad = None


class FreezePreludeCallback(TrainerCallback):
    """--freeze_prelude_from_step N: the prelude trains for the first N optimizer steps, then stops (at step N, and at
    once when a run resumes past N). Core, coda, adapter (and the embeddings, unless frozen) train throughout."""

    def __init__(self, step: int):
        self.step = step
        self.frozen = False

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if not self.frozen and state.global_step >= self.step:
            freeze_prelude_weights(model)
            self.frozen = True
        return control


def checkpoint_complete(checkpoint: str | Path) -> bool:
    """Whether a Trainer checkpoint folder was saved to the end: it holds trainer_state.json, the file
    `Trainer._save_checkpoint` writes after the weights, optimizer, scheduler and RNG states. A save cut off
    part-way (the process stopped) leaves the weights without it, and resuming from such a folder would silently
    restart the step count and the learning-rate schedule from 0."""
    return (Path(checkpoint) / "trainer_state.json").is_file()


def last_complete_checkpoint(folder: str | Path) -> Path | None:
    """The newest complete checkpoint-<step> folder under `folder` (`checkpoint_complete`), or None. Newer
    incomplete ones are skipped with a warning naming them (they are left on disk: delete them, or let
    save_total_limit rotate them away)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    steps = sorted((int(p.name[len(PREFIX_CHECKPOINT_DIR) + 1:]), p) for p in folder.iterdir()
                   if p.is_dir() and p.name.startswith(PREFIX_CHECKPOINT_DIR + "-")
                   and p.name[len(PREFIX_CHECKPOINT_DIR) + 1:].isdigit())
    for _, path in reversed(steps):
        if checkpoint_complete(path):
            return path
        warnings.warn(f"{path} is an incomplete checkpoint (no trainer_state.json: its saving was cut off); "
                      "skipping it", stacklevel=2)
    return None


def require_complete_checkpoint(checkpoint: str | Path) -> None:
    """One clear error for `--resume_from_checkpoint` naming a folder that is not a complete checkpoint."""
    path = Path(checkpoint)
    if not path.is_dir():
        raise ValueError(f"resume_from_checkpoint: {checkpoint} is not a directory")
    if not checkpoint_complete(path):
        raise ValueError(f"resume_from_checkpoint: {checkpoint} has no trainer_state.json: its saving was cut off "
                         "(or it is not a Trainer checkpoint); resume from an earlier complete checkpoint-<step>")


def trained_seconds(checkpoint: str | Path) -> float:
    """Training seconds a checkpoint had counted (earlier segments included): what `TimeBudgetCallback.state`
    stored in its `trainer_state.json`; 0 for a checkpoint saved without a budget."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    saved = state.get("stateful_callbacks", {}).get(TimeBudgetCallback.__name__, {})
    return float(saved.get("args", {}).get("elapsed_before", 0.0))


def probe_stop(accuracies: Sequence[float], stop_accuracy: float | None, patience: int, steps_done: int,
               curriculum_cap: Callable[[int], int] | None = None, max_depth: int | None = None) -> bool:
    """The early-stop rule of every probe (`ProbeCallback`: train_par.py's task and records probes; the RNN
    baseline's validation probe): stop once the last `patience` probe accuracies all reached `stop_accuracy` (never
    without one; a step-0 probe counts like any other) and, given the curriculum (`curriculum_cap`: d_max at a 0-based
    optimizer step), it has reached the longest training length `max_depth` within the `steps_done` steps trained
    (`curriculum_done`). Held-out records longer than the cap are often exact before the cap gets there, and a run
    stopped then has never trained on its longest records (measured: results/own_data_cpu/README.md)."""
    if stop_accuracy is None or len(accuracies) < patience or min(accuracies[-patience:]) < stop_accuracy:
        return False
    return curriculum_cap is None or curriculum_done(curriculum_cap, steps_done, max_depth)


class ProbeCallback(TrainerCallback):
    """An accuracy probe every `every_steps` optimizer steps (and at step 0 of a fresh run with `at_start`) that
    reports one metric, `probe_accuracy`: each probe appends {"step", "probe_accuracy", "probe_n", ...} to
    `state.log_history` before that step's checkpoint is saved, so every checkpoint's `trainer_state.json` holds the
    curve so far. Subclasses say what is probed (`evaluate`, `describe`). Only the main process probes; its time
    counts as training time (`TimeBudgetCallback`).

    Early stop (`stop_accuracy`, off by default): `probe_stop` over the probes of the log history (so the count
    survives a resume), gated with `curriculum_cap` (`ParTrainer.curriculum_cap`) on the curriculum reaching
    `args.max_train_depth`; the step it stopped at is logged as {"step", "probe_stop": stop_accuracy} and its
    checkpoint saved.

    The best model, with the Trainer's own machinery: with `args.metric_for_best_model = "probe_accuracy"` a probe
    more accurate than every earlier one (after step 0) is the Trainer's best (`state.best_metric`,
    `best_global_step`, `best_model_checkpoint`) and its step's checkpoint is saved (`checkpoint-<step>`, kept by
    `save_total_limit`'s rotation); the last step of training is probed too, and its weights are the best when they
    score at least as well (final weights as good as the best stay). With `args.load_best_model_at_end` the Trainer
    loads the best checkpoint when training ends, logged as {"step", "probe_restored_step",
    "probe_restored_accuracy"} when it is not the last step's. The best lives in `trainer_state.json`, so a resumed run
    compares with the probes before the resume."""

    metric = PROBE_METRIC

    def __init__(self, n: int, every_steps: int, batch_size: int, at_start: bool, stop_accuracy: float | None,
                 stop_patience: int, curriculum_cap: Callable[[int], int] | None = None):
        name = type(self).__name__
        for field, value in (("n", n), ("every_steps", every_steps), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}.{field} must be an integer >= 1; got {value!r}.")
        if stop_accuracy is not None and (isinstance(stop_accuracy, bool) or not 0 < stop_accuracy <= 1):
            raise ValueError(f"{name}.stop_accuracy must be None or in (0, 1]; got {stop_accuracy!r}.")
        if isinstance(stop_patience, bool) or not isinstance(stop_patience, int) or stop_patience < 1:
            raise ValueError(f"{name}.stop_patience must be an integer >= 1; got {stop_patience!r}.")
        self.n, self.every_steps, self.batch_size, self.at_start = n, every_steps, batch_size, at_start
        self.stop_accuracy, self.stop_patience, self.curriculum_cap = stop_accuracy, stop_patience, curriculum_cap
        self.eager = False  # set once torch.compile failed on the probe's shapes (`_evaluate_compiled_or_eager`)

    def evaluate(self, model) -> float:
        """The probe's accuracy under `model` (left in the train/eval mode it came in)."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What each log entry says about the probe besides its accuracy."""
        return {"probe_n": self.n}

    def tracks_best(self, args) -> bool:
        """Whether the Trainer's best model follows this probe (`metric_for_best_model` names its metric)."""
        return getattr(args, "metric_for_best_model", None) == self.metric

    def _probe(self, state, model) -> float | None:
        """Probe and log (the main process); None on the other ranks."""
        if not state.is_world_process_zero:
            return None
        entry = {"step": state.global_step, self.metric: self._evaluate_compiled_or_eager(model), **self.describe()}
        state.log_history.append(entry)
        print(entry, flush=True)
        return entry[self.metric]

    def _evaluate_compiled_or_eager(self, model) -> float:
        """`evaluate(model)`; where the model's compiled parts (`compile_core`) fail to compile on the probe's shapes
        (measured: an InductorError on a dynamic-shape guard at the first probe after a resume, once the training
        steps had made the shapes dynamic), this probe and every later one run eagerly, the same computation, while
        training stays compiled. Any other error is raised."""
        from .model_setup import is_compiler_error

        loop = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper's PAR model
        compiled = getattr(loop, "compiled", None)
        if compiled is None:
            return self.evaluate(model)
        if not self.eager:
            try:
                return self.evaluate(model)
            except Exception as error:
                if not is_compiler_error(error):
                    raise
                self.eager = True
                warnings.warn(f"{type(self).__name__}: torch.compile failed on the probe's shapes "
                              f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); probing eagerly from "
                              "now on (the same computation), training stays compiled", stacklevel=2)
        loop.compiled = None
        try:
            return self.evaluate(model)
        finally:
            loop.compiled = compiled

    def should_stop(self, log_history: list[dict], steps_done: int, max_depth: int | None = None) -> bool:
        """`probe_stop` over the probes logged in `log_history`, `steps_done` optimizer steps into training."""
        probes = [row[self.metric] for row in log_history if self.metric in row]
        return probe_stop(probes, self.stop_accuracy, self.stop_patience, steps_done, self.curriculum_cap, max_depth)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_start and state.global_step == 0:
            self._probe(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # the last step (a step cap, a time budget or a callback before this one ends training here)
        last = control.should_training_stop or state.global_step >= state.max_steps
        tracks, scheduled = self.tracks_best(args), state.global_step % self.every_steps == 0
        if not scheduled and not (last and tracks):
            return control
        accuracy = self._probe(state, model)
        # only rank 0 probes, so only it can say stop (or best); every rank takes its word at the same step
        if scheduled and self.stop_accuracy is not None and any_rank(
                state.is_world_process_zero and self.should_stop(
                    state.log_history, state.global_step,
                    None if self.curriculum_cap is None else args.max_train_depth), args.device):
            if state.is_world_process_zero:
                state.log_history.append({"step": state.global_step, "probe_stop": self.stop_accuracy})
                print(f"probe: the last {self.stop_patience} probes reached {self.stop_accuracy}: stopping at step "
                      f"{state.global_step}", flush=True)
            control.should_training_stop = control.should_save = last = True
        if tracks:
            self._track_best(args, state, control, accuracy, last)
        return control

    def _track_best(self, args, state, control, accuracy: float | None, last: bool) -> None:
        """This step is the Trainer's best when its probe beats every earlier one (at the last step: equals it); its
        checkpoint is then saved, where `best_model_checkpoint` names it."""
        best = state.best_metric
        better = accuracy is not None and (best is None or accuracy > best or (last and accuracy >= best))
        if not any_rank(better, args.device):
            return
        if accuracy is not None:
            state.best_metric = accuracy
        state.best_global_step = state.global_step
        state.best_model_checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        control.should_save = True

    def on_train_end(self, args, state, control, **kwargs):
        """Say so when the Trainer has loaded an earlier probe's weights (`load_best_model_at_end`)."""
        step, folder = state.best_global_step, state.best_model_checkpoint
        if (not self.tracks_best(args) or not args.load_best_model_at_end or not state.is_world_process_zero
                or step is None or step == state.global_step or folder is None or not os.path.isdir(folder)):
            return control
        state.log_history.append({"step": state.global_step, "probe_restored_step": step,
                                  "probe_restored_accuracy": state.best_metric})
        last = next((row for row in reversed(state.log_history) if self.metric in row), None)
        final = (f"the final weights scored {last[self.metric]:.4f}, below the best probe" if last is not None
                 and last["step"] == state.global_step else "the final weights were not probed; the best probe")
        print(f"probe: {final}, at step {step} ({state.best_metric:.4f}): its weights are restored ({folder})",
              flush=True)
        return control


class StateAccuracyProbeCallback(ProbeCallback):
    """Overall state accuracy (every query right) at forced depth R = ⌈depth / c⌉ on a fixed probe set, every
    `every_steps` optimizer steps and at step 0 of a fresh run: `n` sequences of `depth` operations drawn once by
    `state_tracking.evaluation.draw_test_problems(task, depth, n, seed)` — the problems `evaluate_length_generalization`
    scores at that depth with the same n and seed, and scored as it does (encode_batch, right padding, forced R,
    `overall_state_accuracy`; the same numbers, tested). Logged as {"step", "probe_accuracy", "probe_depth",
    "probe_n"} (and "probe_phrasing" unless canonical); early stop and best model as `ProbeCallback`'s.

    `phrasing` (text rendering): the sentences of the probe's prompts, ``canonical``, ``seen`` or ``held_out``
    (`Task.phrasing_options`), drawn as the evaluator draws them for that phrasing, seed and depth: a probe on the
    held-out wordings follows, over training, what `evaluate_length_generalization(phrasing="held_out")` measures.

    Nothing needs restoring on resume: the probe set is drawn again from its seed (the same problems) and the curve
    comes back with the checkpoint's log history. The probe touches no random state of training (its problems have
    their own generator; the model runs in eval mode and is put back in train mode).

    It predicts under `torch.no_grad`, not the evaluator's `inference_mode`: a tensor the model caches on its first
    call (the LM-head rows of the candidates) would otherwise be an inference tensor that the next training step
    cannot save for backward, and under `compile_core` inference-mode inputs compile graphs of their own (the
    no-grad ones are those training already uses for iterations outside the gradient window and the EMA teacher),
    which brings the recompile limit, past which a part runs eager, closer."""

    def __init__(self, tokenizer, task, depth: int, n: int = 256, every_steps: int = 250, seed: int = 0,
                 rendering: str = "symbolic", random_initial: bool = False, batch_size: int = 256,
                 fixed_iterations: int | None = None, at_start: bool = True, stop_accuracy: float | None = None,
                 stop_patience: int = 2, curriculum_cap: Callable[[int], int] | None = None,
                 phrasing: str = "canonical"):
        super().__init__(n, every_steps, batch_size, at_start, stop_accuracy, stop_patience, curriculum_cap)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"StateAccuracyProbeCallback.depth must be an integer >= 1; got {depth!r}.")
        if phrasing != "canonical" and rendering != "text":
            raise ValueError(f"StateAccuracyProbeCallback.phrasing {phrasing!r} needs the text rendering (the "
                             f"{rendering!r} rendering has one phrasing: 'canonical').")
        task.phrasing_options(phrasing)  # checks the name
        if fixed_iterations is not None and (isinstance(fixed_iterations, bool) or fixed_iterations < 1):
            raise ValueError(f"StateAccuracyProbeCallback.fixed_iterations must be None or >= 1; got "
                             f"{fixed_iterations!r}.")
        self.depth, self.seed, self.fixed_iterations, self.phrasing = depth, seed, fixed_iterations, phrasing
        ops, initial = draw_test_problems(task, depth, n, seed, random_initial)  # (n, d), (n, Q) or None
        self.ops = ops
        self.targets = task.final_states(ops, initial)  # (n, Q)
        self.encoded = encode_batch(task, tokenizer, rendering, ops, initial, phrasing,
                                    phrasing_rng(phrasing, seed, depth))
        self.collate = StateTrackingCollator(model_token_ids(tokenizer, task)["pad_token_id"], padding_side="right")

    def describe(self) -> dict:
        return {"probe_depth": self.depth, "probe_n": self.n,
                **({} if self.phrasing == "canonical" else {"probe_phrasing": self.phrasing})}

    def evaluate(self, model) -> float:
        """The probe set's overall state accuracy under `model` (left in the train/eval mode it came in)."""
        was_training = model.training
        model.eval()
        num_iterations = self.fixed_iterations or math.ceil(self.depth / model.config.step_size)
        takes_operation_ends = "operation_ends" in inspect.signature(model.predict).parameters
        answers = []
        try:
            for start in range(0, self.n, self.batch_size):
                rows = slice(start, min(start + self.batch_size, self.n))
                batch = self.collate({key: column[rows] for key, column in self.encoded.items()})
                batch = {key: value.to(model.device) for key, value in batch.items()}
                inputs = {"attention_mask": batch["attention_mask"], "query_positions": batch["query_positions"]}
                if takes_operation_ends:
                    inputs["operation_ends"] = batch["operation_ends"]
                with torch.no_grad():
                    answers.append(model.predict(batch["input_ids"], **inputs, num_iterations=num_iterations)
                                   .answers.cpu().numpy())
        finally:
            model.train(was_training)
        return overall_state_accuracy(np.concatenate(answers), self.targets)


def majority_accuracy(states: np.ndarray) -> float:
    """The overall state accuracy of answering every record with their most common state: (n, Q) -> share."""
    _, counts = np.unique(states.reshape(len(states), -1), axis=0, return_counts=True)
    return float(counts.max() / len(states)) if len(states) else 0.0


def learning_outcome(log_history: list[dict]) -> dict | None:
    """summary.json's "learning": the majority answer's accuracy on the probed validation records beside the last
    probe, whether the run ended at chance (its last probe no better), and the step a learned-nothing stop
    (`--stop_when_learning_nothing_after`) ended it at; a warning when it ended at chance. None without probes."""
    probes = [row for row in log_history if "probe_majority" in row]
    if not probes:
        return None
    last = probes[-1]
    at_chance = last["probe_accuracy"] <= last["probe_majority"]
    stopped = next((row["step"] for row in log_history if "probe_at_chance_stop" in row), None)
    if at_chance:
        logger.warning("this run learned nothing measurable: its last validation probe (step %d) is %.4f, no better "
                       "than answering every probed record with their most common final state (%.4f).%s",
                       last["step"], last["probe_accuracy"], last["probe_majority"],
                       " It was stopped for that (--stop_when_learning_nothing_after)." if stopped is not None else "")
    return {"majority_accuracy": last["probe_majority"], "last_probe": last["probe_accuracy"],
            "last_probe_step": last["step"], "at_chance": at_chance, "stopped_at_chance": stopped}


class RecordsProbeCallback(ProbeCallback):
    """The probe on recorded data: overall state accuracy of the final answer (forced R = ⌈d / c⌉ per record) on the
    `n` longest records of an encoded split (`longest_records`; `state_tracking.records.encode_records` output, the
    validation split), every `every_steps` optimizer steps; logged as {"step", "probe_accuracy", "probe_split",
    "probe_n"}. Early stop and best model as `ProbeCallback`'s: train_par.py stops a run whose held-out validation
    records are exact (once the curriculum has reached the longest training length) instead of running to its step
    cap, and with --restore_best_probe ends it with the weights of its best probe."""

    def __init__(self, encoded, pad_token_id: int, split: str = "validation", n: int = 256, every_steps: int = 250,
                 batch_size: int = 256, at_start: bool = False, stop_accuracy: float | None = None,
                 stop_patience: int = 2, curriculum_cap: Callable[[int], int] | None = None,
                 stop_at_chance_after: int | None = None):
        super().__init__(n, every_steps, batch_size, at_start, stop_accuracy, stop_patience, curriculum_cap)
        after = stop_at_chance_after
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 1):
            raise ValueError(f"RecordsProbeCallback.stop_at_chance_after must be None or an integer >= 1; got "
                             f"{stop_at_chance_after!r}.")
        self.stop_at_chance_after = stop_at_chance_after
        if len(encoded) == 0:
            raise ValueError("RecordsProbeCallback: the split to probe holds no record.")
        part = longest_records(encoded, n)
        self.split, self.n = split, len(part)
        self.groups = records_by_length(part)
        self.collate = StateTrackingCollator(pad_token_id, padding_side="right")
        self.majority = majority_accuracy(np.concatenate([targets for _, _, targets in self.groups]))

    def describe(self) -> dict:
        return {"probe_split": self.split, "probe_n": self.n, "probe_majority": self.majority}

    def at_chance(self, accuracy: float) -> bool:
        """Whether a probe did no better than answering every probed record with their most common final state."""
        return accuracy <= self.majority

    def on_step_end(self, args, state, control, model=None, **kwargs):
        """The probe (`ProbeCallback.on_step_end`), then, with `stop_at_chance_after`, the learned-nothing stop: from
        that step on, the last `stop_patience` probes all at chance (`at_chance`) end training, logged as {"step",
        "probe_at_chance_stop": the majority answer's accuracy}."""
        control = super().on_step_end(args, state, control, model=model, **kwargs)
        after = self.stop_at_chance_after
        if after is None or control.should_training_stop or state.global_step < after:
            return control
        if state.global_step % self.every_steps:
            return control
        probes = [row[self.metric] for row in state.log_history if self.metric in row and row["step"] > 0]
        stop = len(probes) >= self.stop_patience and all(self.at_chance(a) for a in probes[-self.stop_patience:])
        if any_rank(state.is_world_process_zero and stop, args.device):
            if state.is_world_process_zero:
                state.log_history.append({"step": state.global_step, "probe_at_chance_stop": self.majority})
                print(f"probe: the last {self.stop_patience} probes were no better than the majority answer "
                      f"({self.majority:.4f}) at step {state.global_step} (>= {after}): stopping", flush=True)
            control.should_training_stop = control.should_save = True
        return control

    def evaluate(self, model) -> float:
        """The probed records' overall state accuracy under `model` (left in the mode it came in)."""
        answers, targets = final_answers(model, self.groups, self.collate, self.batch_size)
        return int((answers == targets).all(-1).sum()) / self.n


def records_by_length(part) -> list[tuple[int, dict, np.ndarray]]:
    """An encoded split's records grouped by length (one forced depth per batch): (length, their input columns, their
    final states), lengths ascending."""
    depth = np.asarray(part["depth"], dtype=np.int64)
    labels = part["step_labels"]
    columns = {k: part[k] for k in ("input_ids", "query_positions", "operation_ends")}
    return [(int(d), {k: [v[i] for i in np.flatnonzero(depth == d)] for k, v in columns.items()},
             np.array([labels[i][d] for i in np.flatnonzero(depth == d)], dtype=np.int64))
            for d in np.unique(depth)]


def final_answers(model, groups: list, collate, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`model`'s final answers (forced R = ⌈d / c⌉ per record) to the records of `groups` (`records_by_length`) and
    their final states, both (records, queries) in the groups' order; the model is left in the mode it came in."""
    was_training = model.training
    model.eval()
    answers = []
    try:
        for depth, columns, targets in groups:
            num_iterations = math.ceil(int(depth) / model.config.step_size)
            for start in range(0, len(targets), batch_size):
                batch = collate({k: v[start:start + batch_size] for k, v in columns.items()})
                batch = {k: v.to(model.device) for k, v in batch.items()}
                with torch.no_grad():
                    answers.append(model.predict(
                        batch["input_ids"], attention_mask=batch["attention_mask"],
                        query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                        num_iterations=num_iterations).answers.cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(answers), np.concatenate([targets for _, _, targets in groups])
