"""probust.metrics' torchmetrics metrics against independent computations: one probust call on the
concatenated points (probust.estimate / probust.certify), numpy's quantiles and group means."""

from __future__ import annotations

import math
import os
import socket

import numpy as np
import pytest
import torch
from torch import nn

import probust
from probust.errors import OptionError
from probust.estimators import LinearisationWarning, untrusted
from probust.metrics import RANK_STRIDE, AverageCaseRobustness, CertifiedAccuracy, points

SIGMA = 0.3
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def small_cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10), nn.Dropout(0.1)
    )


def data(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def oracle(p: np.ndarray, label: np.ndarray, target: np.ndarray, classes: int, threshold: float = 0.5) -> dict:
    """The summary computed with numpy from per-point p."""

    def means(groups: np.ndarray) -> np.ndarray:
        return np.array([p[groups == c].mean() if (groups == c).any() else np.nan for c in range(classes)])

    return {
        "mean": p.mean(),
        "quantiles": np.quantile(p, QUANTILES),
        "below_threshold": (p < threshold).mean(),
        "count": float(p.size),
        "class_mean_by_label": means(label),
        "class_mean_by_target": means(target),
    }


# A batch split changes a point's noise nowhere, but the network's float32 arithmetic on a pass of
# another size may differ in the last bits (tests/estimators/test_contract.py: up to 2e-7 on p).
ROUNDING = 1e-6


def assert_matches(values: dict[str, torch.Tensor], expected: dict, atol: float = ROUNDING) -> None:
    # The trust check's share is compared where the oracle was given the flags.
    assert set(values) - ({"untrusted"} - set(expected)) == set(expected)
    for key, want in expected.items():
        np.testing.assert_allclose(values[key].cpu().numpy(), want, rtol=0, atol=atol, err_msg=key)


def test_metric_equals_one_probust_call_on_the_concatenated_points():
    model, (x, y) = small_cnn(), data(50)
    metric = AverageCaseRobustness(model, SIGMA, n_samples=5, num_classes=10)
    for lo, hi in ((0, 7), (7, 30), (30, 31), (31, 50)):  # uneven batches
        metric.update(x[lo:hi], labels=y[lo:hi])
    reference = probust.make_estimator("mmse", model, SIGMA, n_samples=5)(x)
    p = reference.p.numpy()
    assert p.std() > 0.01  # the summary is not trivially constant
    expected = oracle(p, y.numpy(), reference.target.numpy(), 10)
    expected["untrusted"] = untrusted(reference).double().mean().item()
    assert_matches(metric.compute(), expected)


def test_values_do_not_depend_on_batching():
    model, (x, y) = small_cnn(), data(24)
    one, many = (AverageCaseRobustness(model, SIGMA, "taylor") for _ in range(2))
    one.update(x, labels=y)
    for i in range(0, 24, 5):
        many.update(x[i : i + 5], labels=y[i : i + 5])
    a, b = one.compute(), many.compute()
    for key in a:
        torch.testing.assert_close(a[key], b[key], equal_nan=True, rtol=0, atol=ROUNDING)


def test_given_target_is_the_class_measured():
    model, (x, y) = small_cnn(), data(20)
    metric = AverageCaseRobustness(model, SIGMA, n_samples=3)
    metric.update(x, target=y)  # the labels' survival, not the prediction's
    expected = probust.estimate(model, x, SIGMA, "mmse", n_samples=3, target=y)
    np.testing.assert_allclose(metric.compute()["mean"].item(), expected.mean().item(), rtol=0, atol=ROUNDING)
    assert metric.compute()["class_mean_by_label"].isnan().all()  # no labels given
    by_target = metric.compute()["class_mean_by_target"].numpy()
    want = [expected[y == c].mean().item() if (y == c).any() else np.nan for c in range(by_target.size)]
    np.testing.assert_allclose(by_target, want, rtol=0, atol=ROUNDING)


def test_reset_restarts_the_point_indices():
    model, (x, _) = small_cnn(), data(16)
    metric = AverageCaseRobustness(model, SIGMA, n_samples=4)
    metric.update(x[:8])
    metric.update(x[8:])
    first = metric.compute()
    metric.reset()
    assert metric.points_seen == 0 and metric.p == []
    metric.update(x)
    again = metric.compute()
    for key in first:
        torch.testing.assert_close(first[key], again[key], equal_nan=True, rtol=0, atol=0)


def test_forward_gives_the_batch_and_keeps_counting():
    model, (x, _) = small_cnn(), data(20)
    metric = AverageCaseRobustness(model, SIGMA, n_samples=4)
    metric(x[:12])
    batch = metric(x[12:])
    second = probust.estimate(model, x[12:], SIGMA, "mmse", n_samples=4, index_offset=12)
    np.testing.assert_allclose(batch["mean"].item(), second.mean().item(), rtol=0, atol=ROUNDING)
    whole = probust.estimate(model, x, SIGMA, "mmse", n_samples=4)
    np.testing.assert_allclose(metric.compute()["mean"].item(), whole.mean().item(), rtol=0, atol=ROUNDING)
    assert metric.compute()["count"].item() == 20


def test_max_points_measures_the_first_points_only():
    model, (x, y) = small_cnn(), data(30)
    metric = AverageCaseRobustness(model, SIGMA, "taylor", max_points=13)
    for i in range(0, 30, 10):
        metric.update(x[i : i + 10], labels=y[i : i + 10])
    assert metric.full and metric.points_seen == 13
    expected = probust.estimate(model, x[:13], SIGMA, "taylor")
    values = metric.compute()
    assert values["count"].item() == 13
    np.testing.assert_allclose(
        values["quantiles"].numpy(), np.quantile(expected.numpy(), QUANTILES), rtol=0, atol=ROUNDING
    )


def test_model_mode_restored_and_no_gradient_leaks_even_under_inference_mode():
    model, (x, y) = small_cnn(), data(10)
    model.train()
    metric = AverageCaseRobustness(model, SIGMA, n_samples=3)
    with torch.inference_mode():  # as in Lightning's validation loop
        metric.update(x.clone(), labels=y)
    assert model.training and all(m.training for m in model.modules())
    assert all(param.grad is None for param in model.parameters())
    assert not metric.p[0].requires_grad
    model.eval()
    expected = probust.estimate(model, x, SIGMA, "mmse", n_samples=3)
    np.testing.assert_allclose(metric.compute()["mean"].item(), expected.mean().item(), rtol=0, atol=ROUNDING)


def test_model_is_not_part_of_the_metric_state():
    metric = AverageCaseRobustness(small_cnn(), SIGMA)
    assert list(metric.parameters()) == [] and list(metric.state_dict()) == []


def test_no_points_gives_nan_and_count_zero():
    metric = AverageCaseRobustness(small_cnn(), SIGMA, num_classes=3)
    with pytest.warns(UserWarning, match="compute"):  # torchmetrics warns before any update
        values = metric.compute()
    assert values["count"].item() == 0 and math.isnan(values["mean"].item())
    assert values["quantiles"].isnan().all() and values["class_mean_by_label"].shape == (3,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"threshold": 1.5}, "threshold"),
        ({"quantiles": (0.5, 2.0)}, "quantiles"),
        ({"max_points": 0}, "max_points"),
        ({"num_classes": 0}, "num_classes"),
        ({"n_samples": 0}, "n_samples"),
    ],
)
def test_bad_options_name_the_argument(kwargs, field):
    with pytest.raises(OptionError) as info:
        AverageCaseRobustness(small_cnn(), SIGMA, **kwargs)
    assert info.value.field == field


