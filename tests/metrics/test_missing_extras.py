"""Without torchmetrics (or Lightning) installed, probust.metrics names the extra to install.

The packages are installed here, so a child interpreter hides them from its import system (as
tests/test_extras.py does for the other extras)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_HIDE = """
import importlib.abc, sys
HIDDEN = {hidden!r}
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


def child(code: str, hidden: set[str]) -> subprocess.CompletedProcess:
    source = _HIDE.format(hidden=hidden) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_each_missing_package_names_its_extra():
    # One child (an interpreter start is the cost): torchmetrics and Lightning hidden, then
    # torchmetrics shown again with Lightning still hidden.
    shown = child(
        """
        import torch, probust
        from probust._extras import MissingExtraError
        for reach in (lambda: probust.metrics, lambda: __import__("probust.metrics")):
            try:
                reach()
            except MissingExtraError as exc:
                print(exc.extra, "|", exc)
            else:
                print("imported")
        HIDDEN.discard("torchmetrics")
        metric = probust.metrics.AverageCaseRobustness(torch.nn.Linear(3, 2), sigma=0.1, method="taylor")
        metric.update(torch.zeros(4, 3))
        print(int(metric.compute()["count"]))
        try:
            probust.metrics.RobustnessCallback
        except MissingExtraError as exc:
            print(exc.extra, "|", exc)
        """,
        hidden={"torchmetrics", "lightning"},
    )
    assert shown.returncode == 0, shown.stderr
    *errors, count, callback_error = shown.stdout.strip().splitlines()
    assert len(errors) == 2
    for line in errors:
        extra, message = line.split(" | ")
        assert extra == "metrics"
        assert "pip install 'probust[metrics]'" in message and "torchmetrics" in message
    assert count == "4"  # the metric itself needs no Lightning
    extra, message = callback_error.split(" | ")
    assert extra == "lightning" and "pip install 'probust[lightning]'" in message
