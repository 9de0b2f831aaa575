"""probust.experiments.style: the look shared by every figure."""

from __future__ import annotations

from probust.estimators import METHODS, PAPER_METHODS
from probust.experiments import style


def test_style_names_every_registered_estimator_in_its_own_colour():
    assert set(PAPER_METHODS) <= set(METHODS) == set(style.METHOD_LABELS) == set(style.METHOD_COLORS)
    assert style.METHOD_ORDER == METHODS
    colours = [style.method_color(m) for m in METHODS]
    assert len(set(colours)) == len(colours)
    assert style.METHOD_LABELS["taylor_mvs"] == r"$p^{\mathrm{taylor\_mvs}}$"
