"""Small Trainer callbacks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .distributed import distributed_running


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Stop training (cleanly, with the usual end-of-training save) once `seconds` of training wall time have passed.
    Pair it with a constant or warmup-only learning-rate schedule: a budget cuts any schedule that is defined over
    `max_steps`.

    The budget spans resumed segments: the time trained so far is saved in each checkpoint (`trainer_state.json`,
    `stateful_callbacks`), and a run resumed with `restore_callback_states_from_checkpoint=True` (train_par.py's
    default) goes on counting from it, with the checkpoint's budget. Time after the last checkpoint of an interrupted
    segment is not counted (its steps are redone)."""

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
        stop = torch.tensor([float(self.elapsed() >= self.seconds)], device=args.device)
        if distributed_running():  # every rank stops at the same step, or DDP hangs
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
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
