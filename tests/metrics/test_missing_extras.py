"""Without torchmetrics (or Lightning) installed, probust.metrics names the extra to install.

The packages are installed here, so a child interpreter hides them from its import system (as
tests/test_extras.py does for the other extras)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests._helpers import child_without

ROOT = Path(__file__).resolve().parents[2]


def child(code: str, hidden: set[str]) -> subprocess.CompletedProcess:
    return child_without(code, hidden, cwd=ROOT)


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
