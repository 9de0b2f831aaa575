"""Optional dependencies: which extra installs what, and the error that names it.

``pip install probust`` installs the core (torch, numpy, scipy): the estimators, ``mvn_cdf`` /
``mvn_sf``, the noise models, ``probust.estimate`` and ``probust.certify``. Everything else is
an extra (``pip install 'probust[run]'``); a module that needs one imports it through
:func:`import_extra` (or checks with :func:`require`), so that a missing package is reported
as the extra to install, never as a bare ``No module named 'pandas'``.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from probust.errors import ProbustError

#: The extras and what each adds (pyproject.toml's ``[project.optional-dependencies]``).
EXTRAS: dict[str, str] = {
    "run": "the runner, its results store and progress bars (probust.run_estimate, `probust estimate`)",
    "report": "the experiments' figures and the HTML report (`probust report`, `probust demo`)",
    "data": "the built-in data sets, image folders and the resnet18 architecture",
    "hf": "Hugging Face image classifiers (--model hf:NAME, the vit architecture)",
    "metrics": "the torchmetrics metric for validation loops (probust.metrics.AverageCaseRobustness)",
    "lightning": "the Lightning callback that logs it (probust.metrics.RobustnessCallback)",
    "cleanlab": "the label-issue benchmark's comparison (benchmarks/bench_label_issues.py)",
    "all": "every extra",
}

#: Top-level module -> the extra that installs it.
MODULE_EXTRAS: dict[str, str] = {
    "pandas": "run",
    "pyarrow": "run",
    "tqdm": "run",
    "matplotlib": "report",
    "torchvision": "data",
    "sklearn": "data",
    "PIL": "data",
    "transformers": "hf",
    "torchmetrics": "metrics",
    "lightning": "lightning",
    "cleanlab": "cleanlab",
}


class MissingExtraError(ProbustError, ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it.

    A :class:`~probust.errors.ProbustError` and a :class:`ModuleNotFoundError` (hence an
    :class:`ImportError`), with ``name`` the missing module and ``extra`` the extra to install.
    """

    def __init__(self, module: str, extra: str, feature: str | None = None) -> None:
        self.extra = extra
        self.feature = feature
        what = feature or "this part of probust"
        super().__init__(
            f"{what} needs the {extra!r} extra ({module} is not installed): pip install 'probust[{extra}]' "
            "(or 'probust[all]' for everything)"
        )
        self.name = module


def _extra_of(module: str, extra: str | None) -> str:
    return extra or MODULE_EXTRAS.get(module.partition(".")[0], "all")


def import_extra(module: str, *, extra: str | None = None, feature: str | None = None) -> ModuleType:
    """``importlib.import_module(module)``, or a :class:`MissingExtraError` naming the extra.

    Args:
        module: the module to import ("pandas", "torchvision.datasets").
        extra: the extra to name (default: the one that installs ``module``, see :data:`MODULE_EXTRAS`).
        feature: what needs it, for the message ("probust estimate").
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if exc.name is None or exc.name.partition(".")[0] != top:
            raise  # the module is there but one of its own imports is broken: not a missing extra
        raise MissingExtraError(top, _extra_of(module, extra), feature) from exc


def require(*modules: str, extra: str | None = None, feature: str | None = None) -> None:
    """Check that ``modules`` are installed, without importing them.

    Raises:
        MissingExtraError: for the first missing module, naming ``extra`` (default: the extra
            that installs that module).
    """
    for module in modules:
        if importlib.util.find_spec(module.partition(".")[0]) is None:
            raise MissingExtraError(module.partition(".")[0], _extra_of(module, extra), feature)


def missing_extra(exc: BaseException, feature: str | None = None) -> MissingExtraError | None:
    """``exc`` as a :class:`MissingExtraError` if it reports an extra's module as missing, else None.

    For the command line: a bare ``ModuleNotFoundError`` for pandas, matplotlib, ... raised
    anywhere below becomes the message naming the extra to install.
    """
    if isinstance(exc, MissingExtraError):
        return exc
    if isinstance(exc, ModuleNotFoundError) and exc.name is not None:
        top = exc.name.partition(".")[0]
        if top in MODULE_EXTRAS:
            return MissingExtraError(top, MODULE_EXTRAS[top], feature)
    return None
