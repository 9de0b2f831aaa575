"""The experiment contract: the :class:`Experiment` base, what it returns (:class:`Output`), and
writing an output's files.

An experiment is one :class:`Experiment` subclass in its own module of this package, registered
once in :mod:`probust.experiments.registry`; the report (:mod:`probust.report`), the choices of
``probust report --only/--skip`` and the demo read the registry, so adding an experiment is one
module and one registry entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pandas as pd

from probust._io import atomic_write_text

if TYPE_CHECKING:
    from probust.experiments.runs import Results


class ExperimentSkipped(Exception):
    """The results hold nothing this experiment can use (the message says what is missing)."""


@dataclass
class Output:
    """An experiment's products.

    Attributes:
        name: the experiment's registry name (also its folder and file stem).
        title: a one-line title.
        description: what the experiment measures and how (fixed text).
        tables: tidy tables by name; ``tables[name]`` (the main one) is written to
            ``<name>.csv``, every other one to ``<name>_<table>.csv``.
        figures: PNG files (each with an SVG beside it).
        reading: short statements computed from the numbers.
        settings: the options the experiment ran with.
        skipped: why nothing was produced (then tables and figures are empty).
        files: every file written.
    """

    name: str
    title: str
    description: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    reading: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def table(self) -> pd.DataFrame:
        """The main table."""
        return self.tables[self.name]


def write_tables(out: Path, name: str, tables: dict[str, pd.DataFrame]) -> list[Path]:
    """Write each table as CSV in ``out`` (each whole or not at all, replacing a file or link of its
    name rather than writing through it); returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, frame in tables.items():
        path = out / (f"{name}.csv" if key == name else f"{name}_{key}.csv")
        atomic_write_text(path, frame.to_csv(index=False, float_format="%.6g"), durable=False)
        paths.append(path)
    return paths


def finish(output: Output, out: Path) -> Output:
    """Write the tables of ``output`` and collect the list of files."""
    files = write_tables(out, output.name, output.tables)
    for png in output.figures:
        files += [png, png.with_suffix(".svg")]
    output.files = files
    return output


#: A table as the report shows it: (caption, HTML allowed; the frame).
Shown = tuple[str, pd.DataFrame]


class Experiment:
    """One experiment: what it computes from results tables (:meth:`run`) and what the report
    shows of it (:meth:`display`, :meth:`summary`).

    Subclasses set the class attributes and implement :meth:`run`; the other methods have
    defaults.

    Attributes:
        name: the registry name (also the output folder and the file stem of its tables and figures).
        title: a one-line title, numbered in the registry's order ("1. ...").
        description: what the experiment measures and how (HTML allowed), shown above its results.
        measuring: True when the experiment computes more than reading tables (it times estimators
            or trains models), so that its numbers depend on the machine or take long.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    description: ClassVar[str]
    measuring: ClassVar[bool] = False

    def run(self, results: Results, out: str | Path, *args: Any, **options: Any) -> Output:
        """Compute the experiment's tables, figures and reading from ``results``.

        Args:
            results: the runs (:func:`probust.experiments.load_results`).
            out: the experiment's own folder (its files are written there).
            **options: the experiment's keyword arguments (each subclass names its own; the
                base also takes ``*args`` only so that type checkers accept any subclass
                signature: options are always passed by keyword).

        Returns:
            The :class:`Output`, its files written.

        Raises:
            ExperimentSkipped: the results hold nothing this experiment can use.
        """
        raise NotImplementedError

    def output(self, out: Path, **products: Any) -> Output:
        """This experiment's :class:`Output` of ``products`` (tables, figures, reading, settings),
        with its tables written under ``out`` and its files listed (:func:`finish`)."""
        return finish(Output(name=self.name, title=self.title, description=self.description, **products), out)

    def display(self, output: Output) -> list[Shown]:
        """The tables shown for ``output`` in its section of the report (the CSV files hold
        everything); by default the main table."""
        return [(self.name, output.tables.get(self.name, pd.DataFrame()))]

    def summary(self, output: Output, results: Results) -> list[Shown]:
        """The tables ``output`` adds to the report's summary at the top (default: none).

        Args:
            output: this experiment's output (not skipped).
            results: the runs the report is made from.
        """
        return []

    def skipped(self, reason: str) -> Output:
        """An output that produced nothing, for the reason given."""
        return Output(name=self.name, title=self.title, description=self.description, skipped=reason)
