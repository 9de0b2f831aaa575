"""Options declared once: a dataclass field with an :class:`Option` in its metadata.

A settings dataclass declares each option where it is used, with its type and default (the
field's), and here its help, unit, flag, choices and check. Everything else is derived from
the declaration: the command line's flags and ``--help`` (``probust.cli``), the error-to-flag
map, what ``config.json`` records and what a folder written before an option implies.

Example::

    @dataclass(frozen=True, kw_only=True)
    class Settings:
        tol: float = option(1e-4, help="absolute error tolerance of the mvn-cdf", check=positive)

    declared(Settings)  # [(Field 'tol', Option(help=...))]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

__all__ = ["MISSING", "UNSET", "Option", "declared", "option", "option_of"]

_KEY = "probust.option"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "No value": an option's ``implied`` when folders written before it imply nothing.
UNSET: Any = _Unset()


@dataclass(frozen=True)
class Option:
    """How one option reads, checks and is recorded (the metadata of its dataclass field).

    Attributes:
        help: what it does, with its unit; the default is added to ``--help`` unless ``default_help``.
        default_help: how ``--help`` describes the default (e.g. "half the free memory"); None:
            the default value itself; "" to say nothing.
        flag: its command-line flag; None: ``--`` and the name with dashes; "" for none.
        aliases: other spellings of the flag (errors name ``flag``).
        metavar: the placeholder of its value in ``--help``.
        choices: the allowed values; a mapping gives the command-line word of each value.
        many: takes one or more values (a list on the command line).
        repeat: its flag is repeated, one value each time (``--model-arg a=1 --model-arg b=2``).
        parse: the command-line word to a value (default: the word itself); may raise
            ``ValueError`` (reported as "expected ..., got ...").
        check: checks and normalises a value: ``check(value, name) -> value``; raises
            :class:`probust.errors.OptionError` naming ``name``.
        group: the ``--help`` section it is listed in.
        record: its key in ``config.json``'s "run" (part of a folder's identity); None: not recorded.
        implied: the value a folder recorded before the option existed implies (UNSET: none).
        param: the parameter it sets of the estimator (or loss) the settings are passed to.
        hidden: declared for Python only (no flag).
    """

    help: str
    default_help: str | None = None
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[Any, ...] | Mapping[str, Any] | None = None
    many: bool = False
    repeat: bool = False
    parse: Callable[[str], Any] | None = None
    check: Callable[[Any, str], Any] | None = None
    group: str = ""
    record: str | None = None
    implied: Any = UNSET
    param: str | None = None
    hidden: bool = False


def option(default: Any = MISSING, *, help: str, **details: Any) -> Any:
    """A dataclass field declaring an option (``details``: the fields of :class:`Option`)."""
    return dataclasses.field(default=default, metadata={_KEY: Option(help=help, **details)})


def option_of(field: dataclasses.Field) -> Option | None:
    """The :class:`Option` a field declares, or None."""
    return field.metadata.get(_KEY)


def declared(cls: Any) -> list[tuple[dataclasses.Field, Option]]:
    """Every declared option of a dataclass (or instance), in field order."""
    return [(f, o) for f in dataclasses.fields(cls) if (o := option_of(f)) is not None]
