"""Tearing torch.distributed down so that a data-parallel run exits cleanly.

Why this exists (measured on gloo, 2 CPU ranks, torch 2.13): a rank that ends its script with the process group
still alive aborted about 1 run in 10–25 with "terminate called without an active exception". The core dump shows
the cause: at interpreter exit a gloo worker thread (`ProcessGroupGloo::runLoop`) was releasing the work object of
the last collective (`~AsyncAllgatherWork`, from the Trainer's loss logging); releasing its tensors needs the GIL,
the interpreter was already finalizing, so the thread was made to exit inside a C++ destructor, and std::terminate
aborted the process. A plain `destroy_process_group()` does not prevent it: the DDP wrapper the Trainer keeps
(`trainer.model_wrapped`, `accelerator._models`) still holds the process group, so its worker threads keep running
into finalization. What does: a barrier (every rank is done with its collectives), then dropping those references,
then `destroy_process_group()` — the last reference goes, and the process group's destructor (which releases the
GIL) joins its worker threads while the interpreter is fully alive.

`ParTrainer` registers `teardown_distributed` to run at exit for every trainer it builds under torch.distributed,
so a user's script that ends right after `trainer.train()` exits cleanly; `train_par.py` calls it itself.
"""

from __future__ import annotations

import atexit
import gc
import sys
import warnings
import weakref

import torch

_TRAINERS: weakref.WeakSet = weakref.WeakSet()
_REGISTERED = False


def distributed_running() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def release_process_group_references(trainer) -> None:
    """Drop what a HF Trainer holds that keeps the process group alive: its DDP wrapper (`model_wrapped`) and the
    accelerator's prepared objects. The trainer's unwrapped `model` stays usable."""
    trainer.model_wrapped = trainer.model
    trainer.accelerator.free_memory()


def teardown_distributed(trainers=()) -> None:
    """End torch.distributed on this rank, together with the others: barrier, release the `trainers`' references to
    the process group (`release_process_group_references`), destroy it, and check that it is gone (its worker
    threads joined). A no-op when no process group is running. Call it on every rank."""
    if not distributed_running():
        return
    torch.distributed.barrier()  # every rank has finished its collectives
    for trainer in list(trainers):
        release_process_group_references(trainer)
    world = weakref.ref(torch.distributed.group.WORLD)
    torch.distributed.destroy_process_group()
    gc.collect()
    if world() is not None:
        warnings.warn("teardown_distributed: the process group is still referenced after destroy_process_group (a "
                      "DDP wrapper kept outside the trainer?); its gloo threads may abort the process at exit. Drop "
                      "that reference before the script ends.", RuntimeWarning, stacklevel=2)


def _teardown_at_exit() -> None:
    if getattr(sys, "last_value", None) is not None:  # this rank died of an exception: no barrier to wait at
        return
    teardown_distributed(_TRAINERS)


def teardown_distributed_at_exit(trainer) -> None:
    """Run `teardown_distributed` for `trainer` (and any other registered one) when the interpreter exits normally,
    before it finalizes (atexit). Registered once per process; trainers are held weakly."""
    global _REGISTERED
    _TRAINERS.add(trainer)
    if not _REGISTERED:
        atexit.register(_teardown_at_exit)
        _REGISTERED = True


__all__ = ["distributed_running", "release_process_group_references", "teardown_distributed",
           "teardown_distributed_at_exit"]
