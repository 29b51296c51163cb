"""Small Trainer callbacks."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from .distributed import distributed_running


class TimeBudgetCallback(TrainerCallback):
    """Stop training (cleanly, with the usual end-of-training save) once `seconds` of wall time have passed
    since training began. Pair it with a constant or warmup-only learning-rate schedule: a budget cuts any
    schedule that is defined over `max_steps`."""

    def __init__(self, seconds: float):
        if seconds <= 0:
            raise ValueError(f"TimeBudgetCallback.seconds must be > 0; got {seconds!r}.")
        self.seconds = seconds
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        stop = torch.tensor([float(time.monotonic() - self.started >= self.seconds)], device=args.device)
        if distributed_running():  # every rank stops at the same step, or DDP hangs
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            control.should_training_stop = True
        return control
