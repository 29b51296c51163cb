"""Tokenizers for the renderings in :mod:`state_tracking.prompts`, and fast batch encoding.

:func:`build_tokenizer` makes a word-level ``PreTrainedTokenizerFast`` (``tokenizers`` WordLevel
model, whitespace pre-tokenizer, ``<bos>`` prepended) whose vocabulary is exactly the words the
rendering can produce. Any other tokenizer (e.g. Qwen's BPE) can be used with the ``text``
rendering as long as every answer candidate and "Yes"/"No" is one token in the form it takes
after a space (" apple"); :func:`model_token_ids` checks that and returns the ids the model's
config needs.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from modeling_par.token_boundaries import token_boundaries, unknown_word

from .prompts import (
    BOS_TOKEN,
    NO_TOKEN,
    PAD_TOKEN,
    UNK_TOKEN,
    YES_TOKEN,
    check_rendering,
    prompt_format_of,
    query_token,
    symbolic_vocabulary,
    text_prompt,
    text_sentences,
)
from .tasks import Task


def build_tokenizer(task: Task, rendering: str = "symbolic") -> PreTrainedTokenizerFast:
    """A word-level tokenizer covering every word of ``rendering`` for ``task``.

    Vocabulary: ``<pad> <unk> <bos>``, then (symbolic) the query tokens ``<q1>..``, ``Yes No``,
    the candidates and the op names, or (text) ``Yes No``, the candidates and the remaining words
    in order of first appearance. Saves/loads with ``save_pretrained`` /
    ``AutoTokenizer.from_pretrained``.
    """
    check_rendering(rendering)
    if rendering == "symbolic":
        vocab = symbolic_vocabulary(task)
    else:
        vocab = [PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, YES_TOKEN, NO_TOKEN, *task.candidate_names]
        pre_tokenizer = Whitespace()
        for sentence in text_sentences(task):
            vocab += [word for word, _ in pre_tokenizer.pre_tokenize_str(sentence)]
        vocab = list(dict.fromkeys(vocab))  # keep first appearance
    backend = Tokenizer(WordLevel({token: i for i, token in enumerate(vocab)}, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = Whitespace()
    specials = [PAD_TOKEN, UNK_TOKEN, BOS_TOKEN]
    queries = [query_token(q) for q in range(task.num_queries)] if rendering == "symbolic" else []
    backend.add_special_tokens(specials + queries)  # matched whole, before pre-tokenization
    backend.post_processor = TemplateProcessing(
        single=f"{BOS_TOKEN} $A", special_tokens=[(BOS_TOKEN, vocab.index(BOS_TOKEN))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=queries,
        padding_side="right",
        model_max_length=1_000_000,
    )


def model_token_ids(tokenizer: PreTrainedTokenizerBase, task: Task) -> dict:
    """The ids the model config needs.

    Returns ``{"answer_token_ids": [one id per candidate, in task.candidate_names order],
    "halt_token_ids": (yes_id, no_id), "pad_token_id": id, "vocab_size": len(tokenizer)}``.
    Raises ValueError if a candidate or Yes/No is not a single token (as " word"), if two of them
    share a token, or if the tokenizer has no pad token.
    """
    answer_ids = [_single_token_id(tokenizer, name, "answer candidate") for name in task.candidate_names]
    yes_id = _single_token_id(tokenizer, YES_TOKEN, "halting answer")
    no_id = _single_token_id(tokenizer, NO_TOKEN, "halting answer")
    all_ids = answer_ids + [yes_id, no_id]
    if len(set(all_ids)) != len(all_ids):
        raise ValueError(f"answer candidates and Yes/No must map to distinct tokens, got ids {all_ids}")
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)")
    return {
        "answer_token_ids": answer_ids,
        "halt_token_ids": (yes_id, no_id),
        "pad_token_id": int(tokenizer.pad_token_id),
        "vocab_size": len(tokenizer),
    }


def _single_token_id(tokenizer: PreTrainedTokenizerBase, word: str, role: str) -> int:
    ids = tokenizer.encode(" " + word, add_special_tokens=False)
    if len(ids) != 1 or ids[0] == tokenizer.unk_token_id:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise ValueError(
            f"{role} {word!r} must be one known token of the tokenizer (as ' {word}'), got {pieces}; "
            "choose other names (e.g. get_task(name, items=[...])) or build_tokenizer(task, rendering)"
        )
    return int(ids[0])


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------
def encode_batch(
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    rendering: str,
    ops: np.ndarray,
    initial: np.ndarray | None = None,
    phrasing: str = "canonical",
    rng: np.random.Generator | None = None,
) -> dict[str, list[list[int]]]:
    """Token ids and query positions for a batch of problems.

    Args:
        ops: (n, d) operation indices.
        initial: (n, num_queries) start states, or None for the task's default start (which the
            symbolic rendering leaves unwritten; the text rendering always states the start).
        phrasing, rng: the text rendering's sentences (``canonical``, or drawn among the ``seen`` / ``held_out``
            alternatives with ``rng``; see ``Task.phrasing_options``). The symbolic rendering has one.
    Returns:
        ``{"input_ids": n lists, "query_positions": n lists of num_queries token positions,
        "operation_ends": n lists of d + 1 token positions (the last token of the preamble, then of each
        operation)}``.
    """
    ids_flat, lengths, query_positions, operation_ends = encode_ragged(task, tokenizer, rendering, ops, initial,
                                                                       phrasing, rng)
    rows = np.split(ids_flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
    return {"input_ids": [row.tolist() for row in rows], "query_positions": query_positions.tolist(),
            "operation_ends": operation_ends.tolist()}


def encode_ragged(
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    rendering: str,
    ops: np.ndarray,
    initial: np.ndarray | None = None,
    phrasing: str = "canonical",
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`encode_batch` as arrays: (ids_flat (sum of lengths,), lengths (n,), query_positions (n, Q),
    operation_ends (n, d + 1))."""
    check_rendering(rendering)
    ops = task.check_ops(ops)
    if initial is not None:
        initial = task.check_initial(initial, len(ops))
    if rendering == "symbolic":
        input_ids = _encode_symbolic(task, tokenizer, ops, initial)  # (n, L)
        n, length = input_ids.shape
        query_positions = np.tile(np.arange(length - task.num_queries, length), (n, 1))
        preamble_end = 0 if initial is None else task.num_queries  # <bos> [z_0 candidates]
        operation_ends = np.tile(preamble_end + np.arange(ops.shape[1] + 1), (n, 1))
        return input_ids.reshape(-1), np.full(n, length, dtype=np.int64), query_positions, operation_ends
    return _encode_text(task, tokenizer, ops, initial, phrasing, rng)


