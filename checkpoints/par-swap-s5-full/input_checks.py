"""The model's input checks: one clear error naming the argument and what is allowed, before any computation."""

from __future__ import annotations

from typing import NamedTuple

import torch


class CheckedInputs(NamedTuple):
    """The model's inputs after `check_inputs`, defaults filled in."""

    attention_mask: torch.Tensor  # (b, t)
    query_positions: torch.Tensor  # (b, q) long
    position_scale: torch.Tensor | None  # (b,) float, or None


def check_inputs(config, input_ids, attention_mask, query_positions, position_scale) -> CheckedInputs:
    """input_ids (b, t) in the vocabulary, attention_mask of its shape (default all ones), query_positions (b, q) on
    real tokens (default the last real token), position_scale a float or (b,) in [1, max_position_scale]."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, seq); got {tuple(input_ids.shape)}.")
    if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= config.vocab_size):
        raise ValueError(
            f"input_ids must lie in [0, vocab_size={config.vocab_size}); "
            f"got values in [{int(input_ids.min())}, {int(input_ids.max())}]."
        )
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    elif attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}; "
            f"got {tuple(attention_mask.shape)}."
        )
    if query_positions is None:  # the last real token of each sample (left or right padding)
        last = input_ids.shape[1] - 1 - attention_mask.flip(-1).long().argmax(-1)
        query_positions = last[:, None]
    query_positions = torch.as_tensor(query_positions, device=input_ids.device).long()
    if query_positions.dim() == 1:
        query_positions = query_positions[:, None]
    if query_positions.dim() != 2 or query_positions.shape[0] != input_ids.shape[0]:
        raise ValueError(
            f"query_positions must have shape (batch, queries) with batch={input_ids.shape[0]}; "
            f"got {tuple(query_positions.shape)}."
        )
    if query_positions.min() < 0 or query_positions.max() >= input_ids.shape[1]:
        raise ValueError(f"query_positions must lie in [0, seq_len={input_ids.shape[1]}).")
    if not attention_mask.gather(1, query_positions).bool().all():
        raise ValueError("query_positions must point at real tokens (attention_mask == 1), not padding.")
    if position_scale is not None:
        position_scale = torch.as_tensor(position_scale, device=input_ids.device, dtype=torch.float32)
        if position_scale.dim() == 0:
            position_scale = position_scale.expand(input_ids.shape[0])
        smax = config.max_position_scale
        if position_scale.shape != (input_ids.shape[0],) or (position_scale < 1).any() or (
            position_scale > smax
        ).any():
            raise ValueError(
                f"position_scale must be a float or a (batch,) tensor with values in [1, max_position_scale={smax}]."
            )
    return CheckedInputs(attention_mask, query_positions, position_scale)


def check_operation_ends(config, operation_ends, attention_mask, query_positions):
    """`operation_ends` (b, D+1): per sample the last token index of the preamble and of operations 1..d,
    strictly increasing, then −1; real tokens; every query after the last operation."""
    c = config
    needed = c.loop_view != "full" or c.progress_positions
    if operation_ends is None:
        if needed:
            raise ValueError(
                f"operation_ends is required with loop_view={c.loop_view!r} / progress_positions="
                f"{c.progress_positions}: give (batch, depth + 1) token indices of the end of the preamble and of "
                "each operation (the collator builds them from the dataset's 'operation_ends')."
            )
        return None
    if not needed:
        return None
    b, t = attention_mask.shape
    operation_ends = torch.as_tensor(operation_ends, device=attention_mask.device).long()
    if operation_ends.dim() != 2 or operation_ends.shape[0] != b or operation_ends.shape[1] < 1:
        raise ValueError(f"operation_ends must have shape (batch={b}, depth + 1); got {tuple(operation_ends.shape)}.")
    valid = operation_ends >= 0
    step = operation_ends[:, 1:] - operation_ends[:, :-1]
    if (not valid[:, 0].all() or (valid[:, 1:] & ~valid[:, :-1]).any() or (operation_ends >= t).any()
            or (operation_ends < -1).any() or ((step <= 0) & valid[:, 1:]).any()
            or not attention_mask.gather(1, operation_ends.clamp_min(0)).bool()[valid].all()):
        raise ValueError(
            "operation_ends must hold, per sample, strictly increasing indices of real tokens in "
            f"[0, seq_len={t}) (preamble end, then each operation's end), padded with -1 at the end."
        )
    last = operation_ends.gather(1, (valid.sum(-1) - 1)[:, None])
    if (query_positions <= last).any():
        raise ValueError("query_positions must lie after the last operation (operation_ends[:, depth]).")
    return operation_ends


def check_position_ids(position_ids, input_ids):
    """position_ids (b, t): positions to use instead of the ordinary ones, of the shape of input_ids."""
    positions = torch.as_tensor(position_ids, device=input_ids.device)
    if positions.shape != input_ids.shape:
        raise ValueError(f"position_ids must have the shape of input_ids {tuple(input_ids.shape)}; "
                         f"got {tuple(positions.shape)}.")
    return positions


def check_iterations(config, num_iterations, name="num_iterations"):
    """An iteration count: an int in [1, max_iterations]."""
    limit = config.max_iterations
    if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or not 1 <= num_iterations <= limit:
        raise ValueError(f"{name} must be an integer in [1, max_iterations={limit}]; got {num_iterations!r}.")
    return num_iterations


def check_readout_iterations(readout_iterations, num_iterations: int) -> list[int]:
    """`forward`'s readout iterations, sorted without repeats: default [num_iterations], else a non-empty list of
    iterations in [1, num_iterations]."""
    reads = [num_iterations] if readout_iterations is None else sorted(set(int(k) for k in readout_iterations))
    if not reads or reads[0] < 1 or reads[-1] > num_iterations:
        raise ValueError(
            f"readout_iterations must be a non-empty list of iterations in [1, num_iterations={num_iterations}]; "
            f"got {readout_iterations!r}."
        )
    return reads


class PredictDepth(NamedTuple):
    """`predict`'s depth after `check_predict_depth`."""

    limit: int  # the most iterations any sample runs
    target: torch.Tensor | None  # (b,) long: each sample's forced depth, or None under learned halting


