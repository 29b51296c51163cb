"""The adapter split at its input (`runtime.split_adapter`): W [e ; s] = W_e e + W_s s, with W = [W_e | W_s].

e = P(x) does not change across iterations, so W_e e is computed once per batch and each iteration multiplies s
alone: half the adapter's work per iteration. Same value up to the order of the sum (tested against the whole
adapter, tests/test_speed_paths.py). An adapter that is not a plain bias-free `nn.Linear` (wrapped by PEFT, or with
forward hooks such as accelerate's offloading, which only a call runs) is called whole on [e ; s].

A loop may cut the halves once per batch (`adapter_halves`) and pass them to `e_half_with` / `input_with`, so the
weight is not split again at every iteration (one split, and one node of the backward graph, per batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .loop_types import AdapterHalves


def adapter_halves(model) -> AdapterHalves | None:
    """(W_e, W_s), `model.adapter`'s weight cut at its input; None when the adapter is called whole
    (`runtime.split_adapter` off, or an adapter that is not a plain bias-free `nn.Linear` without hooks)."""
    adapter = model.adapter
    if (not model.runtime.split_adapter or type(adapter) is not nn.Linear or adapter.bias is not None
            or adapter._forward_hooks or adapter._forward_pre_hooks):
        return None
    return AdapterHalves(*adapter.weight.split(model.config.hidden_size, dim=1))


def e_half_with(halves: AdapterHalves | None, e: torch.Tensor) -> torch.Tensor:
    """W_e e from halves already cut (`adapter_halves`); e itself when the adapter is called whole (halves None)."""
    return e if halves is None else F.linear(e, halves.e)


def input_with(halves: AdapterHalves | None, adapter: nn.Module, e_half: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """W [e ; s] = W_e e + W_s s from e's half (`e_half_with`) and halves already cut; `adapter` called whole on
    [e ; s] when halves is None (then `e_half` is e)."""
    if halves is None:
        return adapter(torch.cat([e_half, s], dim=-1))
    return e_half + F.linear(s, halves.s)


def adapter_e_half(model, e: torch.Tensor) -> torch.Tensor:
    """W_e e, the part of the adapter that depends on e alone (e itself when the adapter is called whole)."""
    return e_half_with(adapter_halves(model), e)


def adapter_input(model, e_half: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """W [e ; s] = W_e e + W_s s from e's half (`adapter_e_half`); the whole adapter on [e ; s] when it is called
    whole (then `e_half` is e)."""
    return input_with(adapter_halves(model), model.adapter, e_half, s)


__all__ = ["adapter_e_half", "adapter_halves", "adapter_input", "e_half_with", "input_with"]
