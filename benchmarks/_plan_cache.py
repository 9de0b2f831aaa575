"""Plans measured within one benchmark run: a temporary plan cache unless PROBUST_CACHE_DIR is set.

probust keeps the execution plans it measures on disk (``probust.execution.plan_cache``). A
benchmark reading them would time whatever plans earlier runs stored (another route, another
commit), so its rows would depend on what ran before it: an MMSE row once timed a reverse-mode
plan stored by an earlier run. A caller that sets PROBUST_CACHE_DIR (``off`` included) keeps it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

_ENV = "PROBUST_CACHE_DIR"


@contextlib.contextmanager
def plans_of_this_run() -> Iterator[None]:
    """Run the block with an empty plan cache of its own (removed after), unless one is set."""
    if os.environ.get(_ENV):
        yield
        return
    with tempfile.TemporaryDirectory() as cache:
        os.environ[_ENV] = cache
        try:
            yield
        finally:
            del os.environ[_ENV]
