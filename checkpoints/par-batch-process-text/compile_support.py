"""torch.compile support for the loop's hot path (`ParLoopedQwenForStateTracking.compile_core`).

Four parts of the model are compiled, each a plain method of its own that the eager model also runs: the core
update (C(W [e ; s]) and the anchoring), the no-grad unit of `block_iterations` local-window iterations, the coda
with its final norm, and the prelude. The Python loop and the mask / position bookkeeping stay eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def default_compile_options(compile_kwargs: dict, device: torch.device) -> dict:
    """`torch.compile` keyword arguments for `compile_core`: on a CPU with the inductor backend, `cpp_wrapper=True`
    (the compiled graph is called through C++ instead of a Python wrapper: ~0.3–0.5 ms less per call of the loop,
    see benchmarks/bench_speed.py) unless the caller passes `mode` or sets `cpp_wrapper` in `options`."""
    kwargs = dict(compile_kwargs)
    if torch.device(device).type == "cpu" and kwargs.get("backend", "inductor") == "inductor" and "mode" not in kwargs:
        kwargs["options"] = {"cpp_wrapper": True, **(kwargs.get("options") or {})}
    return kwargs


@dataclass
class CompiledParts:
    """The compiled versions of the model's hot methods (each called exactly like the eager method)."""

    core_update: Callable
    core_iterations: Callable
    coda: Callable
    prelude: Callable


def compile_parts(model, **compile_kwargs) -> CompiledParts:
    """`torch.compile` each hot method of `model` with `default_compile_options(compile_kwargs, model.device)`."""
    kwargs = default_compile_options(compile_kwargs, model.device)
    return CompiledParts(
        core_update=torch.compile(model._core_update, **kwargs),
        core_iterations=torch.compile(model.core_iterations, **kwargs),
        coda=torch.compile(model._coda_block, **kwargs),
        prelude=torch.compile(model._prelude_block, **kwargs),
    )


__all__ = ["CompiledParts", "compile_parts", "default_compile_options"]
