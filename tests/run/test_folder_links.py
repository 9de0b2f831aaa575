"""A results folder is the only place probust writes or deletes: no write, truncation or deletion
follows a symbolic (or hard) link out of it; reading through links is allowed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probust.run import ConfigError, RunSettings, execute, prepare, read_results
from probust.run.store import ResultStore, merge


def settings(out, data, model, **changes) -> RunSettings:
    args = dict(
        data=data,
        model=model,
        sigmas=[0.3],
        methods=["softmax"],
        out=out,
        limit=4,
        unit_size=2,
        device="cpu",
        show_progress=False,
    )
    args.update(changes)
    return RunSettings(**args)


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A folder outside the results folder holding Parquet files (and one other file) of its own."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    for name in ("a.parquet", "b.parquet", ".c.parquet.tmp", "notes.txt"):
        (folder / name).write_bytes(f"not probust's: {name}".encode())
    return folder


def test_overwrite_refuses_a_symlinked_parts_folder_and_deletes_nothing_through_it(
    tmp_path, elsewhere, tiny_data, tiny_model
):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model, merge=False)))
    before = _contents(elsewhere)
    for part in (out / "parts").iterdir():
        part.unlink()
    (out / "parts").rmdir()
    (out / "parts").symlink_to(elsewhere)

    with pytest.raises(ConfigError) as caught:
        execute(prepare(settings(out, tiny_data, tiny_model, overwrite=True)))

    assert _contents(elsewhere) == before
    assert caught.value.field == "out"
    assert f"{out / 'parts'} (its parts folder) is a symbolic link to {elsewhere}" in str(caught.value)
    assert "remove the link" in str(caught.value)


def test_merge_refuses_a_symlinked_parts_folder_and_deletes_nothing_through_it(tmp_path, tiny_data, tiny_model):
    out, elsewhere = tmp_path / "r", tmp_path / "other-run-parts"
    execute(prepare(settings(out, tiny_data, tiny_model, merge=False)))
    (out / "parts").rename(elsewhere)  # valid parts, which a merge would read and then delete
    (out / "parts").symlink_to(elsewhere)
    before = _contents(elsewhere)

    with pytest.raises(OSError, match="its parts folder.* is a symbolic link"):  # a ResultsLinkError
        merge(out)

    assert _contents(elsewhere) == before
    assert not (out / "results.parquet").exists()


def test_a_symlinked_lock_is_refused_and_its_target_keeps_its_contents(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    out.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("a file the user cares about\n")
    (out / ".lock").symlink_to(victim)

    with pytest.raises(ConfigError, match=r"\.lock \(its lock\) is a symbolic link") as caught:
        prepare(settings(out, tiny_data, tiny_model))

    assert victim.read_text() == "a file the user cares about\n"
    assert caught.value.field == "out"
    assert not (out / "config.json").exists()


def test_a_hard_linked_lock_is_refused_and_its_other_name_keeps_its_contents(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    out.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("a file the user cares about\n")
    os.link(victim, out / ".lock")

    with pytest.raises(ConfigError, match=r"\.lock \(its lock\) is a plain file with another name \(a hard link\)"):
        prepare(settings(out, tiny_data, tiny_model))

    assert victim.read_text() == "a file the user cares about\n"


@pytest.mark.parametrize("name, what", [("config.json", "its configuration"), ("results.parquet", "its results file")])
def test_a_symlinked_results_file_is_read_through_but_refused_for_writing(tmp_path, tiny_data, tiny_model, name, what):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    table = read_results(out)
    kept = tmp_path / f"kept-{name}"
    (out / name).rename(kept)
    (out / name).symlink_to(kept)
    before = kept.read_bytes()

    assert read_results(out).equals(table)  # reading through a link is allowed
    with pytest.raises(ConfigError, match=rf"{name} \({what}\) is a symbolic link"):
        execute(prepare(settings(out, tiny_data, tiny_model, overwrite=True)))
    assert kept.read_bytes() == before


def test_a_symlinked_part_is_refused_before_anything_is_written(tmp_path, elsewhere, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model, merge=False)))
    (out / "parts" / "zz-extra.parquet").symlink_to(elsewhere / "a.parquet")
    before = _contents(out)

    with pytest.raises(ConfigError, match=r"zz-extra\.parquet \(a results part\) is a symbolic link"):
        prepare(settings(out, tiny_data, tiny_model, overwrite=True))

    assert _contents(out) == before and (elsewhere / "a.parquet").read_bytes() == b"not probust's: a.parquet"


def test_a_link_planted_where_the_write_probe_goes_is_never_followed(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    (out / "parts").mkdir(parents=True)
    victim = tmp_path / "precious.txt"
    victim.write_text("a file the user cares about\n")
    (out / "parts" / f".write-test-{os.getpid()}.tmp").symlink_to(victim)

    with pytest.raises(ConfigError, match=r"\.write-test-.*\.tmp \(a results part\) is a symbolic link"):
        prepare(settings(out, tiny_data, tiny_model))

    assert victim.read_text() == "a file the user cares about\n"


def test_a_folder_reached_through_a_link_is_written_normally(tmp_path, tiny_data, tiny_model):
    real = tmp_path / "real"
    real.mkdir()
    out = tmp_path / "out"
    out.symlink_to(real)

    summary = execute(prepare(settings(out, tiny_data, tiny_model)))

    assert summary.rows_computed == 4
    assert (real / "results.parquet").is_file() and len(read_results(real)) == 4


def test_a_store_refuses_links_before_clearing(tmp_path, elsewhere):
    store = ResultStore(tmp_path / "r")
    store.path.mkdir()
    (store.path / "parts").symlink_to(elsewhere)
    before = _contents(elsewhere)

    with pytest.raises(OSError, match="is a symbolic link"):  # a ResultsLinkError
        store.clear()
    with pytest.raises(OSError, match="is a symbolic link"):
        store.remove_temporaries()

    assert _contents(elsewhere) == before
