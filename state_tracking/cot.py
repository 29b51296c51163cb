"""Explicit chain-of-thought (CoT) baseline: a plain causal LM that writes every intermediate state.

The prompt is exactly the symbolic prompt PAR sees (:func:`state_tracking.prompts.symbolic_tokens`);
the completion lists the state after every operation, then the final answer::

    prompt      <bos> [z_0, only for a random start] op_1 ... op_d <q1> ... <qQ>
    completion  z_1 No z_2 No ... No z_d Yes a_1 ... a_Q <eos>

Each state z_k is written as its Q candidate tokens (for swap-S5: the item in box 1, ..., box 5).
Tokens reused from the symbolic tokenizer: the candidate names, ``No`` as the separator between
states ("keep going", its meaning in the halting readout) and ``Yes`` as the marker before the final
answer ("done"). The only token added is ``<eos>``, by :func:`build_cot_tokenizer`: nothing in the
symbolic vocabulary ends a sequence, and generation needs a stop token. The answer a_1..a_Q repeats
z_d; it is the part scored as the model's answer.

A completion has ``d·(Q + 1) + Q + 1`` tokens (:func:`cot_completion_length`): 54 for swap-S5 at
d = 8, 390 at d = 64. The loss is on the completion only (``completion_mask``).

Training data comes from :func:`state_tracking.data.build_dataset` with the same seed semantics, so
for one seed the CoT model trains on the same problems as PAR; test problems come from
``derive_seed("eval", seed, d)`` as in :func:`state_tracking.evaluation.evaluate_length_generalization`,
so both methods are scored on identical test sequences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from datasets import Dataset
from datasets.table import InMemoryTable
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .accuracy import overall_state_accuracy, per_query_accuracy
from .data import build_dataset
from .evaluation import (
    check_test_depths,
    draw_test_problems,
    environment_info,
    extrapolation_factor,
    longest_accurate_depth,
    to_json,
)
from .prompts import NO_TOKEN, YES_TOKEN, symbolic_tokens
from .tasks import Task
from .tokenization import build_tokenizer, encode_batch

EOS_TOKEN = "<eos>"  # the one token the CoT format adds to the symbolic vocabulary
SEPARATOR_TOKEN = NO_TOKEN  # between two written states: "not done, another state follows"
ANSWER_TOKEN = YES_TOKEN  # after the last state: "done, the final answer follows"
MALFORMED = -1  # candidate index standing for an unreadable answer (never equals a true candidate)


# ---------------------------------------------------------------------------------------------
# Tokenizer and token ids
# ---------------------------------------------------------------------------------------------
def build_cot_tokenizer(task: Task) -> PreTrainedTokenizerFast:
    """The symbolic tokenizer of ``task`` plus ``<eos>`` (set as ``eos_token``).

    This is the only place the CoT baseline extends the vocabulary; every other token it writes
    (candidates, ``No``, ``Yes``) is already in :func:`build_tokenizer`'s symbolic vocabulary, and
    ``<eos>`` gets the next free id, so all symbolic ids are unchanged.
    """
    tokenizer = build_tokenizer(task, "symbolic")
    tokenizer.add_special_tokens({"eos_token": EOS_TOKEN})
    return tokenizer


@dataclass(frozen=True)
class CotTokenIds:
    """The ids the CoT format uses. ``candidates[c]`` is the id of ``task.candidate_names[c]``."""

    candidates: np.ndarray  # (num_candidates,) int64
    separator: int
    answer: int
    eos: int
    pad: int
    bos: int


def cot_token_ids(tokenizer: PreTrainedTokenizerBase, task: Task) -> CotTokenIds:
    """Look up the CoT tokens; ValueError naming the missing ones (use :func:`build_cot_tokenizer`)."""
    vocab = tokenizer.get_vocab()
    needed = [*task.candidate_names, SEPARATOR_TOKEN, ANSWER_TOKEN, EOS_TOKEN]
    missing = [t for t in needed if t not in vocab]
    if missing:
        raise ValueError(f"tokenizer lacks the CoT token(s) {missing}; build it with build_cot_tokenizer(task)")
    if tokenizer.pad_token_id is None or tokenizer.bos_token_id is None:
        raise ValueError("tokenizer needs a pad and a bos token; build it with build_cot_tokenizer(task)")
    if tokenizer.eos_token_id != vocab[EOS_TOKEN]:
        raise ValueError(f"tokenizer.eos_token must be {EOS_TOKEN!r}; build it with build_cot_tokenizer(task)")
    return CotTokenIds(
        candidates=np.array([vocab[c] for c in task.candidate_names], dtype=np.int64),
        separator=vocab[SEPARATOR_TOKEN], answer=vocab[ANSWER_TOKEN], eos=vocab[EOS_TOKEN],
        pad=int(tokenizer.pad_token_id), bos=int(tokenizer.bos_token_id),
    )


def cot_completion_length(task: Task, depth: int) -> int:
    """Tokens in a well-formed completion for ``depth`` ops: d states of Q tokens, d - 1 separators,
    ``Yes``, the Q-token answer and ``<eos>`` = d·(Q + 1) + Q + 1."""
    depth = _positive_int("depth", depth)
    return depth * (task.num_queries + 1) + task.num_queries + 1


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------
def cot_completion_tokens(task: Task, states: np.ndarray) -> list[str]:
    """The completion for one problem as tokens. states: (d + 1, Q) = z_0..z_d (z_0 is not written)."""
    states = np.asarray(states)
    if states.ndim != 2 or states.shape[0] < 2 or states.shape[1] != task.num_queries:
        raise ValueError(f"states must have shape (d + 1, {task.num_queries}) with d >= 1, got {states.shape}")
    tokens: list[str] = []
    for k in range(1, len(states)):
        if k > 1:
            tokens.append(SEPARATOR_TOKEN)
        tokens += [task.candidate_names[c] for c in states[k]]
    tokens.append(ANSWER_TOKEN)
    tokens += [task.candidate_names[c] for c in states[-1]]
    tokens.append(EOS_TOKEN)
    return tokens


def render_cot(task: Task, ops: np.ndarray, initial: np.ndarray | None = None) -> tuple[str, str]:
    """One problem as (prompt, completion) text, tokens joined by spaces; the prompt is PAR's symbolic
    prompt. ops: (d,), d >= 1; initial: (Q,) or None for the default start (then not written)."""
    ops = np.asarray(ops)
    if ops.ndim != 1 or len(ops) < 1:
        raise ValueError(f"ops must be a 1-d array of at least one operation, got shape {ops.shape}")
    states = task.prefix_states(ops[None], None if initial is None else np.asarray(initial)[None])[0]  # (d + 1, Q)
    return " ".join(symbolic_tokens(task, ops, initial)), " ".join(cot_completion_tokens(task, states))


def cot_completion_ids(states: np.ndarray, ids: CotTokenIds) -> np.ndarray:
    """Vectorised completion ids for problems of one depth. states: (n, d + 1, Q) -> (n, d·(Q+1) + Q + 1)."""
    states = np.asarray(states, dtype=np.int64)
    n, steps, num_queries = states.shape
    if steps < 2:
        raise ValueError(f"states must hold z_0..z_d with d >= 1, got {steps} state(s)")
    written = ids.candidates[states[:, 1:]]  # (n, d, Q)
    marks = np.full((n, steps - 1, 1), ids.separator, dtype=np.int64)
    marks[:, -1, 0] = ids.answer  # after z_d comes "Yes", not "No"
    body = np.concatenate([written, marks], axis=2).reshape(n, -1)  # z_1 No ... z_d Yes
    eos = np.full((n, 1), ids.eos, dtype=np.int64)
    return np.concatenate([body, written[:, -1], eos], axis=1)


# ---------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------
def build_cot_dataset(
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    n: int,
    depths: int | tuple[int, int] | range | Sequence[int] | Mapping[int, float],
    seed: int = 0,
    random_initial: bool = False,
) -> Dataset:
    """n pre-tokenized CoT problems for ``trl.SFTTrainer`` (loss on the completion only).

    The problems are those of ``build_dataset(task, tokenizer, "symbolic", n=n, depths=depths,
    seed=seed, random_initial=random_initial)`` (same ops, start states and order).
    Columns:
        input_ids        prompt ids followed by completion ids
        completion_mask  0 on the prompt, 1 on the completion (TRL builds the labels from it when
                         ``SFTConfig(completion_only_loss=True)``)
        prompt_length    number of prompt tokens
        depth            d
        ops              (d,) operation indices
        step_labels      (d + 1, Q) z_0..z_d
    TRL's trainer feeds only ``input_ids``/``labels`` to the model and drops the other columns.
    """
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    _check_seed(seed)
    ids = cot_token_ids(tokenizer, task)
    base = build_dataset(task, tokenizer, "symbolic", n=int(n), depths=depths, seed=seed, random_initial=random_initial)
    source = base.data.table
    depth = source.column("depth").to_numpy().astype(np.int64)  # (n,)
    prompts, prompt_offsets = _ragged(source.column("input_ids"))
    labels_flat, label_offsets = _ragged(source.column("step_labels"), nested=True)  # offsets count values
    num_queries = task.num_queries

    prompt_lengths = np.diff(prompt_offsets)
    lengths = prompt_lengths + depth * (num_queries + 1) + num_queries + 1  # prompt + completion
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("dataset too large for one Arrow list column (>= 2**31 tokens); build it in shards")
    input_ids = np.empty(int(offsets[-1]), dtype=np.int32)
    completion_mask = np.zeros(int(offsets[-1]), dtype=np.int8)
    for d in np.unique(depth):  # one vectorised render per depth (prompts of one depth share a length)
        rows = np.flatnonzero(depth == d)
        length = int(prompt_lengths[rows[0]])
        prompt = prompts[prompt_offsets[rows][:, None] + np.arange(length)]  # (m, Lp)
        width = (int(d) + 1) * num_queries
        states = labels_flat[label_offsets[rows][:, None] + np.arange(width)]
        states = states.reshape(len(rows), int(d) + 1, num_queries)
        completion = cot_completion_ids(states, ids)  # (m, Lc)
        positions = offsets[rows][:, None] + np.arange(length + completion.shape[1])  # (m, L)
        input_ids[positions] = np.concatenate([prompt, completion], axis=1)
        completion_mask[positions[:, length:]] = 1

    return _cot_table(offsets, input_ids, completion_mask, prompt_lengths, source)


def _cot_table(offsets: np.ndarray, input_ids: np.ndarray, completion_mask: np.ndarray, prompt_lengths: np.ndarray,
               source: pa.Table) -> Dataset:
    """The columns of :func:`build_cot_dataset` as a Dataset: ``input_ids`` and ``completion_mask`` cut at the row
    ``offsets``, ``prompt_length``, and ``depth``, ``ops``, ``step_labels`` as in the ``source`` table."""
    arrow_offsets = pa.array(offsets.astype(np.int32))
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(arrow_offsets, pa.array(input_ids)),
            "completion_mask": pa.ListArray.from_arrays(arrow_offsets, pa.array(completion_mask)),
            "prompt_length": pa.array(prompt_lengths.astype(np.int32)),
            "depth": source.column("depth"),
            "ops": source.column("ops"),
            "step_labels": source.column("step_labels"),
        }
    )
    return Dataset(InMemoryTable(table))


def _ragged(column: pa.ChunkedArray, nested: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A list<int> column (or list<fixed_size_list<int>> with ``nested``) as flat values and row offsets;
    for nested columns the offsets count flat values."""
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.values
    if nested:
        width = values.type.list_size
        offsets = offsets * width
        values = values.values
    start = int(offsets[0])
    return values.to_numpy(zero_copy_only=False).astype(np.int64)[start:], offsets - start


