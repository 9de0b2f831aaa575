"""probust.errors: the helpers every message is made with."""

from __future__ import annotations

from probust.errors import first_line


def test_first_line_of_an_exception():
    assert first_line(ValueError("one\ntwo")) == "one"
    assert first_line(KeyError()) == "KeyError"
