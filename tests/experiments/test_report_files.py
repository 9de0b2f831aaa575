"""The report's figures and tables are written whole, replacing a file or link of their name:
a link planted in the report's folder is never written through."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from probust.experiments.base import write_tables
from probust.experiments.style import save_figure


def test_a_figure_replaces_a_planted_link_and_leaves_its_target(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "report"
    out.mkdir()
    (out / "fig.png").symlink_to(victim)
    (out / "fig.svg").symlink_to(victim)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])

    paths = save_figure(fig, out / "fig")

    assert victim.read_text() == "keep me\n"
    assert all(p.is_file() and not p.is_symlink() for p in paths)
    assert paths[0].read_bytes().startswith(b"\x89PNG") and b"<svg" in paths[1].read_bytes()


def test_a_table_replaces_a_planted_link_and_leaves_its_target(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "report"
    out.mkdir()
    (out / "t.csv").symlink_to(victim)

    (path,) = write_tables(out, "t", {"t": pd.DataFrame({"a": [1, 2]})})

    assert victim.read_text() == "keep me\n"
    assert not path.is_symlink() and path.read_text() == "a\n1\n2\n"
