"""How the work runs on a machine: memory budgets (:mod:`~probust.execution.budget`), measured
execution plans (:mod:`~probust.execution.tuning`: rows per pass, Jacobian strategy, memory
format) and their on-disk cache (:mod:`~probust.execution.plan_cache`)."""
