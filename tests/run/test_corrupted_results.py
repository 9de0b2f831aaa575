"""Damaged results on resume, extend and read: a truncated part, a corrupt config.json, a deleted
part, a part copied in from another run. Each is recomputed or refused by name; none is merged
silently and no row is lost."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from probust.run import ConfigError, RunSettings, execute, prepare, read_results
from probust.run.store import merge


def settings(out, data, model, **changes) -> RunSettings:
    args = dict(
        data=data,
        model=model,
        sigmas=[0.3],
        methods=["softmax", "mc"],
        mc_samples=[50],
        out=out,
        limit=8,
        unit_size=2,
        device="cpu",
        show_progress=False,
        merge=False,
    )
    args.update(changes)
    return RunSettings(**args)


def _table(out: Path) -> pd.DataFrame:
    return read_results(out).drop(columns="seconds")


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run(tmp_path, tiny_data, tiny_model):
    """A finished run's folder (parts not merged) and its table."""
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    return out, _table(out)


def _first_part(out: Path) -> Path:
    return sorted((out / "parts").glob("*.parquet"))[0]


def test_a_truncated_part_is_refused_by_name_everywhere_and_recomputed_once_moved_away(run, tiny_data, tiny_model):
    out, table = run
    part = _first_part(out)
    part.write_bytes(part.read_bytes()[:200])
    before = _contents(out)
    remedy = "move it out of the folder (or delete it) and run the same command again"

    for attempt in (
        lambda: execute(prepare(settings(out, tiny_data, tiny_model))),
        lambda: execute(prepare(settings(out, tiny_data, tiny_model, sigmas=[0.3, 0.5], extend=True))),
        lambda: read_results(out),
        lambda: merge(out),
    ):
        with pytest.raises(ValueError, match=rf"results file {re.escape(str(part))} is damaged .*{re.escape(remedy)}"):
            attempt()
    after = _contents(out)
    assert {k: v for k, v in after.items() if k != "config.json"} == {
        k: v for k, v in before.items() if k != "config.json"
    }  # only the history of the refused runs was added

    part.unlink()
    summary = execute(prepare(settings(out, tiny_data, tiny_model)))
    assert summary.rows_computed == 2
    pd.testing.assert_frame_equal(_table(out), table)


def test_a_corrupt_config_json_is_refused_and_the_folder_left_as_it_was(run, tiny_data, tiny_model):
    out, table = run
    (out / "config.json").write_text('{"format": "probust.results", "run": {')
    before = _contents(out)

    for extend in (False, True):
        with pytest.raises(ConfigError, match=r"config\.json is not valid JSON .*use overwrite=True to replace it"):
            prepare(settings(out, tiny_data, tiny_model, extend=extend))

    assert _contents(out) == before


def test_a_deleted_part_is_computed_again_on_resume_to_the_same_table(run, tiny_data, tiny_model):
    out, table = run
    _first_part(out).unlink()

    summary = execute(prepare(settings(out, tiny_data, tiny_model)))

    assert summary.rows_computed == 2
    pd.testing.assert_frame_equal(_table(out), table)


def test_a_part_from_another_run_is_refused_by_name_and_never_merged(tmp_path, run, tiny_data, tiny_model):
    out, table = run
    other = tmp_path / "other"
    execute(prepare(settings(other, tiny_data, tiny_model, seed=7)))
    foreign = out / "parts" / f"{_first_part(other).stem}-copied.parquet"
    shutil.copy(_first_part(other), foreign)
    message = (
        rf"results file {re.escape(str(foreign))} holds rows of another run \(seed: 7 in the file, 0 in config\.json\)"
    )

    for attempt in (
        lambda: execute(prepare(settings(out, tiny_data, tiny_model))),
        lambda: read_results(out),
        lambda: merge(out),
    ):
        with pytest.raises(ValueError, match=message):
            attempt()
    assert not (out / "results.parquet").exists()

    foreign.unlink()
    pd.testing.assert_frame_equal(_table(out), table)
