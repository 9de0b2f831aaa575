"""Command-line flags derived from declared options (see :mod:`probust._options`).

Each declared field of a settings dataclass becomes one flag (plain argparse): its name, value
placeholder, choices, and help with the default are read from the declaration, and what the
user typed comes back as the field's value (:func:`values`). Errors name a field; :func:`flag_map`
gives the flag of every field, and :func:`message` shows an error in the command's words.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from probust._options import Option, declared
from probust.errors import OptionError, ProbustError, Setting

__all__ = ["add_options", "flag_map", "flag_of", "message", "values"]


def flag_of(field: dataclasses.Field, option: Option) -> str:
    """The flag a declared field is set with (``--`` and its name with dashes unless declared)."""
    return option.flag if option.flag else "--" + field.name.replace("_", "-")


def _switch(field: dataclasses.Field) -> bool:
    return isinstance(field.default, bool) or (field.default is None and str(field.type) == "bool | None")


def _word(value: Any, option: Option) -> str:
    """How a value reads on the command line."""
    if isinstance(option.choices, Mapping):
        return next((w for w, v in option.choices.items() if v == value), str(value))
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value))
    return str(value)


def _help(field: dataclasses.Field, option: Option, default: Any = dataclasses.MISSING) -> str:
    text = option.help
    if default is not dataclasses.MISSING:
        shown = _word(default, option)
    elif option.default_help is not None:
        shown = option.default_help
    elif _switch(field) or field.default is dataclasses.MISSING or field.default is None:
        shown = ""
    else:
        shown = _word(field.default, option)
    return f"{text} (default: {shown})" if shown else text


def add_options(
    parser: argparse.ArgumentParser,
    cls: Any,
    title: str | None = None,
    *,
    required: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> argparse._ArgumentGroup:
    """Add a flag for each declared field of ``cls`` (none for ``hidden`` ones) to a group of
    ``parser`` titled ``title`` (default: ``cls.TITLE``). The value is stored under the field's
    name, and only when given: the dataclass keeps its own default, except for the fields of
    ``defaults``, where the command's default differs from the library's (shown in the help)."""
    defaults = dict(defaults or {})
    group = parser.add_argument_group(title if title is not None else getattr(cls, "TITLE", None))
    for f, o in declared(cls):
        if o.hidden:
            continue
        flag = flag_of(f, o)
        default = defaults.get(f.name, dataclasses.MISSING)
        common: dict[str, Any] = {
            "dest": f.name,
            "default": argparse.SUPPRESS if default is dataclasses.MISSING else default,
            "help": _help(f, o, default),
        }
        if _switch(f) and o.choices is None:
            if f.default is None:  # None / True / False: a pair of flags
                group.add_argument(flag, action="store_true", **common)
                common["help"] = f"the opposite of {flag}"
                group.add_argument("--no-" + flag.removeprefix("--"), action="store_false", **common)
            else:
                group.add_argument(flag, action="store_false" if f.default else "store_true", **common)
            continue
        if o.metavar is not None:
            common["metavar"] = o.metavar
        if o.choices is not None:
            common["choices"] = list(o.choices) if isinstance(o.choices, Mapping) else [str(c) for c in o.choices]
        if o.repeat:
            common["action"] = "append"
        elif o.many:
            common["nargs"] = "+"
        group.add_argument(flag, *o.aliases, required=f.name in set(required), **common)
    return group


def _value(word: str, field: dataclasses.Field, option: Option) -> Any:
    if isinstance(option.choices, Mapping):
        return option.choices[word]
    parse = option.parse
    if parse is None and option.choices is not None:
        parse = type(next(iter(option.choices)))
    if parse is None:
        return word
    try:
        return parse(word)
    except (TypeError, ValueError) as exc:
        what = "an integer" if parse is int else "a number" if parse is float else None
        reason = f"expected {what}, got {word!r}" if what else str(exc)
        raise OptionError(reason, field=field.name) from None


def values(args: argparse.Namespace, cls: Any) -> dict[str, Any]:
    """The fields of ``cls`` that were given on the command line, as values of the field.

    Raises:
        OptionError: a word that does not parse (``field`` names it).
    """
    out = {}
    for f, o in declared(cls):
        if o.hidden or not hasattr(args, f.name):
            continue
        given = getattr(args, f.name)
        if isinstance(given, list):
            out[f.name] = [_value(w, f, o) for w in given]
        elif isinstance(given, str):
            out[f.name] = _value(given, f, o)
        else:
            out[f.name] = given
    return out


def flag_map(*classes: Any) -> dict[str, str]:
    """Every declared field of ``classes`` and the flag that sets it (the first class that
    declares a name wins)."""
    out: dict[str, str] = {}
    for cls in classes:
        for f, o in declared(cls):
            out.setdefault(f.name, flag_of(f, o))
    return out


def message(error: BaseException, flags: Mapping[str, str]) -> str:
    """An error in the command's words: its ``field`` and suggested settings as flags (a flag
    for a switch alone, else the flag and the value); other errors as they read."""
    if not isinstance(error, ProbustError):
        return str(error).replace("\n", "; ")

    def name_of(name: str, value: Any) -> str:
        flag = flags.get(name)
        if flag is None:
            return Setting(name, value).render(lambda n, v: n if v is None else f"{n}={v!r}")
        if value is None or value is True:
            return flag
        if value is False and flag.startswith("--no-"):
            return flag
        return f"{flag} {value}"

    return error.render(name_of).replace("\n", "; ")
