"""The learned halting rule (the paper's): halt at the first iteration whose "Yes" is confirmed over a window.

Imports only torch (remote code); `modeling_par` re-exports both functions.
"""

from __future__ import annotations

import torch


def halt_confirmed(p_yes_window: torch.Tensor, threshold: float, confirm: int) -> torch.Tensor:
    """The halting rule on one window of iterations R..R+m−1, for a batch.

    Halt at R iff P_R(Yes) > τ and #{j ∈ R..R+m−1 : P_j(Yes) > τ} ≥ k.  # (m, b) -> (b,) bool
    """
    above = p_yes_window > threshold
    return above[0] & (above.sum(0) >= confirm)


def halt_iteration(p_yes: torch.Tensor, threshold: float = 0.5, confirm: int = 6, window: int = 8) -> int | None:
    """First iteration R (1-based) confirmed by `halt_confirmed` over R..R+m−1, or None if none is.

    A window that would run past the last iteration given cannot confirm.  # p_yes: (iters,)
    """
    for start in range(p_yes.shape[0] - window + 1):
        if halt_confirmed(p_yes[start : start + window, None], threshold, confirm)[0]:
            return start + 1
    return None


__all__ = ["halt_confirmed", "halt_iteration"]
