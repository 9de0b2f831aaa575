"""``probust issues``: the rows of probust.find_issues, written, resumable, and its HTML page."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import probust
from probust.cli import main


def _blobs(tmp_path, n_per: int = 30):
    """Three separable 1 x 4 x 4 'images' classes, a linear model that separates them, saved."""
    g = torch.Generator().manual_seed(0)
    centres = torch.zeros(3, 16)
    centres[0, :5], centres[1, 5:10], centres[2, 10:] = 0.9, 0.9, 0.9
    y = torch.arange(3).repeat_interleave(n_per)
    x = (centres[y] + 0.05 * torch.randn(len(y), 16, generator=g)).clamp(0, 1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        model[1].weight.copy_(centres * 4)
        model[1].bias.copy_(-2 * (centres**2).sum(1))
    torch.save(model, tmp_path / "m.pt")
    noisy = y.clone()
    noisy[[4, 40]] = torch.tensor([2, 0])  # two planted label errors
    np.savez(tmp_path / "d.npz", x=x.reshape(-1, 1, 4, 4).numpy(), y=noisy.numpy())
    return model, x.reshape(-1, 1, 4, 4), noisy


def test_the_command_writes_find_issues_rows_and_a_page_and_resumes(tmp_path, capsys):
    model, x, labels = _blobs(tmp_path)
    args = ["issues", "--data", str(tmp_path / "d.npz"), "--model", str(tmp_path / "m.pt"), "--allow-pickle"]
    args += ["--sigma", "0.2", "--out", str(tmp_path / "out"), "--no-progress", "--top", "3"]
    assert main(args) == 0
    written = pd.read_csv(tmp_path / "out" / "issues.csv")
    expected = probust.find_issues(model, (x, labels), sigma=0.2, show_progress=False)
    np.testing.assert_allclose(written["label_score"], expected["label_score"], rtol=1e-12)
    assert set(written.sort_values("label_score").head(2)["index"]) == {4, 40}
    assert written.loc[[4, 40], "is_label_issue"].all()
    page = (tmp_path / "out" / "issues.html").read_text()
    assert "data:image/png;base64," in page and "Flagged points" in page
    assert main(args) == 0  # again: every chunk is read back
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "out" / "issues.csv"), written)


def test_folds_from_the_command_line_and_bad_arguments(tmp_path, capsys):
    _blobs(tmp_path)
    np.savetxt(tmp_path / "a.txt", np.arange(0, 90, 2), fmt="%d")
    np.save(tmp_path / "b.npy", np.arange(1, 90, 2))
    base = ["issues", "--data", str(tmp_path / "d.npz"), "--allow-pickle", "--sigma", "0.2", "--no-progress"]
    folds = [
        "--fold",
        str(tmp_path / "m.pt"),
        str(tmp_path / "a.txt"),
        "--fold",
        str(tmp_path / "m.pt"),
        str(tmp_path / "b.npy"),
    ]
    assert main([*base, *folds, "--out", str(tmp_path / "o1")]) == 0
    written = pd.read_csv(tmp_path / "o1" / "issues.csv")
    assert list(written["fold"][:4]) == [0, 1, 0, 1]
    capsys.readouterr()
    overlapping = ["--fold", str(tmp_path / "m.pt"), str(tmp_path / "a.txt")] * 2
    assert main([*base, *overlapping, "--out", str(tmp_path / "o2")]) == 2
    assert "--fold: folds[1] and folds[0] both hold out point 0" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "o3")]) == 2
    assert "give --model, or --fold" in capsys.readouterr().err
    torch.save(nn.Sequential(nn.Flatten(), nn.Linear(16, 3), nn.Softmax(dim=1)), tmp_path / "probs.pt")
    assert main([*base, "--model", str(tmp_path / "probs.pt"), "--out", str(tmp_path / "o4")]) == 2
    assert "probabilit" in capsys.readouterr().err


@pytest.mark.parametrize("top", [1, 4])
def test_the_page_shows_probusts_and_cleanlabs_picks(tmp_path, top):
    from probust.plots.issues import suspects

    model, x, labels = _blobs(tmp_path)
    frame = probust.find_issues(model, (x, labels), sigma=0.2, show_progress=False)
    ds = torch.utils.data.TensorDataset(x, labels)
    figure = suspects(frame, ds, top=top)
    left, right = figure.axes
    assert "probust" in left.get_title() and "cleanlab" in right.get_title()
    captions = [t.get_text() for t in left.texts]
    assert len(captions) == 3 * top
    # Each planted error leads its given class's row: index 40 (class 1) labelled 0, index 4
    # (class 0) labelled 2; rows are the given classes 0, 1, 2, each of ``top`` cells.
    assert captions[0].startswith("0 > 1") and captions[2 * top].startswith("2 > 0")
