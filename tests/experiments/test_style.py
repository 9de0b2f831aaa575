"""probust.experiments.style: the look shared by every figure."""

from __future__ import annotations

from probust.experiments import style


def test_style_names_every_paper_estimator_in_its_own_colour():
    assert set(style.PAPER_METHODS) <= set(style.METHOD_LABELS)
    colours = [style.method_color(m) for m in style.PAPER_METHODS]
    assert len(set(colours)) == len(colours)
    assert style.METHOD_LABELS["taylor_mvs"] == r"$p^{\mathrm{taylor\_mvs}}$"
