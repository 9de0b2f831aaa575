"""probust.find_issues: each documented column against an independent oracle (closed forms for a
linear model, where Taylor's p is exact), the fold bookkeeping, resumption and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

import probust
from probust.issues import IN_SAMPLE, find_issues, train_folds
from probust.issues.counting import estimated_issues, flag
from probust.run import ConfigError, ConfigMismatchError

SIGMA = 0.3


def _two_class(weight: float = 1.0) -> nn.Module:
    """Logits (0, w * (x_0 - 0.5)): class 1 where x_0 > 0.5."""
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
        model.weight[1, 0] = weight
        model.bias[1] = -0.5 * weight
    return model.eval()


def _points(n: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 4, generator=torch.Generator().manual_seed(seed))


def _exact_p(x: torch.Tensor, target: torch.Tensor, weight: float = 1.0) -> np.ndarray:
    """P[argmax f(x + eps) = target] for :func:`_two_class`: the margin of class 1 over 0 is
    w (x_0 - 0.5) + w eps_0, so P[class 1] = Phi((x_0 - 0.5) / sigma)."""
    p1 = norm.cdf((x[:, 0].double().numpy() - 0.5) / SIGMA)
    return np.where(target.numpy() == 1, p1, 1 - p1)


def test_p_label_and_p_robust_are_the_exact_probabilities_of_a_linear_model():
    x = _points()
    labels = (x[:, 0] > 0.5).long()
    labels[:5] = 1 - labels[:5]  # five wrong labels
    df = find_issues(_two_class(), (x, labels), sigma=SIGMA, show_progress=False)
    prediction = (x[:, 0] > 0.5).long()
    np.testing.assert_allclose(df["p_label"], _exact_p(x, labels), atol=1e-6)
    np.testing.assert_allclose(df["p_robust"], _exact_p(x, prediction), atol=1e-6)
    assert (df["prediction"].to_numpy() == prediction.numpy()).all()
    logits = _two_class()(x).detach().double()
    np.testing.assert_allclose(df["self_confidence"], torch.softmax(logits, 1)[torch.arange(40), labels], rtol=1e-6)
    np.testing.assert_allclose(df["label_score"], df["p_label"])
    np.testing.assert_allclose(df["outlier_score"], 1 - df["p_robust"])
    assert (df["sigma"] == SIGMA).all() and (df["fold"] == IN_SAMPLE).all()
    assert list(df["index"]) == list(range(40))


def _blobs(n_per: int = 60, seed: int = 0):
    """Three well-separated Gaussian classes in 8 dimensions and the linear model that separates them."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.eye(3, 8) * 3.0
    y = torch.arange(3).repeat_interleave(n_per)
    x = centres[y] + 0.5 * torch.randn(len(y), 8, generator=g)
    model = nn.Linear(8, 3)
    with torch.no_grad():
        model.weight.copy_(centres)
        model.bias.copy_(-0.5 * (centres**2).sum(1))
    return x, y, model.eval()


def test_planted_label_errors_are_flagged_and_ranked_first_and_clean_points_are_not():
    x, y, model = _blobs()
    noisy = y.clone()
    planted = torch.tensor([3, 70, 150, 151])
    noisy[planted] = (y[planted] + 1) % 3
    df = find_issues(model, (x, noisy), sigma=0.5, show_progress=False)
    lowest = set(df.sort_values("label_score").head(len(planted))["index"])
    assert lowest == set(planted.tolist())
    assert df.loc[planted.numpy(), "is_label_issue"].all()
    assert df["is_label_issue"].sum() == len(planted)  # the confident joint counts exactly these
    # A clean point at its class centre: its label survives the noise.
    centre = int(((x - torch.eye(3, 8)[y] * 3.0).norm(dim=1)).argmin())
    assert not df.loc[centre, "is_label_issue"] and df.loc[centre, "label_score"] > 0.99


