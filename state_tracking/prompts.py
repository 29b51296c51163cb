"""How a problem (start state, operations, queries) is written down, before tokenization.

Two renderings:

``symbolic`` -- one token per operation, for models trained from scratch::

    <bos> [z_0 candidates, only for a random start] op_1 ... op_d <q1> ... <qQ>
    e.g. swap-S5, identity start:  <bos> swap_1_2 identity swap_2_3 <q1> <q2> <q3> <q4> <q5>

  The readout for query q is taken at the position of ``<q{q}>``.

``text`` -- English for pretrained tokenizers. The start state is always stated, then one
sentence per operation, then one question line per query whose answer is left open::

    Box 1 contains the apple. Box 2 contains the banana. ... Box 5 contains the lemon.
    Swap the contents of Box 1 and Box 2. Leave the boxes as they are. ...
    Box 1 contains the ? Box 2 contains the ? ... Box 5 contains the ?

  The readout for query q is taken at the last token of its question words ("... contains the"),
  i.e. the token just before its "?": the place where a pretrained LM would name the item. The
  "?" keeps the next question from reading as the answer, and no answer appears in the prompt.
"""

from __future__ import annotations

import numpy as np

from .tasks import RESERVED_WORDS, Task

RENDERINGS = ("symbolic", "text")
PAD_TOKEN, UNK_TOKEN, BOS_TOKEN = "<pad>", "<unk>", "<bos>"
YES_TOKEN, NO_TOKEN = RESERVED_WORDS  # the halting readout: "Yes" = done, "No" = keep going
QUESTION_MARK = "?"


def check_rendering(rendering: str) -> str:
    if rendering not in RENDERINGS:
        raise ValueError(f"unknown rendering {rendering!r}; allowed: {list(RENDERINGS)}")
    return rendering


def query_token(q: int) -> str:
    """The symbolic token asking query q (0-based): ``<q1>``, ``<q2>``, ..."""
    return f"<q{q + 1}>"


def symbolic_tokens(task: Task, ops: np.ndarray, initial: np.ndarray | None = None) -> list[str]:
    """One problem as symbolic tokens. ops: (d,); initial: (num_queries,) or None (default start,
    not written)."""
    tokens = [BOS_TOKEN]
    if initial is not None:
        tokens += [task.candidate_names[c] for c in initial]
    tokens += [task.op_names[o] for o in ops]
    tokens += [query_token(q) for q in range(task.num_queries)]
    return tokens


def text_prompt(task: Task, ops: np.ndarray, initial: np.ndarray | None = None) -> tuple[str, list[int]]:
    """One problem as English. ops: (d,); initial: (num_queries,) or None for the default start.

    Returns the prompt and, per query, the character offset where its question words end
    (the readout token is the one covering the character just before that offset).
    """
    prompt, query_ends, _ = text_prompt_layout(task, ops, initial)
    return prompt, query_ends


def text_prompt_layout(task: Task, ops: np.ndarray, initial: np.ndarray | None = None) -> tuple[str, list[int], list[int]]:
    """:func:`text_prompt` plus the character offset where the start-state sentences end and where each
    operation's sentence ends (d + 1 offsets): the token covering the character before offset i ends
    operation i (i = 0: the preamble)."""
    if initial is None:
        initial = task.default_initial(1)[0]
    prompt = task.initial_text(initial)
    operation_ends = [len(prompt)]
    for o in ops:
        prompt += " " + task.op_texts[o]
        operation_ends.append(len(prompt))
    query_ends = []
    for words in task.query_texts:
        prompt += " " + words
        query_ends.append(len(prompt))
        prompt += " " + QUESTION_MARK
    return prompt, query_ends, operation_ends


def symbolic_vocabulary(task: Task) -> list[str]:
    """Every token the symbolic rendering can produce, specials first."""
    queries = [query_token(q) for q in range(task.num_queries)]
    return [PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, *queries, YES_TOKEN, NO_TOKEN, *task.candidate_names, *task.op_names]


def text_sentences(task: Task) -> list[str]:
    """Sentences that together use every word the text rendering can produce."""
    starts = [task.initial_text(row) for row in _covering_initial_states(task)]
    questions = [f"{words} {QUESTION_MARK}" for words in task.query_texts]
    return starts + list(task.op_texts) + questions


def _covering_initial_states(task: Task) -> np.ndarray:
    """Start states that put every candidate under every query at least once.  # (num_candidates, Q)"""
    shifts = np.arange(task.num_candidates)[:, None] + np.arange(task.num_queries)[None, :]
    return shifts % task.num_candidates
