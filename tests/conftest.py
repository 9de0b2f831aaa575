"""Shared fixtures: small models whose exact p_robust is known, and the paper's Fashion-MNIST CNN
(session-scoped, for the slow tests); and the slow suite's order, longest first."""

from __future__ import annotations

import fcntl
import os

# The batch-split contract's premise, as the `probust` command sets it for its own process
# (probust.cli.STRICT_PRODUCTS): before any matrix product of the suite's processes and workers.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests._helpers import linear_model, require_fashion_mnist

TRAINED_CNN = "fashion_mnist_cnn"


def pytest_collection_modifyitems(config, items):
    """The tests sharing the trained CNN first, together, then the rest by their declared cost
    (``@pytest.mark.slow(seconds=...)``: one thread, this project's 2-core machine), longest first.

    CI's slow suite runs on 2 workers by work stealing: each takes half of this order and the idle
    one steals the other's tail. Together and first, the trained-CNN tests stay on one worker, so
    that no worker idles on the training's lock (82 s); longest first, no long test starts last.
    Stable: tests with no declared cost (the whole fast suite) keep their order.
    """

    def seconds(item) -> float:
        return max((float(m.kwargs.get("seconds", 0)) for m in item.iter_markers("slow")), default=0.0)

    items.sort(key=lambda item: (TRAINED_CNN not in getattr(item, "fixturenames", ()), -seconds(item)))


@pytest.fixture(autouse=True)
def one_thread():
    # Two OpenMP threads on a shared 2-core machine are many times slower than one.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def make_linear():
    return linear_model


@pytest.fixture(scope="session")
def fashion_mnist_cnn(tmp_path_factory):
    """probust's CNN trained on Fashion-MNIST with the paper's recipe (10 epochs, SGD lr 0.05,
    batch 128, seed 0, one thread): the TrainResult, trained once per session for the slow tests
    that need it (minutes); skipped where the data set is not installed, failed there under CI
    (:func:`tests._helpers.require_fashion_mnist`)."""
    require_fashion_mnist()
    from probust.training import train

    def trained(out):
        return train(
            "fashion-mnist", "cnn", epochs=10, lr=0.05, batch_size=128, out=out, show_progress=False, num_threads=1
        )

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return trained(tmp_path_factory.mktemp("fashion_mnist") / "cnn.pt")
    # pytest-xdist's workers share their base folder's parent: the first to take the lock trains,
    # the others find the finished checkpoint, which train() returns as it is (resume).
    shared = tmp_path_factory.getbasetemp().parent / "fashion_mnist"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return trained(shared / "cnn.pt")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
