"""Seeded datasets of state-tracking problems, prefix truncation, and the batch collator.

Every example holds the prompt and all its prefix states:

    input_ids        (L,)             token ids of the prompt
    query_positions  (Q,)             token position of each query's readout
    operation_ends   (d + 1,)         token position of the last token of the preamble, then of each op
    step_labels      (d + 1, Q)       z_0..z_d as candidate indices (z_t = state after t ops)
    depth            ()               d, the number of operations
    ops              (d,)             the operation indices

so a trainer with step size c reads iteration k's target as z_min(c·k, d)
(``trainers.objectives.progress_targets``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from datasets import Dataset, DatasetInfo, Features, List, Value
from datasets.table import InMemoryTable
from transformers import PreTrainedTokenizerBase

from modeling_par.prompt_format import CANDIDATE
from modeling_par.sentences import collapse_whitespace

from .prompts import check_rendering, prompt_format_of, text_prompt
from .tasks import Task
from .tokenization import encode_batch, encode_ragged

COLUMNS = ("input_ids", "query_positions", "operation_ends", "step_labels", "depth", "ops")
LABEL_PAD_ID = -100
DATA_FORMAT_VERSION = 2  # bump when the prompts or columns change


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any printable parts, e.g. ``derive_seed("eval", seed, depth)``; keeps test
    sets apart from training data drawn with ``np.random.default_rng(seed)``."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def parse_depths(
    depths: int | tuple[int, int] | range | Sequence[int] | Mapping[int, float],
) -> tuple[np.ndarray, np.ndarray]:
    """Depth distribution -> (depth values, probabilities).

    * ``int`` d: always d.
    * ``tuple`` (lo, hi): uniform over lo..hi inclusive; a ``range`` object: uniform over its values.
    * ``list`` [d1, d2, ...]: uniform over exactly these depths.
    * ``dict`` {depth: probability}: probabilities must be >= 0 and sum to 1.
    Depths must be integers >= 1.
    """
    if isinstance(depths, (bool, np.bool_)):
        raise ValueError(f"depths must be an int, (lo, hi) tuple, range, list or {{depth: prob}} dict, got {depths!r}")
    if isinstance(depths, (int, np.integer)):
        values, probs = [int(depths)], [1.0]
    elif isinstance(depths, tuple):
        if len(depths) != 2 or not all(_is_int(d) for d in depths) or depths[0] > depths[1]:
            raise ValueError(f"a depths tuple must be (lo, hi) with integers lo <= hi (inclusive range), "
                             f"got {depths!r}")
        values = list(range(int(depths[0]), int(depths[1]) + 1))
        probs = [1.0 / len(values)] * len(values)
    elif isinstance(depths, (range, list)):
        values = list(depths)
        if not values or not all(_is_int(d) for d in values) or len(set(values)) != len(values):
            raise ValueError(f"a depths list must hold distinct integers, got {depths!r}")
        probs = [1.0 / len(values)] * len(values)
    elif isinstance(depths, Mapping):
        values, probs = list(depths.keys()), [float(p) for p in depths.values()]
        if not values or not all(_is_int(d) for d in values):
            raise ValueError(f"a depths dict must map integer depths to probabilities, got {depths!r}")
        if min(probs) < 0 or abs(sum(probs) - 1.0) > 1e-6:
            raise ValueError(f"depth probabilities must be >= 0 and sum to 1, got sum {sum(probs)}")
    else:
        raise ValueError(f"depths must be an int, (lo, hi) tuple, range, list or {{depth: prob}} dict, got {depths!r}")
    if min(values) < 1:
        raise ValueError(f"depths must be >= 1, got {min(values)}")
    return np.asarray(values, dtype=np.int64), np.asarray(probs, dtype=np.float64)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# ---------------------------------------------------------------------------------------------
# Dataset building
# ---------------------------------------------------------------------------------------------
def build_dataset(
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    rendering: str = "symbolic",
    *,
    n: int,
    depths: int | tuple[int, int] | range | Sequence[int] | Mapping[int, float] = (1, 32),
    seed: int = 0,
    random_initial: bool = False,
    phrasing: str = "seen",
) -> Dataset:
    """n problems with depths drawn from ``depths`` (see :func:`parse_depths`), reproducible from seed.

    ``phrasing`` (text rendering): ``seen`` (default) draws every sentence among the alternatives training may see
    (a task without alternatives has one), ``held_out`` among the held-out ones, ``canonical`` writes the first form
    (see ``Task.phrasing_options``); drawn from a generator of its own, so the ops do not depend on it.

    All randomness comes from ``np.random.default_rng(seed)``: first the n depths, then per depth
    (ascending) the ops and, with ``random_initial``, the start states. Work is vectorised per
    depth; rows keep the order of the drawn depths (already shuffled).
    Columns: see the module docstring.
    """
    check_rendering(rendering)
    if not _is_int(n) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    depth_values, depth_probs = parse_depths(depths)
    task.phrasing_options(phrasing)  # checks the name (the symbolic rendering never reads it)
    rng = np.random.default_rng(seed)
    sample_depths = rng.choice(depth_values, size=n, p=depth_probs)  # (n,)

    pieces, query_positions = _encode_problems(task, tokenizer, rendering, n, rng, sample_depths, seed,
                                               random_initial, phrasing)
    table, features = _problem_table(pieces, query_positions, sample_depths, n, task.num_queries)
    fingerprint = _fingerprint(task, tokenizer, rendering, n, depth_values, depth_probs, seed, random_initial,
                               phrasing)
    return Dataset(InMemoryTable(table), info=DatasetInfo(features=features), fingerprint=fingerprint)


def _encode_problems(task: Task, tokenizer: PreTrainedTokenizerBase, rendering: str, n: int, rng: np.random.Generator,
                     sample_depths: np.ndarray, seed: int, random_initial: bool, phrasing: str
                     ) -> tuple[dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]], np.ndarray]:
    """The problems of :func:`build_dataset` (:func:`_draw_problems`) encoded depth by depth: per ragged column the
    pieces (rows, row lengths, flat values) for :func:`_gather_ragged`, and the query positions (n, Q)."""
    pieces: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
        c: [] for c in ("input_ids", "operation_ends", "step_labels", "ops")
    }
    query_positions = np.empty((n, task.num_queries), dtype=np.int64)
    for depth, rows, ops, initial, phrasing_rng in _draw_problems(task, rng, sample_depths, seed, random_initial):
        states = task.prefix_states(ops, initial)  # (m, d + 1, Q)
        ids_flat, lengths, positions, operation_ends = encode_ragged(task, tokenizer, rendering, ops, initial,
                                                                     phrasing, phrasing_rng)
        query_positions[rows] = positions
        pieces["input_ids"].append((rows, lengths, ids_flat))
        pieces["operation_ends"].append((rows, np.full(len(rows), depth + 1), operation_ends.reshape(-1)))
        pieces["step_labels"].append((rows, np.full(len(rows), states[0].size), states.reshape(-1)))
        pieces["ops"].append((rows, np.full(len(rows), ops.shape[1]), ops.reshape(-1)))
    return pieces, query_positions


def _problem_table(pieces: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]], query_positions: np.ndarray,
                   sample_depths: np.ndarray, n: int, num_queries: int) -> tuple[pa.Table, Features]:
    """The Arrow table of :func:`build_dataset` (columns in `COLUMNS` order, sample order) and its features."""
    columns = {
        "input_ids": _list_array(*_gather_ragged(pieces["input_ids"], n)),
        "query_positions": pa.FixedSizeListArray.from_arrays(
            pa.array(query_positions.reshape(-1).astype(np.int32)), num_queries),
        "operation_ends": _list_array(*_gather_ragged(pieces["operation_ends"], n)),
        "step_labels": _nested_list_array(*_gather_ragged(pieces["step_labels"], n), num_queries),
        "depth": pa.array(sample_depths.astype(np.int32)),
        "ops": _list_array(*_gather_ragged(pieces["ops"], n)),
    }
    features = Features(
        {
            "input_ids": List(Value("int32")),
            "query_positions": List(Value("int32"), length=num_queries),
            "operation_ends": List(Value("int32")),
            "step_labels": List(List(Value("int32"), length=num_queries)),
            "depth": Value("int32"),
            "ops": List(Value("int32")),
        }
    )
    return pa.Table.from_arrays(list(columns.values()), schema=features.arrow_schema), features


def _draw_problems(task: Task, rng: np.random.Generator, sample_depths: np.ndarray, seed: int, random_initial: bool):
    """The problems of :func:`build_dataset`, per depth (ascending): (depth, rows, ops (m, d), initial (m, Q) or None,
    the generator its text rendering draws phrasings from). One source for the dataset and :func:`trained_phrasings`."""
    for depth in np.unique(sample_depths):
        rows = np.flatnonzero(sample_depths == depth)
        ops = task.sample_ops(rng, len(rows), int(depth))  # (m, d)
        initial = task.sample_initial(rng, len(rows)) if random_initial else None
        yield int(depth), rows, ops, initial, np.random.default_rng(derive_seed(seed, "phrasing", int(depth)))


def trained_phrasings(
    task: Task,
    rendering: str = "symbolic",
    *,
    n: int,
    depths: int | tuple[int, int] | range | Sequence[int] | Mapping[int, float] = (1, 32),
    seed: int = 0,
    random_initial: bool = False,
    phrasing: str = "seen",
) -> dict:
    """What the prompts of ``build_dataset(task, _, rendering, n=n, depths=depths, seed=seed,
    random_initial=random_initial, phrasing=phrasing)`` are written with, as ``PromptFormat.trained`` (see
    ``modeling_par/prompt_format.py``): the problems and phrasings drawn again from the same generators (no
    tokenizer needed), each prompt split into units by the task's format, the units collected per slot in the
    format's own order. ``prompt_format_of(task, rendering).with_trained(trained_phrasings(...))`` is what
    ``train_par.py`` saves in a checkpoint."""
    check_rendering(rendering)
    depth_values, depth_probs = parse_depths(depths)
    task.phrasing_options(phrasing)
    fmt = prompt_format_of(task, rendering)
    rng = np.random.default_rng(seed)
    sample_depths = rng.choice(depth_values, size=n, p=depth_probs)
    used_ops, used_op_units, used_preamble, used_queries = _used_units(task, fmt, rendering, rng, sample_depths, seed,
                                                                       random_initial, phrasing)
    names = task.op_names
    if rendering == "symbolic":
        operations = {names[o]: list(fmt.operations[names[o]]) for o in range(task.num_ops) if o in used_ops}
        preamble = [[c for c in task.candidate_names if c in used] for used in used_preamble] if random_initial else []
        queries: list[list[str]] = []
    else:
        operations = {name: [u for u in fmt.operations[name] if (o, collapse_whitespace(u)) in used_op_units]
                      for o, name in enumerate(names)}
        operations = {name: units for name, units in operations.items() if units}
        preamble = [[t.replace(CANDIDATE, c) for t in templates for c in task.candidate_names
                     if collapse_whitespace(t.replace(CANDIDATE, c)) in used_preamble[j]]
                    for j, templates in enumerate(fmt.preamble)]
        queries = [[w for w in words if collapse_whitespace(w) in used_queries[j]]
                   for j, words in enumerate(fmt.queries)]
    spread = depths if not isinstance(depths, range) else (depths.start, depths.stop - 1)
    source = (f"state_tracking.data.trained_phrasings: the prompts of build_dataset(task {task.name!r}, rendering "
              f"{rendering!r}, n={n}, depths={spread!r}, seed={seed}, random_initial={random_initial}, "
              f"phrasing={phrasing!r})")
    return {"operations": operations, "preamble": preamble, "queries": queries, "source": source}


def _used_units(task: Task, fmt, rendering: str, rng: np.random.Generator, sample_depths: np.ndarray, seed: int,
                random_initial: bool, phrasing: str) -> tuple[set, set, list[set[str]], list[set[str]]]:
    """What the prompts of :func:`trained_phrasings` use, drawn again (:func:`_draw_problems`): the operations
    (symbolic), the (operation, unit) pairs (text), per preamble slot its units (the start state's candidates when
    symbolic) and per query its units."""
    q, p = task.num_queries, len(fmt.preamble)
    used_ops: set[int] = set()
    used_op_units: set[tuple[int, str]] = set()
    used_preamble: list[set[str]] = [set() for _ in range(p if rendering == "text" else q)]
    used_queries: list[set[str]] = [set() for _ in range(q)]
    for _, _, ops, initial, phrasing_rng in _draw_problems(task, rng, sample_depths, seed, random_initial):
        if rendering == "symbolic":
            used_ops.update(np.unique(ops).tolist())
            if initial is not None:
                for j in range(q):
                    used_preamble[j].update(task.candidate_names[c] for c in np.unique(initial[:, j]))
            continue
        for i in range(len(ops)):  # the calls encode_ragged makes, in its order: the same draws
            prompt = text_prompt(task, ops[i], None if initial is None else initial[i], phrasing, phrasing_rng)[0]
            units = [collapse_whitespace(prompt[a:b]) for a, b in fmt.units(prompt)]
            for j in range(p):
                used_preamble[j].add(units[j])
            for o, unit in zip(ops[i].tolist(), units[p:len(units) - q]):
                used_op_units.add((o, unit))
            for j in range(q):
                used_queries[j].add(units[len(units) - q + j][:-1].rstrip())
    return used_ops, used_op_units, used_preamble, used_queries


def _fingerprint(task, tokenizer, rendering, n, depth_values, depth_probs, seed, random_initial, phrasing) -> str:
    """A fingerprint from the build arguments (same arguments -> same data), instead of hashing
    the built table."""
    vocab = sorted(tokenizer.get_vocab().items())
    parts = (DATA_FORMAT_VERSION, task.to_dict(), vocab, rendering, n, depth_values.tolist(), depth_probs.tolist(),
             seed, random_initial, phrasing)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _gather_ragged(pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-depth ragged rows into sample order -> (offsets (n + 1,), values)."""
    lengths = np.zeros(n, dtype=np.int64)
    for rows, row_lengths, _ in pieces:
        lengths[rows] = row_lengths
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.int32)
    for rows, row_lengths, flat in pieces:
        starts_in_flat = np.cumsum(row_lengths) - row_lengths
        values[np.repeat(offsets[rows] - starts_in_flat, row_lengths) + np.arange(len(flat))] = flat
    return offsets, values


