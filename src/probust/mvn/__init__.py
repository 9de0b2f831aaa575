"""Batched multivariate normal probabilities in torch.

- :func:`mvn_cdf`: P(X <= upper) for X ~ N(0, cov), differentiable, to an absolute tolerance.
- :func:`mvn_sf`: its complement P(X_i > upper_i for some i), to a relative tolerance.

Modules: ``cdf`` and ``sf`` (the two functions), ``problem`` (checked, standardised inputs;
``checks``), ``bivariate`` (closed form for k <= 2), ``genz`` (Genz's transform and integrand),
``qmc`` (adaptive randomised quasi-Monte Carlo), ``sobol`` (scrambled Sobol' points),
``numerics`` (batch-independent primitives). Derivations and measurements: docs/mvn.md.

The rest of probust imports the names below from ``probust.mvn``, never from the modules
underneath (``lint-imports`` checks it); :func:`ndtr` is the univariate CDF the screenings
share, :func:`add_rows` the order-fixed sum into slots that MMSE's averages and the metrics use.
"""

from probust.mvn.cdf import mvn_cdf
from probust.mvn.numerics import add_rows, ndtr
from probust.mvn.problem import DEFAULT_TOL
from probust.mvn.sf import mvn_sf

__all__ = ["DEFAULT_TOL", "add_rows", "mvn_cdf", "mvn_sf", "ndtr"]
