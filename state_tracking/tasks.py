"""State-tracking tasks: a state, a set of operations, and the states after every prefix.

A task answers one question for a batch of operation sequences ``ops`` of shape (n, d):
what are the states z_0, z_1, ..., z_d after the first 0, 1, ..., d operations?
A state is stored as ``num_queries`` candidate indices (the answer to each query).

Two kinds of task share the :class:`Task` interface:

* :class:`GroupTask` -- the RLT "group word problem". Five boxes each hold one item; an
  operation is a permutation p of the boxes applied by right multiplication

      z_t[b] = z_{t-1}[p_t[b]]          (box b receives what box p_t[b] held)

  so z_d = z_0 ∘ p_1 ∘ ... ∘ p_d and the transposition (i j) swaps the contents of boxes i and j.
  Queries are the boxes, candidates are the items. Presets (:func:`get_task`):
  ``swap_s5`` (identity + 10 transpositions, 11 ops), ``s5`` (all 120 permutations),
  ``a5`` (the 20 3-cycles; from the identity the state ranges over the 60 even permutations).

* :class:`StateMachineTask` -- a user-defined finite machine (e.g. a lamp with on/off states)
  given as a transition table ``operations[op][state] -> state``; one query, the candidates
  are the state names. Load it with :func:`load_task` from a JSON file or a dict::

      {"name": "lamp", "states": ["off", "on"], "initial_state": "off",
       "operations": {"press": {"off": "on", "on": "off"}, "wait": {"off": "off", "on": "on"}},
       "text": {"initial": "The lamp is {state}.", "query": "The lamp is",
                "operations": {"press": "Press the switch.", "wait": "Wait a minute."}}}

Operations are drawn uniformly and independently at every step.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

TASK_FILE_NAME = "state_tracking_task.json"
GROUP_TASK_NAMES = ("swap_s5", "s5", "a5")
GROUP_TEXT_STYLES = ("long", "short")  # the text rendering's wording of a group task's operations
DEFAULT_ITEMS = ("apple", "banana", "cherry", "grape", "lemon")
NUM_BOXES = 5

# Words the renderings reserve; task names may not collide with them (see tokenization.py).
RESERVED_WORDS = ("Yes", "No")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_]+$")


class Task(ABC):
    """Common interface of every state-tracking task.

    Attributes (set by subclasses):
        name: short identifier, e.g. ``"swap_s5"``.
        op_names: one name per operation; an op array holds indices into this list.
        candidate_names: the possible answers; a state holds indices into this list.
        query_names: one name per query (a box, or ``"state"`` for a machine).
        op_texts: one natural-language sentence per operation (text rendering).
        query_texts: per query, the words that precede its answer (text rendering).
    """

    name: str
    op_names: list[str]
    candidate_names: list[str]
    query_names: list[str]
    op_texts: list[str]
    query_texts: list[str]

    @property
    def num_ops(self) -> int:
        return len(self.op_names)

    @property
    def num_candidates(self) -> int:
        return len(self.candidate_names)

    @property
    def num_queries(self) -> int:
        return len(self.query_names)

    held_out_phrasings: int = 0  # the last N alternatives of every sentence list longer than N are kept out of training
    PHRASINGS = ("canonical", "seen", "held_out")

    def phrasing_options(self, split: str) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
        """The sentences a prompt of phrasing ``split`` draws from: (preamble templates with ``{candidate}`` per
        preamble sentence, alternatives per op, question words per query).

        ``canonical``: the first alternative of each list (what ``op_texts`` / ``query_texts`` hold). ``seen``: every
        alternative training draws among (all but the held-out ones). ``held_out``: the last ``held_out_phrasings``
        alternatives of every list that has more than that many, and the seen ones where a list has none held out
        (so a held-out prompt uses an unseen phrasing wherever the spec gives one).
        """
        if split not in self.PHRASINGS:
            raise ValueError(f"phrasing must be one of {list(self.PHRASINGS)}; got {split!r}")
        n = self.held_out_phrasings

        def pick(options: list[str]) -> list[str]:
            if split == "canonical":
                return options[:1]
            seen, held = (options[:-n], options[-n:]) if n and len(options) > n else (options, [])
            return held or seen if split == "held_out" else seen

        lists = (self.preamble_phrasings(), self.op_phrasings, self.query_phrasings)
        return tuple([pick(options) for options in group] for group in lists)

    def preamble_phrasings(self) -> list[list[str]]:
        """Per preamble sentence, its templates (``{candidate}`` = the start state's candidate)."""
        return [[f"{words} {{candidate}}."] for words in self.query_texts]

    # -- to be provided by each kind of task ---------------------------------------------------
    @abstractmethod
    def default_initial(self, n: int) -> np.ndarray:
        """The fixed start state z_0 repeated n times.  # (n, num_queries)"""

    @abstractmethod
    def sample_initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n random start states.  # (n, num_queries)"""

    @abstractmethod
    def apply(self, state: np.ndarray, op: np.ndarray) -> np.ndarray:
        """One step for a batch: state (n, num_queries), op (n,) -> next state (n, num_queries)."""

    def initial_text(self, initial: np.ndarray) -> str:
        """The sentence(s) stating one start state (num_queries,) in the text rendering's canonical phrasing."""
        names = self.candidate_names
        return " ".join(templates[0].replace("{candidate}", names[int(initial[j])])
                        for j, templates in enumerate(self.preamble_phrasings()))

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable spec; ``load_task(task.to_dict())`` rebuilds the task."""

    def check_initial(self, initial: np.ndarray, n: int) -> np.ndarray:
        """Validate start states for n sequences and return them as int64 (n, num_queries)."""
        initial = np.asarray(initial)
        if initial.shape != (n, self.num_queries) or not np.issubdtype(initial.dtype, np.integer):
            raise ValueError(
                f"initial must be an integer array of shape ({n}, {self.num_queries}) "
                f"(one candidate index per query), got dtype {initial.dtype} shape {initial.shape}"
            )
        if initial.size and (initial.min() < 0 or initial.max() >= self.num_candidates):
            raise ValueError(f"initial holds candidate indices outside [0, {self.num_candidates})")
        return initial.astype(np.int64)

    # -- shared behaviour ------------------------------------------------------------------------
    def sample_ops(self, rng: np.random.Generator, n: int, depth: int) -> np.ndarray:
        """n sequences of ``depth`` operations, each drawn uniformly and independently.  # (n, depth)"""
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got {type(rng)}")
        if int(n) != n or n < 0 or int(depth) != depth or depth < 0:
            raise ValueError(f"n and depth must be non-negative integers, got n={n}, depth={depth}")
        return rng.integers(0, self.num_ops, size=(int(n), int(depth)), dtype=np.int64)

    def check_ops(self, ops: np.ndarray) -> np.ndarray:
        """Validate an op array and return it as int64 (n, d)."""
        ops = np.asarray(ops)
        if ops.ndim != 2 or not (np.issubdtype(ops.dtype, np.integer) or ops.size == 0):
            raise ValueError(f"ops must be an integer array of shape (n, depth), got dtype {ops.dtype} "
                             f"shape {ops.shape}")
        if ops.size and (ops.min() < 0 or ops.max() >= self.num_ops):
            raise ValueError(f"ops holds operation indices outside [0, {self.num_ops}) for task {self.name!r}")
        return ops.astype(np.int64)

    def prefix_states(self, ops: np.ndarray, initial: np.ndarray | None = None) -> np.ndarray:
        """All prefix states z_0..z_d, vectorised over the batch.

        Args:
            ops: (n, d) operation indices.
            initial: (n, num_queries) start states, or None for :meth:`default_initial`.
        Returns:
            (n, d + 1, num_queries) int64 candidate indices; [:, t] is the state after t ops.
        """
        ops = self.check_ops(ops)
        n, depth = ops.shape
        state = self.default_initial(n) if initial is None else self.check_initial(initial, n)
        states = np.empty((n, depth + 1, self.num_queries), dtype=np.int64)
        states[:, 0] = state
        for t in range(depth):
            state = self.apply(state, ops[:, t])
            states[:, t + 1] = state
        return states

    def final_states(self, ops: np.ndarray, initial: np.ndarray | None = None) -> np.ndarray:
        """z_d only (what :meth:`prefix_states` returns at [:, -1], without keeping the prefixes).  # (n, Q)"""
        ops = self.check_ops(ops)
        state = self.default_initial(len(ops)) if initial is None else self.check_initial(initial, len(ops))
        for t in range(ops.shape[1]):
            state = self.apply(state, ops[:, t])
        return state

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, num_ops={self.num_ops}, "
            f"num_candidates={self.num_candidates}, num_queries={self.num_queries})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Task) and self.to_dict() == other.to_dict()


# ---------------------------------------------------------------------------------------------
# Group word problems
# ---------------------------------------------------------------------------------------------
class GroupTask(Task):
    """Items in boxes, permuted by right multiplication: z_t[b] = z_{t-1}[p_t[b]].

    Args:
        name: task name.
        perms: (num_ops, num_boxes) permutations; ``perms[o, b]`` is the box whose content box b
            receives under op o.
        op_names: one token-like name per op (``"identity"``, ``"swap_2_4"``, ...).
        items: the item names (candidates), one per box; the default start puts item b in box b.
        group: the preset the task came from (``"swap_s5"``, ``"s5"``, ``"a5"``); saved by to_dict.
        text: the text rendering's wording (:data:`GROUP_TEXT_STYLES`): ``"long"`` ("Swap the contents of Box 1 and
            Box 3.", the default) or ``"short"`` ("swap 1 3.", identity "skip."; about half the tokens per
            operation, for retrofits whose step cost grows with the prompt). The questions are the same in both.
    """

    def __init__(self, name: str, perms: np.ndarray, op_names: list[str], items: list[str], group: str,
                 text: str = "long"):
        if text not in GROUP_TEXT_STYLES:
            raise ValueError(f"group task 'text' must be one of {list(GROUP_TEXT_STYLES)}; got {text!r}")
        perms = np.asarray(perms, dtype=np.int64)
        num_boxes = len(items)
        if perms.ndim != 2 or perms.shape[1] != num_boxes:
            raise ValueError(f"perms must have shape (num_ops, {num_boxes}), got {perms.shape}")
        if not (np.sort(perms, axis=1) == np.arange(num_boxes)).all():
            raise ValueError("every row of perms must be a permutation of the boxes")
        if len(op_names) != len(perms):
            raise ValueError(f"got {len(op_names)} op_names for {len(perms)} permutations")
        _check_names("op_names", op_names)
        _check_names("items", items)
        _check_disjoint("op_names", op_names, "items", items)
        self.name = name
        self.group = group
        self.perms = perms
        self.num_boxes = num_boxes
        self.op_names = list(op_names)
        self.candidate_names = list(items)
        self.query_names = [f"box_{b + 1}" for b in range(num_boxes)]
        self.text_style = text
        self.op_texts = [(_short_permutation_text if text == "short" else _permutation_text)(p) for p in perms]
        self.query_texts = [f"Box {b + 1} contains the" for b in range(num_boxes)]
        self.op_phrasings = [[t] for t in self.op_texts]
        self.query_phrasings = [[t] for t in self.query_texts]

    def default_initial(self, n: int) -> np.ndarray:
        return np.tile(np.arange(self.num_boxes, dtype=np.int64), (n, 1))  # (n, boxes)

    def sample_initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.permuted(self.default_initial(n), axis=1)  # (n, boxes)

    def check_initial(self, initial: np.ndarray, n: int) -> np.ndarray:
        initial = super().check_initial(initial, n)
        if not (np.sort(initial, axis=1) == np.arange(self.num_boxes)).all():
            raise ValueError("initial must put every item in exactly one box (each row a permutation of the items)")
        return initial

    def apply(self, state: np.ndarray, op: np.ndarray) -> np.ndarray:
        return np.take_along_axis(state, self.perms[op], axis=1)  # new[b] = state[p[b]]

    def to_dict(self) -> dict[str, Any]:
        spec = {"group": self.group, "items": list(self.candidate_names)}
        if self.text_style != "long":  # written only when not the default, so earlier checkpoints' specs are unchanged
            spec["text"] = self.text_style
        return spec


def _permutation_text(perm: np.ndarray) -> str:
    """English for one op: box b receives the content of box perm[b]."""
    moved = [(int(perm[b]), b) for b in range(len(perm)) if perm[b] != b]  # (source, target)
    if not moved:
        return "Leave the boxes as they are."
    if len(moved) == 2:
        (i, j), _ = sorted(moved)
        return f"Swap the contents of Box {i + 1} and Box {j + 1}."
    moves = [f"Box {src + 1} to Box {dst + 1}" for src, dst in sorted(moved)]
    return "Move the contents of " + ", ".join(moves[:-1]) + " and " + moves[-1] + "."


def _short_permutation_text(perm: np.ndarray) -> str:
    """The short wording of one op: "skip." (identity), "swap 1 3." (a transposition), else "move 2 1 3 4 5."
    (box b receives the content of the b-th box listed)."""
    moved = [b for b in range(len(perm)) if perm[b] != b]
    if not moved:
        return "skip."
    if len(moved) == 2:
        return f"swap {moved[0] + 1} {moved[1] + 1}."
    return "move " + " ".join(str(int(p) + 1) for p in perm) + "."


def swap_s5_permutations(num_boxes: int = NUM_BOXES) -> tuple[np.ndarray, list[str]]:
    """Identity followed by the transpositions (i j), i < j: 1 + 10 = 11 ops for 5 boxes."""
    perms, names = [np.arange(num_boxes)], ["identity"]
    for i, j in itertools.combinations(range(num_boxes), 2):
        perm = np.arange(num_boxes)
        perm[[i, j]] = perm[[j, i]]
        perms.append(perm)
        names.append(f"swap_{i + 1}_{j + 1}")
    return np.stack(perms), names


def s5_permutations(num_boxes: int = NUM_BOXES) -> tuple[np.ndarray, list[str]]:
    """All num_boxes! permutations in lexicographic order (identity first), named by one-line
    notation: ``perm_21345`` is p = (2, 1, 3, 4, 5), i.e. box 1 receives box 2's item."""
    perms = np.array(list(itertools.permutations(range(num_boxes))))
    names = ["perm_" + "".join(str(int(x) + 1) for x in p) for p in perms]
    return perms, names


def a5_three_cycles(num_boxes: int = NUM_BOXES) -> tuple[np.ndarray, list[str]]:
    """The 20 3-cycles. ``cycle_i_j_k`` moves the content of box i to box j, j to k and k to i,
    i.e. p[j] = i, p[k] = j, p[i] = k. Both orientations of every 3-subset {i < j < k}."""
    perms, names = [], []
    for i, j, k in itertools.combinations(range(num_boxes), 3):
        for a, b, c in ((i, j, k), (i, k, j)):
            perm = np.arange(num_boxes)
            perm[b], perm[c], perm[a] = a, b, c
            perms.append(perm)
            names.append(f"cycle_{a + 1}_{b + 1}_{c + 1}")
    return np.stack(perms), names


_GROUP_PRESETS = {"swap_s5": swap_s5_permutations, "s5": s5_permutations, "a5": a5_three_cycles}


def get_task(name: str, items: list[str] | tuple[str, ...] | None = None, text: str = "long") -> GroupTask:
    """A group word problem: ``"swap_s5"`` (11 ops), ``"s5"`` (120 ops) or ``"a5"`` (20 ops).

    Args:
        name: one of :data:`GROUP_TASK_NAMES`.
        items: five item names (the answer candidates); default :data:`DEFAULT_ITEMS`.
        text: the text rendering's wording of the operations, one of :data:`GROUP_TEXT_STYLES`.
    """
    if name not in _GROUP_PRESETS:
        raise ValueError(f"unknown task name {name!r}; allowed: {list(GROUP_TASK_NAMES)} "
                         "(or load_task for a JSON spec)")
    items = list(DEFAULT_ITEMS if items is None else items)
    if len(items) != NUM_BOXES:
        raise ValueError(f"items must name exactly {NUM_BOXES} items (one per box), got {len(items)}")
    perms, op_names = _GROUP_PRESETS[name]()
    return GroupTask(name, perms, op_names, items, group=name, text=text)


# ---------------------------------------------------------------------------------------------
# User-defined state machines
# ---------------------------------------------------------------------------------------------
class StateMachineTask(Task):
    """A finite machine: ``transitions[o, s]`` is the state after op o in state s.

    z_t = transitions[op_t, z_{t-1}]; one query (``"state"``) whose candidates are the states.
    Build it with :func:`load_task`, which validates the spec.
    """

    def __init__(
        self,
        name: str,
        state_names: list[str],
        op_names: list[str],
        transitions: np.ndarray,
        initial_state: str,
        text: dict[str, Any],
    ):
        self.name = name
        self.candidate_names = list(state_names)
        self.op_names = list(op_names)
        self.transitions = np.asarray(transitions, dtype=np.int64)  # (num_ops, num_states)
        self.initial_state = initial_state
        self.query_names = ["state"]
        self.text = text
        alternatives = lambda value: list(value) if isinstance(value, list) else [value]  # noqa: E731
        self.op_phrasings = [alternatives(text["operations"][op]) for op in op_names]
        self.query_phrasings = [alternatives(text["query"])]
        self.initial_phrasings = alternatives(text["initial"])
        self.held_out_phrasings = text.get("held_out_phrasings", 0)
        self.op_texts = [options[0] for options in self.op_phrasings]
        self.query_texts = [self.query_phrasings[0][0]]

    def default_initial(self, n: int) -> np.ndarray:
        start = self.candidate_names.index(self.initial_state)
        return np.full((n, 1), start, dtype=np.int64)  # (n, 1)

    def sample_initial(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(0, self.num_candidates, size=(n, 1), dtype=np.int64)  # (n, 1)

    def apply(self, state: np.ndarray, op: np.ndarray) -> np.ndarray:
        return self.transitions[op, state[:, 0]][:, None]

    def preamble_phrasings(self) -> list[list[str]]:
        return [[t.format(state="{candidate}") for t in self.initial_phrasings]]  # format: "{{" reads as "{"

    def to_dict(self) -> dict[str, Any]:
        operations = {
            op: {s: self.candidate_names[t] for s, t in zip(self.candidate_names, self.transitions[o])}
            for o, op in enumerate(self.op_names)
        }
        return {
            "name": self.name,
            "states": list(self.candidate_names),
            "initial_state": self.initial_state,
            "operations": operations,
            "text": json.loads(json.dumps(self.text)),
        }


_MACHINE_KEYS = ("name", "states", "operations", "initial_state", "text")
_TEXT_KEYS = ("initial", "query", "operations", "held_out_phrasings")


def state_machine_from_dict(spec: dict[str, Any]) -> StateMachineTask:
    """Validate a state-machine spec (see module docstring) and build the task.

    Required: ``states`` (non-empty list of distinct names), ``operations`` (non-empty mapping
    op name -> {state: next state}, total over the states). Optional: ``name`` (default
    ``"state_machine"``), ``initial_state`` (default: the first state), ``text`` with
    ``initial`` (must contain ``{state}``), ``query`` and ``operations`` (a sentence per op);
    text defaults: "The state is {state}.", "The state is", "Apply <op>.".
    Names must be letters, digits and underscores (each becomes one token).
    """
    unknown = sorted(set(spec) - set(_MACHINE_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in state-machine spec; allowed: {list(_MACHINE_KEYS)}")
    name = spec.get("name", "state_machine")
    if not isinstance(name, str) or not name:
        raise ValueError(f"'name' must be a non-empty string, got {name!r}")

    if "states" not in spec:
        raise ValueError("state-machine spec is missing 'states' (a non-empty list of state names)")
    states = spec["states"]
    if not isinstance(states, list) or not states:
        raise ValueError(f"'states' must be a non-empty list of state names, got {states!r}")
    _check_names("states", states)

    if "operations" not in spec:
        raise ValueError("state-machine spec is missing 'operations' (a mapping op name -> {state: next state})")
    operations = spec["operations"]
    if not isinstance(operations, dict) or not operations:
        raise ValueError("'operations' must be a non-empty mapping op name -> {state: next state}, "
                         f"got {operations!r}")
    op_names = list(operations)
    _check_names("operations", op_names)
    _check_disjoint("operations", op_names, "states", states)

    state_index = {s: i for i, s in enumerate(states)}
    transitions = np.empty((len(op_names), len(states)), dtype=np.int64)
    for o, op in enumerate(op_names):
        table = operations[op]
        if not isinstance(table, dict):
            raise ValueError(f"operation {op!r} must map every state to its next state, got {table!r}")
        unknown_from = [s for s in table if s not in state_index]
        if unknown_from:
            raise ValueError(f"operation {op!r} has transitions from unknown state(s) {unknown_from}; states: {states}")
        missing = [s for s in states if s not in table]
        if missing:
            raise ValueError(f"operation {op!r} is not total: no transition from state(s) {missing}")
        unknown_to = sorted({t for t in table.values() if t not in state_index}, key=str)
        if unknown_to:
            raise ValueError(f"operation {op!r} leads to unknown state(s) {unknown_to}; states: {states}")
        transitions[o] = [state_index[table[s]] for s in states]

    initial_state = spec.get("initial_state", states[0])
    if initial_state not in state_index:
        raise ValueError(f"'initial_state' {initial_state!r} is not one of the states {states}")

    text = _machine_text(spec.get("text", {}), op_names)
    return StateMachineTask(name, states, op_names, transitions, initial_state, text)


def _machine_text(text: Any, op_names: list[str]) -> dict[str, Any]:
    """Validate the ``text`` of a machine spec. Each of ``initial``, ``query`` and every ``operations`` entry is a
    sentence or a list of alternative sentences (varied phrasing: training draws among them); ``held_out_phrasings``
    (default 0) keeps the last N alternatives of every list longer than N out of training (held-out phrasings,
    their words still in the vocabulary)."""
    if not isinstance(text, dict):
        raise ValueError(f"'text' must be a mapping with keys {list(_TEXT_KEYS)}, got {text!r}")
    unknown = sorted(set(text) - set(_TEXT_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in 'text'; allowed: {list(_TEXT_KEYS)}")

    def sentences(field: str, value: Any) -> list[str]:
        options = value if isinstance(value, list) else [value]
        if not options or any(not isinstance(o, str) or not o.strip() for o in options):
            raise ValueError(f"text {field} must be a non-empty string or a non-empty list of them, got {value!r}")
        if len(set(options)) != len(options):
            raise ValueError(f"text {field} lists the same sentence twice: {value!r}")
        return options

    initial = text.get("initial", "The state is {state}.")
    query = text.get("query", "The state is")
    for template in sentences("'initial'", initial):
        if "{state}" not in template:
            raise ValueError(f"text 'initial' must contain '{{state}}' in every alternative, got {template!r}")
        try:
            template.format(state="x")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"text 'initial' may use only the placeholder '{{state}}': {template!r} "
                             f"({error})") from None
    sentences("'query'", query)
    op_texts = text.get("operations", {op: f"Apply {op}." for op in op_names})
    if not isinstance(op_texts, dict):
        raise ValueError(f"text 'operations' must map every operation to a sentence, got {op_texts!r}")
    unknown_ops = [op for op in op_texts if op not in op_names]
    missing_ops = [op for op in op_names if op not in op_texts]
    if unknown_ops or missing_ops:
        raise ValueError(
            f"text 'operations' must give one sentence per operation: missing {missing_ops}, unknown {unknown_ops}"
        )
    for op, sentence in op_texts.items():
        sentences(f"for operation {op!r}", sentence)
    held_out = text.get("held_out_phrasings", 0)
    if not isinstance(held_out, int) or isinstance(held_out, bool) or held_out < 0:
        raise ValueError(f"text 'held_out_phrasings' must be an integer ≥ 0, got {held_out!r}")
    out = {"initial": initial, "query": query, "operations": {op: op_texts[op] for op in op_names}}
    if held_out:
        out["held_out_phrasings"] = held_out
    return out


def _check_names(field: str, names: list[Any]) -> None:
    if not names:
        raise ValueError(f"{field!r} must not be empty")
    for name in names:
        if not isinstance(name, str) or not _NAME_PATTERN.match(name):
            raise ValueError(
                f"{field!r} entry {name!r} must be a non-empty string of letters, digits and underscores "
                "(it becomes one token)"
            )
        if name in RESERVED_WORDS:
            raise ValueError(f"{field!r} entry {name!r} is reserved (the halting answers {list(RESERVED_WORDS)})")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{field!r} has duplicate entries {duplicates}")


def _check_disjoint(field_a: str, names_a: list[str], field_b: str, names_b: list[str]) -> None:
    shared = sorted(set(names_a) & set(names_b))
    if shared:
        raise ValueError(f"{shared} appear in both {field_a!r} and {field_b!r}; names must be distinct tokens")


# ---------------------------------------------------------------------------------------------
# Loading and saving
# ---------------------------------------------------------------------------------------------
def load_task(path_or_dict: str | os.PathLike | dict[str, Any]) -> Task:
    """A task from a spec dict or a JSON file holding one.

    ``{"group": "swap_s5" | "s5" | "a5", "items": [...], "text": "long" | "short"}`` gives a :class:`GroupTask`
    (``items`` and ``text`` optional); any other dict is read as a state-machine spec.
    """
    if isinstance(path_or_dict, (str, os.PathLike)):
        with open(path_or_dict, encoding="utf-8") as f:
            try:
                spec = json.load(f, object_pairs_hook=_reject_duplicate_keys)
            except json.JSONDecodeError as error:
                raise ValueError(f"task file {os.fspath(path_or_dict)!r} is not valid JSON: {error}") from None
    elif isinstance(path_or_dict, dict):
        spec = path_or_dict
    else:
        raise ValueError(f"load_task expects a path to a JSON file or a dict, got {type(path_or_dict).__name__}")
    if not isinstance(spec, dict):
        raise ValueError(f"a task spec must be a JSON object, got {type(spec).__name__}")
    if "group" in spec:
        unknown = sorted(set(spec) - {"group", "items", "text"})
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in group task spec; allowed: ['group', 'items', 'text']")
        return get_task(spec["group"], spec.get("items"), spec.get("text", "long"))
    return state_machine_from_dict(spec)


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"duplicate key(s) {duplicates} in task JSON")
    return dict(pairs)


def save_task(task: Task, directory: str | os.PathLike) -> str:
    """Write ``task.to_dict()`` to ``directory/state_tracking_task.json``; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, TASK_FILE_NAME)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(task.to_dict(), f, indent=2)
    return path


def load_task_from_dir(directory: str | os.PathLike) -> Task:
    """The task saved by :func:`save_task` in ``directory``."""
    path = os.path.join(directory, TASK_FILE_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {TASK_FILE_NAME} in {os.fspath(directory)!r}; save one with save_task(task, dir)")
    return load_task(path)
