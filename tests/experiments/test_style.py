"""probust.experiments.style: the look shared by every figure."""

from __future__ import annotations

import dataclasses

from probust.estimators import METHODS, PAPER_METHODS, MethodSpec
from probust.experiments import style


def test_style_names_every_registered_estimator_in_its_own_colour():
    assert set(PAPER_METHODS) <= set(METHODS) == set(style.METHOD_LABELS) == set(style.METHOD_COLORS)
    assert style.METHOD_ORDER == METHODS
    colours = [style.method_color(m) for m in METHODS]
    assert len(set(colours)) == len(colours)
    assert style.METHOD_LABELS["taylor_mvs"] == r"$p^{\mathrm{taylor\_mvs}}$"


def test_the_look_of_each_method_lives_here_and_the_registry_keeps_the_maths():
    # presentation is the figures' business: every registered method has a style, and the
    # method registry holds no label, colour, line style or marker
    assert tuple(style.METHOD_STYLES) == METHODS
    assert style.METHOD_MARKERS["mc"] == "s" and style.METHOD_LINESTYLES["mmse_mvs"] == "--"
    assert style.METHOD_HTML["mmse"] == "p<sup>mmse</sup>" and style.METHOD_TEXT["mmse"] == "p^mmse"
    fields = {f.name for f in dataclasses.fields(MethodSpec)}
    assert not fields & {"label", "colour", "linestyle", "marker"}
