"""The results lock is opened without following a link (``O_NOFOLLOW``), not only checked first.

The folder's checks (:meth:`ResultStore.refuse_links`) refuse a ``.lock`` that is a symbolic link
before anything is written; but a link made between that check and the lock's ``open`` (another
process racing the run) is followed by a plain ``open``, and the lock's truncation and process id
would land in the link's target. These tests make the link exactly there, after the check and
before the open, so only the open's own refusal keeps the target's contents.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from probust.run import ConfigError, RunSettings, prepare
from probust.run.store import ResultsLinkError, ResultStore

PRECIOUS = "a file the user cares about\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "precious.txt"
    victim.write_text(PRECIOUS)
    return victim


def test_a_lock_linked_after_the_folders_checks_is_refused_by_its_open(tmp_path, monkeypatch, tiny_data, tiny_model):
    out = tmp_path / "r"
    victim = _victim(tmp_path)
    checked = ResultStore.refuse_links

    def check_then_race(self):
        checked(self)  # the check passes: no link yet
        lock = self.path / ".lock"
        lock.unlink(missing_ok=True)
        lock.symlink_to(victim)  # ... and the link appears before the lock is opened

    monkeypatch.setattr(ResultStore, "refuse_links", check_then_race)
    settings = RunSettings(
        data=tiny_data,
        model=tiny_model,
        sigmas=[0.3],
        methods=["softmax"],
        out=out,
        limit=4,
        unit_size=2,
        device="cpu",
        show_progress=False,
    )
    with pytest.raises(ConfigError, match=r"\.lock \(its lock\) is a symbolic link"):
        prepare(settings)
    assert victim.read_text() == PRECIOUS
    assert (out / ".lock").is_symlink()  # the race happened: the open met the link


def test_acquiring_the_lock_through_a_link_refuses_it_and_writes_nothing_through_it(tmp_path):
    # The store's own lock, with no check before the open at all.
    folder = tmp_path / "r"
    folder.mkdir()
    victim = _victim(tmp_path)
    (folder / ".lock").symlink_to(victim)
    store = ResultStore(folder)
    with pytest.raises(ResultsLinkError, match="is a symbolic link"):
        store.acquire_lock()
    assert victim.read_text() == PRECIOUS
    store.release_lock()
