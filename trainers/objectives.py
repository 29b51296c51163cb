"""PAR training targets and losses, each a small function with its formula.

Shapes: K = iterations read, B = batch, Q = queries, C = answer candidates, D = the batch's largest depth.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from modeling_par.loop_views import token_segments
from modeling_par.modeling_par import state_rms

OBJECTIVES = ("par", "final_every_iteration", "final_only")
YES, NO = 0, 1  # column order of the model's halt_logits: (Yes, No)
UNRECORDED = -100  # a target that was not recorded (state_tracking.data.LABEL_PAD_ID): no loss, no accuracy


def iterations_for_depth(depth: int, step_size: int) -> int:
    """Forced depth: R = ⌈d / c⌉, the first iteration whose target is the final state z_d."""
    return math.ceil(depth / step_size)


def hold_iterations(depth: int, step_size: int, rng: np.random.Generator, tail_alpha: float, max_factor: float,
                    max_iterations: int) -> int:
    """Hold schedule: R = ⌈d/c⌉ + X, X = ⌊⌈d/c⌉ · (U^(−1/α) − 1)⌋ with U ~ U(0, 1] (a Pareto tail of index α),
    capped at R ≤ min(max_factor · ⌈d/c⌉, max_iterations). Iterations past ⌈d/c⌉ keep the target z_d."""
    base = iterations_for_depth(depth, step_size)
    u = 1.0 - rng.random()  # (0, 1]
    extra = math.floor(base * (u ** (-1.0 / tail_alpha) - 1.0))
    return int(min(base + extra, math.floor(max_factor * base), max_iterations))


def additive_hold_iterations(depth: int, step_size: int, rng: np.random.Generator, max_extra: int,
                             max_iterations: int) -> int:
    """Hold schedule with an additive tail: R = ⌈d/c⌉ + X, X ~ U{0, …, max_extra}, capped at max_iterations.

    The tail does not grow with d, so the gradient window keeps covering the progress region (iterations < ⌈d/c⌉)
    and the iterations a halting rule reads (up to ⌈d/c⌉ + m − 1) are trained at every depth."""
    return int(min(iterations_for_depth(depth, step_size) + rng.integers(0, max_extra + 1), max_iterations))


def steps_reached(depth: torch.Tensor, iterations, step_size: int) -> torch.Tensor:
    """The operations read by iteration k: min(c·k, d_b) for each iteration k ≥ 1 and sample b.  (B,), (K,) -> (K, B)"""
    if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
        raise ValueError(f"step_size must be an integer ≥ 1; got {step_size!r}.")
    k = torch.as_tensor(iterations, dtype=torch.long, device=depth.device)
    if k.dim() != 1 or (k < 1).any():
        raise ValueError(f"iterations must be a 1-d sequence of iteration numbers ≥ 1; got {k.tolist()}.")
    return torch.minimum(step_size * k[:, None], depth[None, :])


def progress_targets(step_labels: torch.Tensor, depth: torch.Tensor, iterations, step_size: int) -> torch.Tensor:
    """PAR targets: iteration k reads z_min(c·k, d) = step_labels[b, min(c·k, d_b)] (`steps_reached`).

    step_labels (B, D+1, Q), depth (B,), iterations (K,) of k ≥ 1 -> (K, B, Q)
    """
    steps = steps_reached(depth, iterations, step_size)  # (K, B)
    batch_index = torch.arange(step_labels.shape[0], device=depth.device)[None, :].expand_as(steps)
    return step_labels[batch_index, steps]


def prefix_state_targets(step_labels: torch.Tensor, depth: torch.Tensor, iterations, step_size: int) -> torch.Tensor:
    """Dense prefix targets (the wavefront): at iteration k the last token of operation j reads z_j when
    j ≤ min(c·k, d) (`steps_reached`), and nothing (UNRECORDED) otherwise — an operation's state, once reached, stays
    at its token.

    step_labels (B, D+1, Q), depth (B,), iterations (K,) of k ≥ 1 -> (K, B, D, Q) over operations j = 1..D"""
    steps = steps_reached(depth, iterations, step_size)  # (K, B)
    ops = torch.arange(1, step_labels.shape[1], device=depth.device)  # j = 1..D
    reached = ops[None, None, :] <= steps[..., None]  # (K, B, D)
    targets = step_labels[:, 1:][None].expand(steps.shape[0], -1, -1, -1)
    return torch.where(reached[..., None], targets, torch.full_like(targets, UNRECORDED))


def final_targets(step_labels: torch.Tensor, depth: torch.Tensor, iterations: torch.Tensor) -> torch.Tensor:
    """Final-answer supervision (ablation): every iteration k reads z_d.  (B, D+1, Q) -> (K, B, Q)"""
    final = step_labels[torch.arange(step_labels.shape[0], device=depth.device), depth]  # (B, Q)
    return final[None].expand(iterations.shape[0], -1, -1)


def halt_labels(iterations: torch.Tensor, depth: torch.Tensor, step_size: int, offset: int = 0) -> torch.Tensor:
    """Learned halting labels: "Yes" (0) when c·(k − offset) ≥ d, else "No" (1).  (K,), (B,) -> (K, B)

    offset 0 is the paper's rule (Yes from the completing iteration ⌈d/c⌉ on). offset 1 says Yes from the first
    iteration that reads no operation: under `loop_view="local"` the queries cannot tell that operation k is the last
    one, but they see when none is left, so the label becomes a function of what the model sees (the readout of
    that iteration is z_d: a no-op step, trained by the hold schedule)."""
    done = step_size * (iterations.to(depth.device)[:, None] - offset) >= depth[None, :]
    return torch.where(done, YES, NO)


def answer_loss(answer_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """L = Σ_k CE(y_k, target_k), each CE averaged over the recorded (batch, query) targets of iteration k; an
    iteration with none recorded adds 0 (records with final states only: UNRECORDED before the last operation).
    (K, B, Q, C), (K, B, Q) -> ()"""
    ce = F.cross_entropy(answer_logits.flatten(0, 2).float(), targets.flatten(), reduction="none",
                         ignore_index=UNRECORDED).view(targets.shape)
    recorded = (targets != UNRECORDED).sum(dim=(1, 2))
    return (ce.sum(dim=(1, 2)) / recorded.clamp(min=1)).sum()


def operation_encodings(prelude_states: torch.Tensor, operation_ends: torch.Tensor, ops: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every operation's encoding by the prelude: z = e at the operation's last token, with its operation id.
    prelude_states (B, T, H), operation_ends (B, D+1) (index 0 the preamble, −1 past d), ops (B, D) (< 0 past d)
    -> z (N, H), ids (N,) over the N operations of the batch."""
    ends = operation_ends[:, 1:1 + ops.shape[1]]
    valid = (ends >= 0) & (ops >= 0)
    rows = torch.arange(ops.shape[0], device=ops.device)[:, None].expand_as(ops)
    return prelude_states[rows[valid], ends[valid]], ops[valid]


