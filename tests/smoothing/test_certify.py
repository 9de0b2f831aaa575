"""CERTIFY and PREDICT: the authors' procedures exactly, their random streams, their refusals.

The oracle of the procedure is Cohen et al.'s algorithm written out here on the same noise draws
(the documented streams: ``probust.point_keys(seed, index, STREAM_*)``), with scipy's beta
quantile, normal quantile and binomial test; the guarantee is checked by simulation in
test_guarantee.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import Tensor, nn

import probust
from probust.execution import Execution
from probust.noise import STREAM_CERTIFY_ESTIMATE, STREAM_CERTIFY_SELECT, STREAM_PREDICT, point_keys
from probust.smoothing import ABSTAIN, Certify, CertifyResult, Predict, PredictResult
from probust.smoothing.smoothed import PRIOR_FIRST_CHECK, PRIOR_GROWTH
from tests._helpers import NonFiniteAbove, TinyCNN, linear_model, points_near_boundaries

SETTINGS = dict(execution=Execution(batch_size=64, memory_budget="256MB", channels_last=False))


def votes(model: nn.Module, x: Tensor, sigma: float, seed: int, stream: int, n: int, offset: int = 0) -> np.ndarray:
    """Per-class counts of n noisy copies of each point, int [B, C], drawn the documented way."""
    keys = point_keys(seed, torch.arange(offset, offset + len(x)), stream)
    eps = probust.Gaussian(sigma).sample(keys, 0, n, x.shape[1:])
    with torch.no_grad():
        logits = model((x[:, None] + eps).flatten(0, 1))
    classes = logits.shape[1]
    predicted = logits.argmax(1).view(len(x), n)
    return torch.nn.functional.one_hot(predicted, classes).sum(1).numpy()


def _cnn_points() -> tuple[nn.Module, Tensor, float]:
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(2)) * 0.5
    return TinyCNN(classes=3, seed=0).eval(), x, 2.0


def _linear_points() -> tuple[nn.Module, Tensor, float]:
    model = linear_model(12, 10, seed=3)
    return model, points_near_boundaries(model, 6, 0.3), 0.3


MODELS = {"linear": _linear_points, "cnn": _cnn_points}


def assert_same(a, b) -> None:
    """Every field identical, tensors bit for bit, except the wall time ``seconds``."""
    for f in dataclasses.fields(a):
        if f.name == "seconds":
            continue
        u, v = getattr(a, f.name), getattr(b, f.name)
        if isinstance(u, Tensor):
            assert isinstance(v, Tensor) and u.dtype == v.dtype and torch.equal(u, v), (f.name, u, v)
        else:
            assert u == v, (f.name, u, v)


# ---------------------------------------------------------------- the authors' procedures


@pytest.mark.parametrize("model_name", list(MODELS))
def test_certify_is_cohens_certify(model_name):
    model, x, sigma = MODELS[model_name]()
    n0, n, alpha, seed = 50, 400, 0.01, 4
    r = probust.certify(model, x, sigma, n0=n0, n=n, alpha=alpha, seed=seed, index_offset=7, **SETTINGS)
    # Cohen et al.: the class most often drawn in n0 selection draws (numpy's argmax: the first)...
    c_a = votes(model, x, sigma, seed, STREAM_CERTIFY_SELECT, n0, offset=7).argmax(1)
    # ... its count in n independent estimation draws, the one-sided Clopper-Pearson bound ...
    n_a = votes(model, x, sigma, seed, STREAM_CERTIFY_ESTIMATE, n, offset=7)[np.arange(len(x)), c_a]
    p_a = np.where(n_a == 0, 0.0, stats.beta.ppf(alpha, n_a, n - n_a + 1))
    # ... abstain below 1/2, else the radius sigma * Phi^-1(pA).
    abstain = p_a < 0.5
    assert r.selected.tolist() == c_a.tolist()
    assert r.hits.tolist() == n_a.tolist()
    assert r.prediction.tolist() == np.where(abstain, ABSTAIN, c_a).tolist()
    np.testing.assert_allclose(r.p_lower.numpy(), p_a, rtol=1e-12)
    np.testing.assert_allclose(r.radius.numpy(), np.where(abstain, 0.0, sigma * stats.norm.ppf(p_a)), rtol=1e-12)
    assert (r.n_drawn == n0 + n).all() and r.certified is None and r.radii is None
    assert r.prediction.dtype == torch.int64 and r.radius.dtype == torch.float64 and r.n_drawn.dtype == torch.int64


@pytest.mark.parametrize("model_name", list(MODELS))
def test_predict_is_cohens_predict(model_name):
    model, x, sigma = MODELS[model_name]()
    n, alpha = 300, 0.05
    r = probust.predict(model, x, sigma, n=n, alpha=alpha, seed=1, **SETTINGS)
    counts = votes(model, x, sigma, 1, STREAM_PREDICT, n)
    top = counts.argmax(1)
    n_a = counts.max(1)
    n_b = np.sort(counts, axis=1)[:, -2]
    p = np.array([stats.binomtest(a, a + b, 0.5).pvalue for a, b in zip(n_a, n_b)])
    assert r.top.tolist() == top.tolist()
    assert r.count_top.tolist() == n_a.tolist() and r.count_second.tolist() == n_b.tolist()
    np.testing.assert_allclose(r.p_value.numpy(), p, rtol=1e-9)
    assert r.prediction.tolist() == np.where(p <= alpha, top, ABSTAIN).tolist()
    assert (r.n_drawn == n).all()


def _two_class(margin_direction: float = 1.0) -> nn.Linear:
    """f(x) = (x_0, -x_0): class 0 where x_0 > 0; p_robust = Phi(x_0 / sigma), radius |x_0|."""
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[margin_direction, 0.0], [-margin_direction, 0.0]]))
        model.bias.zero_()
    return model


def test_certify_abstains_where_the_bound_is_below_one_half():
    model = _two_class()
    # on the boundary (p = 1/2 for both classes), and just off it: both abstain
    x = torch.tensor([[0.0, 0.3], [0.001, 0.0]])
    r = probust.certify(model, x, 1.0, n0=100, n=1000, **SETTINGS)
    assert r.prediction.tolist() == [ABSTAIN, ABSTAIN]
    assert r.radius.tolist() == [0.0, 0.0]
    assert (r.p_lower < 0.5).all()
    assert r.abstained.all()
    p = probust.predict(model, x, 1.0, n=1000, **SETTINGS)
    assert p.prediction.tolist() == [ABSTAIN, ABSTAIN] and p.abstained.all()


def test_a_sure_point_gets_the_closed_form_radius():
    # Every draw predicts class 0: pA = alpha^(1/n) (Clopper-Pearson at k = n), radius sigma Phi^-1(pA).
    model = _two_class()
    x = torch.tensor([[50.0, 0.0]])
    r = probust.certify(model, x, 0.5, n0=10, n=2000, alpha=0.001, **SETTINGS)
    assert r.prediction.item() == 0 and r.hits.item() == 2000
    assert r.radius.item() == pytest.approx(0.5 * stats.norm.ppf(0.001 ** (1 / 2000)), rel=1e-12)


class _Slab(nn.Module):
    """Class 0 only where |x_0| < width: the clean prediction at x = 0 is 0, but under noise of
    scale sigma >> width the copies land in class 1 with probability 1 - (2 Phi(width / sigma) - 1)."""

    def __init__(self, width: float) -> None:
        super().__init__()
        self.width = width
        self.anchor = nn.Parameter(torch.zeros(1))  # a parameter, so the model has a device and dtype

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([self.width - x[:, 0].abs(), torch.zeros_like(x[:, 0])], dim=1) + self.anchor


def test_the_smoothed_class_may_differ_from_the_clean_prediction():
    model, sigma = _Slab(0.1), 1.0
    x = torch.zeros(3, 4)
    with torch.no_grad():
        assert model(x).argmax(1).tolist() == [0, 0, 0]
    p_class_1 = 1 - (2 * stats.norm.cdf(0.1 / sigma) - 1)  # 0.920
    r = probust.certify(model, x, sigma, n0=100, n=5000, alpha=0.001, **SETTINGS)
    assert r.prediction.tolist() == [1, 1, 1]
    # the bound is on the probability of the smoothed class (1), and below its exact value
    assert (r.p_lower < p_class_1).all() and (r.p_lower > p_class_1 - 0.03).all()
    assert probust.predict(model, x, sigma, n=2000, **SETTINGS).prediction.tolist() == [1, 1, 1]
    # The analytic estimates are of keeping the clean prediction (class 0), and only estimates:
    # MMSE sees class 0 kept with p well below 1/2 (no radius), while Taylor, linearising at the
    # slab's centre where the gradient is 0, sees no boundary at all (an infinite radius).
    assert (probust.radius_estimate(probust.MMSE(model, sigma, n_samples=64)(x), sigma) == 0).all()
    assert (probust.radius_estimate(probust.Taylor(model, sigma)(x), sigma) == float("inf")).all()


# ---------------------------------------------------------------- sequential CERTIFY


@pytest.mark.parametrize("procedure", ["sequential", "prior"])
def test_sequential_certify_decides_each_radius_and_stops(procedure):
    model, sigma = _two_class(), 0.5
    radii = (0.0, 0.25, 0.5)
    # true radii |x_0|: far beyond every radius, between 0.25 and 0.5, below 0 (class 1), on the fence at 0.25
    x = torch.tensor([[3.0, 0.0], [0.4, 0.0], [-0.1, 0.0], [0.25, 0.0]])
    r = probust.certify(model, x, sigma, n0=100, n=20_000, radii=radii, alpha=0.001, procedure=procedure, **SETTINGS)
    assert r.radii == radii and r.certified is not None and r.certified.shape == (4, 3)
    assert r.certified[0].tolist() == [True, True, True]
    assert r.certified[1].tolist() == [True, True, False]
    assert r.prediction[2].item() == 1 and r.certified[2].tolist() == [True, False, False]
    assert not r.certified[3, 2]
    assert (r.n_drawn <= 100 + 20_000).all()
    if procedure == "prior":
        # the sure point stops at the first looks; the one on the fence is given up (the predictive
        # chance of the last look certifying 0.25 falls below 0.01) before n
        assert r.n_drawn[0] < 2_000 and r.n_drawn[3] < 100 + 20_000
        assert torch.equal(r.radius, torch.tensor([0.5, 0.25, 0.0, 0.0], dtype=torch.float64))
        return
    # the sure point stops at the first looks, the one on the fence draws all n
    assert r.n_drawn[0] < 2_000 and r.n_drawn[3] == 100 + 20_000
    # the radius is the confidence sequence's, at least every radius certified
    assert torch.equal(r.certified, (r.radius[:, None] >= torch.tensor(radii)) & ~r.abstained[:, None])
    torch.testing.assert_close(r.radius, torch.where(r.abstained, 0.0, sigma * torch.special.ndtri(r.p_lower)))
    torch.testing.assert_close(
        r.certified_accuracy(torch.tensor([0, 0, 1, 0])), torch.tensor([1.0, 0.5, 0.25]).double()
    )


def test_sequential_draws_are_the_first_of_the_fixed_draws():
    # The estimation stream is the same: a point that stopped after t draws has the hits of
    # fixed-n CERTIFY run with n = t.
    model, x, sigma = _linear_points()
    seq = probust.certify(model, x, sigma, n0=30, n=3000, radii=[0.0, 0.1], seed=2, **SETTINGS)
    for t in seq.n_drawn.unique().tolist():
        rows = (seq.n_drawn == t).nonzero().flatten()
        fixed = probust.certify(model, x, sigma, n0=30, n=t - 30, seed=2, **SETTINGS).take(rows)
        assert torch.equal(fixed.hits, seq.hits[rows]) and torch.equal(fixed.selected, seq.selected[rows])


def _replay(model, x, sigma, *, n0, n, radii, alpha, futility, seed, procedure, predictive=0.01):
    """Sequential CERTIFY replayed one point at a time: the documented streams and the rules the
    docstrings state, with test_level.py's oracles of the looks, the uniform mixture's evidence and
    the prior's allowances (whose center is Taylor's Phi^-1(p) for the selected class, capped by
    the 0.999 Clopper-Pearson upper bound of its selection votes). Returns, per point, the hits,
    the estimation draws and the radii certified."""
    from tests.smoothing.test_level import _log_evidence, _looks, _prior_allowed

    selection = votes(model, x, sigma, seed, STREAM_CERTIFY_SELECT, n0)
    selected = selection.argmax(1)
    keys = point_keys(seed, torch.arange(len(x)), STREAM_CERTIFY_ESTIMATE)
    eps = probust.Gaussian(sigma).sample(keys, 0, n, x.shape[1:])
    with torch.no_grad():
        kept = (model((x[:, None] + eps).flatten(0, 1)).argmax(1).view(len(x), n).numpy() == selected[:, None]).cumsum(
            1
        )
    p0 = stats.norm.cdf(np.array(radii) / sigma)
    prior = procedure == "prior"
    looks = _looks(n, PRIOR_FIRST_CHECK, PRIOR_GROWTH) if prior else _looks(n)
    if prior:
        p_fail = probust.Taylor(model, sigma, p_fail=True, check_draws=0, seed=seed)(x, torch.from_numpy(selected))
        z = -stats.norm.ppf(p_fail.p_fail.double().numpy())
        k = selection[np.arange(len(x)), selected]
        upper = np.where(k >= n0, 1.0, stats.beta.ppf(0.999, k + 1, np.maximum(n0 - k, 1)))
        centers = np.clip(np.minimum(z, stats.norm.ppf(upper)), -10.0, 40.0)
    at = (math.log(1 / alpha), math.log(1 / futility))
    out = []
    for b in range(len(x)):
        certified, given_up = [False] * len(radii), [False] * len(radii)
        need = [_prior_allowed(q, n, alpha, centers[b]) for q in p0] if prior else []
        for i, t in enumerate(looks):
            s = int(kept[b, t - 1])
            done = [c or g for c, g in zip(certified, given_up, strict=True)]
            for j, q in enumerate(p0):
                below = _log_evidence(np.array([t - s]), t, 1 - q)[0] >= at[1]
                if not prior:
                    certified[j] |= bool(_log_evidence(np.array([s]), t, q)[0] >= at[0])
                    given_up[j] |= bool(below or _log_evidence(np.array([s + n - t]), n, q)[0] < at[0])
                    continue
                if done[j]:
                    continue
                lower_ok, lower_lost = (certified[j - 1], given_up[j - 1]) if j else (True, False)
                if lower_ok and s >= need[j][i]:
                    certified[j] = True
                    continue
                most = max(u - v for u, v in zip(looks[i:], need[j][i:], strict=True))
                hopeless = (
                    t < n and stats.betabinom.cdf(n - need[j][-1] - (t - s), n - t, t - s + 0.5, s + 0.5) < predictive
                )
                given_up[j] = bool(below or t - s > most or hopeless or lower_lost)
            if all(c or g for c, g in zip(certified, given_up, strict=True)):
                break
        out.append((s, t, certified))
    return out


@pytest.mark.parametrize("procedure", ["sequential", "prior"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_sequential_draws_and_verdicts_are_the_stated_rules_replayed_point_by_point(model_name, procedure):
    model, x, sigma = MODELS[model_name]()
    radii = [0.0, 0.05, 0.1, 0.2, 0.4] if model_name == "linear" else [0.0, 0.5, 1.0, 2.0]
    kw = dict(n0=50, n=2000, radii=radii, alpha=0.01, futility=0.01, seed=4)
    r = probust.certify(model, x, sigma, procedure=procedure, **kw, **SETTINGS)
    replayed = _replay(model, x, sigma, procedure=procedure, **kw)
    assert r.hits.tolist() == [s for s, _, _ in replayed]
    assert (r.n_drawn - 50).tolist() == [t for _, t, _ in replayed]
    assert r.certified.tolist() == [c for _, _, c in replayed]
    # The rules are exercised: some radii certified, some given up before n, some points stop early.
    assert r.certified.any() and not r.certified.all() and (r.n_drawn < 50 + 2000).any()


# ---------------------------------------------------------------- batching and random streams


def _calls(model, sigma):
    return {
        "certify": Certify(model, sigma, n0=20, n=300, **SETTINGS),
        "sequential": Certify(model, sigma, n0=20, n=3000, radii=[0.0, 0.1, 0.3], alpha=0.01, **SETTINGS),
        "predict": Predict(model, sigma, n=300, **SETTINGS),
    }


@pytest.mark.parametrize("batch_size", [16, 128])
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("kind", ["certify", "sequential", "predict"])
def test_results_do_not_depend_on_batch_split(kind, model_name, batch_size):
    model, x, sigma = MODELS[model_name]()
    method = _calls(model, sigma)[kind]
    method.batch_size = batch_size
    whole = method(x)
    parts_type = PredictResult if kind == "predict" else CertifyResult
    for k in (2, 4):
        assert_same(whole, parts_type.cat([method(x[:k]), method(x[k:], index_offset=k)]))


@pytest.mark.parametrize("kind", ["certify", "sequential", "predict"])
def test_a_points_result_depends_on_its_index_not_its_row(kind):
    model, x, sigma = _cnn_points()
    method = _calls(model, sigma)[kind]
    whole = method(x)
    for k in (1, 3):
        assert_same(whole.take(torch.arange(k, len(x))), method(x[k:], index_offset=k))


@pytest.mark.parametrize("kind", ["certify", "sequential", "predict"])
def test_the_same_seed_gives_the_same_result_and_another_seed_another(kind):
    model, x, sigma = _cnn_points()
    a = _calls(model, sigma)[kind](x)
    assert_same(a, _calls(model, sigma)[kind](x))
    other = _calls(model, sigma)[kind]
    other.seed = 1
    b = other(x)
    field = "count_top" if kind == "predict" else "hits"
    assert not torch.equal(getattr(a, field), getattr(b, field))


def test_the_model_is_computed_in_eval_mode_and_given_back_in_its_own_modes():
    model, x, sigma = _cnn_points()
    expected = probust.certify(model, x, sigma, n0=20, n=200, **SETTINGS)
    model.train()
    model.head.eval()
    modes = [m.training for m in model.modules()]
    got = probust.certify(model, x, sigma, n0=20, n=200, **SETTINGS)
    assert [m.training for m in model.modules()] == modes
    assert_same(expected, got)


def test_take_and_cat_keep_rows_and_settings():
    model, x, sigma = _linear_points()
    r = probust.certify(model, x, sigma, n0=20, n=500, radii=[0.0, 0.2], **SETTINGS)
    back = CertifyResult.cat([r.take(torch.arange(0, 2)), r.take(torch.arange(2, len(x)))])
    assert_same(r, back)
    assert torch.equal(back.seconds, r.seconds)
    assert len(r) == len(x) and r.take(torch.tensor([3])).certified.shape == (1, 2)
    other = probust.certify(model, x, sigma, n0=20, n=500, radii=[0.0, 0.3], **SETTINGS)
    with pytest.raises(ValueError, match="radii"):
        CertifyResult.cat([r, other])


def test_seconds_apportion_the_wall_time():
    model, x, sigma = _linear_points()
    r = probust.certify(model, x, sigma, n0=20, n=500, **SETTINGS)
    assert r.seconds.dtype == torch.float64 and (r.seconds > 0).all()
    assert torch.equal(r.seconds, r.seconds[:1].expand_as(r.seconds))  # equal draws, equal shares


# ---------------------------------------------------------------- refusals


def test_integer_inputs_are_refused_saying_where_the_noise_enters():
    model = _two_class()
    with pytest.raises(ValueError, match=r"floating point.*added to the inputs in their own units.*x.float\(\) / 255"):
        probust.certify(model, torch.zeros(2, 2, dtype=torch.uint8), 0.5, n=10)
    with pytest.raises(ValueError, match="floating point"):
        probust.predict(model, torch.zeros(2, 2, dtype=torch.int64), 0.5, n=10)


@pytest.mark.parametrize(
    ("sigma", "message"),
    [
        (probust.Uniform(0.5), "Uniform noise"),
        (probust.Laplace(0.5), "Laplace noise"),
        (probust.Gaussian(torch.tensor([0.5, 0.2])), "isotropic"),
        (probust.Gaussian(cov=torch.eye(2)), "isotropic"),
        (torch.tensor([0.5, 0.5]), "one number"),
        (0.0, "sigma"),
        (-1.0, "sigma"),
        (True, "sigma"),
        (None, "sigma"),
    ],
)
def test_noise_other_than_isotropic_gaussian_is_refused(sigma, message):
    with pytest.raises(ValueError, match=message):
        Certify(_two_class(), sigma)
    with pytest.raises(ValueError, match=message):
        Predict(_two_class(), sigma)


def test_an_isotropic_gaussian_is_accepted():
    assert Certify(_two_class(), probust.Gaussian(0.3)).sigma == 0.3
    assert Certify(_two_class(), torch.tensor(0.3)).sigma == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(n0=0), "n0"),
        (dict(n=0), "n"),
        (dict(n=2.5), "n"),
        (dict(alpha=0.0), "alpha"),
        (dict(alpha=1.0), "alpha"),
        (dict(radii=[]), "radii"),
        (dict(radii=[0.1, -0.2]), "radii"),
        (dict(radii=[float("nan")]), "radii"),
        (dict(radii=0.5), "radii"),
        (dict(futility=0.0), "futility"),
        (dict(procedure="bayes", radii=[0.1]), "procedure"),
        (dict(procedure="prior"), "procedure"),
        (dict(procedure="sequential"), "procedure"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_a_bad_argument_fails_before_any_work_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Certify(_two_class(), 0.5, **kwargs)


def test_bad_call_arguments_fail_naming_them():
    certify = Certify(_two_class(), 0.5, n0=5, n=10)
    with pytest.raises(ValueError, match="index_offset"):
        certify(torch.zeros(2, 2), index_offset=-1)
    with pytest.raises(ValueError, match="NaN or inf"):
        certify(torch.full((2, 2), float("nan")))
    r = certify(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="labels"):
        r.certified_accuracy(torch.zeros(3, dtype=torch.int64), [0.0])
    with pytest.raises(ValueError, match="radii is required"):
        r.certified_accuracy(torch.zeros(2, dtype=torch.int64))


def test_nan_logits_on_noisy_copies_are_refused():
    model = NonFiniteAbove(_two_class(), threshold=1.0, value=float("nan"))
    with pytest.raises(ValueError, match="NaN or inf logits on noisy copies"):
        probust.certify(model, torch.zeros(2, 2), 1.0, n0=20, n=200, **SETTINGS)


def test_fixed_procedure_with_radii_reads_the_clopper_pearson_bound_at_each_radius():
    model, sigma = _two_class(), 0.5
    x = torch.tensor([[0.6, 0.0], [0.2, 0.0], [-0.3, 0.0]])
    radii = (0.0, 0.25, 0.5)
    r = probust.certify(model, x, sigma, n0=50, n=2000, radii=radii, procedure="fixed", **SETTINGS)
    plain = probust.certify(model, x, sigma, n0=50, n=2000, **SETTINGS)
    assert torch.equal(r.p_lower, plain.p_lower) and torch.equal(r.n_drawn, plain.n_drawn)
    thresholds = torch.tensor([stats.norm.cdf(v / sigma) for v in radii], dtype=torch.float64)
    assert torch.equal(r.certified, r.p_lower[:, None] >= thresholds)


def test_prior_procedure_reports_the_largest_certified_radius():
    # The analytic-prior test (the default with radii) decides only the thresholds: p_lower is the
    # largest certified Phi(r / sigma), the radius the largest certified r, and the radii are
    # certified in increasing order; a point with none abstains.
    model, sigma = _two_class(), 0.5
    x = torch.tensor([[3.0, 0.0], [0.2, 0.0], [0.0, 0.0]])  # the last on the boundary: p = 1/2
    radii = (0.0, 0.25, 0.5)
    r = probust.certify(model, x, sigma, n0=50, n=4000, radii=radii, **SETTINGS)
    assert r.certified is not None
    c = r.certified
    assert torch.equal(c, c.cummin(dim=1).values)  # a prefix of the radii
    largest = torch.where(c, torch.tensor(radii, dtype=torch.float64), -1.0).amax(dim=1)
    assert torch.equal(r.radius, torch.where(c.any(dim=1), largest, 0.0))
    thresholds = torch.tensor([stats.norm.cdf(v / sigma) for v in radii], dtype=torch.float64)
    assert torch.allclose(r.p_lower, torch.where(c, thresholds, 0.0).amax(dim=1))
    assert torch.equal(r.abstained, ~c.any(dim=1))
    assert c[0].all() and not c[2].any()
