"""How the work runs on a machine, apart from what it computes.

:class:`Execution` (:mod:`~probust.execution.engine`) is the one object an estimator runs by:
rows per pass, memory budget, memory format and Jacobian strategy, turned into plans for a
model and a batch. It hands the batch down as :class:`~probust.execution.engine.Inputs`, its
description and first row. Underneath: memory budgets and row costs
(:mod:`~probust.execution.budget`) and the plans declared from them
(:mod:`~probust.execution.plans`: rows per pass, memory format, loop or vmap; nothing is timed).
The passes it plans are :mod:`probust.linearisation`'s (its strategies and declared costs), one
layer down.

The rest of probust enters through this door only: it imports the names below from
``probust.execution``, never from the modules underneath (``lint-imports`` checks it), and an
estimator asks :class:`Execution` for all it needs (plans, C, the declared costs) before its maths.
"""

from probust.execution.budget import check_budget, peak_memory, resolve_budget
from probust.execution.engine import EXECUTION_SETTINGS, Execution
from probust.execution.plans import JACOBIANS, ForwardPlan, sync

__all__ = [
    "EXECUTION_SETTINGS",
    "JACOBIANS",
    "Execution",
    "ForwardPlan",
    "check_budget",
    "peak_memory",
    "resolve_budget",
    "sync",
]
