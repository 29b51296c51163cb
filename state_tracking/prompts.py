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

from modeling_par.prompt_format import CANDIDATE, PromptFormat

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


def text_prompt(task: Task, ops: np.ndarray, initial: np.ndarray | None = None, phrasing: str = "canonical",
                rng: np.random.Generator | None = None) -> tuple[str, list[int]]:
    """One problem as English. ops: (d,); initial: (num_queries,) or None for the default start.

    ``phrasing`` (see ``Task.phrasing_options``): ``canonical`` writes every sentence in its first form; ``seen`` /
    ``held_out`` draw each sentence uniformly among that split's alternatives with ``rng`` (required for them).
    Returns the prompt and, per query, the character offset where its question words end (the readout token is the
    one covering the character just before that offset). Where the preamble and each operation end is found by
    segmenting the prompt (:func:`prompt_format_of`), as a checkpoint does with raw text.
    """
    preamble, op_options, query_options = task.phrasing_options(phrasing)
    if phrasing != "canonical" and rng is None:
        raise ValueError(f"phrasing={phrasing!r} draws among alternatives: pass rng (a numpy Generator)")

    def choose(options: list[str]) -> str:
        return options[0] if len(options) == 1 else options[int(rng.integers(len(options)))]

    if initial is None:
        initial = task.default_initial(1)[0]
    names = task.candidate_names
    start = [choose(templates).replace(CANDIDATE, names[int(initial[j])]) for j, templates in enumerate(preamble)]
    prompt = " ".join([*start, *(choose(op_options[o]) for o in ops)])
    query_ends = []
    for options in query_options:
        prompt += " " + choose(options)
        query_ends.append(len(prompt))
        prompt += " " + QUESTION_MARK
    return prompt, query_ends


def prompt_format_of(task: Task, rendering: str) -> PromptFormat:
    """The segmentation rule of ``task``'s ``rendering`` (saved in a checkpoint's config as ``prompt_format``): every
    sentence each preamble unit, operation and query may be written with (seen and held-out phrasings alike). Every
    prompt this module renders segments back into its own operations (``encode_batch`` builds ``operation_ends``
    through it)."""
    check_rendering(rendering)
    if rendering == "symbolic":
        return PromptFormat("symbolic", tuple(task.query_names), tuple(task.candidate_names),
                            {name: (name,) for name in task.op_names}, task_name=task.name)
    return PromptFormat("text", tuple(task.query_names), tuple(task.candidate_names),
                        {name: tuple(task.op_phrasings[o]) for o, name in enumerate(task.op_names)},
                        preamble=tuple(tuple(t) for t in task.preamble_phrasings()),
                        queries=tuple(tuple(q) for q in task.query_phrasings), task_name=task.name)


def symbolic_vocabulary(task: Task) -> list[str]:
    """Every token the symbolic rendering can produce, specials first."""
    queries = [query_token(q) for q in range(task.num_queries)]
    return [PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, *queries, YES_TOKEN, NO_TOKEN, *task.candidate_names, *task.op_names]


def text_sentences(task: Task) -> list[str]:
    """Sentences that together use every word the text rendering can produce (every phrasing, held-out ones too)."""
    names = task.candidate_names
    starts = [t.replace(CANDIDATE, names[int(row[j])]) for row in _covering_initial_states(task)
              for j, templates in enumerate(task.preamble_phrasings()) for t in templates]
    questions = [f"{words} {QUESTION_MARK}" for options in task.query_phrasings for words in options]
    return starts + [t for options in task.op_phrasings for t in options] + questions


def _covering_initial_states(task: Task) -> np.ndarray:
    """Start states that put every candidate under every query at least once.  # (num_candidates, Q)"""
    shifts = np.arange(task.num_candidates)[:, None] + np.arange(task.num_queries)[None, :]
    return shifts % task.num_candidates
