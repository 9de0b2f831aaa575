"""The one gradient engine (probust.linearisation.pullback): pulls of cotangents from one forward pass, the
strategies, and the narrow test that reads an error as "torch.func cannot trace this"."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from probust.linearisation import head as linear_head
from probust.linearisation import pullback as gradients
from probust.linearisation.pullback import (
    VMAP_STEP,
    Pullback,
    TraceFallbackWarning,
    cannot_trace,
    features_and_logits,
    forward_jacobian,
    forward_mode_runs,
)
from tests._helpers import OldStyleSquare


def _net(classes: int = 7, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 9), nn.Tanh(), nn.Linear(9, classes)).eval()


def _jacobian(fn, x: torch.Tensor) -> torch.Tensor:
    """[B, F, *S]: the Jacobian of a row-wise function by autograd.functional (the oracle)."""
    return torch.autograd.functional.jacobian(lambda v: fn(v).sum(0), x).transpose(0, 1)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
@pytest.mark.parametrize("with_head", [True, False])
def test_pulls_are_the_transposed_jacobian_applied_to_the_cotangents(strategy, with_head):
    model = _net()
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1))
    head = linear_head.find_linear_head(model, x[:1]) if with_head else None
    assert (head is model[-1]) == with_head
    features_of = model[:3] if with_head else model
    expected_jacobian = _jacobian(features_of, x)  # [B, F, 3, 4]
    pulled = Pullback(model, x, head, strategy=strategy)
    torch.testing.assert_close(pulled.logits, model(x))
    torch.testing.assert_close(pulled.features, features_of(x))
    # More cotangents than one vmapped step, so the padding of the last step is exercised.
    count = VMAP_STEP + 3
    cotangents = torch.randn(count, 5, pulled.features.shape[1], generator=torch.Generator().manual_seed(2))
    got = pulled.pull(cotangents)
    assert got.shape == (5, count, 3, 4)
    expected = torch.einsum("kbf,bfij->bkij", cotangents, expected_jacobian)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_one_forward_pass_serves_any_number_of_pulls(strategy):
    model = _net()
    calls = []
    model[1].register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(4, 3, 4)
    pulled = Pullback(model, x, linear_head.find_linear_head(model, x[:1]), strategy=strategy)
    calls.clear()
    first = pulled.pull(torch.ones(2, 4, 9))
    second = pulled.pull(torch.ones(2, 4, 9))
    assert calls == [] and torch.equal(first, second)
    assert pulled.pull(torch.ones(0, 4, 9)).shape == (4, 0, 3, 4)


def test_features_and_logits_swap_the_heads_output_for_its_input_and_restore_the_model():
    model = _net()
    x = torch.randn(3, 3, 4)
    head = linear_head.find_linear_head(model, x[:1])
    features, logits = features_and_logits(model, head)(x)
    torch.testing.assert_close(features, model[:3](x))
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(model(x), logits)  # the hook is gone: the model returns logits again
    plain_features, plain_logits = features_and_logits(model, None)(x)
    assert plain_features is plain_logits


def test_models_torch_func_cannot_trace_fall_back_to_the_loop_with_one_warning():
    model = torch.jit.trace(_net(), torch.randn(2, 3, 4))
    x = torch.randn(4, 3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vmapped = Pullback(model, x, None, strategy="vmap")
        Pullback(model, x, None, strategy="vmap")
    fallbacks = [w for w in caught if "one backward pass per cotangent" in str(w.message)]
    assert len(fallbacks) <= 1  # once per model class and process (maybe earlier in the session)
    looped = Pullback(model, x, None, strategy="loop")
    cotangents = torch.randn(3, 4, 7)
    torch.testing.assert_close(vmapped.pull(cotangents), looped.pull(cotangents))


@pytest.mark.parametrize("pull", ["pullback", "linearise"])
def test_vmapped_pulls_keep_no_graph_back_to_the_parameters(pull):
    """Detached gradients must not make autograd record each vmapped chunk: with the parameters
    requiring grad, every chunk would keep its saved activations alive until the end (a 2-layer
    ViT-B/16 kept 260 MB per 8 cotangents and ran out of 24 GB at d = 768). What the pull saves
    for backward (counted by autograd's saved-tensor hooks) must not grow with the cotangents."""
    model = _net()
    x = torch.randn(4, 3, 4, generator=torch.Generator().manual_seed(0))

    def saved(count: int) -> int:
        cotangents = torch.randn(count, 4, 7, generator=torch.Generator().manual_seed(1))
        packed = [0]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            packed[0] += 1
            return tensor

        if pull == "pullback":
            pulled = Pullback(model, x, None, strategy="vmap")  # its one forward pass saves activations
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                grads = pulled.pull(cotangents)
        else:  # torch.func's vjp refuses saved-tensor hooks: the graph shows as requires_grad
            grads = gradients.pull(
                model, x.flatten(1), lambda logits: cotangents, strategy="vmap", chunk_size=VMAP_STEP
            )[1]
            grads = grads.view(4, count, 3, 4)
        assert grads.shape == (4, count, 3, 4) and not grads.requires_grad
        return packed[0]

    assert saved(VMAP_STEP) == saved(16 * VMAP_STEP)
    if pull == "linearise":  # asked for differentiable gradients, it still records them
        ones = lambda logits: torch.ones(2, 4, 7)  # noqa: E731
        assert gradients.pull(model, x.flatten(1), ones, strategy="vmap", differentiable=True)[1].requires_grad


def test_cannot_trace_reads_torch_funcs_own_errors_and_nothing_else():
    """The fallback's condition: torch.func's error about a transform (caught from the real
    failure) or a NotImplementedError; a TypeError, an AttributeError or a RuntimeError of
    shapes is a bug, in probust or the model, and must propagate."""
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError) as real:
        torch.func.vjp(lambda t: OldStyleSquare.apply(t), x)
    assert cannot_trace(real.value)
    flash = NotImplementedError("Trying to use forward AD with _scaled_dot_product_flash_attention_for_cpu")
    assert cannot_trace(flash)
    assert not cannot_trace(TypeError("unsupported operand type(s) for +: 'Tensor' and 'NoneType'"))
    assert not cannot_trace(AttributeError("'NoneType' object has no attribute 'shape'"))
    assert not cannot_trace(RuntimeError("mat1 and mat2 shapes cannot be multiplied (3x4 and 5x6)"))
    assert not cannot_trace(ValueError("vmap"))  # not a RuntimeError: a value the code refused


