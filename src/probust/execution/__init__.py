"""How the work runs on a machine, apart from what it computes.

:class:`Execution` (:mod:`~probust.execution.engine`) is the one object an estimator runs by:
rows per pass, memory budget, memory format and Jacobian strategy, turned into plans for a
model and a batch. Underneath: memory budgets and row costs (:mod:`~probust.execution.budget`),
measured plans (:mod:`~probust.execution.tuning`: each timed on the call's own work), the declared
costs the gradient routes are chosen by (:mod:`~probust.execution.cost_model`), and the cache that
keeps what was measured per model and on disk (:mod:`~probust.execution.plan_cache`).
"""

from probust.execution.engine import Execution

__all__ = ["Execution"]
