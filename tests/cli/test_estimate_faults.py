"""``probust estimate`` under faults, with real processes: two runs on one folder, a lock left by
a killed run, a full disk."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from probust import models
from probust.cli import main
from probust.run.reading import read_results

REPO = Path(__file__).resolve().parents[2]

ARGS = [
    "--data",
    "digits",
    "--sigma",
    "0.1",
    "0.3",
    "--methods",
    "mc",
    "taylor",
    "softmax",
    "--mc-samples",
    "200",
    "--limit",
    "24",
    "--unit-size",
    "4",
    "--device",
    "cpu",
    "--quiet",
]

# The command, stopped for good before its fourth part: it holds the folder (and its lock) for
# as long as the test needs, however loaded the machine, until it is killed.
_STALLED = """
import sys, time
import probust.run.store as store
write_part, written = store.ResultStore.write_part, []
def stall_after_three(self, *args, **kwargs):
    while len(written) == 3:
        time.sleep(1)
    written.append(1)
    return write_part(self, *args, **kwargs)
store.ResultStore.write_part = stall_after_three
from probust.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def linear(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("model")
    return models.save_checkpoint(folder / "linear.pt", models.build("linear", 10, (1, 8, 8)), {"dataset": "digits"})


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def _args(model: Path, out: Path) -> list[str]:
    return ["estimate", *ARGS, "--model", str(model), "--out", str(out)]


def _reference(model: Path, out: Path, threads: int = 1):
    """The uninterrupted run's table; one thread as in the subprocesses, so float rounding is the same."""
    default = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert main(_args(model, out)) == 0
    finally:
        torch.set_num_threads(default)
    return read_results(out).drop(columns="seconds")


def _wait_for_parts(proc: subprocess.Popen, out: Path, count: int) -> None:
    deadline = time.monotonic() + 120
    while len(list((out / "parts").glob("*.parquet"))) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no part files appeared"
        time.sleep(0.01)


def test_a_second_process_is_refused_and_a_killed_runs_lock_is_taken_over(linear, tmp_path):
    out = tmp_path / "r"
    first = subprocess.Popen(
        [sys.executable, "-c", _STALLED, *_args(linear, out)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_parts(first, out, 3)
        second = subprocess.run(
            [sys.executable, "-m", "probust", *_args(linear, out)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert first.poll() is None, first.communicate()
        assert second.returncode == 2
        assert second.stderr.count("\n") == 1, second.stderr
        assert f"--out: {out} is being written by another run (pid {first.pid} on " in second.stderr
        assert "wait for it, or choose another output folder" in second.stderr
        assert len(list((out / "parts").glob("*.parquet"))) == 3  # and wrote nothing
    finally:
        first.kill()  # SIGKILL: no chance to release anything
        first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    assert f"pid {first.pid} " in (out / ".lock").read_text()  # the lock file is left behind
    assert len(read_results(out)) == 3 * 4

    # The same command again: the dead process's lock is no obstacle (the kernel released it).
    assert main(_args(linear, out)) == 0
    assert (out / ".lock").read_text().startswith(f"pid {os.getpid()} ")
    assert read_results(out).drop(columns="seconds").equals(_reference(linear, tmp_path / "reference"))


def test_a_full_disk_is_one_line_naming_the_folder_and_the_same_command_finishes(linear, tmp_path, capsys, monkeypatch):
    import pyarrow.parquet as pq

    out = tmp_path / "r"
    write_table, calls = pq.write_table, []

    def full_after_five(table, f, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            f.write(b"PAR1 half a part")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_table(table, f, **kwargs)

    monkeypatch.setattr(pq, "write_table", full_after_five)
    assert main(_args(linear, out)) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"probust estimate: error: ResultsWriteError: cannot write to {out} (No space left on device")
    assert "run the same command again" in err
    assert len(read_results(out)) == 5 * 4 and not [p for p in out.rglob("*.tmp")]
    assert main(_args(linear, out)) == 0
    assert (
        read_results(out)
        .drop(columns="seconds")
        .equals(_reference(linear, tmp_path / "reference", torch.get_num_threads()))
    )
