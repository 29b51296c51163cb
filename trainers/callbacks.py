"""Small Trainer callbacks."""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from state_tracking import StateTrackingCollator, encode_batch, model_token_ids, overall_state_accuracy
from state_tracking.evaluation import draw_test_problems
from state_tracking.records import longest_records

from .distributed import distributed_running


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
    steps are redone)."""

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
        return control

    def state(self) -> dict:
        return {"args": {"seconds": self.seconds, "elapsed_before": round(self.elapsed(), 3)}, "attributes": {}}


def trained_seconds(checkpoint: str | Path) -> float:
    """Training seconds a checkpoint had counted (earlier segments included): what `TimeBudgetCallback.state`
    stored in its `trainer_state.json`; 0 for a checkpoint saved without a budget."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    saved = state.get("stateful_callbacks", {}).get(TimeBudgetCallback.__name__, {})
    return float(saved.get("args", {}).get("elapsed_before", 0.0))


class StateAccuracyProbeCallback(TrainerCallback):
    """Overall state accuracy (every query right) at forced depth R = ⌈depth / c⌉ on a fixed probe set, every
    `every_steps` optimizer steps and at step 0 of a fresh run: `n` sequences of `depth` operations drawn once by
    `state_tracking.evaluation.draw_test_problems(task, depth, n, seed)` — the problems `evaluate_length_generalization`
    scores at that depth with the same n and seed, and scored as it does (encode_batch, right padding, forced R,
    `overall_state_accuracy`; the same numbers, tested).

    Each probe appends {"step", "probe_accuracy", "probe_depth", "probe_n"} to `state.log_history` before that
    step's checkpoint is saved, so every checkpoint's `trainer_state.json` holds the curve so far. Nothing needs
    restoring on resume: the probe set is drawn again from its seed (the same problems) and the curve comes back with
    the checkpoint's log history. The probe touches no random state of training (its problems have their own
    generator; the model runs in eval mode and is put back in train mode).

    It predicts under `torch.no_grad`, not the evaluator's `inference_mode`: a tensor the model caches on its first
    call (the LM-head rows of the candidates) would otherwise be an inference tensor that the next training step
    cannot save for backward, and under `compile_core` inference-mode inputs compile graphs of their own (the
    no-grad ones are those training already uses for iterations outside the gradient window and the EMA teacher),
    which brings the recompile limit, past which a part runs eager, closer. Only the main process probes; its time
    counts as training time (`TimeBudgetCallback`).

    Early stop (`stop_accuracy`, off by default): training stops once the last `stop_patience` probes all reached
    `stop_accuracy` (the count is read from the log history, so it survives a resume); the step it stopped at is
    logged as {"step", "probe_stop": stop_accuracy}. A run that has learned its probe set stops spending steps on it;
    the checkpoint of that step is saved as usual (probes fall on save steps when every_steps = save_steps)."""

    def __init__(self, tokenizer, task, depth: int, n: int = 256, every_steps: int = 250, seed: int = 0,
                 rendering: str = "symbolic", random_initial: bool = False, batch_size: int = 256,
                 fixed_iterations: int | None = None, at_start: bool = True, stop_accuracy: float | None = None,
                 stop_patience: int = 2, stop_after: Callable[[int], bool] | None = None):
        for name, value in (("depth", depth), ("n", n), ("every_steps", every_steps), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StateAccuracyProbeCallback.{name} must be an integer >= 1; got {value!r}.")
        if fixed_iterations is not None and (isinstance(fixed_iterations, bool) or fixed_iterations < 1):
            raise ValueError(f"StateAccuracyProbeCallback.fixed_iterations must be None or >= 1; got "
                             f"{fixed_iterations!r}.")
        if stop_accuracy is not None and (isinstance(stop_accuracy, bool) or not 0 < stop_accuracy <= 1):
            raise ValueError(f"StateAccuracyProbeCallback.stop_accuracy must be None or in (0, 1]; got "
                             f"{stop_accuracy!r}.")
        if isinstance(stop_patience, bool) or not isinstance(stop_patience, int) or stop_patience < 1:
            raise ValueError(f"StateAccuracyProbeCallback.stop_patience must be an integer >= 1; got {stop_patience!r}.")
        self.stop_accuracy, self.stop_patience, self.stop_after = stop_accuracy, stop_patience, stop_after
        self.depth, self.n, self.every_steps, self.seed = depth, n, every_steps, seed
        self.batch_size, self.fixed_iterations, self.at_start = batch_size, fixed_iterations, at_start
        ops, initial = draw_test_problems(task, depth, n, seed, random_initial)  # (n, d), (n, Q) or None
        self.ops = ops
        self.targets = task.final_states(ops, initial)  # (n, Q)
        self.encoded = encode_batch(task, tokenizer, rendering, ops, initial)
        self.collate = StateTrackingCollator(model_token_ids(tokenizer, task)["pad_token_id"], padding_side="right")

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

    def _probe(self, state, model) -> None:
        if not state.is_world_process_zero:
            return
        entry = {"step": state.global_step, "probe_accuracy": self.evaluate(model), "probe_depth": self.depth,
                 "probe_n": self.n}
        state.log_history.append(entry)
        print(entry, flush=True)

    def should_stop(self, log_history: list[dict], step: int | None = None) -> bool:
        """True when the last `stop_patience` probes in `log_history` all reached `stop_accuracy` (never without it;
        the step-0 probe counts like any other) and, with `stop_after`, `stop_after(step)` holds (the curriculum has
        reached the longest training length: a probe exact on lengths not yet trained does not end training)."""
        if self.stop_accuracy is None or (self.stop_after is not None and step is not None
                                          and not self.stop_after(step)):
            return False
        probes = [row["probe_accuracy"] for row in log_history if "probe_accuracy" in row]
        return len(probes) >= self.stop_patience and min(probes[-self.stop_patience:]) >= self.stop_accuracy

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_start and state.global_step == 0:
            self._probe(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every_steps != 0:
            return control
        self._probe(state, model)
        if self.stop_accuracy is None:
            return control
        # only rank 0 probes, so only it can say stop
        if any_rank(state.is_world_process_zero and self.should_stop(state.log_history, state.global_step),
                   args.device):
            if state.is_world_process_zero:
                state.log_history.append({"step": state.global_step, "probe_stop": self.stop_accuracy})
                print(f"probe: the last {self.stop_patience} probes reached {self.stop_accuracy}: stopping at step "
                      f"{state.global_step}", flush=True)
            control.should_training_stop = True
            control.should_save = True
        return control


class RecordsProbeCallback(StateAccuracyProbeCallback):
    """The probe on recorded data: overall state accuracy of the final answer (forced R = ⌈d / c⌉ per record) on the
    `n` longest records of an encoded split (`longest_records`) (`state_tracking.records.encode_records` output, the validation split),
    every `every_steps` optimizer steps; logged as {"step", "probe_accuracy", "probe_split", "probe_n"}. Early stop
    as the task probe's: training stops once the last `stop_patience` probes reached `stop_accuracy` (a run whose
    held-out validation records are exact stops instead of running to its step cap). `keep_best`: the run ends with
    the weights of its best probe (`on_train_end`)."""

    def __init__(self, encoded, pad_token_id: int, split: str = "validation", n: int = 256, every_steps: int = 250,
                 batch_size: int = 256, at_start: bool = False, stop_accuracy: float | None = None,
                 stop_patience: int = 2, stop_after: Callable[[int], bool] | None = None, keep_best: bool = False):
        self.keep_best, self.best = keep_best, None  # best: (accuracy, step, the weights then), in memory
        for name, value in (("n", n), ("every_steps", every_steps), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RecordsProbeCallback.{name} must be an integer >= 1; got {value!r}.")
        if stop_accuracy is not None and (isinstance(stop_accuracy, bool) or not 0 < stop_accuracy <= 1):
            raise ValueError(f"RecordsProbeCallback.stop_accuracy must be None or in (0, 1]; got {stop_accuracy!r}.")
        if isinstance(stop_patience, bool) or not isinstance(stop_patience, int) or stop_patience < 1:
            raise ValueError(f"RecordsProbeCallback.stop_patience must be an integer >= 1; got {stop_patience!r}.")
        if len(encoded) == 0:
            raise ValueError("RecordsProbeCallback: the split to probe holds no record.")
        part = longest_records(encoded, n)
        self.split, self.n, self.every_steps, self.batch_size, self.at_start = split, len(part), every_steps, \
            batch_size, at_start
        self.stop_accuracy, self.stop_patience, self.stop_after = stop_accuracy, stop_patience, stop_after
        depth = np.asarray(part["depth"], dtype=np.int64)
        labels = part["step_labels"]
        columns = {k: part[k] for k in ("input_ids", "query_positions", "operation_ends")}
        # (rows, their columns, their final states) per length: one forced depth per batch
        self.groups = [(d, {k: [v[i] for i in np.flatnonzero(depth == d)] for k, v in columns.items()},
                        np.array([labels[i][d] for i in np.flatnonzero(depth == d)], dtype=np.int64))
                       for d in np.unique(depth)]
        self.collate = StateTrackingCollator(pad_token_id, padding_side="right")

    def evaluate(self, model) -> float:
        """The probed records' overall state accuracy under `model` (left in the mode it came in)."""
        was_training = model.training
        model.eval()
        right = 0
        try:
            for depth, columns, targets in self.groups:
                num_iterations = math.ceil(int(depth) / model.config.step_size)
                answers = []
                for start in range(0, len(targets), self.batch_size):
                    batch = self.collate({k: v[start:start + self.batch_size] for k, v in columns.items()})
                    batch = {k: v.to(model.device) for k, v in batch.items()}
                    with torch.no_grad():
                        answers.append(model.predict(
                            batch["input_ids"], attention_mask=batch["attention_mask"],
                            query_positions=batch["query_positions"], operation_ends=batch["operation_ends"],
                            num_iterations=num_iterations).answers.cpu().numpy())
                right += int((np.concatenate(answers) == targets).all(-1).sum())
        finally:
            model.train(was_training)
        return right / self.n

    def _probe(self, state, model) -> None:
        if not state.is_world_process_zero:
            return
        entry = {"step": state.global_step, "probe_accuracy": self.evaluate(model), "probe_split": self.split,
                 "probe_n": self.n}
        state.log_history.append(entry)
        print(entry, flush=True)
        if self.keep_best and (self.best is None or entry["probe_accuracy"] > self.best[0]):
            self.best = (entry["probe_accuracy"], entry["step"],
                         {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})

    def on_train_end(self, args, state, control, model=None, **kwargs):
        """With `keep_best`: probe the final weights (unless the last probe was at this step) and, if an earlier probe
        was more accurate, load the weights of the best probe (the first of equals) — a run that collapses late, or
        whose time budget ends mid-spike, keeps the model its validation split liked best. Logged as {"step",
        "probe_restored_step", "probe_restored_accuracy"}. Only the main process probes and restores (the saved model
        and the evaluation are its); the best weights live in memory, so a resumed run compares its own probes only."""
        if not self.keep_best or not state.is_world_process_zero or model is None:
            return control
        last = next((row for row in reversed(state.log_history) if "probe_accuracy" in row), None)
        if last is None or last["step"] != state.global_step:
            self._probe(state, model)
            last = state.log_history[-1]
        if self.best is not None and self.best[0] > last["probe_accuracy"]:
            accuracy, step, weights = self.best
            model.load_state_dict(weights)
            state.log_history.append({"step": state.global_step, "probe_restored_step": step,
                                      "probe_restored_accuracy": accuracy})
            print(f"probe: the final weights scored {last['probe_accuracy']:.4f} on the {self.split} split, below the "
                  f"probe at step {step} ({accuracy:.4f}): its weights are restored", flush=True)
        return control
