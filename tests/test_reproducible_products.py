"""``import probust`` puts MKL in its strict reproducible mode, so that a row of a matrix product
(a Linear layer's output) has the same bits whatever the number of rows in the call: the premise
of a point's estimate not depending on the batch it was computed in (docs/estimate.md). MKL's
strict mode gives this on Intel CPUs only: on an AMD EPYC (AVX-512) rows of passes of 1 to 9 rows
still round differently, at float32 rounding, whatever ``MKL_CBWR`` says."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests._helpers import intel_cpu

_ROWS = """
import os, sys, torch
import probust  # before any matrix product
torch.manual_seed(0)
moved, by = 0, 0.0
for inputs, outputs in [(256, 3), (256, 10), (784, 10), (50, 10), (512, 1000)]:
    layer = torch.nn.Linear(inputs, outputs)
    x = torch.randn(96, inputs)
    with torch.no_grad():
        full = layer(x)
        for m in range(1, 97):
            part = layer(x[:m])
            moved += not torch.equal(part, full[:m])
            by = max(by, ((part - full[:m]).abs() / full[:m].abs().clamp_min(1)).max().item())
print(os.environ.get("MKL_CBWR"), moved, by)
"""


def _run(env: dict[str, str]) -> str:
    shown = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_ROWS)], capture_output=True, text=True, env=env, timeout=300
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip()


def test_import_sets_mkls_strict_mode_unless_the_user_chose_one():
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env["OMP_NUM_THREADS"] = "2"
    mode, moved, by = _run(env).split()
    assert mode == "AUTO,STRICT"  # set by the import
    if intel_cpu():  # every row of every product has the bits of the 96-row product's
        assert int(moved) == 0
    else:  # a few float32 roundings of the row at most (measured 7.7e-7 on an AMD EPYC)
        assert float(by) < 4e-6
    # A user's own choice is kept (whatever it does to the rows on this CPU).
    assert _run({**env, "MKL_CBWR": "COMPATIBLE"}).split()[0] == "COMPATIBLE"
