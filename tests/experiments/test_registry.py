"""probust.experiments.registry and running experiments by name."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from probust import experiments
from probust.experiments import registry
from probust.experiments.base import Experiment, ExperimentSkipped
from probust.experiments.registry import Registry


def test_unknown_experiment_names_are_refused(results, out_dir):
    with pytest.raises(ValueError, match="unknown experiment"):
        experiments.run("nope", results, out_dir)
    assert len(experiments.EXPERIMENTS) == 12
    # titles are numbered in the registry's order
    assert [experiments.describe(n)[0].split(".")[0] for n in experiments.EXPERIMENTS] == [str(i) for i in range(1, 13)]


class Dummy(Experiment):
    name = "dummy"
    title = "13. A test-local experiment"
    description = "nothing"

    def run(self, results, out):
        raise ExperimentSkipped("nothing to do")


def test_every_builtin_module_defines_the_experiment_registered_under_its_name():
    assert registry.BUILTIN == experiments.EXPERIMENTS
    for name in registry.BUILTIN:
        module = importlib.import_module(f"probust.experiments.{name}")
        assert isinstance(module.EXPERIMENT, Experiment) and module.EXPERIMENT.name == name
        assert experiments.REGISTRY.get(name) is module.EXPERIMENT and experiments.get(name) is module.EXPERIMENT
        assert experiments.describe(name) == (module.EXPERIMENT.title, module.EXPERIMENT.description)


def test_a_registered_experiment_comes_last_and_can_be_removed():
    reg = Registry(["estimation_error"])
    dummy = reg.register(Dummy())
    assert reg.names() == ("estimation_error", "dummy") and reg.get("dummy") is dummy and list(reg)[-1] is dummy
    assert "dummy" in reg and len(reg) == 2
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Dummy())
    with pytest.raises(TypeError, match="must be an Experiment"):
        reg.register("dummy")  # type: ignore[arg-type]  # the wrong type on purpose
    reg.unregister("dummy")
    assert reg.names() == ("estimation_error",)
    with pytest.raises(ValueError, match="unknown experiment 'dummy'; known: estimation_error"):
        reg.get("dummy")


def test_experiments_and_run_all_follow_what_is_registered_now(results, tmp_path):
    experiments.REGISTRY.register(Dummy())
    try:
        assert experiments.EXPERIMENTS[-1] == "dummy" and len(experiments.EXPERIMENTS) == len(registry.BUILTIN) + 1
        outputs = experiments.run_all(results, tmp_path, skip=registry.BUILTIN)
        assert [(o.name, o.title, o.skipped) for o in outputs] == [("dummy", Dummy.title, "nothing to do")]
    finally:
        experiments.REGISTRY.unregister("dummy")
    assert experiments.EXPERIMENTS == registry.BUILTIN


def test_listing_the_names_imports_no_experiment():
    code = (
        "import sys; from probust import experiments; names = experiments.EXPERIMENTS; "
        "print(sorted(n for n in names if f'probust.experiments.{n}' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert done.stdout.strip() == "[]"


def test_the_experiments_that_measure_or_train_say_so():
    assert [e.name for e in experiments.REGISTRY if e.measuring] == ["runtime", "case_study"]
