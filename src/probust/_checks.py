"""Option and output checks shared by every estimator: fail early, name the argument and what was
expected (the user's inputs, labels and sigma are read in :mod:`probust._inputs`).

A bad option value (a count, a level, a choice) raises :class:`probust.errors.OptionError` whose
``field`` is the argument's name; bad logits a plain ValueError."""

from __future__ import annotations

import math

from probust.errors import OptionError


def check_positive_int(value: int, name: str) -> int:
    """An integer >= 1 (not a bool); an :class:`~probust.errors.OptionError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"must be an integer >= 1, got {value!r}", field=name)
    return value


def check_positive_float(value: float, name: str) -> float:
    """A positive finite number, as a float; an :class:`~probust.errors.OptionError` naming ``name``."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"must be a positive number, got {value!r}", field=name) from None
    if not math.isfinite(value) or value <= 0:
        raise OptionError(f"must be a positive finite number, got {value!r}", field=name)
    return value


def check_fraction(value: float, name: str, *, closed_below: bool = False) -> float:
    """A number in (0, 1) (``[0, 1)`` when ``closed_below``), as a float; an
    :class:`~probust.errors.OptionError` naming ``name`` (a bool or a string is not a number)."""
    interval = "[0, 1)" if closed_below else "(0, 1)"
    if isinstance(value, (bool, str)):
        raise OptionError(f"must be a number in {interval}, got {value!r}", field=name)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"must be a number in {interval}, got {value!r}", field=name) from None
    if not (0 <= number < 1 if closed_below else 0 < number < 1):
        raise OptionError(f"must be in {interval}, got {value!r}", field=name)
    return number


def check_choice(value: object, choices: tuple, name: str) -> None:
    """``value`` is one of ``choices``; an :class:`~probust.errors.OptionError` naming ``name``."""
    try:
        known = value in choices
    except (TypeError, ValueError, RuntimeError):  # e.g. an array: no single truth value
        known = False
    if not known:
        raise OptionError(f"must be one of {choices}, got {value!r}", field=name)
