"""From a prompt's character offsets to token indices: the boundaries the loop reads (`token_boundaries`) and the
first word a tokenizer cannot read (`unknown_word`), for the pipeline and the evaluators.

Imports only the standard library and a sibling module (remote code).
"""

from __future__ import annotations

from .prompt_format import PromptFormatError, Segments


def unknown_word(tokenizer, encoding, i: int, prompt: str) -> str | None:
    """The first word of prompt `i` that the tokenizer maps to its unknown token, or None (a tokenizer without one
    knows every word)."""
    unk = tokenizer.unk_token_id
    ids = encoding["input_ids"][i]
    if unk is None or unk not in ids:
        return None
    return prompt[slice(*encoding.token_to_chars(i, ids.index(unk)))]


def token_boundaries(encoding, i: int, prompt: str, segments: Segments) -> tuple[list[int], list[int]]:
    """Token indices from character offsets: `operation_ends` (d + 1: the preamble's last token, then each
    operation's) and `query_positions` (Q) of prompt `i` of a fast-tokenizer `encoding` (needs char_to_token).
    A preamble without characters (symbolic, default start) ends at token 0, which must be a special token."""
    def token_at(end: int, what: str) -> int:
        token = encoding.char_to_token(i, end - 1)
        if token is None:
            raise PromptFormatError(
                f"the tokenizer's offsets map no token to character {end - 1} ({prompt[end - 1]!r}, the end of {what}) "
                f"of prompt {i}: char_to_token returned None, so the operation and query boundaries cannot be found. "
                "Use a fast tokenizer whose offsets cover every word (the checkpoint's own tokenizer, or e.g. "
                "Qwen2's).")
        return token

    if segments.preamble_end is None:
        if encoding.char_to_token(i, len(prompt) - len(prompt.lstrip())) == 0:
            raise PromptFormatError("a symbolic prompt with the default start needs the tokenizer to prepend its "
                                    "<bos> token (token 0 ends the preamble).")
        preamble = 0
    else:
        preamble = token_at(segments.preamble_end, "the preamble")
    ends = [preamble] + [token_at(end, f"operation {k + 1}") for k, end in enumerate(segments.operation_ends)]
    queries = [token_at(end, f"query {j + 1}") for j, end in enumerate(segments.query_ends)]
    for k in range(1, len(ends)):
        if ends[k] <= ends[k - 1]:
            raise PromptFormatError(
                f"operation {k} of prompt {i} shares its last token with what precedes it: the tokenizer merged "
                "the boundary; separate the sentences with whitespace.")
    return ends, queries


__all__ = ["token_boundaries", "unknown_word"]
