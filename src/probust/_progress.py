"""Progress bars that cost nothing when they are off, and one bar for a whole run.

An estimator opens :func:`progress` over its own work and reports into it: Monte Carlo methods
(and CERTIFY / PREDICT) count their draws, Taylor and MMSE their points. Called alone with
``show_progress=True``, it draws its own tqdm bar.

The runner (``probust.score``, ``probust estimate``, ``probust certify``) draws one bar for a
whole call instead (:func:`run_bar`, counting model evaluations) and hands each piece of work a
:class:`Share` of it with :func:`counting`: inside, the :func:`progress` an estimator opens draws
nothing and forwards its updates to that share, times a scale (:func:`counted_as`: an MMSE point
is its noisy copies), never past the share's size; :meth:`Share.finish` fills what the work did
not report (a method without a bar of its own). Outside :func:`counting`, and with no bar asked
for, :func:`progress` yields a no-op.

Work that stops early (sequential CERTIFY, adaptive Monte Carlo) opens its bar over the most it
may do and, as each point stops, takes the draws it will not make off the total (:func:`drop`), so
the bar's total is the work still planned, it ends at 100%, and its time left never counts draws
that will not be made. :func:`interactive` says where a bar is drawn by default (CERTIFY, PREDICT).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Protocol

from probust._extras import import_extra

__all__ = ["Progress", "Share", "counted_as", "counting", "drop", "interactive", "progress", "ramp", "run_bar", "shown"]


class Progress(Protocol):
    """What the work reports to a progress bar: units done since the last update."""

    def update(self, n: int = 1) -> object: ...


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


_SILENT = _Silent()


def shown(bar: Progress) -> bool:
    """Whether ``bar`` (what :func:`progress` yielded) reaches a bar someone sees: its own tqdm
    bar, or a run's share."""
    return bar is not _SILENT


class Share:
    """A piece of a run's bar: ``size`` units of it (model evaluations), filled by the work's
    updates and, at the end, by :meth:`finish`.

    Args:
        bar: the run's bar (anything with ``update(n)``).
        size: the units this piece adds to the bar once done.
    """

    def __init__(self, bar: Progress, size: int) -> None:
        self.bar = bar
        self.left = size

    def add(self, n: int) -> None:
        """Move the bar by ``n`` units, never past this share's size."""
        step = min(n, self.left)
        if step > 0:
            self.left -= step
            self.bar.update(step)

    def finish(self) -> None:
        """Move the bar by what this share has not yet added (the work is done)."""
        self.add(self.left)

    def drop(self, n: int) -> None:
        """The work will not do ``n`` of its units: take them off this share and off the bar's
        total (never more than the share has left)."""
        step = min(n, self.left)
        if step > 0:
            self.left -= step
            drop(self.bar, step)


class _Forward:
    """The bar an estimator's :func:`progress` gets inside :func:`counting`: its updates, times
    ``scale``, go to ``share``. ``open``: a :func:`progress` of the work holds it (one at a time)."""

    def __init__(self, share: Share, scale: int) -> None:
        self.share = share
        self.scale = scale
        self.open = False

    def update(self, n: int = 1) -> None:
        self.share.add(n * self.scale)

    def drop(self, n: int) -> None:
        self.share.drop(n * self.scale)


_TARGET: ContextVar[_Forward | None] = ContextVar("probust_progress_target", default=None)


def drop(bar: Progress, n: int) -> None:
    """The work ``bar`` counts will not do ``n`` of the units it was opened over (a point that
    stopped early): take them off its total, so that it ends at 100% and its time left counts only
    the work still planned. A bar that is not shown: nothing."""
    if n <= 0 or bar is _SILENT:
        return
    own = getattr(bar, "drop", None)
    if own is not None:  # a run's share, or the forward to one
        own(n)
        return
    total = getattr(bar, "total", None)
    if total is not None:  # a tqdm bar
        bar.total = max(total - n, getattr(bar, "n", 0))  # type: ignore[attr-defined]
        refresh = getattr(bar, "refresh", None)
        if refresh is not None:
            refresh()