# ---------------------------------------------------------------------------------------------
# Parsing generated completions
# ---------------------------------------------------------------------------------------------
@dataclass
class CotParse:
    """What a generated completion says: ``states`` (k, Q) the written z_1..z_k and ``answer`` (Q,)
    as candidate indices, both None when the completion is malformed; ``num_tokens`` generated up
    to and including the first ``<eos>`` (all generated tokens if there is none)."""

    states: np.ndarray | None
    answer: np.ndarray | None
    num_tokens: int

    @property
    def well_formed(self) -> bool:
        return self.answer is not None


def parse_cot_completion(generated: Sequence[int] | np.ndarray | torch.Tensor, ids: CotTokenIds,
                         num_queries: int) -> CotParse:
    """Read one generated completion (ids after the prompt; trailing padding allowed after ``<eos>``).

    Well-formed means exactly: k >= 1 groups of ``num_queries`` candidate tokens separated by ``No``,
    then ``Yes``, ``num_queries`` candidate tokens and ``<eos>``. Anything else (no ``<eos>``, a wrong
    token, a short group) is malformed and yields ``states = answer = None``.
    """
    tokens = np.asarray(generated.detach().cpu() if isinstance(generated, torch.Tensor) else generated, dtype=np.int64)
    eos_at = np.flatnonzero(tokens == ids.eos)
    num_tokens = int(eos_at[0]) + 1 if len(eos_at) else len(tokens)
    malformed = CotParse(None, None, num_tokens)
    if not len(eos_at):
        return malformed
    body = tokens[: eos_at[0]]  # z_1 No ... z_k Yes a_1..a_Q
    group = num_queries + 1
    if len(body) - num_queries < group or (len(body) - num_queries) % group != 0:
        return malformed
    lookup = {int(t): c for c, t in enumerate(ids.candidates)}
    steps = (len(body) - num_queries) // group
    chunks = body[: steps * group].reshape(steps, group)  # each: z_k then a mark
    marks = chunks[:, -1]
    if (marks[:-1] != ids.separator).any() or marks[-1] != ids.answer:
        return malformed
    written = [*chunks[:, :num_queries].reshape(-1).tolist(), *body[steps * group :].tolist()]
    if any(t not in lookup for t in written):
        return malformed
    indices = np.array([lookup[t] for t in written], dtype=np.int64)
    return CotParse(indices[:-num_queries].reshape(steps, num_queries), indices[-num_queries:], num_tokens)