def _list_array(offsets: np.ndarray, values: np.ndarray | pa.Array) -> pa.ListArray:
    if offsets[-1] >= 2**31:
        raise ValueError("dataset too large for one Arrow list column (>= 2**31 values); build it in shards")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                    values if isinstance(values, pa.Array) else pa.array(values))


def _nested_list_array(offsets: np.ndarray, values: np.ndarray, width: int) -> pa.ListArray:
    """Rows of shape (t, width) from flat values; ``offsets`` count values, not rows."""
    return _list_array(offsets // width, pa.FixedSizeListArray.from_arrays(pa.array(values), width))


# ---------------------------------------------------------------------------------------------
# Prefix truncation (self-distillation teacher inputs)
# ---------------------------------------------------------------------------------------------
def truncate_to_prefix(
    example_or_batch: Mapping[str, Any],
    j: int | Sequence[int] | np.ndarray | torch.Tensor,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    rendering: str = "symbolic",
    random_initial: bool = False,
) -> dict[str, Any]:
    """The same problem(s) keeping only the first j operations.

    Args:
        example_or_batch: one example (``depth`` a scalar) or a batch in columns: lists as from
            ``dataset[a:b]`` or tensors as from :class:`StateTrackingCollator` (padding is removed
            using ``depth``). Needs ``ops``, ``step_labels`` and ``depth``.
        j: the prefix length, an int or one per example (e.g. ``min(c·k, depth)``); 0 <= j <= depth.
        random_initial: whether the examples were built with ``random_initial`` (the symbolic
            rendering then writes z_0 into the prompt); checked against the examples.
    Returns:
        The truncated example(s) in the same layout as ``dataset[i]`` / ``dataset[a:b]`` (lists),
        with new ``input_ids``, ``query_positions``, ``step_labels`` (z_0..z_j), ``depth`` (= j)
        and ``ops``; feed a batch to the collator again.
    """
    check_rendering(rendering)
    missing = [c for c in ("ops", "step_labels", "depth") if c not in example_or_batch]
    if missing:
        raise ValueError(f"truncate_to_prefix needs columns {missing} in the example or batch")
    single = np.ndim(_to_numpy(example_or_batch["depth"])) == 0
    depth = np.atleast_1d(_to_numpy(example_or_batch["depth"])).astype(np.int64)  # (B,)
    ops_rows, labels_rows = _problem_rows(example_or_batch, depth, single)
    keep = np.broadcast_to(np.asarray(_to_numpy(j), dtype=np.int64), depth.shape)
    if (keep < 0).any() or (keep > depth).any():
        raise ValueError(f"prefix length j must satisfy 0 <= j <= depth for every example, got j={keep.tolist()} "
                         f"depth={depth.tolist()}")
    initial = np.stack([row[0] for row in labels_rows]).astype(np.int64)  # (B, Q)
    if not random_initial and not (initial == task.default_initial(len(initial))).all():
        raise ValueError("an example starts from a non-default state; pass random_initial=True for such data")
    if rendering == "symbolic" and "input_ids" in example_or_batch:
        _check_symbolic_lengths(example_or_batch, depth, single, task, random_initial)
    batch = _encode_prefixes(keep, ops_rows, labels_rows, initial, task, tokenizer, rendering, random_initial)
    return {c: values[0] for c, values in batch.items()} if single else batch


def _problem_rows(example_or_batch: Mapping[str, Any], depth: np.ndarray,
                  single: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per example of :func:`truncate_to_prefix` its ops (d,) and step labels (d + 1, Q), padding removed;
    `ValueError` where an example has fewer."""
    ops_column, labels_column = example_or_batch["ops"], example_or_batch["step_labels"]
    if single:
        ops_column, labels_column = [ops_column], [labels_column]
    ops_rows = [_to_numpy(row)[:d] for row, d in zip(ops_column, depth)]
    labels_rows = [_to_numpy(row)[: d + 1] for row, d in zip(labels_column, depth)]
    if (any(len(row) != d for row, d in zip(ops_rows, depth))
            or any(len(row) != d + 1 for row, d in zip(labels_rows, depth))):
        raise ValueError("every example needs depth ops and depth + 1 rows of step_labels")
    return ops_rows, labels_rows


def _check_symbolic_lengths(example_or_batch: Mapping[str, Any], depth: np.ndarray, single: bool, task: Task,
                            random_initial: bool) -> None:
    """`ValueError` where an example's ``input_ids`` (unpadded by ``attention_mask`` when given) is not as long as a
    symbolic prompt of its depth with ``random_initial``."""
    extra = task.num_queries if random_initial else 0
    ids_column, masks = example_or_batch["input_ids"], example_or_batch.get("attention_mask")
    if single:
        ids_column, masks = [ids_column], None if masks is None else [masks]
    lengths = [int(_to_numpy(m).sum()) for m in masks] if masks is not None else [len(r) for r in ids_column]
    if any(length != 1 + extra + d + task.num_queries for length, d in zip(lengths, depth)):
        raise ValueError(f"input_ids lengths do not match a symbolic prompt with random_initial={random_initial}")


def _encode_prefixes(keep: np.ndarray, ops_rows: list[np.ndarray], labels_rows: list[np.ndarray],
                     initial: np.ndarray, task: Task, tokenizer: PreTrainedTokenizerBase, rendering: str,
                     random_initial: bool) -> dict[str, list]:
    """The batch of :func:`truncate_to_prefix` in columns (`COLUMNS`): each example's first ``keep`` operations
    encoded again, one vectorised encode per prefix length."""
    batch: dict[str, list] = {c: [None] * len(keep) for c in COLUMNS}
    for k in np.unique(keep):  # one vectorised encode per prefix length
        rows = np.flatnonzero(keep == k)
        ops = np.stack([ops_rows[r][:k] for r in rows]).reshape(len(rows), int(k))
        encoded = encode_batch(task, tokenizer, rendering, ops, initial[rows] if random_initial else None)
        for i, r in enumerate(rows):
            batch["input_ids"][r] = encoded["input_ids"][i]
            batch["query_positions"][r] = encoded["query_positions"][i]
            batch["operation_ends"][r] = encoded["operation_ends"][i]
            batch["step_labels"][r] = labels_rows[r][: k + 1].tolist()
            batch["depth"][r] = int(k)
            batch["ops"][r] = ops[i].tolist()
    return batch


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


# ---------------------------------------------------------------------------------------------
# Collation and targets
# ---------------------------------------------------------------------------------------------
@dataclass
class StateTrackingCollator:
    """Pads a list of examples (or a batch in columns, as from ``dataset[a:b]``) into tensors.

    Returns ``input_ids`` (B, T) and ``attention_mask`` (B, T) padded on ``padding_side``,
    ``query_positions`` (B, Q) pointing into the padded rows (shifted by the pad count under left
    padding), and when the examples have them ``operation_ends`` (B, D + 1) shifted the same way and
    padded with -1, ``step_labels`` (B, D + 1, Q) and ``ops`` (B, D) padded with -100 to the batch's
    largest depth D, and ``depth`` (B,).
    """

    pad_token_id: int
    padding_side: str = "right"
    label_pad_id: int = LABEL_PAD_ID

    def __post_init__(self):
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}")
        if not _is_int(self.pad_token_id):
            raise ValueError(f"pad_token_id must be an int, got {self.pad_token_id!r}")

    def __call__(self, features: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]) -> dict[str, torch.Tensor]:
        if isinstance(features, Mapping):  # columns -> rows
            keys = list(features)
            features = [dict(zip(keys, values)) for values in zip(*(features[k] for k in keys))]
        if not features:
            raise ValueError("cannot collate an empty batch")
        keys = set(features[0])
        for key in ("input_ids", "query_positions"):
            if key not in keys:
                raise ValueError(f"every example needs {key!r}; got keys {sorted(keys)}")
        if keys - set(COLUMNS):
            raise ValueError(f"unknown example keys {sorted(keys - set(COLUMNS))}; "
                             f"the collator handles {list(COLUMNS)}")
        if keys & {"step_labels", "ops"} and "depth" not in keys:
            raise ValueError("examples with step_labels or ops also need 'depth'")

        rows = [_to_numpy(f["input_ids"]) for f in features]
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        max_len = int(lengths.max())
        offsets = max_len - lengths if self.padding_side == "left" else np.zeros_like(lengths)  # left pads per row
        input_ids, real = _pad_ragged(rows, max_len, self.pad_token_id, offsets)
        query_positions = np.stack([_to_numpy(f["query_positions"]) for f in features]).astype(np.int64)
        query_positions += offsets.reshape(-1, *[1] * (query_positions.ndim - 1))  # (B,) or (B, Q): shape kept
        batch = {"input_ids": input_ids, "attention_mask": torch.from_numpy(real.astype(np.int64)),
                 "query_positions": torch.from_numpy(query_positions)}
        if "operation_ends" in keys:
            ends = [_to_numpy(f["operation_ends"]).astype(np.int64) + offset for f, offset in zip(features, offsets)]
            batch["operation_ends"] = _pad_ragged(ends, max(len(e) for e in ends), -1)[0]

        if "depth" in keys:
            depth = [int(_to_numpy(f["depth"])) for f in features]
            batch["depth"] = torch.tensor(depth, dtype=torch.long)
            if "step_labels" in keys:
                labels = [_to_numpy(f["step_labels"]) for f in features]
                if any(len(row) != d + 1 for row, d in zip(labels, depth)):
                    raise ValueError("each example's step_labels must have depth + 1 rows (z_0..z_d)")
                batch["step_labels"] = _pad_ragged(labels, max(depth) + 1, self.label_pad_id)[0]
            if "ops" in keys:
                ops = [_to_numpy(f["ops"]) for f in features]
                if any(len(row) != d for row, d in zip(ops, depth)):
                    raise ValueError("each example must have depth ops")
                batch["ops"] = _pad_ragged(ops, max(depth), self.label_pad_id)[0]
        return batch


def _pad_ragged(rows: list[np.ndarray], length: int, fill: int,
                offsets: np.ndarray | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """Rows of shape (len_b, *tail) into one (B, length, *tail) long tensor filled with ``fill``, row b starting at
    column ``offsets[b]`` (default 0), in one vectorised copy. Returns the tensor and the (B, length) mask of the
    real entries."""
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    starts = np.zeros_like(lengths) if offsets is None else offsets
    columns = np.arange(length)[None]
    real = (columns >= starts[:, None]) & (columns < (starts + lengths)[:, None])
    tail = np.shape(rows[0])[1:]
    padded = np.full((len(rows), length, *tail), fill, dtype=np.int64)
    if lengths.sum():
        padded[real] = np.concatenate([np.asarray(row, dtype=np.int64).reshape(-1, *tail) for row in rows])
    return torch.from_numpy(padded), real