def test_bad_labels_name_the_argument():
    metric = AverageCaseRobustness(small_cnn(), SIGMA)
    x, y = data(4)
    with pytest.raises(OptionError) as info:
        metric.update(x, labels=y[:3])
    assert info.value.field == "labels"


def test_merged_states_equal_one_metric_over_both_ranks(monkeypatch):
    # torchmetrics' own reduction (merge_state uses the states' dist_reduce_fx, as a DDP sync does);
    # the second metric plays rank 1: its points are numbered from RANK_STRIDE.
    model, (x, y) = small_cnn(), data(30)
    rank0 = AverageCaseRobustness(model, SIGMA, n_samples=4, num_classes=10)
    rank0.update(x[:17], labels=y[:17])
    monkeypatch.setattr(points, "process_rank", lambda: 1)
    rank1 = AverageCaseRobustness(model, SIGMA, n_samples=4, num_classes=10)
    rank1.update(x[17:], labels=y[17:])
    rank0.merge_state(rank1)
    est = probust.make_estimator("mmse", model, SIGMA, n_samples=4)
    first, second = est(x[:17]), est(x[17:], index_offset=RANK_STRIDE)
    p = torch.cat([first.p, second.p]).numpy()
    target = torch.cat([first.target, second.target]).numpy()
    assert_matches(rank0.compute(), oracle(p, y.numpy(), target, 10))


