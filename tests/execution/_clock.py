"""A planning clock that does not run: what a test asserts of measured plans must not depend on
how loaded the machine is.

The plans' timings (``tuning._seconds``) are faked by the tests that count them; the planning
allowance (``tuning._Allowance``) also reads the wall time spent since the call began, through
``tuning.time.perf_counter``. On a loaded machine that time grows, the allowance runs out and a
plan is left unfinished: a later call then times the rest. Frozen, the allowance sees only the
faked timings, and each call measures the same whatever else runs.
"""

from __future__ import annotations

from types import SimpleNamespace

from probust.execution import tuning


def freeze_planning_clock(monkeypatch) -> None:
    """The planning module's ``time.perf_counter`` reads 0.0 for the rest of the test."""
    monkeypatch.setattr(tuning, "time", SimpleNamespace(perf_counter=lambda: 0.0))
