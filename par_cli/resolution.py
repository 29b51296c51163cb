"""A run's arguments resolved before they are built (`Resolution`): the choices that depend on the data — the training
depth range from the records' lengths, the recipe's flags, the validation probe, `--num_train_epochs` as steps, the
curriculum fitted to the step budget — are each computed by a function that reads the arguments as resolved so far
and returns the fields it chooses (field -> value); `Resolution.choose` collects them, and `Resolution.build` makes
the argument objects once, with `dataclasses.replace` (which validates them again: their `__post_init__`, such as
`ParTrainingArguments`'). Nothing sets an attribute on an argument object, before or after it is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def field_names(arguments) -> set[str]:
    """The dataclass fields of an argument object (what `dataclasses.replace` can set)."""
    return {f.name for f in dataclasses.fields(arguments)}


class Resolved:
    """One argument object read as a `Resolution` resolves it, read-only: a field chosen so far reads its chosen
    value, anything else (fields, properties, methods) the object's own."""

    __slots__ = ("_arguments", "_chosen")

    def __init__(self, arguments, chosen: dict):
        object.__setattr__(self, "_arguments", arguments)
        object.__setattr__(self, "_chosen", chosen)  # the resolution's own dict: later choices read through

    def __getattr__(self, name: str) -> Any:
        chosen = object.__getattribute__(self, "_chosen")
        arguments = object.__getattribute__(self, "_arguments")
        if name in chosen and name in field_names(arguments):
            return chosen[name]
        return getattr(arguments, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"{type(self._arguments).__name__}.{name} is resolved, not set: return it as a choice "
                             "(Resolution.choose) instead.")


class Resolution:
    """The model, data and training arguments of a run as parsed (each validated by its dataclass), with the fields
    the data-dependent steps chose for them (`choose`, in order; a later choice of a field wins). `model`, `data` and
    `train` read each object as resolved so far (`Resolved`); `build()` returns the arguments the run trains with,
    built once."""

    def __init__(self, model_args, data_args, train_args, chosen: dict | None = None):
        self.parsed = (model_args, data_args, train_args)
        self.chosen: dict = {}
        self.choose(chosen or {})

    @property
    def model(self) -> Resolved:
        return Resolved(self.parsed[0], self.chosen)

    @property
    def data(self) -> Resolved:
        return Resolved(self.parsed[1], self.chosen)

    @property
    def train(self) -> Resolved:
        return Resolved(self.parsed[2], self.chosen)

    def choose(self, fields: dict) -> None:
        """Record the `fields` a step chose (field -> value); each must be a field of one of the argument objects."""
        known = set().union(*(field_names(a) for a in self.parsed))
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"Resolution.choose: {unknown} {'is' if len(unknown) == 1 else 'are'} no field of the "
                             "model, data or training arguments.")
        self.chosen.update(fields)

    def copy(self) -> Resolution:
        """Another resolution of the same parsed arguments, with the choices so far (the recipe race's candidates)."""
        return Resolution(*self.parsed, chosen=self.chosen)

    def build(self) -> tuple:
        """(model_args, data_args, train_args) with the chosen fields: each object that has one is built again with
        `dataclasses.replace` (its `__post_init__` validates the whole, as when parsed), the others are the parsed
        objects themselves."""
        built = []
        for arguments in self.parsed:
            mine = {name: value for name, value in self.chosen.items() if name in field_names(arguments)}
            built.append(dataclasses.replace(arguments, **mine) if mine else arguments)
        return tuple(built)


__all__ = ["Resolution", "Resolved", "field_names"]
