"""A progress bar that costs nothing when it is off."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class Progress(Protocol):
    """What the work reports to a progress bar: units done since the last update."""

    def update(self, n: int = 1) -> object: ...


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextlib.contextmanager
def progress(total: int, description: str, enabled: bool) -> Iterator[Progress]:
    """A tqdm bar over ``total`` units (points or model evaluations), or a no-op."""
    if not enabled:
        yield _Silent()
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=description, unit="eval" if total > 10**5 else "pt", dynamic_ncols=True) as bar:
        yield bar
