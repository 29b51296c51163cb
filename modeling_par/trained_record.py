"""A prompt format's record of what training wrote (`PromptFormat.trained`; its fields are described in
`prompt_format.py`'s module docstring), checked against the format and normalized to tuples: `checked_trained`.

Every sentence of the record must be one the format accepts in that slot; a bad record is one `ValueError` naming
its first bad field ("prompt_format.trained.operations['swap_1_2'] must be ...").

Remote code: imports only the standard library (`PromptFormat` calls it as it is built).
"""

from __future__ import annotations


def _fail(name, allowed, value):
    raise ValueError(f"prompt_format.trained{name} must be {allowed}; got {value!r}.")


def _strings(fmt, name, value, allowed_keys, what, may_be_empty=False) -> tuple:
    """`value` as a tuple of strings, each one whose key (`fmt._key`) is in `allowed_keys`."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value) or (
            not value and not may_be_empty):
        _fail(name, f"a {'' if may_be_empty else 'non-empty '}list of {what}", value)
    for v in value:
        if fmt._key(v) not in allowed_keys:
            _fail(name, f"{what} this format accepts there", v)
    return tuple(value)


def checked_trained(fmt, trained) -> dict:
    """`trained` checked against the format `fmt` (every sentence one the format accepts in that slot) and
    normalized to tuples; one `ValueError` naming the first bad field."""
    if not isinstance(trained, dict):
        _fail("", "None or a dict with 'operations', 'preamble', 'queries' (and optionally 'source')", trained)
    allowed = {"operations", "preamble", "queries", "source", "untrained_accuracy"}
    if sorted(set(trained) - allowed) or "operations" not in trained:
        _fail("", f"a dict with keys {sorted(allowed)} ('operations' required)", sorted(trained))
    out_ops = _checked_operations(fmt, trained["operations"])
    out_preamble, out_queries = _checked_start_and_queries(fmt, trained.get("preamble", []),
                                                           trained.get("queries", []))
    source = trained.get("source")
    if source is not None and not isinstance(source, str):
        _fail(".source", "None or a string", source)
    out = {"operations": out_ops, "preamble": out_preamble, "queries": out_queries, "source": source}
    measured = trained.get("untrained_accuracy")
    if measured is not None:
        out["untrained_accuracy"] = _checked_measured(measured)
    return out


def _checked_operations(fmt, operations) -> dict:
    """The record's op name -> sentences, each op one of the format's and each sentence one of that op's."""
    if not isinstance(operations, dict) or not operations:
        _fail(".operations", "a non-empty mapping op name -> the sentences training used", operations)
    out_ops = {}
    for name, units in operations.items():
        if name not in fmt.operations:
            _fail(".operations", f"keyed by the format's operations {list(fmt.operations)[:8]}", name)
        out_ops[name] = _strings(fmt, f".operations[{name!r}]", units, {fmt._key(u) for u in fmt.operations[name]},
                                 f"sentences of operation {name!r}")
    return out_ops


def _checked_start_and_queries(fmt, preamble, queries) -> tuple[tuple, tuple]:
    """The record's start (text: start sentences per preamble unit; symbolic: [] or start candidates per query) and
    question words per query (symbolic: none, its queries are fixed tokens)."""
    q = len(fmt.query_names)
    if fmt.rendering == "symbolic":
        if not isinstance(preamble, (list, tuple)) or len(preamble) not in (0, q):
            _fail(".preamble", f"[] (training wrote no start) or one list of start candidates per query ({q})",
                  preamble)
        out_preamble = tuple(_strings(fmt, f".preamble[{j}]", p, set(fmt.candidates), "candidates")
                             for j, p in enumerate(preamble))
        if queries:
            _fail(".queries", "[] in the symbolic rendering (its queries are fixed tokens)", queries)
        return out_preamble, ()
    if not isinstance(preamble, (list, tuple)) or len(preamble) != len(fmt.preamble):
        _fail(".preamble", f"one list of start sentences per preamble unit ({len(fmt.preamble)})", preamble)
    out_preamble = tuple(_strings(fmt, f".preamble[{j}]", p, fmt._lookup["preamble"][j], "start sentences")
                         for j, p in enumerate(preamble))
    if not isinstance(queries, (list, tuple)) or len(queries) != q:
        _fail(".queries", f"one list of question words per query ({q})", queries)
    out_queries = tuple(_strings(fmt, f".queries[{j}]", w, {fmt._key(a) for a in fmt.queries[j]}, "question words")
                        for j, w in enumerate(queries))
    return out_preamble, out_queries


def _checked_measured(measured) -> dict:
    """The record's `untrained_accuracy`: {"accuracy": in [0, 1], "depth": >= 1, "n": >= 1, "source": str}, its
    accuracy as a float."""
    fields = {"accuracy", "depth", "n", "source"}
    if not isinstance(measured, dict) or set(measured) != fields:
        _fail(".untrained_accuracy", f"None or a dict with keys {sorted(fields)}", measured)
    accuracy, depth, n = measured["accuracy"], measured["depth"], measured["n"]
    if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) or not 0 <= accuracy <= 1:
        _fail(".untrained_accuracy['accuracy']", "a number in [0, 1]", accuracy)
    for name, value in (("depth", depth), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            _fail(f".untrained_accuracy[{name!r}]", "an integer >= 1", value)
    if not isinstance(measured["source"], str):
        _fail(".untrained_accuracy['source']", "a string", measured["source"])
    return dict(measured, accuracy=float(accuracy))


__all__ = ["checked_trained"]
