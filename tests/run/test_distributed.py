"""torchrun: sharding, and a 2-process gloo run equal to a single-process run."""

from __future__ import annotations

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
from probust.run import distributed
from probust.run.reading import read_config, read_results

REPO = Path(__file__).resolve().parents[2]


def test_outside_torchrun_there_is_one_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    world = distributed.join("cpu")
    assert (world.rank, world.world_size, world.is_main, world.distributed) == (0, 1, True, False)
    assert world.all_gather("x") == ["x"]
    world.barrier()
    world.close()


def test_torchrun_environment_is_read(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.environment_world() == (3, 4, 1)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="RANK=4"):
        distributed.environment_world()


def test_shards_are_disjoint_and_cover_everything():
    items = list(range(11))
    shards = [distributed.World(rank=r, world_size=3).shard(items) for r in range(3)]
    assert sorted(sum(shards, [])) == items
    assert shards[0] == [0, 3, 6, 9]


ARGS = [
    "--data",
    "digits",
    "--sigma",
    "0.1",
    "0.3",
    "--methods",
    "mc",
    "taylor",
    "mmse",
    "mc_cv",
    "taylor_mvs",
    "mmse_mvs",
    "softmax",
    "--p-fail",
    "--mc-samples",
    "50",
    "--mmse-samples",
    "3",
    "--limit",
    "20",
    "--unit-size",
    "3",
    "--device",
    "cpu",
    "--quiet",
]


