"""Where data sets are looked for, and the message given when they are not there."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from probust.data._errors import ProbustDataError
from probust.errors import Part, Setting

#: Environment variable naming the default data folder (used when ``root`` is None).
DATA_DIR_ENV = "PROBUST_DATA_DIR"

#: Folders where system packages install data sets, by probust name. Debian's
#: ``dataset-fashion-mnist`` puts the four IDX ``.gz`` files in /usr/share/datasets/fashion-mnist.
SYSTEM_DIRS: dict[str, list[Path]] = {
    "fashion-mnist": [Path("/usr/share/datasets/fashion-mnist")],
}

#: How to get each data set besides ``--download``.
SYSTEM_PACKAGES: dict[str, str] = {
    "fashion-mnist": "apt-get install dataset-fashion-mnist (Debian/Ubuntu)",
}


def data_home() -> Path:
    """The default data folder: ``$PROBUST_DATA_DIR``, else ``~/.cache/probust/data``."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "probust" / "data"


def search_roots(name: str, root: str | os.PathLike | None) -> list[Path]:
    """Folders to look in, in order: ``root`` (or :func:`data_home`), then system folders."""
    first = Path(root).expanduser() if root is not None else data_home()
    roots = [first] + [d for d in SYSTEM_DIRS.get(name, []) if d != first]
    return roots


def dedupe(paths: Iterable[Path]) -> list[Path]:
    seen: set[Path] = set()
    out = []
    for p in paths:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def not_found(
    name: str,
    split: str,
    missing: Sequence[str],
    looked_in: Sequence[Path],
    download_root: Path,
    notes: Sequence[str | Sequence[Part]] = (),
    download_error: str | None = None,
) -> ProbustDataError:
    """Builds the error for a data set that is not on disk (and could not be downloaded).
    A note is a line of text, or a line's parts (text and :class:`~probust.errors.Setting`s)."""
    lines: list[str | Sequence[Part]] = [f"{name} ({split} split) not found: missing {', '.join(missing)}"]
    lines.append("looked in: " + "; ".join(str(p) for p in looked_in))
    lines.extend(notes)
    if download_error is not None:
        lines.append(f"download failed: {download_error}")
    parts: list[Part] = []
    for k, line in enumerate(lines):
        parts.extend([*([] if k == 0 else ["\n"]), *([line] if isinstance(line, str) else line)])
    how = "; or ".join(
        [
            f"to fetch it into {download_root}",
            *([SYSTEM_PACKAGES[name]] if name in SYSTEM_PACKAGES else []),
            "put the files in ",
        ]
    )
    return ProbustDataError(
        *parts,
        "\nto get it: pass ",
        Setting("download", True),
        f" {how}",
        Setting("root"),
        f" (or ${DATA_DIR_ENV})",
    )
