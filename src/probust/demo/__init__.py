"""``probust demo``: the paper's evaluation end to end on Fashion-MNIST, in minutes on a CPU.

The pipeline (every step reuses what an earlier run with the same settings left on disk):

1. **Train** the paper's Fashion-MNIST models: the linear model and the CNN, and a small robust
   family, the same CNN trained with gradient-norm regularisation at a few lambdas (the CNN at
   lambda = 0 is both the main CNN and the family's first member); and, beyond the paper, the
   same CNN trained with the robust loss CE + mu * mean(-log p_robust) (:class:`probust.RobustLoss`
   at ``robust_sigma``, one model per ``robust_mus``), compared with the family at matched
   accuracy by the last experiment. A checkpoint whose name encodes its settings is reused when
   it exists.
2. **Score** the first ``points`` test images at several sigma with every estimator into one
   results folder per model (:func:`probust.run.run_estimate`): Monte Carlo at a modest n,
   MMSE at N copies (the family members and the robust-loss CNNs with mc, taylor, mmse and
   softmax); for the main models also a convergence subset (Monte Carlo up to 10^4 or
   10^5 samples, MMSE N = 1 ... 100), and for the main CNN a larger pool scored with MMSE and
   softmax at one sigma, for the image grids and the case study.
3. **Certify** (beyond the paper) the first ``certify_points`` test images of the main CNN and
   of each robust-loss CNN by randomized smoothing at ``certify_sigma`` (Cohen et al.'s CERTIFY,
   :func:`probust.run.run_certify`, with the Taylor estimate of the radius beside it), each into
   a ``<model>-certify`` folder beside the model's results folder.
4. **Report**: every experiment (:mod:`probust.experiments`) on those folders, and
   ``report.html`` (:mod:`probust.report`).

Models are trained and scored in ``jobs`` worker processes with ``threads`` torch threads each
(default 2 and 1): the numbers do not depend on either, only on the seed and the settings. When
Fashion-MNIST is not on the machine the demo says so and uses scikit-learn's digits instead.

The library prints nothing: progress goes to the ``say`` and ``on_output`` callbacks of
:func:`run_demo` (``probust demo`` passes printers, and prints the summary).

Modules: :mod:`~probust.demo.settings` (:class:`DemoConfig`), :mod:`~probust.demo.specs`
(:class:`ModelSpec`, one per model, and the results folders' grid key), :mod:`~probust.demo.worker`
(the work of one model) and :mod:`~probust.demo.pipeline` (:func:`run_demo`).

Example:
    >>> summary = probust.demo.run_demo(out="runs/demo", say=print)
    >>> summary.report.path
"""

from probust.demo.pipeline import DemoSummary, run_demo
from probust.demo.settings import FAMILY_METHODS, PAPER_METHODS, DemoConfig, DemoConfigError, check_config, config_for
from probust.demo.specs import (
    GRID_FILE,
    CertifyRequest,
    ModelSpec,
    RobustLossSpec,
    ScoreRequest,
    certify_key,
    grid_key,
    model_specs,
)

__all__ = [
    "FAMILY_METHODS",
    "GRID_FILE",
    "CertifyRequest",
    "PAPER_METHODS",
    "DemoConfig",
    "DemoConfigError",
    "DemoSummary",
    "ModelSpec",
    "RobustLossSpec",
    "ScoreRequest",
    "certify_key",
    "check_config",
    "config_for",
    "grid_key",
    "model_specs",
    "run_demo",
]