def _encode_symbolic(task: Task, tokenizer: PreTrainedTokenizerBase, ops: np.ndarray,
                     initial: np.ndarray | None) -> np.ndarray:
    """Pure id mapping: <bos> [initial] ops queries.  # (n, 1 [+ Q] + d + Q) int64"""
    vocab = tokenizer.get_vocab()
    queries = [query_token(q) for q in range(task.num_queries)]
    missing = [t for t in [BOS_TOKEN, *queries, *task.candidate_names, *task.op_names] if t not in vocab]
    if missing:
        raise ValueError(
            f"the symbolic rendering needs tokens {missing[:5]}{'...' if len(missing) > 5 else ''} that this "
            "tokenizer lacks; use build_tokenizer(task, 'symbolic')"
        )
    op_ids = np.array([vocab[name] for name in task.op_names], dtype=np.int64)
    n = len(ops)
    parts = [np.full((n, 1), vocab[BOS_TOKEN], dtype=np.int64)]
    if initial is not None:
        candidate_ids = np.array([vocab[name] for name in task.candidate_names], dtype=np.int64)
        parts.append(candidate_ids[initial])
    parts.append(op_ids[ops])
    parts.append(np.tile(np.array([vocab[q] for q in queries], dtype=np.int64), (n, 1)))
    return np.concatenate(parts, axis=1)


def _encode_text(
    task: Task, tokenizer: PreTrainedTokenizerBase, ops: np.ndarray, initial: np.ndarray | None,
    phrasing: str = "canonical", rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Render, then find the boundaries the way a checkpoint reads raw text: the task's `PromptFormat` segments each
    prompt (and must give back its own operations) and `token_boundaries` maps them to tokens."""
    n = len(ops)
    if n == 0:
        return (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                np.zeros((0, task.num_queries), dtype=np.int64), np.zeros((0, ops.shape[1] + 1), dtype=np.int64))
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            "the text rendering needs a tokenizer with character offsets (a fast tokenizer): "
            f"{type(tokenizer).__name__} has none (is_fast is False). Load it with "
            "AutoTokenizer.from_pretrained(..., use_fast=True) or use build_tokenizer(task, 'text')."
        )
    prompt_format = prompt_format_of(task, "text")
    prompts = [text_prompt(task, ops[i], None if initial is None else initial[i], phrasing, rng)[0] for i in range(n)]
    segments = [prompt_format.segment(prompt) for prompt in prompts]
    names = task.op_names
    for i, seg in enumerate(segments):
        if list(seg.operations) != [names[o] for o in ops[i]]:
            raise ValueError(f"text prompt {i} segments into other operations than it was rendered from "
                             f"({list(seg.operations[:5])} vs {[names[o] for o in ops[i][:5]]}): two of the task's "
                             "sentences read alike; give every operation its own sentence.")
    encoding = tokenizer(prompts, add_special_tokens=True)
    rows = encoding["input_ids"]
    for i in range(n):
        word = unknown_word(tokenizer, encoding, i, prompts[i])
        if word is not None:
            raise ValueError(f"word {word!r} of the text prompt is unknown to the tokenizer; "
                             "use build_tokenizer(task, 'text')")
    bounds = [token_boundaries(encoding, i, prompts[i], seg) for i, seg in enumerate(segments)]
    query_positions = np.array([queries for _, queries in bounds], dtype=np.int64).reshape(n, task.num_queries)
    operation_token_ends = np.array([ends for ends, _ in bounds], dtype=np.int64).reshape(n, ops.shape[1] + 1)
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    ids_flat = np.fromiter((t for row in rows for t in row), dtype=np.int64, count=int(lengths.sum()))
    return ids_flat, lengths, query_positions, operation_token_ends


