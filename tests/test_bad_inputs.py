"""The bad-input table (docs/design.md: a user's data and model are read and checked in one place,
probust._inputs): every entry point x every bad input either raises a ProbustError naming the
argument and its fix, or, for an input it accepts, gives the numbers of the canonical form."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import probust
from probust.errors import ProbustError

pytest.importorskip("pandas")


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))


MODEL = _net()
X = torch.rand(24, 1, 8, 8, generator=torch.Generator().manual_seed(1))
Y = torch.arange(24) % 10


class Dicts(Dataset):
    def __init__(self, x_key: str = "image", y_key: str = "label") -> None:
        self.keys = (x_key, y_key)

    def __len__(self) -> int:
        return len(X)

    def __getitem__(self, i: int) -> dict:
        return {self.keys[0]: X[i], self.keys[1]: int(Y[i])}


def _nan(x):
    x = x.clone()
    x[3, 0, 2, 2] = float("nan")
    return x


def _inf(x):
    x = x.clone()
    x[5, 0, 1, 1] = float("inf")
    return x


def _label(value):
    y = Y.clone()
    y[3] = value
    return y


#: bad input -> (data, the field named, words of the fix); data is (x, labels) or a data set.
REFUSED = {
    "uint8": (((X * 255).to(torch.uint8), Y), "x.float() / 255"),
    "nan": ((_nan(X), Y), "NaN or inf"),
    "inf": ((_inf(X), Y), "NaN or inf"),
    "label 10": ((X, _label(10)), "label 10 of point 3"),
    "label -1": ((X, _label(-1)), "label -1 of point 3"),
    "float labels": ((X, Y.float()), "labels.long()"),
    "labels of another length": ((X, Y[:-1]), "one label per point"),
    "2-D labels": ((X, Y[:, None]), "labels.squeeze(1)"),
    "dict items with other keys": (Dicts("pic", "cls"), "keys="),
    "no channel dimension": ((X[:, 0], Y), "x.unsqueeze(1)"),
    "shuffled loader": (DataLoader(TensorDataset(X, Y), batch_size=4, shuffle=True), "shuffle=False"),
}
#: Entry points taking points without labels take the rows of these.
UNLABELLED = {"uint8", "nan", "inf", "no channel dimension"}


def _find_issues(data, **kw):
    return probust.find_issues(MODEL, data, sigma=kw.pop("sigma", 0.1), show_progress=False, **kw)


def _score(data, **kw):
    return probust.score(MODEL, data, kw.pop("sigma", 0.1), ["taylor"], show_progress=False, **kw)


def _certify(data, **kw):
    return probust.certify(MODEL, data[0], kw.pop("sigma", 0.1), n0=10, n=50, **kw)


def _taylor(data, **kw):
    return probust.Taylor(MODEL, kw.pop("sigma", 0.1))(data[0])


def _track(data, **kw):
    tracker = probust.issues.Tracker(data, sigma=kw.pop("sigma", 0.1), **kw)
    tracker.update(MODEL)
    return tracker.find_issues()


def _train(data, **kw):
    x, y = data
    classes = [str(c) for c in range(10)]
    return probust.training.train(
        probust.data.TensorDataset(x, y, name="t", classes=classes), "cnn", epochs=1, show_progress=False
    )


LABELLED = {"find_issues": _find_issues, "score": _score, "Tracker": _track}
POINTS = {"certify": _certify, "Taylor": _taylor}
#: Entry points taking a data set object (not a loader or dict items): train, on tensors.
TENSORS_ONLY = {"train": _train}
NOT_TENSORS = {"dict items with other keys", "shuffled loader", "no channel dimension"}


def _cases():
    for bad, (data, fix) in REFUSED.items():
        for name, call in LABELLED.items():
            yield pytest.param(call, data, fix, id=f"{name}-{bad}")
        if bad not in NOT_TENSORS:
            for name, call in TENSORS_ONLY.items():
                yield pytest.param(call, data, fix, id=f"{name}-{bad}")
        if bad in UNLABELLED:
            for name, call in POINTS.items():
                yield pytest.param(call, data, fix, id=f"{name}-{bad}")


@pytest.mark.parametrize(("call", "data", "fix"), list(_cases()))
def test_a_bad_input_is_refused_naming_the_argument_and_its_fix(call, data, fix):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ProbustError) as info:
            call(data)
    assert info.value.field in {"data", "x", "keys", "dataset"}, info.value
    assert fix in str(info.value)


def _certified(labels):
    return probust.certify(MODEL, X, 0.1, n0=10, n=50).certified_accuracy(labels, radii=[0.0])


def _certified_metric(labels):
    from probust.metrics import CertifiedAccuracy

    CertifiedAccuracy(MODEL, 0.1, radii=[0.0], n0=10, n=50).update(X, labels)


def _robustness_metric(labels):
    from probust.metrics import AverageCaseRobustness

    AverageCaseRobustness(MODEL, 0.1, method="taylor").update(X, target=labels)


def _target(labels):
    return probust.Taylor(MODEL, 0.1)(X, labels)


#: Every entry point taking labels (or a target class) apart from data, x each bad label of REFUSED.
LABELS = {"certify": _certified, "CertifiedAccuracy": _certified_metric, "AverageCaseRobustness": _robustness_metric}
LABELS["Taylor target"] = _target


@pytest.mark.parametrize("bad", [b for b in REFUSED if "label" in b])
@pytest.mark.parametrize("call", list(LABELS.values()), ids=list(LABELS))
def test_bad_labels_are_refused_by_every_entry_point_taking_them(call, bad):
    (_, labels), fix = REFUSED[bad]
    if call is _certified and bad == "label 10":
        fix = "of the model's 10 outputs"  # CertifyResult knows C
    with pytest.raises(ProbustError) as info:
        call(labels)
    assert info.value.field in {"labels", "target"}, info.value
    assert fix.split(" of point")[0] in str(info.value)


def _certify_class(data, **kw):
    return probust.smoothing.Certify(MODEL, 0.1, n0=10, n=50)(data[0])


def _estimate(data, **kw):
    return probust.estimate(MODEL, data[0], 0.1, method="taylor")


@pytest.mark.parametrize(
    "call",
    [_find_issues, _score, _certify, _track, _taylor, _certify_class, _estimate],
    ids=["find_issues", "score", "certify", "Tracker", "Taylor", "Certify", "estimate"],
)
def test_images_in_0_to_255_are_warned_of_by_every_entry_point_on_data(call):
    with pytest.warns(UserWarning, match="not \\[0, 1\\].*x / 255"):
        try:
            call((X * 255, Y))
        except ProbustError:
            pass


@pytest.mark.parametrize("call", [_find_issues, _score, _track], ids=["find_issues", "score", "Tracker"])
def test_dict_items_read_by_the_common_keys_give_the_numbers_of_the_tensors(call):
    by_keys = call(Dicts("pixel_values", "labels"))
    named = call(Dicts("pic", "cls"), keys=("pic", "cls"))
    canonical = call((X, Y))
    for frame in (by_keys, named):
        column = "p_label" if "p_label" in canonical else "p"
        assert np.array_equal(frame[column].to_numpy(), canonical[column].to_numpy())


@pytest.mark.parametrize("sigma", [[0.1, 0.3], -1.0, "a", float("nan")])
@pytest.mark.parametrize(
    "call", [_find_issues, _certify, _taylor, _track], ids=["find_issues", "certify", "Taylor", "Tracker"]
)
def test_sigma_not_one_positive_number_is_refused_by_name(call, sigma):
    with pytest.raises(ProbustError) as info:
        call((X, Y), sigma=sigma)
    assert info.value.field == "sigma"


@pytest.mark.parametrize(
    "call", [_find_issues, _score, _certify, _track], ids=["find_issues", "score", "certify", "Tracker"]
)
def test_a_probability_model_is_refused_saying_to_remove_the_softmax(call, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "MODEL", nn.Sequential(_net(), nn.Softmax(1)), raising=False)
    globals()["MODEL"], saved = nn.Sequential(_net(), nn.Softmax(1)), MODEL
    try:
        with pytest.raises(ProbustError, match="remove the final softmax"):
            call((X, Y))
    finally:
        globals()["MODEL"] = saved


def _files(tmp_path, x):
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=Y.numpy())
    (tmp_path / "netmod.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 10))\n"
    )
    torch.save(_net(), tmp_path / "pickled.pt")
    torch.save(_net().state_dict(), tmp_path / "state.pt")


SHELL = {
    "uint8 file": ("uint8", ["--model", "netmod:make", "--untrained"], "--data", "float32 scaled to [0, 1]"),
    "untrained": ("float", ["--model", "netmod:make"], "--weights", "--untrained"),
    "pickled module": ("float", ["--model", "pickled.pt"], "--model", "--allow-pickle"),
    "bare state_dict": ("float", ["--model", "state.pt"], "--model", "--weights"),
}


@pytest.mark.parametrize("command", ["issues", "estimate", "certify"])
@pytest.mark.parametrize("case", SHELL, ids=list(SHELL))
def test_the_shell_names_the_flag_and_a_fix_in_its_own_words(tmp_path, monkeypatch, capsys, command, case):
    from probust.cli import main

    kind, model, flag, fix = SHELL[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _files(tmp_path, (X * 255).to(torch.uint8) if kind == "uint8" else X)
    sigma = ["--sigma", "0.1"]
    extra = (
        ["--methods", "softmax"]
        if command == "estimate"
        else ["--N0", "8", "--N", "16"]
        if command == "certify"
        else []
    )
    assert main([command, "--data", "d.npz", *model, *sigma, *extra, "--out", "o", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}" in err and fix in err, err
    assert "allow_pickle=True" not in err and "load_state_dict" not in err


def test_the_units_warning_comes_once_per_estimator_and_once_per_score_call():
    def units_warnings(call):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            call()
        return [w for w in seen if "not [0, 1]" in str(w.message)]

    taylor = probust.Taylor(MODEL, 0.1)
    assert len(units_warnings(lambda: (taylor(X * 255), taylor(X * 255)))) == 1
    # score warns for the data set and its estimators, called by probust, say nothing more
    found = units_warnings(lambda: _score((X * 255, Y)))
    assert len(found) == 1 and found[0].filename == __file__
