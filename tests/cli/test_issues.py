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


def test_the_page_captions_each_image_with_its_index_labels_and_a_distinct_score(tmp_path):
    import re

    _blobs(tmp_path)
    args = ["issues", "--data", str(tmp_path / "d.npz"), "--model", str(tmp_path / "m.pt"), "--allow-pickle"]
    assert main([*args, "--sigma", "0.2", "--out", str(tmp_path / "out"), "--no-progress", "--top", "10"]) == 0
    page = (tmp_path / "out" / "issues.html").read_text()
    frame = pd.read_csv(tmp_path / "out" / "issues.csv")
    for column in ("label_score", "self_confidence", "outlier_score", "memorisation_score"):
        assert f'id="{column}"' in page  # a section per ranking
    assert "display:grid" in page and "auto-fill" in page  # wraps to the page's width
    section = page.split('id="label_score"')[1].split("<h2")[0]
    captions = re.findall(r"<figcaption><b>#(\d+)</b><br>(.*?) &gt; (.*?)<br>(.*?)</figcaption>", section)
    assert len(captions) == 10 and len(re.findall("<img ", section)) == 10  # one small image each
    ranked = frame.sort_values(["label_score", "index"]).head(10)
    assert [int(i) for i, *_ in captions] == ranked["index"].tolist()
    assert {int(i) for i, *_ in captions[:2]} == {4, 40}  # the planted errors first
    scores = [s for *_, s in captions]
    assert len(set(scores)) == ranked["label_score"].map(lambda v: f"{v:.6g}").nunique()  # distinct where they differ
    assert all(float(s) == pytest.approx(v, rel=1e-2) for s, v in zip(scores, ranked["label_score"], strict=True))


def test_score_labels_tell_apart_values_that_differ():
    from probust.plots.issues import score_labels

    assert score_labels([1.2e-7, 1.3e-7, 0.5, 0.5]) == ["1.2e-07", "1.3e-07", "0.5", "0.5"]
    assert len(set(score_labels([0.123451, 0.123452, 0.9]))) == 3


def test_issue_grid_draws_one_captioned_image_per_point(tmp_path):
    from probust.plots.issues import issue_grid

    model, x, labels = _blobs(tmp_path)
    frame = probust.find_issues(model, (x, labels), sigma=0.2, show_progress=False)
    ds = torch.utils.data.TensorDataset(x, labels)
    figure = issue_grid(frame, ds, "outlier_score", count=10, highest=True, columns=4)
    titles = [ax.get_title() for ax in figure.axes if ax.images]
    top = frame.sort_values(["outlier_score", "index"], ascending=[False, True]).head(10)
    assert len(titles) == 10 and [int(t.split("\n")[0][1:]) for t in titles] == top["index"].tolist()
    assert all(" > " in t.split("\n")[1] for t in titles)
