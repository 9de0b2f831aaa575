"""torchrun: sharding, and a 2-process gloo run equal to a single-process run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from probust import models
from probust.cli import main
from probust.run import distributed
from probust.run.store import read_config, read_results

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
    "taylor_mvs",
    "mmse_mvs",
    "softmax",
    "--mc-samples",
    "50",
    "--mmse-samples",
    "3",
    "--limit",
    "20",
    "--batch-size",
    "3",
    "--device",
    "cpu",
    "--quiet",
]


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
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
        "-m",
        "probust",
        "estimate",
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_gloo_processes_give_the_single_process_table(tmp_path):
    torch.manual_seed(0)
    model = models.save_checkpoint(tmp_path / "cnn.pt", models.build("cnn", 10, (1, 8, 8)), {"dataset": "digits"})
    out = tmp_path / "two"
    done = _torchrun(*ARGS, "--model", str(model), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_config(out)["history"][-1]["world_size"] == 2
    assert not list((out / "parts").glob("*.parquet"))  # rank 0 merged every rank's parts

    torch.set_num_threads(1)  # as each torchrun worker, so float rounding is the same
    try:
        assert main(["estimate", *ARGS, "--model", str(model), "--out", str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
    one = read_results(tmp_path / "one").drop(columns="seconds")
    two = read_results(out).drop(columns="seconds")
    assert len(two) == 20 * 2 * 4
    assert two.equals(one)

    # A configuration error found by rank 0 alone stops both ranks (nobody waits forever).
    refused = _torchrun(*ARGS, "--model", str(model), "--out", str(out), "--seed", "1")
    assert refused.returncode != 0
    assert "seed: 0 there, 1 here" in refused.stderr


@pytest.mark.slow
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
