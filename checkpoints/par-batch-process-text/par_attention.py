"""The attention implementation "par_eager": transformers' eager attention (bit for bit, in fewer tensor operations:
`bmm_attention`), with the local window's few-key blocks written for inductor while `compile_core` traces them.
Registered through transformers' `AttentionInterface` when this module is imported (the model file imports it), so
`attn_implementation="par_eager"` works wherever the remote code loads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward, repeat_kv

from .runtime_options import SMALL_BLOCK_KEYS


def small_block_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scaling + mask) v, both products written as broadcast multiply-and-sum,
    scores_ij = Σ_d q_id k_jd, out_id = Σ_j p_ij v_jd, instead of two batched matmuls.

    The same values as transformers' `eager_attention_forward` (up to the order of the sums). Under torch.compile
    inductor fuses each into one loop over (b, h, q, k): on the local window's few-key blocks a batched matmul per
    (b, h) pair is mostly call overhead. Eagerly it would materialize (b, h, q, k, d): `par_eager_attention` only
    calls it while compiling. query (b, h, q, d), key/value (b, h, k, d) with h heads each (GQA repeated by the
    caller), mask additive (b, 1, q, k) -> output (b, q, h, d), weights (b, h, q, k)."""
    scores = (query[:, :, :, None, :] * key[:, :, None, :, :]).sum(-1) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = (weights[..., None] * value[:, :, None, :, :]).sum(-2)
    return output.transpose(1, 2).contiguous(), weights


def bmm_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                  scaling: float, dropout: float = 0.0, training: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `eager_attention_forward`, softmax(q kᵀ · scaling + mask) v, with its two products written as
    `torch.bmm` over the (batch · heads) matrices: the kernel `torch.matmul` calls, on the same copies of the inputs
    that it makes, so the values and gradients are bit-identical (tested); what it leaves out is matmul's
    broadcasting (two `expand`s per product and their backward nodes), which on the local window's tiny blocks is
    a good part of the attention's cost. query (b, h, q, d), key/value (b, h, k, d) with h heads each (GQA repeated
    by the caller), mask additive (b, 1, q, k) -> output (b, q, h, d), weights (b, h, q, k)."""
    b, h, n, d = query.shape
    k = key.shape[-2]
    scores = torch.bmm(query.reshape(b * h, n, d), key.transpose(2, 3).reshape(b * h, d, k)).view(b, h, n, k)
    scores = scores * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=training)
    output = torch.bmm(weights.reshape(b * h, n, k), value.reshape(b * h, k, d)).view(b, h, n, d)
    return output.transpose(1, 2).contiguous(), weights


def par_eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """The attention implementation "par_eager" (`attn_implementation="par_eager"`): transformers' eager attention
    (`eager_attention_forward`: matmul, softmax, matmul; uncompiled as `bmm_attention`, bit for bit), except while
    torch.compile traces it (`compile_core`) on a block of at most `SMALL_BLOCK_KEYS` keys without dropout, where it is
    `small_block_attention`. Uncompiled it is exactly "eager". The CPU default for the local window
    (`state_tracking.default_attn_implementation`): measured 4-10% faster per training step and evaluation than
    compiled "eager" (benchmarks/bench_speed.py)."""
    groups = module.num_key_value_groups
    if not torch.compiler.is_compiling():
        return bmm_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), attention_mask, scaling, dropout,
                             module.training)
    if key.shape[-2] > SMALL_BLOCK_KEYS or (dropout and module.training):
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    return small_block_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), attention_mask, scaling)


AttentionInterface.register("par_eager", par_eager_attention)

__all__ = ["bmm_attention", "par_eager_attention", "small_block_attention"]
