"""The values of command-line flags, one style in every script: booleans (`true_or_false`) and ``none`` for an
optional number (`none_or`)."""

from __future__ import annotations

import argparse

NONE_VALUES = ("none", "None", "null")


def true_or_false(value: str) -> bool:
    """A boolean flag's value, the one style of every script (as HfArgumentParser, train_par.py, takes it):
    ``--flag``, ``--flag true`` / ``false`` (also yes / no, 1 / 0). Add one with ``type=true_or_false, nargs="?",
    const=True, default=False``."""
    if value.lower() in ("true", "yes", "t", "y", "1"):
        return True
    if value.lower() in ("false", "no", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def none_or(convert):
    """An argparse `type` that reads ``none`` (also ``None``, ``null``) as None and any other value with `convert`."""
    def parse(value: str):
        return None if value in NONE_VALUES else convert(value)
    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names it in "invalid <name> value"
    return parse


__all__ = ["NONE_VALUES", "none_or", "true_or_false"]
