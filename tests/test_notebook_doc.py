"""docs/notebook.md: every Python block runs, in order, in one namespace (as a notebook would),
and prints the output shown under it (a ```text block right after the code)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "notebook.md"
MARK = "\x00block-output\x00"

_BLOCK = re.compile(r"```python\n(?P<code>.*?)```(?:\s*```text\n(?P<out>.*?)```)?", re.DOTALL)

# The child: runs the blocks given on stdin in one namespace, a marker line before each one's output.
_RUNNER = f"""
import json, sys, warnings
blocks = json.load(sys.stdin)
namespace = {{"__name__": "__notebook__"}}
warnings.simplefilter("ignore")  # the page shows its own warnings where it means to
for code in blocks:
    print({MARK!r}, flush=True)
    exec(compile(code, "docs/notebook.md", "exec"), namespace)
    sys.stdout.flush()
"""


def blocks() -> list[tuple[str, str | None]]:
    """The page's (code, expected output or None) pairs, in order."""
    return [(m["code"], m["out"]) for m in _BLOCK.finditer(PAGE.read_text(encoding="utf-8"))]


def test_the_page_has_a_block_for_each_part():
    codes = "\n".join(code for code, _ in blocks())
    for name in (
        "with_normalization",
        "probust.score(",
        "DataLoader(",
        ".to_pandas()",
        "agreement",
        "AverageCaseRobustness",
        "RobustnessCallback",
        "probust.plots.extremes",
        "ViTForImageClassification",
        "timm.create_model",
    ):
        assert name in codes, name
    assert all(out is not None for _, out in blocks()), "every block shows its output"


@pytest.mark.slow(seconds=36)
def test_every_block_runs_and_prints_what_the_page_shows(tmp_path):
    pairs = blocks()
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PROBUST_CACHE_DIR": "off", "MPLBACKEND": "Agg"}
    env.pop("PYTHONWARNINGS", None)
    run = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps([code for code, _ in pairs]),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    outputs = run.stdout.split(MARK + "\n")[1:]
    assert len(outputs) == len(pairs)
    for index, ((code, expected), got) in enumerate(zip(pairs, outputs)):
        if expected is not None:
            assert got.rstrip() == expected.rstrip(), f"block {index + 1}:\n{code}\nprinted:\n{got}"
    for name in ("extremes", "class_bias", "against_mc", "over_sigma"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
