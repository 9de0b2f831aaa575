"""Errors raised by :mod:`probust.data`."""

from __future__ import annotations

from probust.errors import ProbustError


class ProbustDataError(ProbustError, FileNotFoundError):
    """A data set cannot be used: its files are missing, unreadable or corrupted.

    The message says which files, where they were looked for, and how to get them. It is a
    :class:`~probust.errors.ProbustError` and a ``FileNotFoundError``, so that callers who only
    care about "no usable data" catch one type.
    """


class DataCorruptError(ProbustDataError):
    """A data file was found but fails a format check (magic number, size, structure)."""


class DataFormatError(ProbustDataError):
    """A user's data file or folder is not usable: the message names the file and what is wrong
    (mixed shapes, labels out of range or not whole numbers, non-numeric columns, NaN, ...)."""