def _torchrun_command(
    *args: str, script: Path | None = None, command: str = "estimate"
) -> tuple[list[str], dict[str, str]]:
    """torchrun with two CPU workers running ``probust <command> *args`` (or ``script <command> *args``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    program = [str(script), command] if script is not None else ["-m", "probust", command]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "--max-restarts",
        "0",
        *program,
        *args,
    ], env


def _torchrun(*args: str, command: str = "estimate") -> subprocess.CompletedProcess:
    cmd, env = _torchrun_command(*args, command=command)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _checkpoint(folder: Path) -> Path:
    torch.manual_seed(0)
    return models.save_checkpoint(folder / "cnn.pt", models.build("cnn", 10, (1, 8, 8)), {"dataset": "digits"})


def _one_process(model: Path, out: Path):
    """The uninterrupted single-process table (one thread, as each torchrun worker)."""
    default = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker, so float rounding is the same
    try:
        assert main(["estimate", *ARGS, "--model", str(model), "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(default)
    return read_results(out).drop(columns="seconds")


@pytest.mark.slow(seconds=21)
def test_two_gloo_processes_give_the_single_process_table(tmp_path):
    model = _checkpoint(tmp_path)
    out = tmp_path / "two"
    done = _torchrun(*ARGS, "--model", str(model), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_config(out)["history"][-1]["world_size"] == 2
    assert not list((out / "parts").glob("*.parquet"))  # rank 0 merged every rank's parts

    one = _one_process(model, tmp_path / "one")
    two = read_results(out).drop(columns="seconds")
    assert len(two) == 20 * 2 * 7
    assert two.p_fail.notna().sum() == 20 * 2 * 4 and two.cv_beta.notna().sum() == 20 * 2
    assert two.equals(one)

    # A configuration error found by rank 0 alone stops both ranks (nobody waits forever).
    refused = _torchrun(*ARGS, "--model", str(model), "--out", str(out), "--seed", "1")
    assert refused.returncode != 0
    assert "seed: 0 there, 1 here" in refused.stderr


CERTIFY_ARGS = [
    "--data",
    "digits",
    "--sigma",
    "0.25",
    "0.5",
    "--N0",
    "16",
    "--N",
    "256",
    "--radii",
    "0",
    "0.25",
    "--estimate",
    "taylor",
    "--limit",
    "10",
    "--unit-size",
    "3",
    "--device",
    "cpu",
    "--quiet",
]


@pytest.mark.slow(seconds=10)
def test_two_gloo_processes_certify_the_single_process_table(tmp_path):
    from probust.run.certify import read_certified, tsv_name

    model = _checkpoint(tmp_path)
    out = tmp_path / "two"
    done = _torchrun(*CERTIFY_ARGS, "--model", str(model), "--out", str(out), command="certify")
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_config(out)["history"][-1]["world_size"] == 2
    assert not list((out / "parts").glob("*.parquet"))  # rank 0 merged every rank's parts

    default = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker
    try:
        assert main(["certify", *CERTIFY_ARGS, "--model", str(model), "--out", str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(default)
    one = read_certified(tmp_path / "one").drop(columns="seconds")
    two = read_certified(out).drop(columns="seconds")
    assert len(two) == 10 * 2
    assert two.equals(one)
    for sigma in (0.25, 0.5):  # the TSVs differ in their times only
        cut = [line.rsplit("\t", 1)[0] for line in (out / tsv_name(sigma)).read_text().splitlines()]
        assert cut == [
            line.rsplit("\t", 1)[0] for line in (tmp_path / "one" / tsv_name(sigma)).read_text().splitlines()
        ]


@pytest.mark.slow(seconds=8)
def test_a_tie_on_one_rank_stops_both_before_any_estimate(tmp_path):
    from probust.data import load

    # A linear model whose classes 0 and 1 share their weights (the direction of point 4) and
    # whose class 2 is a constant between point 4's projection and every other point's: the
    # clean prediction is tied at point 4 alone, which is in rank 1's share (blocks of 3).
    x = load("digits", "test").subset(torch.arange(20)).tensors()[0].flatten(1).double()
    direction = x[4] / x[4].norm()
    projections = x @ direction
    others = projections[torch.arange(20) != 4].max()
    assert others < projections[4]
    model = models.build("linear", 10, (1, 8, 8))
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.weight[0] = model.fc.weight[1] = direction.float()
        model.fc.bias.fill_(-1e3)
        model.fc.bias[0] = model.fc.bias[1] = 0.0
        model.fc.bias[2] = float(others + projections[4]) / 2
    path = models.save_checkpoint(tmp_path / "tied.pt", model, {"dataset": "digits"})
    out = tmp_path / "r"
    refused = _torchrun(*ARGS, "--model", str(path), "--out", str(out))
    assert refused.returncode != 0
    assert "--target: the clean prediction is tied between two classes at data-set indices [4] (1 point)" in (
        refused.stderr
    )
    assert not list((out / "parts").glob("*.parquet"))


# probust estimate, with rank 1 stopped for good after its second part (it tells its pid), so the
# test kills it mid-run however loaded the machine.
_STALL_RANK_1 = """
import os, sys, time
import probust.run.store as store
if os.environ["RANK"] == "1":
    write_part, written = store.ResultStore.write_part, []
    def stall_after_two(self, *args, **kwargs):
        if len(written) == 2:
            with open(os.environ["RANK_1_PID"], "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(1)
        written.append(1)
        return write_part(self, *args, **kwargs)
    store.ResultStore.write_part = stall_after_two
from probust.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow(seconds=18)
def test_a_killed_rank_is_resumed_by_the_same_command_to_the_single_process_table(tmp_path):
    model = _checkpoint(tmp_path)
    out = tmp_path / "two"
    script = tmp_path / "stall_rank_1.py"
    script.write_text(_STALL_RANK_1)
    pid_file = tmp_path / "rank1.pid"
    cmd, env = _torchrun_command(*ARGS, "--model", str(model), "--out", str(out), script=script)
    job = subprocess.Popen(
        cmd, env={**env, "RANK_1_PID": str(pid_file)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 240
        while not pid_file.exists() or not pid_file.read_text():
            assert job.poll() is None, job.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "rank 1 never wrote its parts"
            time.sleep(0.05)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        _, err = job.communicate(timeout=120)  # torchrun stops rank 0 and fails
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode != 0, err[-3000:]
    partial = read_results(out)
    assert 0 < len(partial) < 20 * 2 * 7 and not (out / "results.parquet").exists()

    done = _torchrun(*ARGS, "--model", str(model), "--out", str(out))  # the same command again
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list((out / "parts").iterdir())  # merged; the dead rank's temporaries cleaned
    assert read_results(out).drop(columns="seconds").equals(_one_process(model, tmp_path / "one"))