def parse_cot_answer(generated: Sequence[int] | np.ndarray | torch.Tensor, tokenizer: PreTrainedTokenizerBase,
                     task: Task) -> np.ndarray | None:
    """The final state (Q,) candidate indices from one generated completion, or None if malformed
    (malformed output counts as wrong)."""
    return parse_cot_completion(generated, cot_token_ids(tokenizer, task), task.num_queries).answer


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id rows -> input_ids (B, T), attention_mask (B, T)."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        if len(row):
            input_ids[b, width - len(row) :] = torch.as_tensor(row, dtype=torch.long)
            attention_mask[b, width - len(row) :] = 1
    return input_ids, attention_mask


@torch.inference_mode()
def generate_cot(model: Any, prompts: Sequence[Sequence[int]], ids: CotTokenIds, max_new_tokens: int,
                 batch_size: int = 256, device: str | torch.device | None = None) -> list[np.ndarray]:
    """Greedy KV-cached generation for each prompt (left padding); returns the generated ids per prompt."""
    device = torch.device(device) if device is not None else model.device
    outputs: list[np.ndarray] = []
    for start in range(0, len(prompts), batch_size):
        input_ids, attention_mask = left_pad(prompts[start : start + batch_size], ids.pad)
        generated = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), do_sample=False, use_cache=True,
            max_new_tokens=int(max_new_tokens), eos_token_id=ids.eos, pad_token_id=ids.pad,
            temperature=None, top_p=None, top_k=None,
        )
        outputs += list(generated[:, input_ids.shape[1] :].cpu().numpy())
    return outputs