def test_each_fold_scores_the_points_it_held_out_with_its_own_model():
    x = _points(30)
    labels = (x[:, 0] > 0.5).long()
    held_a, held_b = torch.arange(0, 30, 2), torch.arange(1, 30, 2)  # not consecutive: per-point indices
    # The two folds' models differ by their scale, so each row shows which model scored it.
    folds = [(_two_class(1.0), held_a), (_two_class(4.0), held_b.numpy())]
    df = find_issues(None, (x, labels), folds=folds, sigma=SIGMA, show_progress=False)
    assert (df.loc[held_a.numpy(), "fold"] == 0).all() and (df.loc[held_b.numpy(), "fold"] == 1).all()
    # Taylor's p of a linear model does not depend on its scale: both equal the closed form ...
    np.testing.assert_allclose(df["p_label"], _exact_p(x, labels), atol=1e-6)
    # ... but the clean softmax does: each row's is its own fold model's.
    for model, held in folds:
        held = torch.as_tensor(held)
        expected = torch.softmax(model(x[held]).detach().double(), 1)[torch.arange(len(held)), labels[held]]
        np.testing.assert_allclose(df.loc[held.numpy(), "self_confidence"], expected, rtol=1e-6)


def test_points_no_fold_holds_out_are_scored_in_sample_by_model():
    x = _points(20)
    labels = (x[:, 0] > 0.5).long()
    df = find_issues(_two_class(), (x, labels), folds=[(_two_class(2.0), [0, 1, 2])], sigma=SIGMA, show_progress=False)
    assert list(df["fold"][:4]) == [0, 0, 0, IN_SAMPLE] and (df["fold"][3:] == IN_SAMPLE).all()


def test_a_boolean_mask_is_a_fold():
    x = _points(10)
    labels = (x[:, 0] > 0.5).long()
    mask = torch.zeros(10, dtype=torch.bool)
    mask[::3] = True
    df = find_issues(_two_class(), (x, labels), folds=[(_two_class(), mask)], sigma=SIGMA, show_progress=False)
    assert list(np.flatnonzero(df["fold"] == 0)) == [0, 3, 6, 9]


@pytest.mark.parametrize(
    ("folds", "words"),
    [
        ([(_two_class(), [0, 1, 2]), (_two_class(), [2, 3])], "both hold out point 2"),
        ([(_two_class(), [0, 1])], "held out by no fold"),
        ([(_two_class(), [0, 10])], "10 is not an index"),
        ([(_two_class(), [1, 1])], "appears twice"),
        ([(_two_class(), [])], "empty"),
        ([(_two_class(), [0.5])], "integer indices"),
        ([_two_class()], "expected a pair"),
    ],
)
def test_bad_folds_are_refused_with_the_reason(folds, words):
    x = _points(10)
    with pytest.raises(ConfigError, match=words) as caught:
        find_issues(None, (x, (x[:, 0] > 0.5).long()), folds=folds, sigma=SIGMA, show_progress=False)
    assert caught.value.field == "folds"


def test_labels_outside_the_models_classes_are_refused():
    x = _points(10)
    labels = torch.zeros(10, dtype=torch.long)
    labels[7] = 2
    with pytest.raises(ConfigError, match=r"label 2 of point 7 is not a class of the model's 2 outputs") as caught:
        find_issues(_two_class(), (x, labels), sigma=SIGMA, show_progress=False)
    assert caught.value.field == "data"


def test_points_without_labels_and_a_model_without_logits_are_refused():
    x = _points(10)
    with pytest.raises(ConfigError, match="no labels"):
        find_issues(_two_class(), x, sigma=SIGMA, show_progress=False)
    probabilities = nn.Sequential(_two_class(), nn.Softmax(dim=1))
    with pytest.raises(probust.errors.ProbustError, match="probabilit"):
        find_issues(probabilities, (x, torch.zeros(10, dtype=torch.long)), sigma=SIGMA, show_progress=False)
    with pytest.raises(ConfigError, match="give a model"):
        find_issues(None, (x, torch.zeros(10, dtype=torch.long)), sigma=SIGMA, show_progress=False)


def test_a_dataloader_and_a_dataset_give_the_rows_of_the_tensors():
    x, y, model = _blobs(20)
    ds = torch.utils.data.TensorDataset(x, y)
    by_tensors = find_issues(model, (x, y), sigma=0.5, show_progress=False)
    for data in (ds, torch.utils.data.DataLoader(ds, batch_size=7)):
        other = find_issues(model, data, sigma=0.5, show_progress=False)
        np.testing.assert_array_equal(other["label_score"], by_tensors["label_score"])


