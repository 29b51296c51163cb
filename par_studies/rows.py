"""A study row is data: a name, a table label and a flag mapping built from presets declared once.

A row's flags are what it adds to, or changes in, its study's common flags: the command a row runs is the study's common
flags with the row's over them (`{**common, **row.flags}`), each flag once. Inside a row each flag is given once:
`combine` refuses a flag that two of a row's parts give (no "last flag wins").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

KINDS = {"par": "examples/train_par.py", "rnn": "examples/baselines/rnn.py", "cot": "examples/baselines/cot_trl.py",
         "automata": "examples/baselines/automata.py"}


@dataclass(frozen=True)
class Preset:
    """A named set of flags declared once for every study. `halting`: a row built on it trains learned halting (and is
    evaluated with it)."""

    name: str
    flags: Mapping[str, str]
    halting: bool = False

    def __post_init__(self):
        object.__setattr__(self, "flags", MappingProxyType(combine(self.name, self.flags)))


def combine(row: str, *parts: Preset | Mapping[str, str]) -> dict[str, str]:
    """The flags of `parts` (presets or plain mappings) as one mapping. A flag given by two parts is an error that names
    the flag, both parts and the row; a flag is "--name" and its value a string."""
    flags: dict[str, str] = {}
    origin: dict[str, str] = {}
    for i, part in enumerate(parts, 1):
        source, items = (f"preset {part.name!r}", part.flags) if isinstance(part, Preset) else (f"its flags #{i}", part)
        for flag, value in items.items():
            if not (isinstance(flag, str) and flag.startswith("--")) or not isinstance(value, str):
                raise ValueError(f"row {row!r}: flags are '--name': 'value' strings; got {flag!r}: {value!r}")
            if flag in flags:
                raise ValueError(f"row {row!r}: {flag} is given twice ({origin[flag]}: {flags[flag]!r}, {source}: "
                                 f"{value!r}); give each flag once")
            flags[flag], origin[flag] = value, source
    return flags


@dataclass(frozen=True)
class Row:
    """One row of a study.

    name: the row's name (`--row NAME`); label: what the table calls it; flags: what it adds to or changes in the
    study's common flags; kind: the script that trains it (`KINDS`); halting: it trains learned halting (set by a
    halting preset); budget: seconds of training (`--max_train_seconds`) where the study sets one; init_from: the row
    whose trained model (same seed) it fine-tunes; group: the table's group of the row (a variant, a kind of baseline).
    """

    name: str
    label: str
    flags: Mapping[str, str] = field(default_factory=dict)
    kind: str = "par"
    halting: bool = False
    budget: int | None = None
    init_from: str | None = None
    group: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"row {self.name!r}: kind must be one of {sorted(KINDS)}; got {self.kind!r}")
        object.__setattr__(self, "flags", MappingProxyType(combine(self.name, self.flags)))

    @classmethod
    def of(cls, name: str, label: str, *parts: Preset | Mapping[str, str], **fields):
        """A row whose flags combine `parts` (each flag once); it trains halting when one of its presets does."""
        halting = any(isinstance(part, Preset) and part.halting for part in parts)
        return cls(name=name, label=label, flags=combine(name, *parts), halting=halting, **fields)

    @property
    def script(self) -> str:
        return KINDS[self.kind]


def rows_by_name(*rows: Row) -> dict[str, Row]:
    """name -> row, in the order given (the tables' order); a name given twice is an error."""
    out: dict[str, Row] = {}
    for row in rows:
        if row.name in out:
            raise ValueError(f"row {row.name!r} is declared twice")
        out[row.name] = row
    return out


def argv(flags: Mapping[str, str]) -> list[str]:
    """["--flag", "value", ...]: a command line with each flag once."""
    return [item for flag, value in flags.items() for item in (flag, value)]


def parse_argv(args: list[str], what: str = "flags") -> dict[str, str]:
    """The inverse of `argv` for "--flag value" pairs (a flag given twice is an error, as in a row)."""
    if len(args) % 2 or any(not a.startswith("--") for a in args[::2]):
        raise ValueError(f"{what} must be '--flag value' pairs; got {args}")
    flags: dict[str, str] = {}
    for flag, value in zip(args[::2], args[1::2]):
        if flag in flags:
            raise ValueError(f"{what}: {flag} is given twice ({flags[flag]!r}, {value!r}); give each flag once")
        flags[flag] = value
    return flags


# ------------------------------------------------------------------------------------------------------------- presets
# The recipe's loop view (train_par.py's from-scratch default since the length-generalization study): local view,
# progress-coupled query positions, bidirectional queries; written out in every row, whatever the defaults are.
LOCAL = Preset("recipe view (local)", {"--loop_view": "local", "--progress_positions": "true",
                                       "--bidirectional_queries": "true"})
# The paper's setting: the full causal view, ordinary positions, causal queries.
FULL = Preset("paper's view (full)", {"--loop_view": "full", "--progress_positions": "false",
                                      "--bidirectional_queries": "false"})
SELF_DISTILL = Preset("label-free prefix self-distillation", {"--self_distillation": "true"})
# The mastery curriculum (trainers.MasteryCurriculum): from d ≤ 2, d_max + 1 once the final answers of the last 20
# steps at d_max are 90% right, at least 100 steps apart.
MASTERY = Preset("mastery curriculum", {"--curriculum_advance_accuracy": "0.9", "--curriculum_window": "20",
                                        "--curriculum_every_steps": "100"})


def hold_tail(extra: int = 8, grad_window: int = 16) -> Preset:
    """The hold schedule's tail: R = d + X, X ~ U{0..extra}, the last `grad_window` iterations carry gradient."""
    return Preset(f"hold tail (X ~ U{{0..{extra}}}, window {grad_window})", {
        "--depth_schedule": "hold", "--hold_extra_iterations": str(extra), "--grad_window": str(grad_window)})


def halting(extra: int = 8, grad_window: int = 16, label_offset: int | None = 1) -> Preset:
    """Learned halting: the hold tail and the halting loss (weight 0.5), labels Yes from iteration d + label_offset on
    (1, the recipe's: once no operation is left to read; None: train_par.py's default 0, not written, as the first
    halting runs trained). The model halts at the first iteration R with P(Yes) above the threshold at R and at 6 of the
    8 iterations R..R+7 (modeling_par.halt_iteration)."""
    offset = {} if label_offset is None else {"--halt_label_offset": str(label_offset)}
    tail = hold_tail(extra, grad_window)
    return Preset(f"learned halting, {tail.name}, label offset {label_offset or 0}",
                  {**tail.flags, "--halting_loss_weight": "0.5", **offset}, halting=True)


HOLD_TAIL = hold_tail()
HALTING = halting()