def _ddp_worker(rank: int, port: int, x: torch.Tensor, y: torch.Tensor, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        metric = AverageCaseRobustness(small_cnn(), SIGMA, n_samples=4, num_classes=10)
        half = slice(0, 11) if rank == 0 else slice(11, None)  # ranks with different counts
        metric.update(x[half], labels=y[half])
        # plain floats: a tensor sent through the queue would be shared memory the exiting child frees
        queue.put((rank, {k: v.tolist() for k, v in metric.compute().items()}))
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_real_two_process_gloo_group_syncs_to_the_whole():
    import torch.multiprocessing as mp

    (x, y), model = data(25), small_cnn()
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    procs = [context.Process(target=_ddp_worker, args=(r, port, x, y, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=240) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    est = probust.make_estimator("mmse", model, SIGMA, n_samples=4)
    first, second = est(x[:11]), est(x[11:], index_offset=RANK_STRIDE)
    p = torch.cat([first.p, second.p]).numpy()
    target = torch.cat([first.target, second.target]).numpy()
    expected = oracle(p, y.numpy(), target, 10)
    for rank in (0, 1):
        assert_matches({k: torch.tensor(v) for k, v in results[rank].items()}, expected)


def test_certified_accuracy_equals_certify_on_the_concatenated_points():
    model, (x, y) = small_cnn(), data(12)
    model.eval()
    with torch.no_grad():
        y = model(x).argmax(1)  # labels the model gets right, so some points certify
    y[:3] = (y[:3] + 1) % 10  # and some it gets wrong
    radii = (0.0, 0.1, 0.3)
    metric = CertifiedAccuracy(model, 0.1, radii, n0=20, n=200)
    metric.update(x[:5], y[:5])
    metric.update(x[5:], y[5:])
    result = probust.certify(model, x, 0.1, n0=20, n=200, radii=radii)
    values = metric.compute()
    expected = result.certified_accuracy(y).numpy()
    assert 0 < expected[0] < 1
    np.testing.assert_allclose(values["certified_accuracy"].numpy(), expected, rtol=0, atol=ROUNDING)
    assert values["abstained"].item() == pytest.approx(result.abstained.double().mean().item())
    assert values["count"].item() == 12
    assert set(metric.loggable()) == {
        "certified_accuracy/r0",
        "certified_accuracy/r0.1",
        "certified_accuracy/r0.3",
        "certified_accuracy/abstained",
    }


def test_one_radius_and_one_quantile_are_logged_although_torchmetrics_squeezes_them():
    # compute() of a one-element state comes back 0-d from torchmetrics: loggable() still names it.
    model, (x, y) = small_cnn(), data(6)
    certified = CertifiedAccuracy(model, 0.1, (0.1,), n0=20, n=100)
    certified.update(x, y)
    result = probust.certify(model, x, 0.1, n0=20, n=100, radii=(0.1,))
    logged = certified.loggable()
    assert set(logged) == {"certified_accuracy/r0.1", "certified_accuracy/abstained"}
    assert logged["certified_accuracy/r0.1"].item() == pytest.approx(result.certified_accuracy(y).item())
    robustness = AverageCaseRobustness(model, 0.1, method="taylor", quantiles=(0.5,))
    robustness.update(x)
    median = np.quantile(probust.estimate(model, x, 0.1, "taylor").numpy(), 0.5)
    assert robustness.loggable()["p_robust/q50"].item() == pytest.approx(median, abs=ROUNDING)


def test_certified_accuracy_needs_radii():
    with pytest.raises(OptionError) as info:
        CertifiedAccuracy(small_cnn(), 0.1, None)  # type: ignore[arg-type]
    assert info.value.field == "radii"


class _Quadratic(nn.Module):
    """Two classes with margin c + x_0 - k ||x||^2: Taylor at 0 says p = Phi(c) but the model
    almost always fails under unit noise in 50 dimensions (the trust check's bad case)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = 1.0 + x[:, 0] - 0.05 * (x * x).sum(dim=1)
        return torch.stack([g + 5, torch.full_like(g, 5.0)], dim=1)


def test_untrusted_share_is_the_flagged_points_with_one_warning_per_compute_not_per_batch():
    import warnings

    model, x = _Quadratic(), torch.zeros(12, 50)
    x[6:, 0] = 30.0  # where the other class wins by far: the check passes, so the share is between 0 and 1
    metric = AverageCaseRobustness(model, 1.0, method="taylor", prune="off")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in range(0, 12, 4):
            metric.update(x[start : start + 4])
        assert not [w for w in caught if issubclass(w.category, LinearisationWarning)]  # none per batch
        values = metric.compute()
        flags = untrusted(probust.Taylor(model, 1.0, prune="off")(x))  # the oracle: one call on every point
    assert values["untrusted"].item() == pytest.approx(flags.double().mean().item())
    assert 0 < flags.sum() < 12
    found = [w for w in caught if issubclass(w.category, LinearisationWarning) and "metric" in str(w.message)]
    assert len(found) == 1 and f"at {int(flags.sum())} of 12 points" in str(found[0].message)
    assert metric.loggable(values)["p_robust/untrusted"] == values["untrusted"]
    # Monte Carlo has no linearisation to check: no share, no key.
    mc = AverageCaseRobustness(small_cnn(), 0.1, method="mc", n_samples=16)
    mc.update(data(3)[0])
    assert math.isnan(mc.compute()["untrusted"].item()) and "p_robust/untrusted" not in mc.loggable()
