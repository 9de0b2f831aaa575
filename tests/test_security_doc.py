"""docs/security.md: every test it names as checking a statement exists under tests/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_named_in_the_security_page_exists():
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", (ROOT / "docs" / "security.md").read_text()))
    assert len(named) >= 50, "each statement lists the tests that check it"
    defined = {
        match
        for path in (ROOT / "tests").rglob("test_*.py")
        for match in re.findall(r"^def (test_[a-z0-9_]+)\(", path.read_text(), flags=re.MULTILINE)
    }
    assert not named - defined, f"named in docs/security.md but not defined: {sorted(named - defined)}"
