"""Dense prefix-state readout: the loop state at an operation's last token read as the state after that operation.

The paper supervises only the queries: iteration k reads z_k there. FPRM (arXiv 2606.18206) supervises every token
with its own prefix state. `ParLoopedQwenConfig.prefix_state_queries` Q > 0 gives the model a linear state head,
W_z (Q · C × h), and `prefix_state_logits` reads it at chosen tokens; `trainers.objectives.prefix_state_targets`
says what each read must say (the wavefront: at iteration k the last token of operation j ≤ c·k reads z_j).
Imports only torch (remote code).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def prefix_state_logits(states: torch.Tensor, token_positions: torch.Tensor, head_weight: torch.Tensor,
                        num_queries: int) -> torch.Tensor:
    """ŷ_{b,j} = W_z s[b, t_{b,j}], reshaped to the Q queries' candidate logits.

    states (b, t, h) a loop state s_k; token_positions (b, n) token indices (negative entries, e.g. operation_ends
    past d, read token 0 and must be masked by the caller); head_weight (Q · C, h) -> (b, n, Q, C)."""
    if head_weight.shape[0] % num_queries:
        raise ValueError(f"the state head has {head_weight.shape[0]} rows, not a multiple of "
                         f"num_queries={num_queries}.")
    index = token_positions.clamp(min=0)[..., None].expand(-1, -1, states.shape[-1])
    at_tokens = states.gather(1, index)  # (b, n, h)
    logits = F.linear(at_tokens, head_weight.to(at_tokens.dtype))
    return logits.unflatten(-1, (num_queries, head_weight.shape[0] // num_queries))


__all__ = ["prefix_state_logits"]
