"""What `HfArgumentParser` cannot say by itself: an optional number field (``float | None``, ``int | None``) that
takes ``none`` on the command line (`accept_none`)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable

from .flag_values import none_or


def accept_none(parser: argparse.ArgumentParser, dataclass_types: Iterable[type]) -> None:
    """Let every optional number field of `dataclass_types` (a ``float | None`` or ``int | None`` whose None means
    "off", such as ``curriculum_advance_accuracy``) take ``none`` (also ``None``, ``null``) on the command line, as a
    YAML / JSON config's ``null`` does: `HfArgumentParser` types such a flag as the number alone, so without this a
    default that is set can never be unset from the command line. Other values parse as before.

    argparse has no public way to change an added argument, so this rewrites the `type` of the parser's actions
    (``parser._actions``) for those fields."""
    optional = set()
    for cls in dataclass_types:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints.get(f.name))
            if (typing.get_origin(hints.get(f.name)) in (typing.Union, types.UnionType) and type(None) in args
                    and {a for a in args if a is not type(None)} <= {int, float}):
                optional.add(f.name)

    for action in parser._actions:
        if action.dest in optional and action.type is not None:
            action.type = none_or(action.type)
            action.help = f"{action.help or ''} (none: unset)".strip()


__all__ = ["accept_none"]
