"""Facts kept per model object (row costs, plans, whether forward mode runs) are dropped when the
model's structure changes in place, as it does in a notebook: the next call computes what a fresh
model object with the same modules computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust
from probust._user_model import PerModel, structure_token, weights_in_format
from probust.execution import Execution
from probust.linearisation.pullback import forward_mode_runs

# The toy nets' points may be flagged by the trust check; that is not at issue here.
pytestmark = pytest.mark.filterwarnings("ignore::probust.LinearisationWarning")

#: Fixed plans (nothing timed), so that two calls can be compared bit for bit.
FIXED = dict(execution=Execution(jacobian="loop", batch_size=8, channels_last=False), seed=0)


def _net(classes: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, classes)
    )


def test_the_token_changes_with_the_structure_and_not_with_the_values():
    model = _net(500).eval()
    token = structure_token(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # a training step
    model.load_state_dict(_net(500).state_dict())
    with weights_in_format(model, True):  # probust's own channels_last swap of the weights' storage
        assert structure_token(model) == token
    assert structure_token(model) == token
    model[5] = nn.Linear(32, 10)  # a new head
    assert structure_token(model) != token
    token = structure_token(model)
    model[1] = nn.GELU()  # a layer without parameters swapped for another
    assert structure_token(model) != token
    token = structure_token(model)
    model.double()
    assert structure_token(model) != token


def test_a_model_s_entries_are_empty_once_its_structure_changed():
    kept: PerModel[int] = PerModel()
    model = _net(500)
    kept.put(model, "shape", 1)
    assert kept.get(model, "shape") == 1 and kept.holds(model)
    model[5] = nn.Linear(32, 10)
    assert kept.get(model, "shape") is None and not kept.holds(model)
    unheld = _Slotted()  # a callable model that cannot be held weakly keeps nothing, and fails nothing
    kept.put(unheld, "shape", 2)
    assert kept.get(unheld, "shape") is None


class _Slotted:
    __slots__ = ()

    def __call__(self, x):
        return x


def test_a_new_head_in_place_gives_what_a_fresh_model_with_the_same_modules_gives():
    model = _net(500).eval()
    x = torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    probust.Taylor(model, 0.5, **FIXED)(x)  # the 500-class model's facts kept
    assert Execution.classes(model, x) == 500
    torch.manual_seed(2)
    model[5] = nn.Linear(32, 10)
    assert Execution.classes(model, x) == 10
    again = probust.Taylor(model, 0.5, **FIXED)(x)
    fresh = probust.Taylor(nn.Sequential(*model).eval(), 0.5, **FIXED)(x)
    assert 0.05 < float(again.p.min()) and float(again.p.max()) < 0.999  # not a trivial p
    assert torch.equal(again.p, fresh.p)
    assert torch.equal(again.route, fresh.route)


class _NoForwardMode(torch.autograd.Function):
    """The identity, with a backward pass but no forward-mode rule."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Opaque(nn.Module):
    def forward(self, x):
        return _NoForwardMode.apply(x)


def test_whether_forward_mode_runs_is_asked_again_once_a_layer_is_swapped():
    model = _net(10).eval()
    x = torch.rand(2, 3, 4, 4)
    assert forward_mode_runs(model, x)
    model[1] = _Opaque()
    assert not forward_mode_runs(model, x)


def test_an_estimator_built_before_model_bfloat16_reads_the_model_again():
    # The estimator kept how to run the float32 model (its inputs as they are); in bfloat16 the
    # model needs its inputs cast at its input, which a fresh estimator does.
    model = _net(10).eval()
    x = torch.rand(4, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    kept = probust.Taylor(model, 0.5, **FIXED)
    kept(x)
    model.bfloat16()
    again = kept(x)
    fresh = probust.Taylor(model, 0.5, **FIXED)(x)
    assert torch.equal(again.p, fresh.p)


def _first_ten(model: nn.Sequential):
    return lambda x: nn.Sequential.forward(model, x)[:, :10]


def test_a_forward_replaced_on_the_model_or_a_forward_hook_is_a_new_structure():
    model = _net(500).eval()
    token = structure_token(model)
    model.forward = _first_ten(model)  # type: ignore[method-assign]
    assert structure_token(model) != token
    del model.forward
    assert structure_token(model) == token
    handle = model[5].register_forward_hook(lambda module, args, out: out[:, :10])
    assert structure_token(model) != token
    handle.remove()
    assert structure_token(model) == token


def test_a_forward_replaced_in_place_gives_what_a_fresh_model_with_the_same_forward_gives():
    model = _net(500).eval()
    x = torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    probust.Taylor(model, 0.5, **FIXED)(x)  # the 500-class model's facts kept
    model.forward = _first_ten(model)  # type: ignore[method-assign]
    assert Execution.classes(model, x) == 10
    again = probust.Taylor(model, 0.5, **FIXED)(x)
    fresh_model = nn.Sequential(*model).eval()
    fresh_model.forward = _first_ten(fresh_model)  # type: ignore[method-assign]
    fresh = probust.Taylor(fresh_model, 0.5, **FIXED)(x)
    assert 0.05 < float(again.p.min()) and float(again.p.max()) < 0.999  # not a trivial p
    assert torch.equal(again.p, fresh.p)
