"""The one exception family of probust: every error it raises on purpose is a :class:`ProbustError`.

An error carries what it concerns as data: ``field``, the argument (an option's declared name,
e.g. ``"tol"``) and/or ``path``, the file or folder. A message may also suggest settings
(``use overwrite=True``) as :class:`Setting` parts, so that the command line can show the same
message in its own words (``use --overwrite``) from the declarations, without rewriting text.

Subclasses also derive from the matching builtin where one fits (``ValueError`` for a bad value,
``OSError`` for a file that cannot be written, ``FileNotFoundError`` for missing data), so code
that catches the builtin keeps working.

Example:
    >>> try:
    ...     probust.run.RunSettings(data="digits", model="m.pt", sigmas=[0.1], tol=-1)
    ... except probust.errors.ProbustError as exc:
    ...     print(exc.field, "->", exc.reason)
    tol -> must be a positive number, got -1
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "ConfigError",
    "OptionError",
    "Phrase",
    "ProbustError",
    "Setting",
    "first_line",
    "first_parts",
    "python_name",
    "user_stacklevel",
]


@dataclass(frozen=True)
class Setting:
    """A setting named inside a message: the option ``name`` (its declared, Python name), and
    the ``value`` it suggests (``True`` for a switch; omitted: the option itself is named)."""

    name: str
    value: Any = None

    def render(self, name_of: Callable[[str, Any], str]) -> str:
        return name_of(self.name, self.value)


@dataclass(frozen=True)
class Phrase(Setting):
    """Advice that reads differently from Python (``python``) and from the shell (``shell``),
    where no one option names it (``build the model and call load_state_dict`` is no advice for
    a shell user): the command line's renderer (any ``name_of`` but :func:`python_name`) shows
    ``shell``."""

    python: str = ""
    shell: str = ""

    def render(self, name_of: Callable[[str, Any], str]) -> str:
        return self.python if name_of is python_name else self.shell


class Placeholder(str):
    """A value in a suggestion that stands for the user's own (``NAMES``, ``N``): written bare,
    ``feature_columns=NAMES`` in Python and ``--feature-columns NAMES`` on the command line."""

    def __repr__(self) -> str:
        return str(self)


def python_name(name: str, value: Any = None) -> str:
    """How a Python caller sets an option: ``overwrite=True``, ``device='cpu'`` (or just ``out``)."""
    return name if value is None else f"{name}={value!r}"


Part = str | Setting


class ProbustError(Exception):
    """Base of every error probust raises on purpose.

    Args:
        *parts: the message after its subject: strings and :class:`Setting` parts, joined.
        field: the option the error concerns (its declared name), shown first in the message.
        path: the file or folder the error concerns (None: not about one).

    Attributes:
        field, path: as given.
        reason: the message without its subject (``str(error)`` is ``"field: reason"``).
        prefixed: whether the message starts with ``field:`` (False for errors whose text
            names the field itself).
    """

    prefixed: ClassVar[bool] = True

    def __init__(self, *parts: Any, field: str | None = None, path: str | os.PathLike | None = None) -> None:
        self.parts: tuple[Part, ...] = tuple(p if isinstance(p, Setting) else str(p) for p in parts)
        self.field = field
        self.path = None if path is None else os.fspath(path)
        super().__init__(self.render())

    @property
    def reason(self) -> str:
        return self.render(subject=False)

    def render(self, name_of: Callable[[str, Any], str] = python_name, *, subject: bool = True) -> str:
        """The message with every setting named by ``name_of(name, value)`` (by default as in
        Python; the command line passes its flags), starting with ``field:`` when ``subject``."""
        text = "".join(p if isinstance(p, str) else p.render(name_of) for p in self.parts)
        if subject and self.prefixed and self.field is not None:
            return f"{name_of(self.field, None)}: {text}"
        return text

    def __str__(self) -> str:
        return self.render()

    def renamed(self, names: Mapping[str, str]) -> ProbustError:
        """A copy whose ``field`` and :class:`Setting` parts use ``names[name]`` for each name
        it maps (the others kept): how a caller that gave an option under another name (the
        training's ``robust_loss`` is the loss's ``mu``) reports an error in its own names."""
        error = type(self).__new__(type(self))  # no __init__: subclasses' signatures differ
        error.__dict__.update(self.__dict__)
        error.parts = tuple(
            Setting(names.get(p.name, p.name), p.value) if isinstance(p, Setting) and not isinstance(p, Phrase) else p
            for p in self.parts
        )
        if self.field is not None:
            error.field = names.get(self.field, self.field)
        error.args = (error.render(),)
        return error

    def lines(self) -> list[tuple[Part, ...]]:
        """The message's lines (without the subject), each as its parts."""
        out: list[list[Part]] = [[]]
        for part in self.parts:
            if isinstance(part, Setting):
                out[-1].append(part)
                continue
            first, *rest = part.split("\n")
            if first:
                out[-1].append(first)
            for line in rest:
                out.append([line] if line else [])
        return [tuple(line) for line in out]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def first_parts(error: BaseException) -> tuple[Part, ...]:
    """The first line of an error's message, as parts (settings kept as such), without its subject."""
    if isinstance(error, ProbustError):
        lines = error.lines()
        return lines[0] if lines and lines[0] else (error.reason,)
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__,)


class OptionError(ProbustError, ValueError):
    """A bad value of an option (``field`` names it): the type, range or choice is wrong, or two
    options exclude each other."""


class ConfigError(OptionError):
    """A bad argument, found before any work started (the CLI prints it on one line, exit 2).

    ``field`` names the argument (a field of :class:`~probust.run.RunSettings`, or of the function
    called), when there is one. Also :class:`probust.run.ConfigError`."""


def user_stacklevel() -> int:
    """The ``stacklevel`` for :func:`warnings.warn`, called in the function that warns, at which
    the warning points at the first frame outside probust: the user's line, however deep in
    probust (an estimator, the runner, a metric) the warning is raised. (Python 3.12's
    ``skip_file_prefixes`` does the same; probust supports 3.10.)"""
    frame = sys._getframe(1)  # the function that warns: stacklevel 1
    level = 1
    while frame is not None and in_probust(frame.f_globals.get("__name__", "")):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def in_probust(module: str) -> bool:
    return module == "probust" or module.startswith("probust.")
