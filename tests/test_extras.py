"""A light core: ``import probust`` needs torch, numpy and scipy only, and a missing extra is named.

The extras' packages are installed here (the suite runs with ``[all,dev]``), so these tests hide
them: a child interpreter whose import system refuses pandas, matplotlib, ... as if they were
not installed. ``tests/core_only/check_core.py`` proves the same in a venv that truly lacks them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from probust._extras import EXTRAS, MODULE_EXTRAS, MissingExtraError, import_extra, missing_extra, require
from tests._helpers import child_without

ROOT = Path(__file__).resolve().parents[1]

#: The modules of the core: what ``pip install probust`` gives.
CORE_MODULES = (
    "probust",
    "probust.estimators",
    "probust.mvn",
    "probust.noise",
    "probust.execution",
    "probust.smoothing",
    "probust.linearisation.pullback",
    "probust.linearisation.head",
    "probust.training.robust_loss",
    "probust._user_model",
    "probust._checks",
    "probust._progress",
)


def _child(code: str, hidden=tuple(MODULE_EXTRAS), args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return child_without(code, hidden, cwd=ROOT, args=args)


def test_the_core_imports_none_of_the_extras_packages():
    # torch itself imports tqdm when it is there (torch.hub): count what probust adds after torch
    code = f"""
        import importlib, sys, torch
        before = set(sys.modules)
        for module in {CORE_MODULES!r}:
            importlib.import_module(module)
        added = {{m.partition(".")[0] for m in set(sys.modules) - before}}
        print(sorted(added & {set(MODULE_EXTRAS)!r}))
    """
    shown = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "[]"


def test_the_core_works_with_every_extra_hidden():
    result = _child(
        """
        import torch, probust
        model = torch.nn.Linear(4, 3)
        x = torch.randn(5, 4)
        for est in (probust.Taylor(model, 0.1), probust.MMSE(model, 0.1, n_samples=2), probust.Softmax(model)):
            assert est(x).p.shape == (5,)
        assert probust.estimate(model, x, 0.1, "mc", n_samples=100).shape == (5,)
        assert probust.certify(model, x, 0.25, n0=10, n=100).radius.shape == (5,)
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("code", "extra"),
    [
        ("probust.run_estimate", "run"),
        ("import probust.experiments", "report"),
        ("import probust.report", "report"),
        ("probust.data.load('digits')", "data"),
        ("probust.models.ResNet18()", "data"),
        ("from probust._progress import progress\nwith progress(3, 'points', True): pass", "run"),
    ],
)
def test_a_missing_extra_is_named_in_the_error(code, extra):
    result = _child(
        f"""
        import probust, probust.data, probust.models
        from probust._extras import MissingExtraError
        try:
            exec({code!r})
        except MissingExtraError as exc:
            print(exc.extra, "|", exc)
        """
    )
    assert result.returncode == 0, result.stderr
    named, _, message = result.stdout.partition("|")
    assert named.strip() == extra
    assert f"pip install 'probust[{extra}]'" in message


_MAIN = "import sys\nfrom probust.cli import main\nsys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("estimate", "--data", "digits", "--model", "linear", "--sigma", "0.1", "--out", "{tmp}/out"), "run"),
        (("report", "{tmp}", "--only", "runtime"), "report"),
    ],
)
def test_the_command_line_names_the_extra_to_install(tmp_path, args, extra):
    result = _child(_MAIN, args=tuple(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"probust {args[0]}: error:"), result.stderr
    assert f"pip install 'probust[{extra}]'" in result.stderr and "Traceback" not in result.stderr


def test_the_command_line_lists_every_command_without_the_extras():
    result = _child(_MAIN, args=("--help",))
    assert result.returncode == 0, result.stderr
    for command in ("estimate", "train", "report", "demo"):
        assert f"    {command}" in result.stdout
    assert "pip install 'probust[report]'" in result.stdout


def test_import_extra_and_require_name_the_extra():
    assert import_extra("math").sqrt(4) == 2
    require("math", "json")
    with pytest.raises(MissingExtraError, match=r"plotting needs the 'report' extra .*pip install 'probust\[report\]'"):
        import_extra("probust_no_such_package", extra="report", feature="plotting")
    with pytest.raises(MissingExtraError) as info:
        require("json", "probust_no_such_package.sub", extra="run")
    assert info.value.name == "probust_no_such_package" and info.value.extra == "run"
    assert isinstance(info.value, ImportError)


def test_missing_extra_turns_a_bare_module_error_into_the_named_extra():
    error = missing_extra(ModuleNotFoundError("No module named 'pyarrow.parquet'", name="pyarrow.parquet"), "x")
    assert error is not None and error.extra == "run" and "pip install 'probust[run]'" in str(error)
    assert missing_extra(ModuleNotFoundError("No module named 'foo'", name="foo")) is None
    assert missing_extra(ValueError("pandas")) is None


def test_the_extras_in_pyproject_match_the_modules_that_need_them():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = lambda deps: {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in deps}
    assert names(project["dependencies"]) == {"torch", "numpy", "scipy"}
    optional = project["optional-dependencies"]
    assert set(EXTRAS) <= set(optional) and set(MODULE_EXTRAS.values()) <= set(optional)
    distribution = {"sklearn": "scikit-learn", "PIL": "pillow"}
    for module, extra in MODULE_EXTRAS.items():
        assert distribution.get(module, module).lower() in names(optional[extra]), (module, extra)
    assert optional["report"][0] == "probust[run]" and optional["all"] == [
        "probust[run,report,data,hf,metrics,lightning,cleanlab]"
    ]


def test_the_lazy_names_are_listed_by_dir_for_tab_completion():
    import probust

    assert {"score", "find_issues", "run_estimate", "plots", "issues"} <= set(dir(probust))


def test_the_subpackages_in_the_docs_are_attributes_of_a_fresh_import():
    # probust.issues.Tracker as docs/issues.md writes it, in a process where nothing imported it.
    code = "import probust; print(probust.issues.Tracker.__name__, probust.metrics.__name__, probust.data.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Tracker", "probust.metrics", "probust.data"]
