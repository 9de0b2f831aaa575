"""The runner's progress: one bar per call (``probust.score``, ``run_estimate``, ``run_certify``)
that counts the model evaluations the estimators count (Monte Carlo draws, MMSE copies, one per
point for Taylor and softmax), moving pass by pass inside a work unit; the estimators' own bars
when they are called alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import tqdm.auto

import probust
from probust.execution import Execution
from probust.run import run_estimate
from probust.run.certify import CertifySettings, read_certified, run_certify
from probust.run.methods import LINEARISED_EXTRA, PULL_IN_FORWARDS
from tests._helpers import tiny_data, tiny_model


class FakeBar:
    """A tqdm stand-in that records what the work tells it."""

    made: list[FakeBar] = []

    def __init__(self, total: int | None = None, initial: int = 0, desc: str | None = None, **_: Any) -> None:
        self.total, self.initial, self.n = total, initial, initial
        self.descriptions = [desc]
        self.updates: list[int] = []
        self.closed = False
        FakeBar.made.append(self)

    def update(self, n: int = 1) -> None:
        self.updates.append(n)
        self.n += n

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.descriptions.append(desc)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture()
def bars(monkeypatch) -> list[FakeBar]:
    """Every progress bar drawn during the test, in order."""
    FakeBar.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    return FakeBar.made


def test_score_draws_one_bar_that_counts_every_model_evaluation(bars):
    points, sigmas, draws, copies = 10, [0.1, 0.3], 200, 3
    df = probust.score(
        tiny_model(),
        tiny_data(points),
        sigmas,
        ["mc", "taylor", "mmse", "softmax"],
        mc_samples=draws,
        mmse_samples=copies,
        unit_size=4,
        batch_size=50,
        device="cpu",
        show_progress=True,
    )
    assert len(df) == points * len(sigmas) * 4
    assert len(bars) == 1
    bar = bars[0]
    # per point and sigma: mc's draws, mmse's copies and taylor's linearisation at their declared
    # costs (C = 3: a forward pass and 2 backward passes each, plus the check and the map), one
    # clean pass (softmax)
    linearisation = 1 + PULL_IN_FORWARDS * 2
    taylor, mmse = linearisation + LINEARISED_EXTRA, copies * linearisation + LINEARISED_EXTRA
    assert bar.total == points * len(sigmas) * (draws + mmse + taylor + 1)
    assert bar.n == bar.total and bar.closed
    assert bar.descriptions[0] == "sigma=0.1 mc n=200"
    assert "sigma=0.3 softmax" in bar.descriptions


def test_the_bar_moves_pass_by_pass_inside_a_work_unit(bars):
    # One work unit (4 points) of 1,000 draws each, 250 rows per pass through the model: the bar
    # must move after each pass, not once the unit is done.
    probust.score(
        tiny_model(),
        tiny_data(4),
        0.3,
        ["mc"],
        mc_samples=1000,
        unit_size=4,
        batch_size=250,
        device="cpu",
        show_progress=True,
    )
    (bar,) = bars
    assert bar.total == 4 * 1000 and bar.n == bar.total
    assert len(bar.updates) >= 16 and max(bar.updates) <= 250


def test_an_adaptive_runs_total_drops_the_draws_it_did_not_need(bars):
    df = probust.score(
        tiny_model(),
        tiny_data(6),
        0.3,
        ["mc"],
        mc_samples=10_000,
        target_half_width=0.1,
        unit_size=3,
        device="cpu",
        show_progress=True,
    )
    assert (df.n_drawn < 10_000).all()  # every point stopped early
    (bar,) = bars
    # Each point that stopped took its remaining draws off the total: the bar ends at 100% on the
    # draws made, with no jump over the draws not needed.
    assert bar.n == bar.total == int(df.n_drawn.sum()) and max(bar.updates) <= 3 * 1000


def test_an_extended_run_starts_its_bar_at_the_work_already_stored(bars, tmp_path):
    common = dict(methods=["mc"], mc_samples=100, unit_size=4, device="cpu", out=tmp_path / "r")
    run_estimate(tiny_data(8), tiny_model(), [0.1], show_progress=False, **common)
    assert bars == []  # show_progress=False: no bar at all
    run_estimate(tiny_data(8), tiny_model(), [0.1, 0.3], show_progress=True, extend=True, **common)
    (bar,) = bars
    assert (bar.initial, bar.total, bar.n) == (8 * 100, 2 * 8 * 100, 2 * 8 * 100)
    assert bar.descriptions[0] == "sigma=0.3 mc n=100"


def test_certify_draws_one_bar_over_its_draws_and_the_estimates_copies(bars, tmp_path):
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    settings = CertifySettings(
        data=(x, torch.zeros(6, dtype=torch.int64)),
        model=tiny_model(),
        sigmas=[0.25, 0.5],
        n0=10,
        n=50,
        estimate="mmse",
        estimate_copies=3,
        unit_size=3,
        device="cpu",
        out=tmp_path / "cert",
        show_progress=True,
    )
    run_certify(settings)
    (bar,) = bars
    assert bar.total == 2 * 6 * (10 + 50 + 3) and bar.n == bar.total
    assert len(bar.updates) > 2 * 2  # more than once per work unit
    assert bar.descriptions == ["certify sigma=0.25", "certify sigma=0.5"]


def test_certify_with_radii_drops_the_draws_it_did_not_need_from_the_total(bars, tmp_path):
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    settings = CertifySettings(
        data=(x, torch.zeros(4, dtype=torch.int64)),
        model=tiny_model(),
        sigmas=[0.25],
        n0=10,
        n=2000,
        radii=[0.0],
        device="cpu",
        out=tmp_path / "cert",
        show_progress=True,
    )
    run_certify(settings)
    (bar,) = bars
    drawn = int(read_certified(tmp_path / "cert").n_drawn.sum())
    assert drawn < 4 * (10 + 2000) and bar.n == bar.total == drawn


def test_an_estimator_called_alone_draws_its_own_bar_over_its_draws(bars):
    x = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    probust.MonteCarlo(tiny_model(), 0.3, n_samples=100, execution=Execution(show_progress=True))(x)
    (bar,) = bars
    assert bar.total == 3 * 100 and bar.n == bar.total


class _DescribedBar(FakeBar):
    """Records how far the bar was when each piece of work began."""

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        super().set_description(desc, refresh)
        self.at.append((desc, self.n))

    @property
    def at(self) -> list[tuple[str | None, int]]:
        return self.__dict__.setdefault("_at", [])


def test_a_multi_method_bar_weighs_each_method_by_its_declared_cost(monkeypatch):
    # Monte Carlo first, then Taylor and MMSE: the bar must not read 99% once Monte Carlo is done
    # (it counted one evaluation per Taylor point and one per MMSE copy against 1,000 draws).
    FakeBar.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", _DescribedBar)
    probust.score(
        tiny_model(10),
        (torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(3)), torch.zeros(8, dtype=torch.int64)),
        0.1,
        ["mc", "taylor", "mmse"],
        mc_samples=1000,
        mmse_samples=5,
        device="cpu",
        show_progress=True,
    )
    (bar,) = FakeBar.made
    assert bar.n == bar.total
    share = {desc: n / bar.total for desc, n in bar.at}  # the bar's fraction when each method began
    after_mc = share["sigma=0.1 taylor"]
    assert 0.6 < after_mc < 0.9, share  # Taylor and MMSE(5) at C = 10: about a sixth of the work
    assert share["sigma=0.1 mmse n=5"] - after_mc > 0.02, share