def check_predict_depth(config, batch: int, device, num_iterations, halting, max_iterations) -> PredictDepth:
    """`predict`'s depth: forced (`num_iterations`, an int or a (b,) tensor, each in [1, max_iterations]) or learned
    halting (`halting=True`, needing `config.halt_token_ids`, up to `max_iterations`, default config.max_iterations),
    exactly one of them."""
    if not isinstance(halting, bool):
        raise ValueError(f"predict: halting must be a bool; got {halting!r}.")
    if halting:
        if num_iterations is not None:
            raise ValueError("predict: give num_iterations (forced depth) or halting=True, not both.")
        if config.halt_token_ids is None:
            raise ValueError("predict(halting=True) needs ParLoopedQwenConfig.halt_token_ids (Yes, No).")
        limit = config.max_iterations if max_iterations is None else max_iterations
        return PredictDepth(check_iterations(config, limit, "max_iterations"), None)
    if num_iterations is None:
        raise ValueError("predict: num_iterations (forced depth) is required unless halting=True.")
    if max_iterations is not None:
        raise ValueError("predict: max_iterations bounds learned halting (halting=True); forced depth runs "
                         "exactly num_iterations.")
    target = torch.as_tensor(num_iterations, device=device).long().expand(batch).clone()
    limit = check_iterations(config, int(target.max()), "num_iterations")
    check_iterations(config, int(target.min()), "num_iterations")
    return PredictDepth(limit, target)


__all__ = ["CheckedInputs", "PredictDepth", "check_inputs", "check_iterations", "check_operation_ends",
           "check_position_ids", "check_predict_depth", "check_readout_iterations"]
