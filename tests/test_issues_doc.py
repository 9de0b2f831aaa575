"""docs/issues.md's example runs and prints what the page shows (counts exactly, decimals of 3 or
more places within 0.005: another CPU's float32 training moves them that much)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_EXAMPLE = re.compile(
    r"## [^\n]*[Aa]n example that runs.*?```python\n(?P<code>.*?)```\s*```text\n(?P<out>.*?)```", re.DOTALL
)
_NUMBER = re.compile(r"-?\d+(?:\.(\d+))?")


def _same(got: str, expected: str) -> bool:
    if _NUMBER.sub("#", " ".join(got.split())) != _NUMBER.sub("#", " ".join(expected.split())):
        return False
    for x, y in zip(_NUMBER.finditer(got), _NUMBER.finditer(expected)):
        if x[0] != y[0] and (y[1] is None or len(y[1]) < 3 or abs(float(x[0]) - float(y[0])) > 5e-3):
            return False
    return True


_EXAMPLES = list(_EXAMPLE.finditer((ROOT / "docs" / "issues.md").read_text(encoding="utf-8")))


def test_the_page_has_its_two_examples():
    assert len(_EXAMPLES) == 2, "docs/issues.md: the Tracker's example and find_issues' example, each with its output"


@pytest.mark.parametrize("found", _EXAMPLES, ids=["tracker", "find_issues"][: len(_EXAMPLES)])
def test_the_pages_example_prints_what_the_page_shows(found):
    run = subprocess.run([sys.executable, "-c", found["code"]], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert _same(run.stdout, found["out"]), f"printed:\n{run.stdout}\nthe page shows:\n{found['out']}"
