"""The trust check's statistics pinned by cases only the stated values decide: its level
(TRUST_LEVEL 5% at TRUST_CONFIDENCE 95%), its clear rate (CLEAR_RATE 1%), the stages (2, 8, 32)
and the draws of its stream each stage consumes; and its bound's size, by simulation where the
disagreement rate is known exactly.

The oracle of the level is scipy: a point with k of n draws disagreeing is flagged exactly where
the one-sided Clopper-Pearson lower bound at 95% exceeds 0.05, i.e. where k or more
disagreements out of n would have probability below 5% at a rate of 0.05:
``binom.sf(k - 1, n, 0.05) < 0.05``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy import optimize, stats

import probust
from probust.estimators import trust
from probust.noise import STREAM_TRUST, Gaussian, point_keys
from tests.estimators.test_trust import Quadratic, quadratic_disagreement

LEVEL, CONFIDENCE = 0.05, 0.95  # docs/estimators.md and trust's docstrings: 5%, at 95% confidence


def _flagged(k: int, n: int, level: float = LEVEL) -> bool:
    """k of n draws disagreeing flag the point: P(Bin(n, level) >= k) < 1 - confidence."""
    return k > 0 and stats.binom.sf(k - 1, n, level) < 1 - CONFIDENCE


def _trust_flags(k: int, n: int) -> bool:
    """The check's verdict on k of n disagreeing after a later stage: stopped and not all agreeing."""
    stopped = not bool(trust.undecided(torch.tensor([n - k]), torch.tensor([n]))[0])
    return stopped and k > 0


def test_three_of_sixteen_disagreeing_flag_a_point_at_five_percent_and_would_not_at_ten():
    # 3 of 16: P(Bin(16, 0.05) >= 3) = 0.043 < 5% flags; at a level of 10% it is 0.21, no flag;
    # 2 of 16 (0.19 at 5%) does not flag. Only a level in [0.023, 0.054) decides all three so.
    assert _flagged(3, 16) and not _flagged(3, 16, level=0.1) and not _flagged(2, 16)
    assert _trust_flags(3, 16) and not _trust_flags(2, 16)
    lower = trust.disagreement_lower(torch.tensor([13 / 16], dtype=torch.float64), torch.tensor([16]))
    assert 0.05 < float(lower[0]) < 0.1  # the 95% lower bound of the rate: 0.053


def test_the_fewest_disagreements_that_flag_are_the_five_percent_tests_at_every_number_of_draws():
    # At each number of draws, the smallest flagging count (scipy) flags and one fewer does not:
    # a level or confidence other than 5% / 95% moves at least one of these thresholds.
    seen = set()
    for n in (2, 3, 5, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 100, 128, 200, 400, 1000):
        least = next(k for k in range(1, n + 1) if _flagged(k, n))
        assert _trust_flags(least, n), (least, n)
        assert not _trust_flags(least - 1, n), (least - 1, n)
        seen.add((n, least))
    assert {(2, 2), (8, 3), (16, 3), (32, 5)} <= seen  # the docstrings' cases: 2 of 2, 3 of 8, 5 of 32
    for level in (0.045, 0.055, 0.1):  # the cases tell these levels apart from 5%
        assert any(_flagged(j, n, level) != _flagged(j, n) for n, k in seen for j in (k - 1, k)), level


def test_a_point_whose_first_draws_agree_stops_at_a_flip_rate_of_one_percent_and_not_above():
    agreeing, draws = torch.tensor([2, 2, 2, 2]), torch.tensor([2, 2, 2, 2])
    just_above = math.nextafter(0.01, 1.0)
    rate = torch.tensor([0.0, 0.01, just_above, 0.0099], dtype=torch.float64)
    assert trust.undecided(agreeing, draws, rate).tolist() == [False, False, True, False]
    # a disagreeing draw goes on whatever the rate (1 of 2 cannot flag: P(Bin(2, .05) >= 1) = 0.0975)
    assert not _flagged(1, 2)
    assert trust.undecided(torch.tensor([1]), torch.tensor([2]), torch.tensor([0.0], dtype=torch.float64)).tolist() == [
        True
    ]


def _record_trust_draws(monkeypatch, seed: int, points: int) -> list[tuple[list[int], int, int]]:
    """Every ``Gaussian.sample`` call on the trust stream: (the points' indices, start, count)."""
    every = point_keys(seed, torch.arange(points), STREAM_TRUST)
    index_of = {int(key): i for i, key in enumerate(every)}
    calls: list[tuple[list[int], int, int]] = []
    original = Gaussian.sample

    def recording(self, keys, start, n, shape):
        if all(int(k) in index_of for k in keys):
            calls.append(([index_of[int(k)] for k in keys], start, n))
        return original(self, keys, start, n, shape)

    monkeypatch.setattr(Gaussian, "sample", recording)
    return calls


