"""probust.linearisation.forward_mode.jvp: torch.func.jvp's values, bit for bit, without the zero tangents' work."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from probust.linearisation.forward_mode import _LeanTangents, jvp, jvps


def _cnn(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(2, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 6, 3, stride=2, dilation=1, groups=2, bias=False),
        nn.BatchNorm2d(6, affine=False),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 2 * 2, 16),
        nn.LayerNorm(16),
        nn.GELU(),
        nn.Linear(16, 5),
    )
    with torch.no_grad():  # statistics as after training, so the batch norms do something
        for bn in (net[1], net[5]):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
        net[1].weight.normal_()
        net[1].bias.normal_()
    return net.to(dtype).eval()


class _CountConvolutions(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.convolution, torch.ops.aten._convolution):
            self.calls += func.overloadpacket is torch.ops.aten.convolution
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_values_are_torch_func_jvps_bit_for_bit(dtype: torch.dtype, channels_last: bool) -> None:
    net = _cnn(dtype)
    x = torch.rand(3, 2, 10, 10, dtype=dtype)
    v = torch.randn(3, 2, 10, 10, dtype=dtype)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x, v = (t.contiguous(memory_format=torch.channels_last) for t in (x, v))
    with torch.no_grad():
        out, out_t = torch.func.jvp(net, (x,), (v,))
        lean_out, lean_t = jvp(net, x, v)
    assert torch.equal(lean_out, out)
    assert torch.equal(lean_t, out_t)


def test_under_vmap_the_jacobian_columns_are_the_same_bits() -> None:
    """The forward route's use: one jvp per input coordinate, vmapped in chunks."""
    net = _cnn(torch.float64)
    x = torch.rand(2, 2, 10, 10, dtype=torch.float64)
    basis = torch.eye(200, dtype=torch.float64).view(200, 1, 2, 10, 10).expand(-1, 2, -1, -1, -1)
    with torch.no_grad():
        ref = torch.func.vmap(lambda t: torch.func.jvp(net, (x,), (t,))[1], chunk_size=64)(basis)
        lean = torch.func.vmap(lambda t: jvp(net, x, t)[1], chunk_size=64)(basis)
    assert torch.equal(lean, ref)


def test_a_convolution_runs_twice_not_three_times() -> None:
    """The point of the module: torch's rule also convolves the input with the weight's zero tangent."""
    net = _cnn()
    x, v = torch.rand(2, 2, 10, 10), torch.randn(2, 2, 10, 10)
    counts = []
    for run in (lambda: torch.func.jvp(net, (x,), (v,)), lambda: jvp(net, x, v)):
        with torch.no_grad(), _CountConvolutions() as counter:
            run()
        counts.append(counter.calls)
    assert counts == [6, 4]  # two convolution layers


def _function_of_parameters(kind: str):
    """(f(x, *params), x, params) for a layer whose parameters carry tangents too."""
    g = torch.Generator().manual_seed(1)
    if kind == "conv":
        x = torch.rand(2, 3, 8, 8, generator=g, dtype=torch.float64)
        params = (
            torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64),
            torch.randn(4, generator=g, dtype=torch.float64),
        )
        return (lambda x, w, b: F.conv2d(x, w, b, padding=1)), x, params
    if kind == "conv1d":
        x = torch.rand(2, 3, 9, generator=g, dtype=torch.float64)
        params = (
            torch.randn(4, 3, 2, generator=g, dtype=torch.float64),
            torch.randn(4, generator=g, dtype=torch.float64),
        )
        return (lambda x, w, b: F.conv1d(x, w, b, stride=2)), x, params
    if kind == "linear":
        x = torch.rand(2, 5, 3, generator=g, dtype=torch.float64)
        params = (torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64))
        return (lambda x, w, b: F.linear(x, w, b)), x, params
    x = torch.rand(2, 3, 4, 4, generator=g, dtype=torch.float64)
    mean = torch.randn(3, generator=g, dtype=torch.float64)
    var = torch.rand(3, generator=g, dtype=torch.float64) + 0.5
    params = (torch.randn(3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64))
    return (lambda x, w, b: F.batch_norm(x, mean, var, w, b, training=False, eps=1e-3)), x, params


@pytest.mark.parametrize("kind", ["conv", "conv1d", "linear", "batch_norm"])
def test_tangents_of_parameters_are_kept(kind: str) -> None:
    """Weights computed from the input (hypernetworks) carry tangents: their terms are added."""
    f, x, params = _function_of_parameters(kind)
    tangents = tuple(torch.randn_like(t) for t in (x, *params))

    ref = torch.func.jvp(f, (x, *params), tangents)
    with _LeanTangents():
        lean = torch.func.jvp(f, (x, *params), tangents)
    torch.testing.assert_close(lean[0], ref[0], rtol=0, atol=0)
    torch.testing.assert_close(lean[1], ref[1], rtol=1e-12, atol=1e-12)


def test_forms_it_does_not_recognise_run_as_torch_runs_them() -> None:
    """String padding and training-mode batch norm go to torch's own rules."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 3, 3, padding="same"), nn.BatchNorm2d(3, track_running_stats=False), nn.ReLU())
    x, v = torch.rand(4, 2, 6, 6), torch.randn(4, 2, 6, 6)
    with torch.no_grad():
        ref = torch.func.jvp(net, (x,), (v,))
        lean = jvp(net, x, v)
    assert torch.equal(lean[0], ref[0]) and torch.equal(lean[1], ref[1])


@pytest.mark.parametrize("chunk_size", [None, 7, 200])
def test_jvps_along_many_tangents_are_the_jvps_one_by_one(chunk_size: int | None) -> None:
    """Chunked or not (vmap cannot join chunks of an output that is the same for every tangent)."""
    net = _cnn(torch.float64)
    x = torch.rand(2, 2, 10, 10, dtype=torch.float64)
    tangents = torch.randn(20, 2, 2, 10, 10, dtype=torch.float64)
    with torch.no_grad():
        output, derivatives = jvps(net, x, tangents, chunk_size)
        one_by_one = [torch.func.jvp(net, (x,), (t,)) for t in tangents]
    assert torch.equal(output, one_by_one[0][0])
    assert derivatives.shape == (20, 2, 5)
    torch.testing.assert_close(derivatives, torch.stack([d for _, d in one_by_one]), rtol=1e-12, atol=1e-12)
    assert torch.equal(output, net(x))
