"""probust._progress: the work's updates reach the run's bar (scaled, never past a share), and
nothing is drawn or counted twice."""

from __future__ import annotations

import pytest
import torch

import probust
from probust._progress import Share, counted_as, counting, drop, progress
from probust.models import build
from probust.smoothing import Certify


class Recorder:
    def __init__(self) -> None:
        self.n = 0
        self.updates: list[int] = []

    def update(self, n: int = 1) -> None:
        self.n += n
        self.updates.append(n)


def test_a_share_moves_the_bar_by_at_most_its_size_and_finish_fills_the_rest():
    bar = Recorder()
    share = Share(bar, 10)
    share.add(4)
    share.add(9)  # past the share: only what is left of it
    assert bar.n == 10
    share.finish()
    assert bar.updates == [4, 6]
    other = Share(bar, 5)
    other.add(2)
    other.finish()
    assert bar.n == 15 and bar.updates[-2:] == [2, 3]


def test_inside_counting_the_works_progress_goes_to_the_share_scaled_and_draws_nothing():
    bar = Recorder()
    share = Share(bar, 100)
    with counting(share):
        # enabled=True would draw a tqdm bar outside counting; inside, it only forwards
        with progress(4, "mmse", True) as inner:
            inner.update(1)
        with counted_as(5), progress(4, "mmse", False) as inner:
            inner.update(2)
    assert bar.updates == [1, 10]


def test_a_progress_opened_inside_another_is_silent():
    bar = Recorder()
    share = Share(bar, 100)
    with counting(share), progress(10, "outer", False) as outer, progress(10, "inner", False) as inner:
        inner.update(3)  # an inner method's bar: counted by the outer one already
        outer.update(2)
    assert bar.updates == [2]


def test_a_bar_that_is_off_draws_nothing_in_or_out_of_a_run(monkeypatch):
    import tqdm.auto

    def no_bar(*args: object, **kwargs: object) -> None:
        raise AssertionError("a bar was drawn")

    monkeypatch.setattr(tqdm.auto, "tqdm", no_bar)
    for context in (counting(None), counted_as(7)):  # a run without a bar; a scale outside any run
        with context, progress(10, "mc", False) as bar:
            bar.update(3)
    with progress(10, "mc", False) as bar:
        bar.update(3)


_BAR = probust.Execution(show_progress=True)
#: Each method with its bar on, and the units its bar counts on 300 points (points; Monte Carlo
#: methods count draws).
_BARS = {
    "taylor": (lambda model: probust.Taylor(model, 0.05, execution=_BAR), 300),
    "mmse": (lambda model: probust.MMSE(model, 0.05, n_samples=4, execution=_BAR), 300),
    "mc": (lambda model: probust.MonteCarlo(model, 0.05, n_samples=2000, execution=_BAR), 300 * 2000),
    "certify": (lambda model: Certify(model, 0.05, n0=20, n=2000, execution=_BAR), 300 * 2020),
}


@pytest.mark.parametrize("method", list(_BARS))
def test_the_bar_moves_once_the_first_pass_of_work_is_done(method, monkeypatch):
    # The first update comes after a pass's work, not after a chunk of up to 1,024 points (or the
    # whole call): the linearised methods' first chunks are small where a bar shows.
    import tqdm.auto

    bars: list[Recorder] = []

    class Bar(Recorder):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__()
            bars.append(self)

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(300, 1, 12, 12)
    make, total = _BARS[method]
    make(model)(x)
    (bar,) = bars
    assert bar.n == total and len(bar.updates) >= 3, bar.updates
    assert bar.updates[0] <= total / 8, bar.updates  # a first pass's points, not the call's


class _TqdmLike(Recorder):
    """tqdm as the bars use it: a total that work stopping early may lower, kwargs recorded."""

    made: list[_TqdmLike] = []

    def __init__(self, *args: object, total: int = 0, **kwargs: object) -> None:
        super().__init__()
        self.total = total
        self.kwargs = kwargs
        self.totals = [total]
        self.fractions: list[float] = []
        _TqdmLike.made.append(self)

    def update(self, n: int = 1) -> None:
        super().update(n)
        self.fractions.append(self.n / self.total)

    def refresh(self) -> None:
        self.totals.append(self.total)
        self.fractions.append(self.n / self.total)

    def __enter__(self) -> _TqdmLike:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def tqdm_like(monkeypatch):
    import tqdm.auto

    _TqdmLike.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", _TqdmLike)
    return _TqdmLike.made


class _Terminal:
    """stderr as a terminal shows it (isatty), writing nowhere."""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _certify_inputs() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return build("cnn", 10, (1, 12, 12)).eval(), torch.rand(6, 1, 12, 12)


def test_certify_draws_a_bar_of_draws_by_default_where_the_session_is_interactive(tqdm_like, monkeypatch):
    model, x = _certify_inputs()
    probust.certify(model, x, 0.1, n0=10, n=300)  # stderr captured by pytest: not interactive
    assert tqdm_like == []
    monkeypatch.setattr("sys.stderr", _Terminal())
    r = probust.certify(model, x, 0.1, n0=10, n=300)
    (bar,) = tqdm_like
    assert bar.kwargs["unit"] == "draw" and bar.n == bar.total == int(r.n_drawn.sum()) == 6 * 310
    probust.certify(model, x, 0.1, n0=10, n=300, execution=probust.Execution(show_progress=False))
    assert len(tqdm_like) == 1  # an execution given says


def test_sequential_certify_bar_total_is_the_draws_still_planned_and_ends_at_100_percent(tqdm_like):
    # Points stop long before n: the total shrinks as each stops, so the bar never reads far below
    # the share of the work done and reaches 100% at the end (it used to count n0 + n per point
    # and jump from a few percent to the end).
    model, x = _certify_inputs()
    n0, n = 20, 200_000
    r = Certify(model, 2.0, n0=n0, n=n, radii=[0.0, 1.0], execution=_BAR)(x)
    (bar,) = tqdm_like
    drawn = int(r.n_drawn.sum())
    assert drawn < 6 * (n0 + n) // 100 and len(set(r.n_drawn.tolist())) > 1  # stopped early, at several draws
    assert bar.kwargs["unit"] == "draw"
    assert bar.n == bar.total == drawn
    assert bar.totals == sorted(bar.totals, reverse=True) and bar.totals[0] == 6 * (n0 + n)
    assert max(bar.updates) < drawn / 4  # no jump to the end: every update is draws made
    assert (bar.n - bar.updates[-1]) / bar.total >= 0.5  # just before the last update: most of the way


def test_a_dropped_share_lowers_the_runs_total_and_finish_fills_only_what_is_left(tqdm_like):
    import tqdm.auto

    with tqdm.auto.tqdm(total=100) as bar:
        share = Share(bar, 60)
        with counting(share), counted_as(2), progress(30, "mc", False) as inner:
            inner.update(5)  # 10 units
            drop(inner, 20)  # 40 units the work will not do
        share.finish()
    assert bar.total == 60 and bar.n == 20 and bar.updates == [10, 10]  # 40 of the 100 are other shares


def test_adaptive_monte_carlo_bar_ends_at_the_draws_made(tqdm_like):
    model, x = _certify_inputs()
    est = probust.MonteCarlo(model, 0.3, n_samples=20_000, target_half_width=0.05, execution=_BAR)(x)
    (bar,) = tqdm_like
    assert bar.kwargs["unit"] == "draw" and bar.n == bar.total == int(est.n_samples.sum()) < 6 * 20_000
