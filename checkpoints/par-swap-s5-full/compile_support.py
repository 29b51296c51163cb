"""The loop's hot functions (`loop_types.LoopParts`), eager or compiled (`ParLoopedQwenForStateTracking.compile_core`).

Five functions, each a plain function or method that the eager model also runs: the core update on the whole prompt
(C(W [e ; s]) and the anchoring), the same on the local window's rows, the no-grad unit of `block_iterations` window
iterations, the coda with its final norm, and the prelude. The Python loop and the mask / position bookkeeping stay
eager.

`compile_kwargs` go to `torch.compile` (default `dynamic=None`: one graph per shape, then dynamic shapes on a
recompile). The window block is one graph; its first compile takes longer. On a CPU, inductor's C++ wrapper is on
unless `options`/`mode` say otherwise (`default_compile_options`). Each new input shape (depth, batch, window)
recompiles, up to `torch._dynamo.config.recompile_limit` graphs; past it the part runs eager (pass `dynamic=True` when
shapes vary a lot). On a CPU, pair it with `attn_implementation="par_eager"` for the local window's few-row attention
(`par_attention`).
"""

from __future__ import annotations

from functools import partial

import torch

from .loop_types import LoopParts
from .window_path import window_block, window_update


def default_compile_options(compile_kwargs: dict, device: torch.device) -> dict:
    """`torch.compile` keyword arguments for `compile_core`: on a CPU with the inductor backend, `cpp_wrapper=True`
    (the compiled graph is called through C++ instead of a Python wrapper: ~0.3–0.5 ms less per call of the loop,
    see benchmarks/bench_speed.py) unless the caller passes `mode` or sets `cpp_wrapper` in `options`."""
    kwargs = dict(compile_kwargs)
    if torch.device(device).type == "cpu" and kwargs.get("backend", "inductor") == "inductor" and "mode" not in kwargs:
        kwargs["options"] = {"cpp_wrapper": True, **(kwargs.get("options") or {})}
    return kwargs


def eager_parts(model) -> LoopParts:
    """The hot functions of `model`, uncompiled."""
    return LoopParts(core_update=model.core_update, window_update=partial(window_update, model),
                     window_block=partial(window_block, model), coda=model._coda_block, prelude=model._prelude_block)


def compile_parts(model, **compile_kwargs) -> LoopParts:
    """`torch.compile` each of `eager_parts(model)` with `default_compile_options(compile_kwargs, model.device)`."""
    kwargs = default_compile_options(compile_kwargs, model.device)
    return LoopParts(*(torch.compile(part, **kwargs) for part in eager_parts(model)))


__all__ = ["compile_parts", "default_compile_options", "eager_parts"]