def test_each_stage_draws_the_streams_next_draws_from_where_the_last_stopped(monkeypatch):
    # A quadratic model where no point stops after 2 draws unless they flag it: the stages are
    # draws 0-1 of every point, then 2-7 of those still open, then 8-31 of those still open,
    # and a point's agreement is that of the first draws of its own stream, recomputed apart
    # in one call (model and linearisation, with the stream's draws 0..n-1).
    d, c, k = 50, 2.0, 0.02
    model, x = Quadratic(d, c, k), torch.zeros(60, d)
    calls = _record_trust_draws(monkeypatch, 0, len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        r = probust.Taylor(model, 1.0, prune="off", check_draws=32)(x)
    assert [(start, n) for _, start, n in calls] == [(0, 2), (2, 6), (8, 24)]
    assert calls[0][0] == list(range(len(x)))
    at_least_8 = (r.agreement_draws >= 8).nonzero().flatten().tolist()
    at_32 = (r.agreement_draws == 32).nonzero().flatten().tolist()
    assert calls[1][0] == at_least_8 and calls[2][0] == at_32 and 0 < len(at_32) < len(at_least_8)
    monkeypatch.undo()
    keys = point_keys(0, torch.arange(len(x)), STREAM_TRUST)
    eps = Gaussian(1.0).sample(keys, 0, 32, x.shape[1:])  # [60, 32, d]: each stream's first 32 draws
    e = eps.double()
    linear = (c + e[..., 0]) > 0  # Taylor at 0: c + w . eps, w = e_1
    g = c + e[..., 0] - k * (e * e).sum(-1)
    with torch.no_grad():
        logits = model((x[:, None] + eps).flatten(0, 1)).view(len(x), 32, 2)
    survives = logits.argmax(-1) == 0
    assert torch.equal(survives, g > 0) or (survives != (g > 0)).sum() <= 1  # float32 rounding at most
    agree = (survives == linear).double()
    n = r.agreement_draws
    expected = torch.stack([agree[b, : n[b]].mean() for b in range(len(x))])
    assert torch.equal(r.agreement, expected)


def _staged_flag_rate(q: float, level: float) -> float:
    """P(flagged) for a point whose draws disagree independently with probability q, whose first
    stage never clears (its residuals are too large), under the stages 2, 8, 32: after each, a
    point stops where the 5%-at-95% rule (at ``level``) flags it; after 8, also where all agree."""
    flagged = 0.0
    first = stats.binom.pmf(np.arange(3), 2, q)  # disagreements among draws 0-1
    for k1, p1 in enumerate(first):
        if _flagged(k1, 2, level):
            flagged += p1
            continue
        for extra8, p8 in enumerate(stats.binom.pmf(np.arange(7), 6, q)):
            k8 = k1 + extra8
            if k8 == 0:
                continue
            if _flagged(k8, 8, level):
                flagged += p1 * p8
                continue
            rest = stats.binom.pmf(np.arange(25), 24, q)
            flagged += p1 * p8 * sum(p for extra, p in enumerate(rest) if _flagged(k8 + extra, 32, level))
    return flagged


def test_a_point_at_the_trust_level_is_flagged_at_the_rate_its_staged_test_implies():
    """At a disagreement rate of exactly TRUST_LEVEL = 0.05 (a quadratic model: the rate by
    quadrature), the staged check flags a point with probability ~0.022 (<= 5%, the docstring's
    bound), and R = 4,000 points' flags pass the two-sided binomial test against it (level 1e-3).
    A check at a level of 10% flags ~0.008, rejected by that test with probability > 0.999 (0.99996)."""
    d, c, repeats = 50, 2.0, 4000
    k = optimize.brentq(lambda k: quadratic_disagreement(d, c, k) - LEVEL, 1e-4, 0.05, xtol=1e-12)
    assert math.isclose(quadratic_disagreement(d, c, k), LEVEL, rel_tol=1e-8)
    model, x = Quadratic(d, c, k), torch.zeros(repeats, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        r = probust.Taylor(model, 1.0, prune="off", check_draws=32)(x)
    # The premise: the first stage never clears (points stop at 2 only where both draws disagree).
    assert (r.agreement[r.agreement_draws == 2] == 0).all()
    assert set(r.agreement_draws.tolist()) <= {2, 8, 32}
    exact, at_ten = _staged_flag_rate(LEVEL, LEVEL), _staged_flag_rate(LEVEL, 0.1)
    assert exact <= 1 - CONFIDENCE and exact > 2 * at_ten
    flags = int(trust.untrusted(r).sum())
    assert stats.binomtest(flags, repeats, exact).pvalue > 1e-3, (flags, exact)
    ks = np.arange(repeats + 1)
    rejected = np.array([stats.binomtest(int(j), repeats, exact).pvalue <= 1e-3 for j in ks[:500]])
    power = float(stats.binom.pmf(ks[:500], repeats, at_ten)[rejected].sum())
    assert power > 0.999, power
