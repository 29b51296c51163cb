"""Token mixing without positions: the causal depthwise convolution the full view's core may read its input through
(`ParLoopedQwenConfig.core_conv_kernel`, FPRM's `conv1d` before attention).

Imports only torch (remote code); `modeling_par` re-exports it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_depthwise_mix(u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Causal depthwise convolution over the tokens, as a residual (FPRM's `conv1d` before attention):

        u_t ← u_t + Σ_{j=0}^{K−1} w_{K−1−j} ⊙ u_{t−j}       (u_{t−j} = 0 before the first token),

    one K-tap filter per channel, `weight` (h, 1, K) as `nn.Conv1d(h, h, K, groups=h)` stores it; w = 0 is the
    identity. Token t reads only tokens t−K+1..t: a local order signal that needs no positional encoding.
    # (b, t, h), (h, 1, K) -> (b, t, h)"""
    kernel = weight.shape[-1]
    mixed = F.conv1d(F.pad(u.transpose(1, 2), (kernel - 1, 0)), weight.to(u.dtype), groups=u.shape[-1])
    return u + mixed.transpose(1, 2)


__all__ = ["causal_depthwise_mix"]
