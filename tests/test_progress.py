"""probust._progress: the work's updates reach the run's bar (scaled, never past a share), and
nothing is drawn or counted twice."""

from __future__ import annotations

import pytest
import torch

import probust
from probust._progress import Share, counted_as, counting, progress
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
