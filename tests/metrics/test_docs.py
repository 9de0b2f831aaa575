"""docs/metrics.md's snippets run, and print what the page shows under them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def snippets() -> list[tuple[str, str]]:
    """Every ```python block followed directly by a plain ``` block (its printed output)."""
    # the code may not contain a fence: a block without output is not matched across the next one
    pairs = re.findall(r"```python\n((?:(?!```).)*)```\n\n```\n((?:(?!```).)*)```", DOC.read_text(), flags=re.DOTALL)
    assert len(pairs) == 2, "the metric in a loop, the callback in a Trainer"
    return pairs


def run(code: str, cwd: Path) -> list[str]:
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip().splitlines()


@pytest.mark.slow  # a fresh interpreter importing torch, scikit-learn and torchmetrics
def test_the_metric_snippet_prints_what_the_page_shows(tmp_path):
    code, output = snippets()[0]
    assert run(code, tmp_path) == output.strip().splitlines()


@pytest.mark.slow
def test_the_callback_snippet_prints_what_the_page_shows(tmp_path):
    code, output = snippets()[1]
    expected = output.strip().splitlines()
    assert run(code, tmp_path)[-len(expected) :] == expected
    assert (tmp_path / "logs" / "lightning_logs" / "version_0" / "metrics.csv").is_file()
