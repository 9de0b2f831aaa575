"""One backward pass of a cotangent (probust.linearisation.pullback.pull_back): autograd's bits, no first-call import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from probust.linearisation.pullback import pull_back


def _cnn(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return (
        nn.Sequential(
            nn.Conv2d(1, 4, 3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(4 * 3 * 3, 6),
        )
        .eval()
        .to(dtype)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gradients_are_autograds_bit_for_bit(dtype):
    model = _cnn(dtype)
    x = torch.randn(5, 1, 8, 8, dtype=dtype, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    out = model(x)
    for k in range(3):
        cotangent = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(10 + k))
        (ours,) = pull_back(out, x, cotangent, retain_graph=True)
        (theirs,) = torch.autograd.grad(out, x, cotangent, retain_graph=True)
        assert torch.equal(ours, theirs)


def test_a_cotangent_of_another_dtype_is_cast_as_autograd_casts_it():
    model = _cnn(torch.float32)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    out = model(x)
    cotangent = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (ours,) = pull_back(out, x, cotangent, retain_graph=True)
    (theirs,) = torch.autograd.grad(out, x, cotangent.float())
    assert ours.dtype == torch.float32 and torch.equal(ours, theirs)


def test_second_derivatives_flow_as_through_autograd():
    # create_graph: the gradient-norm penalty of robust training differentiates the gradients.
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(5)).requires_grad_(True)
    cotangent = torch.randn(4, 3, generator=torch.Generator().manual_seed(6))
    weight = model[0].weight
    out = model(x)
    (ours,) = pull_back(out, x, cotangent, retain_graph=True, create_graph=True)
    (theirs,) = torch.autograd.grad(out, x, cotangent, retain_graph=True, create_graph=True)
    assert torch.equal(ours, theirs)
    (d_ours,) = torch.autograd.grad(ours.square().sum(), weight, retain_graph=True)
    (d_theirs,) = torch.autograd.grad(theirs.square().sum(), weight)
    torch.testing.assert_close(d_ours, d_theirs, rtol=1e-6, atol=1e-7)


def test_unused_inputs_and_shape_mismatches():
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    out = a * 2.0
    grad_a, grad_b = pull_back(out, [a, b], torch.ones(3), allow_unused=True, retain_graph=True)
    assert torch.equal(grad_a, torch.full((3,), 2.0)) and grad_b is None
    with pytest.raises(ValueError, match="cotangent shape"):
        pull_back(out, a, torch.ones(4))


def test_taylor_and_mmse_in_a_fresh_process_import_no_symbolic_shapes():
    # torch.autograd.grad with a tensor grad_outputs imports torch.fx's symbolic shapes and sympy
    # on its first call in a process (about 0.85 s): a first use the paper's loop never pays.
    script = textwrap.dedent(
        """
        import sys, torch
        from torch import nn
        import probust
        model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10)).eval()
        x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        probust.Taylor(model, 0.1, execution=probust.Execution(jacobian="loop"))(x)
        probust.MMSE(model, 0.1, n_samples=4, execution=probust.Execution(jacobian="loop"))(x)
        print(sorted(m for m in ("torch.fx.experimental.symbolic_shapes", "sympy") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_pull_inside_no_grad_still_runs_as_autograds_does():
    # A custom Function's backward runs without grad mode; the graph it pulls through was recorded.
    x = torch.randn(4, requires_grad=True)
    with torch.enable_grad():
        out = x.sin()
    cotangent = torch.randn(4, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        (ours,) = pull_back(out, x, cotangent, retain_graph=True)
        (theirs,) = torch.autograd.grad(out, x, cotangent)
    assert torch.equal(ours, theirs)
