"""docs/estimate.md's "What probust guarantees": every test it names exists under tests/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_named_in_the_guarantees_exists():
    doc = (ROOT / "docs" / "estimate.md").read_text()
    section = doc.split("## What probust guarantees", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", section))
    assert len(named) >= 30, "the section lists the tests of each statement"
    defined = {
        match
        for path in (ROOT / "tests").rglob("test_*.py")
        for match in re.findall(r"^def (test_[a-z0-9_]+)\(", path.read_text(), flags=re.MULTILINE)
    }
    assert not named - defined, f"named in docs/estimate.md but not defined: {sorted(named - defined)}"