def evaluate_cot(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    depths: Sequence[int],
    n_per_depth: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    random_initial: bool = False,
    train_max_depth: int | None = None,
    extra_new_tokens: int | None = None,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Accuracy of a CoT causal LM on fresh problems at each depth (greedy, KV cache, left padding).

    Args:
        depths: test depths, distinct integers >= 1, evaluated in ascending order.
        n_per_depth: problems per depth, drawn by :func:`~state_tracking.evaluation.draw_test_problems` (PAR's too).
        extra_new_tokens: generation budget beyond a well-formed completion
            (``max_new_tokens = cot_completion_length + extra``); default Q + 1, room for one extra state.
        train_max_depth: longest training depth; enables ``extrapolation_factor``.
    Returns:
        A JSON-ready dict shaped like :func:`evaluate_length_generalization`'s: ``depths``,
        ``accuracy`` (overall state accuracy of the final answer per depth; malformed = wrong),
        ``intermediate_accuracy`` (fraction writing exactly d states, all right), ``mean_generated_tokens``,
        ``per_depth`` rows (those plus ``per_query_accuracy``, ``fraction_malformed``,
        ``fraction_wrong_state_count``, ``mean_states_written``, ``max_new_tokens``, ``n``), ``d50``,
        ``extrapolation_factor``, ``n_per_depth``/``n``, seed, task, model config and environment.
    """
    depths = _check_depths(depths)
    n_per_depth = _positive_int("n_per_depth", n_per_depth)
    batch_size = _positive_int("batch_size", batch_size)
    _check_seed(seed)
    if extra_new_tokens is None:
        extra_new_tokens = task.num_queries + 1
    if not isinstance(extra_new_tokens, (int, np.integer)) or extra_new_tokens < 0:
        raise ValueError(f"extra_new_tokens must be a non-negative integer, got {extra_new_tokens!r}")
    ids = cot_token_ids(tokenizer, task)
    if hasattr(model, "eval"):
        model.eval()

    per_depth = [_cot_depth_row(model, tokenizer, task, ids, depth, n_per_depth, seed, random_initial,
                                extra_new_tokens, batch_size, device) for depth in depths]
    return _cot_record(model, task, depths, per_depth, random_initial, seed, n_per_depth, batch_size,
                       train_max_depth, device)


def _cot_depth_row(model: Any, tokenizer: PreTrainedTokenizerBase, task: Task, ids: CotTokenIds, depth: int,
                   n_per_depth: int, seed: int, random_initial: bool, extra_new_tokens: int, batch_size: int,
                   device: str | torch.device | None) -> dict[str, Any]:
    """One ``per_depth`` row of :func:`evaluate_cot`: the test problems at ``depth`` generated and scored
    (:func:`score_cot`), with ``depth``, ``max_new_tokens`` and ``n``."""
    ops, initial = draw_test_problems(task, depth, n_per_depth, seed, random_initial)
    states = task.prefix_states(ops, initial)  # (n, d + 1, Q)
    prompts = encode_batch(task, tokenizer, "symbolic", ops, initial)["input_ids"]
    max_new_tokens = cot_completion_length(task, depth) + int(extra_new_tokens)
    generated = generate_cot(model, prompts, ids, max_new_tokens, batch_size, device)
    row = score_cot(generated, states, ids, task)
    row.update(depth=depth, max_new_tokens=max_new_tokens, n=n_per_depth)
    return row


def _cot_record(model: Any, task: Task, depths: list[int], per_depth: list[dict[str, Any]], random_initial: bool,
                seed: int, n_per_depth: int, batch_size: int, train_max_depth: int | None,
                device: str | torch.device | None) -> dict[str, Any]:
    """The JSON-ready result of :func:`evaluate_cot` from its ``per_depth`` rows and settings."""
    accuracies = [row["accuracy"] for row in per_depth]
    config = getattr(model, "config", None)
    return {
        "method": "cot",
        "task": task.name,
        "task_spec": task.to_dict(),
        "rendering": "symbolic",
        "random_initial": random_initial,
        "seed": seed,
        "n_per_depth": n_per_depth,
        "n": n_per_depth,
        "batch_size": batch_size,
        "train_max_depth": train_max_depth,
        "depths": depths,
        "accuracy": accuracies,
        "intermediate_accuracy": [row["intermediate_accuracy"] for row in per_depth],
        "mean_generated_tokens": [row["mean_generated_tokens"] for row in per_depth],
        "per_depth": per_depth,
        "d50": longest_accurate_depth(depths, accuracies),
        "extrapolation_factor": (None if train_max_depth is None
                                 else extrapolation_factor(depths, accuracies, train_max_depth)),
        "model_config": to_json(config.to_dict()) if hasattr(config, "to_dict") else None,
        "environment": environment_info(device if device is not None else getattr(model, "device", None)),
    }


def score_cot(generated: Sequence[np.ndarray], states: np.ndarray, ids: CotTokenIds, task: Task) -> dict[str, Any]:
    """Score generated completions against the true states (n, d + 1, Q) of their problems."""
    states = np.asarray(states)
    depth = states.shape[1] - 1
    parses = [parse_cot_completion(g, ids, task.num_queries) for g in generated]
    answers = np.array([p.answer if p.well_formed else np.full(task.num_queries, MALFORMED) for p in parses])
    targets = states[:, -1]  # (n, Q)
    right_count = np.array([p.states is not None and len(p.states) == depth for p in parses])
    chain_right = np.array([bool(c) and bool((p.states == states[i, 1:]).all())
                            for i, (p, c) in enumerate(zip(parses, right_count))])
    written = [len(p.states) for p in parses if p.states is not None]
    return {
        "accuracy": overall_state_accuracy(answers, targets),
        "per_query_accuracy": dict(zip(task.query_names, per_query_accuracy(answers, targets).tolist())),
        "intermediate_accuracy": float(chain_right.mean()),
        "mean_generated_tokens": float(np.mean([p.num_tokens for p in parses])),
        "expected_tokens": cot_completion_length(task, depth),
        "fraction_malformed": float(np.mean([not p.well_formed for p in parses])),
        "fraction_wrong_state_count": float(np.mean([p.well_formed and not c for p, c in zip(parses, right_count)])),
        "mean_states_written": float(np.mean(written)) if written else None,
    }


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------
def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_seed(seed: Any) -> None:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, (bool, np.bool_)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _check_depths(depths: Sequence[int] | int) -> list[int]:
    """A depth or depths, each an integer (not a bool or float), then `check_test_depths` (distinct, >= 1, sorted)."""
    values = [depths] if isinstance(depths, (int, np.integer)) else list(depths)
    if any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) for d in values):
        raise ValueError(f"depths must be a non-empty list of integers >= 1, got {values!r}")
    return check_test_depths(values)


__all__ = [
    "ANSWER_TOKEN", "EOS_TOKEN", "SEPARATOR_TOKEN", "CotParse", "CotTokenIds", "build_cot_dataset",
    "build_cot_tokenizer", "cot_completion_ids", "cot_completion_length", "cot_completion_tokens",
    "cot_token_ids", "evaluate_cot", "generate_cot", "left_pad", "parse_cot_answer",
    "parse_cot_completion", "render_cot", "score_cot",
]
