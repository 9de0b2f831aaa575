"""Whose process runs MKL in its strict reproducible mode. On Intel CPUs with AVX-512 that mode
makes a row of a matrix product (a Linear layer's output) the same bits whatever the number of
rows in the call: the premise of a point's estimate not depending on the batch it was computed
in (docs/estimate.md). The ``probust`` command sets it for its own process; ``import probust``
leaves a user's process, and the bits of its products, as they were. On an AMD EPYC (AVX-512)
rows of passes of 1 to 9 rows round differently whatever ``MKL_CBWR`` says."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests._helpers import intel_cpu

_ROWS = """
import os, sys, hashlib, torch
{setup}
torch.manual_seed(0)
moved, by, digest = 0, 0.0, hashlib.sha256()
for inputs, outputs in [(256, 3), (256, 10), (784, 10), (50, 10), (512, 1000)]:
    layer = torch.nn.Linear(inputs, outputs)
    x = torch.randn(96, inputs)
    with torch.no_grad():
        full = layer(x)
        digest.update(full.numpy().tobytes())
        for m in range(1, 97):
            part = layer(x[:m])
            digest.update(part.numpy().tobytes())
            moved += not torch.equal(part, full[:m])
            by = max(by, ((part - full[:m]).abs() / full[:m].abs().clamp_min(1)).max().item())
print(os.environ.get("MKL_CBWR"), moved, by, digest.hexdigest())
"""

_CLI = """
import probust.cli
try:
    probust.cli.main(["--version"])
except SystemExit:
    pass
"""


def _run(setup: str, env: dict[str, str]) -> list[str]:
    code = textwrap.dedent(_ROWS).replace("{setup}", textwrap.dedent(setup))
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()[-1].split()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    return {**env, "OMP_NUM_THREADS": "2", **extra}


def test_import_probust_leaves_the_users_products_as_they_were():
    plain = _run("", _env())
    imported = _run("import probust", _env())
    assert plain[0] == imported[0] == "None"
    assert imported[3] == plain[3]  # every product's bits, with and without probust imported


def test_the_command_sets_mkls_strict_mode_for_its_own_process_unless_the_user_chose_one():
    mode, moved, by, _ = _run(_CLI, _env())
    assert mode == "AUTO,STRICT"
    if intel_cpu():  # every row of every product has the bits of the 96-row product's
        assert int(moved) == 0
    else:  # a few float32 roundings of the row at most (measured 7.7e-7 on an AMD EPYC)
        assert float(by) < 4e-6
    assert _run(_CLI, _env(MKL_CBWR="COMPATIBLE"))[0] == "COMPATIBLE"  # a user's own choice is kept
