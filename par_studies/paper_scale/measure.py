"""What the dry run measures with (`par_studies.paper_scale.harness`): the process's resident memory from /proc
(peak, current, the peak reset, what the machine has available), the bytes autograd saves for backward
(`SavedTensorBytes`), tensor, optimizer-state and parameter counts by part of the split, and the CPU flash-attention
kernel registered with torch's FLOP counter."""

from __future__ import annotations

import weakref
from pathlib import Path


def register_cpu_flash_attention() -> None:
    """torch's FLOP counter knows the CUDA sdpa kernels; on a CPU sdpa runs `_scaled_dot_product_flash_attention_for
    _cpu`, which it would count as 0. The same formula as the others: 4·b·h·s_q·s_k·d forward (QKᵀ and AV, the full
    square whatever the causal mask, as torch counts every sdpa kernel), twice that backward (dQ, dK, dV, dP)."""
    import torch
    from torch.utils import flop_counter

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is None or forward in flop_counter.flop_registry or forward.default in flop_counter.flop_registry:
        return  # not in this torch, or registered already (by torch or an earlier call)

    def fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        b, h, s_q, d = query_shape
        return 4 * b * h * s_q * key_shape[2] * d

    def bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        b, h, s_q, d = query_shape
        return 8 * b * h * s_q * key_shape[2] * d

    flop_counter.register_flop_formula(forward)(fwd)
    if backward is not None:
        flop_counter.register_flop_formula(backward)(bwd)


def peak_rss() -> int:
    """Peak resident memory of this process (VmHWM), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return -1


def current_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return -1


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: `5` to /proc/self/clear_refs); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return -1


class SavedTensorBytes:
    """Bytes autograd holds for backward at the end of the context (activations): the storages of the tensors saved
    inside it that are still alive when it closes (a graph branch freed during the forward, e.g. an unused output's,
    releases its saves), each storage counted once, parameters (and views of them) left out. Deterministic for a
    given graph, unlike RSS."""

    def __init__(self, model):
        import torch

        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.saved: list[tuple] = []
        self.total = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)

    def _pack(self, tensor):
        try:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in self.params:
                self.saved.append((weakref.ref(tensor), storage.data_ptr(), storage.nbytes()))
        except (RuntimeError, NotImplementedError, TypeError):  # e.g. sparse or wrapper tensors: not counted
            pass
        return tensor

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        alive = {ptr: nbytes for ref, ptr, nbytes in self.saved if ref() is not None}
        self.total = sum(alive.values())
        self.saved = []
        return self._hooks.__exit__(*exc)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def optimizer_state_bytes(optimizer) -> int:
    import torch

    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))


def parameter_counts(model, split) -> dict:
    P, C, _ = split
    counts = {"total": 0, "embedding": 0, "prelude": 0, "core": 0, "coda": 0, "adapter": 0, "other": 0}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        counts["total"] += p.numel()
        if "embed_tokens" in name or "lm_head" in name:
            counts["embedding"] += p.numel()
        elif "adapter" in name:
            counts["adapter"] += p.numel()
        elif ".layers." in name:
            index = int(name.split(".layers.")[1].split(".")[0])
            counts["prelude" if index < P else "core" if index < P + C else "coda"] += p.numel()
        else:
            counts["other"] += p.numel()
    return counts
