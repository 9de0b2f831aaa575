"""A progress bar that costs nothing when it is off."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from probust._extras import import_extra


class Progress(Protocol):
    """What the work reports to a progress bar: units done since the last update."""

    def update(self, n: int = 1) -> object: ...


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextlib.contextmanager
def progress(total: int, description: str, enabled: bool) -> Iterator[Progress]:
    """A tqdm bar over ``total`` units (points or model evaluations), or a no-op.

    tqdm comes with the 'run' extra; without it, asking for a bar raises a MissingExtraError.
    """
    if not enabled:
        yield _Silent()
        return
    tqdm = import_extra("tqdm.auto", extra="run", feature="a progress bar (show_progress=True)").tqdm
    with tqdm(total=total, desc=description, unit="eval" if total > 10**5 else "pt", dynamic_ncols=True) as bar:
        yield bar