def interactive() -> bool:
    """Whether someone watches this session: stderr is a terminal, or the code runs in a Jupyter
    kernel (a notebook) — and tqdm, which draws the bar, is installed. The default of the progress
    bars that are on by default where it is true (CERTIFY, PREDICT); off in tests, CI logs and
    pipes."""
    try:
        if importlib.util.find_spec("tqdm") is None:
            return False
    except ImportError:  # an import hook that refuses it (as the core-only checks do)
        return False
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        return True
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


@contextlib.contextmanager
def counting(share: Share | None, scale: int = 1) -> Iterator[None]:
    """Inside, the :func:`progress` the work opens forwards its updates (times ``scale``) to
    ``share`` instead of drawing a bar; a :func:`progress` opened inside another one's is silent,
    so nothing is counted twice. ``share`` None: nothing changes."""
    if share is None:
        yield
        return
    token = _TARGET.set(_Forward(share, scale))
    try:
        yield
    finally:
        _TARGET.reset(token)


@contextlib.contextmanager
def counted_as(scale: int) -> Iterator[None]:
    """Inside :func:`counting`: each unit the work reports counts ``scale`` units of the share
    (e.g. an MMSE estimator counts points, and a point is its noisy copies). Outside: nothing."""
    target = _TARGET.get()
    with counting(target.share if target is not None else None, scale):
        yield


@contextlib.contextmanager
def progress(total: int, description: str, enabled: bool, unit: str = "pt") -> Iterator[Progress]:
    """A tqdm bar over ``total`` units, named ``unit`` ("pt": points, "draw": noisy draws, each a
    model evaluation; "epoch"), or a no-op.

    Inside :func:`counting` the updates go to the run's share instead, whatever ``enabled`` says
    (and no bar is drawn). tqdm comes with the 'run' extra; without it, asking for a bar raises a
    MissingExtraError.
    """
    target = _TARGET.get()
    if target is not None:
        if target.open:  # inside another progress of the same work: counted there
            yield _SILENT
            return
        target.open = True
        try:
            yield target
        finally:
            target.open = False
        return
    if not enabled:
        yield _SILENT
        return
    tqdm = import_extra("tqdm.auto", extra="run", feature="a progress bar (show_progress=True)").tqdm
    with tqdm(total=total, desc=description, unit=unit, unit_scale=total >= 10_000, dynamic_ncols=True) as bar:
        yield bar


@contextlib.contextmanager
def run_bar(total: int, description: str, enabled: bool, *, initial: int = 0) -> Iterator[Any]:
    """The one bar of a run: ``total`` model evaluations (``initial`` of them already done, e.g.
    stored by an earlier run), on stderr, with tqdm's rate and time left; None when not
    ``enabled``. Its ``set_description`` names the work in progress."""
    if not enabled:
        yield None
        return
    tqdm = import_extra("tqdm.auto", extra="run", feature="a progress bar (show_progress=True)").tqdm
    with tqdm(
        total=total,
        initial=initial,
        desc=description,
        unit="eval",
        unit_scale=total >= 10_000,  # 1.2M/16M beyond; exact counts below
        dynamic_ncols=True,
        file=sys.stderr,
        smoothing=0.1,
    ) as bar:
        yield bar


def ramp(points: int, chunk: int, first: int) -> list[slice]:
    """The chunks of ``points`` points: ``first`` points, then 4 times as many each time, up to
    ``chunk``. With ``first`` half a pass of pullbacks, a progress bar's first update comes after
    one pass's work, not a whole chunk's (up to
    :data:`probust.execution.engine.MAX_POINTS_PER_CHUNK` points); a chunk's points share its
    screening and its passes, so the later, larger chunks keep their throughput. A point's numbers
    do not depend on its chunk (``test_a_points_sketch_stages_and_numbers_do_not_depend_on_the_batch_split``)."""
    cuts, start, size = [], 0, min(first, chunk)
    while start < points:
        cuts.append(slice(start, min(start + size, points)))
        start, size = start + size, min(chunk, size * 4)
    return cuts