def operation_centroids(z: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each operation's mean encoding over the batch: c_o = mean of z_j over the occurrences j of operation o.
    (N, H), (N,) -> centroids (O, H), inverse (N,) (each occurrence's row of centroids), counts (O,)"""
    _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    centroids = torch.zeros(len(counts), z.shape[1], device=z.device, dtype=z.dtype).index_add_(0, inverse, z)
    return centroids / counts[:, None], inverse, counts


def phrasing_alignment_loss(z: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Phrasings of one operation read alike: the within-operation spread of the unit-normalized encodings,

    L = mean_i ‖ẑ_i − c_{o_i}‖²,  ẑ = z / ‖z‖,  c_o = mean of ẑ_j over the batch's occurrences j of operation o,

    over the occurrences of operations that occur at least twice in the batch (0 when none does). 0 when every
    wording of an operation is encoded alike; at most 2. (N, H), (N,) -> ()"""
    unit = F.normalize(z.float(), dim=-1)
    centroids, inverse, counts = operation_centroids(unit, ids)
    repeated = counts[inverse] >= 2
    if not bool(repeated.any()):
        return unit.sum() * 0.0
    return ((unit - centroids[inverse]) ** 2).sum(-1)[repeated].mean()


def within_operation_variance_ratio(z: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Phrasings of one operation read alike, measured against how far operations read apart (Fisher's ratio):

    L = Σ_i ‖z_i − c_{o_i}‖² / Σ_i ‖z_i − z̄‖²,  c_o = mean of z_j over the batch's occurrences j of operation o,
    z̄ = mean of all z_i,

    the share of the encodings' variance that lies within operations. The batch mean is taken out, so a direction all
    encodings share (the anisotropy that keeps `phrasing_alignment_loss` near 0) counts for nothing, and the ratio
    cannot be lowered by shrinking every encoding. 0 when every wording of an operation is encoded alike; 1 when the
    operation explains none of the spread; 0 when no operation occurs twice or all encodings are equal.
    (N, H), (N,) -> ()"""
    z = z.float()
    centroids, inverse, counts = operation_centroids(z, ids)
    within = ((z - centroids[inverse]) ** 2).sum()
    total = ((z - z.mean(0)) ** 2).sum()
    if not bool((counts >= 2).any()) or float(total.detach()) <= 0.0:
        return z.sum() * 0.0
    return within / total


PHRASING_ALIGNMENT_FORMS = {"unit": phrasing_alignment_loss, "variance_ratio": within_operation_variance_ratio}


def balanced_halt_loss(halt_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Class-balanced CE over (Yes, No): each present class weighs 1/2 overall, whatever its count.

    L = ½ Σ_{y∈{Yes,No}} mean_{(k,b): label=y} CE(h_{k,b}, y)  (one class present: its mean alone).
    (K, B, 2), (K, B) -> ()
    """
    ce = F.cross_entropy(halt_logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    flat = labels.flatten()
    means = [ce[flat == y].mean() for y in (YES, NO) if (flat == y).any()]
    return torch.stack(means).mean()


def readout_accuracy(answer_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Overall state accuracy per iteration read: all recorded queries right, over the samples with a recorded
    target at that iteration (0 where none is).  (K, B, Q, C), (K, B, Q) -> (K,)"""
    recorded = targets != UNRECORDED
    right = ((answer_logits.argmax(-1) == targets) | ~recorded).all(-1)  # (K, B)
    scored = recorded.any(-1)
    return (right & scored).sum(-1).float() / scored.sum(-1).clamp(min=1)


def waiting_row_change(states: tuple[torch.Tensor, ...] | list[torch.Tensor], operation_ends: torch.Tensor,
                       attention_mask: torch.Tensor, iterations: torch.Tensor, step_size: int = 1,
                       eps: float = 1e-6) -> torch.Tensor:
    """Stability of the rows the loop has not reached yet (issue 68): over the supervised iterations k ≥ 2 and the
    tokens t of every operation j > c·k + 1 (two or more past the one iteration k reads; j ≤ d, the question's rows
    excluded; each token's operation from `modeling_par.loop_views.token_segments`),

        L_wait = mean_{k, b, t} ||s_k[b, t] − s_{k−1}[b, t]||² / (||s_{k−1}[b, t]||² + ε),

    s_k = `states`[k − 1] (b, T, H) the loop state after iteration k. In the full view those rows pass the core at
    every iteration before the loop reaches them; a row that moves at every pass can tell how many passes it has had,
    and a count learned to k_train fails past it (results/full_view_positions/row_freeze.json). At a fixed point L_wait
    is 0 whatever the wait. 0 when no token waits (e.g. every k ≥ d − 1)."""
    segments, depth, _ = token_segments(operation_ends, attention_mask)
    operation = segments <= depth[:, None]  # the preamble and the operations, not the question
    total, count = states[0].new_zeros(()), 0
    for k in iterations.tolist():
        if k < 2:
            continue
        waiting = operation & (segments > step_size * k + 1)
        if not bool(waiting.any()):
            continue
        now, before = states[k - 1][waiting], states[k - 2][waiting]
        total = total + ((now - before).pow(2).sum(-1) / (before.pow(2).sum(-1) + eps)).sum()
        count += int(waiting.sum())
    return total / max(count, 1)


def progress_flag_logits(states: torch.Tensor, channel: int = 0) -> torch.Tensor:
    """The read-so-far flag's logit of each row: f = s[channel] / rms(s), rms the loop's own per-token norm
    (`modeling_par.modeling_par.state_rms`, the one anchoring uses); |f| ≤ √H.  # (..., H) -> (...)"""
    return states[..., channel] / state_rms(states)[..., 0]


def progress_flag_loss(states: tuple[torch.Tensor, ...] | list[torch.Tensor], operation_ends: torch.Tensor,
                       attention_mask: torch.Tensor, iterations: torch.Tensor, step_size: int = 1,
                       channel: int = 0) -> torch.Tensor:
    """The read-so-far flag (issue 68): at each supervised iteration k, one channel of the loop state of every token
    of operation j = 1..d (each token's operation from `modeling_par.loop_views.token_segments`; the preamble and the
    question excluded), scaled by the row's rms (`progress_flag_logits`), is a logit for "operation j is read by
    iteration k":

        f_k[b, t] = s_k[b, t, channel] / rms(s_k[b, t]),   y_k[b, t] = 1[j ≤ c·k],
        L_flag = mean_{k, b, t} BCE(σ(f_k[b, t]), y_k[b, t]),

    s_k = `states`[k − 1] (b, T, H). The flag is a wave that moves one operation per iteration: a row can compute it
    from its neighbour's flag one pass earlier (the core's causal convolution reaches the previous operation's
    tokens), with no position and no pass count, so the row the loop reads next — flag just turned on — is found by
    content at any length (results/full_view_positions/row_probe.json: the query rows fetch operation k)."""
    segments, depth, _ = token_segments(operation_ends, attention_mask)
    operation = (segments >= 1) & (segments <= depth[:, None])
    read_by = segments[operation]  # (n,): each operation token's j
    logits = progress_flag_logits(torch.stack([states[k - 1] for k in iterations.tolist()])[:, operation], channel)
    targets = (read_by[None, :] <= step_size * iterations[:, None].to(read_by.device)).to(logits.dtype)
    return F.binary_cross_entropy_with_logits(logits, targets) if logits.numel() else logits.sum()
