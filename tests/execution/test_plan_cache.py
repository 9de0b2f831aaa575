"""The plan cache on disk is data, not trust: an entry edited by hand or written by another version
is checked against its plan's fields and types, and one that does not fit is measured again."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import probust
from probust.execution import plan_cache, tuning
from probust.execution.tuning import ForwardPlan
from probust.linearisation import JacobianPlan
from probust.linearisation.pullback import Strategy
from probust.models import build
from tests.execution._clock import freeze_planning_clock

GOOD_FORWARD = {"rows": 64, "channels_last": False}
GOOD_JACOBIAN = {"strategy": "loop", "rows": 32, "class_chunk": None, "channels_last": True}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv(plan_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(plan_cache, "_WARNED", set(), raising=False)  # what this process warned about
    return tmp_path / "plans.json"


def _write(path, plans) -> None:
    path.write_text(json.dumps({"version": plan_cache._VERSION, "plans": plans}))


def test_a_valid_entry_is_read_as_its_plan(cache):
    _write(cache, {"f": GOOD_FORWARD, "j": GOOD_JACOBIAN})
    model = nn.Linear(2, 2)

    assert plan_cache.lookup(model, "f", ForwardPlan) == ForwardPlan(64, False)
    assert plan_cache.lookup(model, "j", JacobianPlan) == JacobianPlan(Strategy.LOOP, 32, None, True)


BAD = {
    "rows as text": ("f", ForwardPlan, {"rows": "many", "channels_last": False}),
    "no rows": ("f", ForwardPlan, {"rows": 0, "channels_last": False}),
    "negative rows": ("f", ForwardPlan, {"rows": -3, "channels_last": False}),
    "rows as a bool": ("f", ForwardPlan, {"rows": True, "channels_last": False}),
    "rows as a float": ("f", ForwardPlan, {"rows": 2.5, "channels_last": False}),
    "channels_last as text": ("f", ForwardPlan, {"rows": 8, "channels_last": "yes"}),
    "an unknown strategy": ("j", JacobianPlan, {**GOOD_JACOBIAN, "strategy": "os.system"}),
    "class_chunk as a list": ("j", JacobianPlan, {**GOOD_JACOBIAN, "class_chunk": [1]}),
    "a field too many": ("f", ForwardPlan, {**GOOD_FORWARD, "exec": "print(1)"}),
    "a field missing": ("j", JacobianPlan, {"strategy": "loop", "rows": 4}),
    "a list, not an object": ("f", ForwardPlan, [64, False]),
}


@pytest.mark.parametrize("key, kind, entry", BAD.values(), ids=BAD.keys())
def test_an_entry_that_is_not_a_plan_is_dropped_with_one_warning(cache, key, kind, entry):
    _write(cache, {key: entry})
    model = nn.Linear(2, 2)

    with pytest.warns(UserWarning, match=rf"{cache}: a cached {kind.__name__} is not valid .*measured again"):
        assert plan_cache.lookup(model, key, kind) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same entry again: no second warning
        assert plan_cache.lookup(model, key, kind) is None


@pytest.mark.parametrize("text", ["{not json", json.dumps({"version": plan_cache._VERSION, "plans": [1, 2]}), "[]"])
def test_a_file_that_is_not_a_plans_file_is_ignored_with_one_warning(cache, text):
    cache.write_text(text)

    with pytest.warns(UserWarning, match=rf"{cache} is not a probust plans file"):
        assert plan_cache.lookup(nn.Linear(2, 2), "f", ForwardPlan) is None


def test_another_versions_file_is_measured_again_silently(cache):
    cache.write_text(json.dumps({"version": plan_cache._VERSION - 1, "plans": {"f": {"rows": "x"}}}))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan_cache.lookup(nn.Linear(2, 2), "f", ForwardPlan) is None


def test_a_bad_entry_under_a_models_key_is_measured_again_and_replaced(cache, monkeypatch):
    timed: list = []

    def fake_seconds(run, device):  # every timed call takes 0.1 ms: plans finish on a loaded machine
        timed.append(run)
        return 1e-4

    monkeypatch.setattr(tuning, "_seconds", fake_seconds)
    freeze_planning_clock(monkeypatch)  # and the allowance's clock stands still
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(300, 1, 12, 12)
    reference = probust.Taylor(model, 0.2)(x).p
    stored = json.loads(cache.read_text())["plans"]
    assert stored and timed
    _write(cache, {key: {**value, "rows": "lots"} for key, value in stored.items()})
    plan_cache.forget(model)
    measured = len(timed)

    with pytest.warns(UserWarning, match="is not valid"):
        again = probust.Taylor(model, 0.2)(x).p

    assert len(timed) > measured  # measured again
    torch.testing.assert_close(again, reference, rtol=0, atol=1e-6)
    fixed = json.loads(cache.read_text())["plans"]
    assert fixed.keys() == stored.keys() and all(isinstance(plan["rows"], int) for plan in fixed.values())
