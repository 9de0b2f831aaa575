"""What Taylor and MMSE compute is decided without any timing: fresh processes whose clocks run at
random speeds (every perf_counter / monotonic interval scaled by a random factor in [0.01, 100],
tests/estimators/clock_child.py) give the same numbers.

The models: C = 1,000 with a linear head (the spectral screening), a small CNN (C = 10), and two
without a head at C = 500 (forward mode's route; the forward-mode sketch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import probust

CHILD = Path(__file__).with_name("clock_child.py")


def _children(mode: str, seeds: tuple[int, ...]) -> list[dict]:
    """Each seed's output, the children run side by side (one thread each), the plan cache off."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # The children import the probust this process imported (the working tree, or the copy a
    # mutation check planted a bug in).
    env["PYTHONPATH"] = os.pathsep.join([str(Path(probust.__file__).parents[1]), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", str(CHILD), str(seed), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for seed in seeds
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outs.append(json.loads(out))
    return outs


def test_a_fixed_plan_gives_the_same_bits_whatever_the_clock():
    """jacobian, batch_size and the memory format fixed: every method, every model, bit for bit."""
    first, *others = _children("fixed", (1, 2))
    assert len(first) == 24
    screened = {key: sorted(set(v["route"])) for key, v in first.items() if v["route"] is not None}
    assert screened["screened/taylor"] == [3] and screened["forward/taylor"] == [2]  # candidates; forward
    assert screened["sketch/taylor"] == [3]  # the sketch's candidates (see the module's docstring)
    for other in others:
        differ = [key for key in first if first[key]["p"] != other[key]["p"]]
        assert differ == [], differ


@pytest.mark.slow(seconds=24)
def test_defaults_give_the_same_bits_whatever_the_clock():
    """The default plans are declared (probust.execution.plans), never timed: every method, every
    model, the same routes and the same numbers bit for bit."""
    first, *others = _children("defaults", (3, 4, 5))
    for other in others:
        for key, got in first.items():
            assert got["route"] == other[key]["route"], key
            assert got["values"] == other[key]["values"], key