class _TypeErrorInside(nn.Module):
    def forward(self, x):
        return x + None  # a bug: a TypeError on every path


@pytest.mark.parametrize("strategy", ["vmap", "forward"])
def test_a_bug_in_the_model_is_raised_as_it_is_not_read_as_a_tracing_limit(strategy):
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceFallbackWarning)  # no fallback was tried
        with pytest.raises(TypeError, match="unsupported operand"):
            if strategy == "vmap":
                Pullback(_TypeErrorInside(), x, None, strategy="vmap")
            else:
                forward_jacobian(_TypeErrorInside(), x)
        with pytest.raises(TypeError, match="unsupported operand"):
            forward_mode_runs(_TypeErrorInside(), x)


def test_a_model_torch_func_cannot_transform_falls_back_with_the_same_gradients():
    class Square(nn.Module):
        def forward(self, x):
            return OldStyleSquare.apply(x) @ torch.ones(4, 3)

    model, x = Square(), torch.randn(2, 4)
    cotangents = torch.randn(5, 2, 3)
    with pytest.warns(TraceFallbackWarning):
        vmapped = Pullback(model, x, None, strategy="vmap")
    looped = Pullback(model, x, None, strategy="loop")
    assert torch.equal(vmapped.pull(cotangents), looped.pull(cotangents))  # it is the loop
    logits, jacobian = forward_jacobian(model, x)  # forward mode cannot run: the loop's Jacobian
    torch.testing.assert_close(jacobian, (2 * x)[:, None, :].expand(2, 3, 4))
    assert not forward_mode_runs(model, x)


class _ItemInBackward(torch.autograd.Function):
    """Transformable (it has setup_context), but its backward reads a value with .item(), which
    vmap cannot batch: torch.func.vjp works and only the vmapped pullback fails."""

    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad * (2.0 if grad.abs().max().item() >= 0 else 0.0)


class _DoubleThenLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(_ItemInBackward.apply(x))


def test_a_pullback_vmap_cannot_batch_falls_back_when_pulled():
    torch.manual_seed(0)
    model, x = _DoubleThenLinear().eval(), torch.randn(2, 4)
    cotangents = torch.randn(3, 2, 3)
    vmapped = Pullback(model, x, None, strategy="vmap")  # the vjp itself works
    with pytest.warns(TraceFallbackWarning, match="one backward pass per cotangent"):
        got = vmapped.pull(cotangents)
    assert torch.equal(got, Pullback(model, x, None, strategy="loop").pull(cotangents))
    assert torch.equal(vmapped.pull(cotangents), got)  # later pulls take the loop, without a warning
    with pytest.raises(RuntimeError, match="item"):  # fallback=False: torch's error (as timing wants)
        Pullback(model, x, None, strategy="vmap", fallback=False).pull(cotangents)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_pull_keeps_the_graph_only_where_asked(strategy):
    """gradients.pull is one Pullback on the logits: differentiable keeps the graph to the
    parameters and to an input that requires grad (double backpropagation), else all detached."""
    model = _net()
    x = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(2))
    cot = gradients.unit_cotangents
    logits, grads = gradients.pull(model, x, cot, strategy=strategy)
    assert not logits.requires_grad and not grads.requires_grad and grads.shape == (3, 7, 3, 4)
    x_grad = x.clone().requires_grad_(True)
    logits, grads = gradients.pull(model, x_grad, cot, strategy=strategy, differentiable=True)
    assert logits.requires_grad and grads.requires_grad
    to_weight, to_input = torch.autograd.grad(grads.square().sum(), [model[1].weight, x_grad])
    assert to_weight.abs().sum() > 0 and to_input.abs().sum() > 0  # tanh'' != 0: both reach
    oracle = _jacobian(model, x)
    torch.testing.assert_close(grads.detach(), oracle, rtol=1e-5, atol=1e-6)