def test_an_interrupted_call_resumes_from_its_folder_and_another_call_is_refused(tmp_path, monkeypatch):
    x, y, model = _blobs(800)  # 2,400 points: two chunks
    first = find_issues(model, (x, y), sigma=0.5, out=tmp_path, show_progress=False)
    assert len(list(tmp_path.glob("part*.npz"))) == 2
    from probust.issues import find as find_module

    def no_more_work(*args, **kwargs):
        raise AssertionError("a stored chunk was computed again")

    monkeypatch.setattr(find_module, "_chunk", no_more_work)
    again = find_issues(model, (x, y), sigma=0.5, out=tmp_path, show_progress=False)
    np.testing.assert_array_equal(again["label_score"], first["label_score"])
    with pytest.raises(ConfigMismatchError, match="sigma"):
        find_issues(model, (x, y), sigma=0.4, out=tmp_path, show_progress=False)
    monkeypatch.undo()
    moved = x.clone()
    moved[2100] += 10.0  # a point of the second chunk: that chunk is computed again, the first is not
    calls = []
    real = find_module._chunk
    monkeypatch.setattr(find_module, "_chunk", lambda *args: calls.append(len(args[1])) or real(*args))
    changed = find_issues(model, (moved, y), sigma=0.5, out=tmp_path, show_progress=False)
    assert calls == [352]  # 2,400 points: chunks of 2,048 and 352
    expected = find_issues(model, (moved, y), sigma=0.5, show_progress=False)
    np.testing.assert_array_equal(changed["label_score"], expected["label_score"])


def test_the_default_sigma_is_the_inputs_rms_spread():
    x = _points(200)
    df = find_issues(_two_class(), (x, (x[:, 0] > 0.5).long()), show_progress=False)
    expected = float(x.double().var(0, unbiased=False).mean().sqrt())
    assert df["sigma"].iloc[0] == pytest.approx(expected)


def test_the_confident_joint_counts_and_prunes_by_class():
    # Class 0's threshold is 0.8 (mean p_0 over points labelled 0), class 1's 0.7.
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.4, 0.6]])
    labels = np.array([0, 0, 0, 1, 1])
    # Point 2 (labelled 0) is confidently neither; point 4 (labelled 1) reaches class 0? 0.4 < 0.8: no;
    # class 1 threshold (0.8 + 0.6) / 2 = 0.7: point 4's 0.6 misses it too. No label errors.
    assert list(estimated_issues(labels, probs)) == [0, 0]
    probs[4] = [0.85, 0.15]  # now confidently class 0 while labelled 1
    assert list(estimated_issues(labels, probs)) == [0, 1]
    flags = flag(labels, np.array([0.5, 0.5, 0.1, 0.9, 0.2]), np.array([0, 1]))
    assert list(flags) == [False, False, False, False, True]


def test_train_folds_cuts_disjoint_folds_covering_every_point_and_is_seeded():
    x, y, _ = _blobs(10)
    factory = lambda: nn.Linear(8, 3)
    folds = train_folds(factory, x, y, k=4, epochs=2, seed=3, show_progress=False)
    held = np.concatenate([h for _, h in folds])
    assert sorted(held.tolist()) == list(range(30)) and {len(h) for _, h in folds} <= {7, 8}
    again = train_folds(factory, x, y, k=4, epochs=2, seed=3, show_progress=False)
    for (m1, h1), (m2, h2) in zip(folds, again):
        np.testing.assert_array_equal(h1, h2)
        assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    df = find_issues(None, (x, y), folds=folds, sigma=0.5, show_progress=False)
    assert sorted(df["fold"].unique().tolist()) == [0, 1, 2, 3]


@pytest.mark.filterwarnings("ignore::probust.LinearisationWarning")
@pytest.mark.parametrize("method", ["mc", "mmse"])
def test_an_estimator_given_indices_matches_each_row_at_its_own_offset(method):
    # Monte Carlo's draws and MMSE's copies come from each point's own stream: the index matters.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 6)).eval()
    x = 0.1 * torch.randn(15, 8)
    samples = 64 if method == "mc" else 5
    estimator = probust.make_estimator(
        method, model, 1.0, n_samples=samples, execution=probust.Execution(show_progress=False)
    )
    index = torch.tensor([40, 3, 17, 8, 99, 0, 12, 5, 60, 61, 62, 63, 64, 65, 66])
    together = estimator(x, indices=index).p
    alone = torch.cat([estimator(x[i : i + 1], index_offset=int(index[i])).p for i in range(len(x))])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-9)
    assert not torch.equal(estimator(x, indices=index + 1000).p, together)  # another index, another stream
    with pytest.raises(probust.errors.OptionError, match="distinct"):
        estimator(x[:2], indices=torch.tensor([1, 1]))
    with pytest.raises(probust.errors.OptionError, match="not both"):
        estimator(x[:2], indices=torch.tensor([1, 2]), index_offset=3)
