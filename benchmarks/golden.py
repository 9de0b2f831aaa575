"""Golden run: prove that a new version of probust computes the same numbers as an old one.

What it proves: from the SAME model files, the code under test writes, through the command line
(``probust estimate``, ``probust report``), results tables equal value for value to a reference
run (exact float equality, NaN == NaN) and report tables equal as written (the report's CSVs hold
6 significant digits). Only measurements are exempt (EXCLUDED_* below, each with its reason).
Training is not compared: ``make`` trains once into DIR/models and ``check`` reuses those files.

Usage (from the repository root, with the project's virtualenv):

    python benchmarks/golden.py make DIR             # train (or reuse DIR/models), estimate, report
    python benchmarks/golden.py compare DIR_A DIR_B  # exit 0: identical, 1: differences (listed)
    python benchmarks/golden.py check DIR            # make into a temp folder with DIR's models, compare

Exit status: 0 identical, 1 differences, 2 error (missing folder, failed command). --src PATH
(make, check) runs the probust of another src/ folder, e.g. a `git worktree` of the old commit.

Everything that could pick a different arithmetic path is pinned: CPU device, one torch thread
(OMP/MKL_NUM_THREADS=1), --batch-size, --jacobian, --channels-last and --memory-budget. The
declared execution plan (rows per pass, Jacobian strategy, channels_last) would also be the same
from run to run; other plans agree only to float rounding (at most 5e-7 in the analytic estimates, benchmarks/plan_agreement.py), and a golden comparison is exact. A golden folder
is only comparable on the same kind of machine and the same torch build (see manifest.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PROBUST = [sys.executable, "-m", "probust"]
ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "CUDA_VISIBLE_DEVICES": "",
}
MODELS: dict[str, list[str]] = {  # name -> probust train flags (about 6 s each on 2 CPU cores)
    "linear": ["--arch", "linear", "--epochs", "10"],
    "cnn": ["--arch", "cnn", "--epochs", "20"],
}
TRAIN = ["--data", "digits", "--seed", "0", "--threads", "1", "--device", "cpu", "--quiet"]
ESTIMATE = [  # two sample counts each: covers experiment 2 (convergence); the plan is pinned: see the docstring
    "--data",
    "digits",
    "--limit",
    "64",
    "--sigma",
    "0.1",
    "0.3",
    "--seed",
    "0",
    "--mc-samples",
    "100",
    "500",
    "--mmse-samples",
    "2",
    "5",
    "--device",
    "cpu",
    "--unit-size",
    "32",
    "--batch-size",
    "256",
    "--jacobian",
    "loop",
    "--channels-last",
    "off",
    "--memory-budget",
    "1GB",
    "--quiet",
]
ALL_METHODS = ["mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax", "mc_cv", "mc_is"]
P_FAIL = ("cnn", ["taylor", "mmse", "taylor_mvs", "mmse_mvs", "mc_is"])  # second folder, with --p-fail
KEYS = ["index", "sigma", "method", "n_samples"]
# Excluded from the comparison, and why (compare prints which of them it met):
EXCLUDED_RESULT_COLUMNS = {"seconds": "wall time of the estimator per point: a measurement, not a result"}
# Any column named like a measurement (wall or CPU time, speed-up, memory), in any table: today only
# runtime.csv has such columns; the net keeps a timing column added by a refactor from failing the run.
TIME_COLUMN = re.compile(r"(^|_)(seconds?|secs?|time|times|wall|elapsed|cpu|speedup|memory|mb)($|_)", re.I)
EXCLUDED_EXPERIMENTS = {
    "runtime": "experiment 3 times the estimators and measures their peak memory now; its "
    "estimates use plans timed on the spot, so even its mean_p may move at float rounding"
}
NOT_COMPARED = "report.html (build date, host name, timings, figures), PNG/SVG figures, manifest.json"
# Strings in report tables are compared after replacing dates, absolute paths and host names:
DATE = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2}| UTC)?")
PATH = re.compile(r"(?<![\w.])(/[^\s,;'\"()\[\]]+)+")


def fail(message: str) -> NoReturn:
    print(f"golden: error: {message}", file=sys.stderr)
    sys.exit(2)


def environment(src: Path | None) -> dict[str, str]:
    """The pinned environment; ``src`` (a checkout's src/ folder) goes first on PYTHONPATH."""
    path = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, **ENV, **({"PYTHONPATH": path} if src else {})}


def run(cmd: list[str], log: list[dict[str, Any]], src: Path | None) -> None:
    """Run a probust command (pinned environment), record it and its wall time."""
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=environment(src), capture_output=True, text=True)
    log.append({"argv": ["probust", *cmd[len(PROBUST) :]], "seconds": round(time.perf_counter() - start, 2)})
    if done.returncode != 0:
        fail(f"command failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr}")


def git(where: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else f"unknown ({done.stderr.strip()})"


def source_sha256(package: Path) -> str:
    """One hash of every .py file of the package (tracked or not): same hash <=> same code."""
    digest = hashlib.sha256()
    for f in sorted(package.rglob("*.py")):
        digest.update(str(f.relative_to(package)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def make(out: Path, src: Path | None = None) -> None:
    """Train (or reuse) the models, estimate with every method, build the report, write the manifest."""
    if src is not None and not (src / "probust" / "__init__.py").is_file():
        fail(f"--src {src}: no probust package there (expected {src / 'probust' / '__init__.py'})")
    start, log, where = time.perf_counter(), [], src or REPO
    code_state = {  # before anything runs: the code the commands import
        "git_commit": git(where, "rev-parse", "HEAD"),
        "git_status": git(where, "status", "--porcelain").splitlines(),
        "source_sha256": source_sha256((src or REPO / "src") / "probust"),
    }
    models = out / "models"
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot create {models}: {exc}")
    for sub in ("results", "results_pfail", "report"):  # golden's own outputs: always recomputed
        shutil.rmtree(out / sub, ignore_errors=True)
    reused = []
    for name, flags in MODELS.items():
        if (models / f"{name}.pt").is_file():
            reused.append(name)
        else:
            run([*PROBUST, "train", *flags, *TRAIN, "--out", str(models / f"{name}.pt")], log, src)
        est = [*PROBUST, "estimate", "--model", str(models / f"{name}.pt"), *ESTIMATE]
        run([*est, "--methods", *ALL_METHODS, "--out", str(out / "results" / name)], log, src)
        if name == P_FAIL[0]:
            run([*est, "--methods", *P_FAIL[1], "--p-fail", "--out", str(out / "results_pfail" / name)], log, src)
    run([*PROBUST, "report", str(out / "results"), "--out", str(out / "report"), "--threads", "1", "--quiet"], log, src)
    code = "import probust, torch; print(probust.__version__, torch.__version__, probust.__file__)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment(src))
    versions = [*found.stdout.split(), "unknown", "unknown", "unknown"]
    manifest = {
        **dict(zip(("probust_version", "torch_version", "probust_imported_from"), versions)),
        "python": platform.python_version(),
        **code_state,
        "host": platform.node(),
        "machine": f"{platform.system()} {platform.machine()}",
        "environment": ENV,
        "models": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(models.glob("*.pt"))},
        "models_reused": reused,
        "commands": log,
        "seconds": round(time.perf_counter() - start, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"golden: made {out} in {manifest['seconds']} s ({len(log)} commands; models reused: {reused or 'none'})")


def compare_frames(
    a: pd.DataFrame, b: pd.DataFrame, where: str, normalise: Any, diffs: list[str], skipped: set[str], keys: list[str]
) -> int:
    """Compare two aligned tables column by column; append differences; return values compared."""

    def row(i: int) -> str:  # how to name a row in a message: its key, or its number
        return " ".join(f"{k}={a[k].iloc[i]}" for k in keys) if keys else f"row {i}"

    if list(a.columns) != list(b.columns):
        only_a, only_b = sorted(set(a.columns) - set(b.columns)), sorted(set(b.columns) - set(a.columns))
        diffs.append(
            f"{where}: columns differ: only in A {only_a}, only in B {only_b}"
            + ("" if only_a or only_b else ": the same columns in another order")
        )
    if len(a) != len(b):
        diffs.append(f"{where}: {len(a)} rows in A, {len(b)} in B")
        return 0
    count = 0
    excluded = [c for c in a.columns if c in EXCLUDED_RESULT_COLUMNS or TIME_COLUMN.search(c)]
    skipped.update(f"column {c}" for c in excluded)
    for col in [c for c in a.columns if c in b.columns and c not in excluded]:
        x, y = a[col], b[col]
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            if x.dtype != y.dtype:
                diffs.append(f"{where}: column {col!r}: dtype {x.dtype} in A, {y.dtype} in B")
            u, v = x.to_numpy(np.float64, na_value=np.nan), y.to_numpy(np.float64, na_value=np.nan)
            bad = ~((u == v) | (np.isnan(u) & np.isnan(v)))
            if bad.any():
                with np.errstate(invalid="ignore"):
                    gap = np.abs(u[bad] - v[bad])
                i = int(np.flatnonzero(bad)[0])
                diffs.append(
                    f"{where}: column {col!r}: {int(bad.sum())} of {len(u)} rows differ, "
                    f"max |A-B| = {np.nanmax(gap) if np.isfinite(gap).any() else 'nan/inf'}; "
                    f"first at {row(i)}: {float(u[i])!r} vs {float(v[i])!r}"
                )
        else:
            u = x.astype(object).where(x.notna(), None).map(normalise)
            v = y.astype(object).where(y.notna(), None).map(normalise)
            # Missing on both sides is equal (pandas' string dtype keeps NaN through where(..., None)).
            both_missing = (x.isna() & y.isna()).to_numpy()
            bad = (u != v).to_numpy() & ~both_missing
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                diffs.append(
                    f"{where}: column {col!r}: {int(bad.sum())} of {len(u)} rows differ, "
                    f"first at {row(i)}: {x.iloc[i]!r} vs {y.iloc[i]!r}"
                )
        count += len(x)
    return count


def compare_results(a: Path, b: Path, rel: Path, diffs: list[str], skipped: set[str]) -> int:
    """One results.parquet: the same rows by key, every non-timing column equal (on the common rows)."""
    frames = []
    for root in (a, b):
        df = pd.read_parquet(root / rel)
        if missing := [k for k in KEYS if k not in df.columns]:
            fail(f"{root / rel}: no key column(s) {missing}")
        if df.duplicated(KEYS).any():
            diffs.append(f"{rel} ({root}): {int(df.duplicated(KEYS).sum())} duplicate rows for a key {KEYS}")
        frames.append(df.drop_duplicates(KEYS).set_index(KEYS, drop=False).sort_index())
    fa, fb = frames
    only_a, only_b = fa.index.difference(fb.index), fb.index.difference(fa.index)
    if len(only_a) or len(only_b):
        diffs.append(
            f"{rel}: rows differ: {len(only_a)} keys only in A (e.g. {list(only_a[:2])}), "
            f"{len(only_b)} only in B (e.g. {list(only_b[:2])}); comparing the common rows"
        )
    common = fa.index.intersection(fb.index)
    fa, fb = (f.loc[common].reset_index(drop=True) for f in (fa, fb))
    return compare_frames(fa, fb, str(rel), lambda s: s, diffs, skipped, KEYS)


def read_config(path: Path, diffs: list[str]) -> dict[str, Any]:
    """A JSON file as a dict; a file that cannot be read is a difference."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        diffs.append(f"{path}: cannot read ({exc})")
        return {}


def normaliser(a: Path, b: Path) -> Any:
    """Strings equal up to the two golden folders, paths, dates and the hosts of the manifests."""
    hosts = {read_config(r / "manifest.json", []).get("host", "") for r in (a, b) if (r / "manifest.json").is_file()}
    roots = sorted({str(a.resolve()), str(b.resolve()), str(a), str(b)}, key=len, reverse=True)

    def normalise(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        for r in roots:
            value = value.replace(r, "<DIR>")
        for h in hosts - {""}:
            value = re.sub(rf"\b{re.escape(h)}\b", "<HOST>", value)
        return PATH.sub("<PATH>", DATE.sub("<DATE>", value))

    return normalise


def compare_configs(a: Path, b: Path, rel: Path, diffs: list[str]) -> None:
    """The parts of a results folder's config.json that say what was computed (data and model
    sha256, seed, settings, grid); the rest holds paths, dates, hosts and versions."""
    ca, cb = (read_config(r / rel, diffs) for r in (a, b))
    for key in ("run", "requests"):
        va, vb = ca.get(key), cb.get(key)
        if va != vb and isinstance(va, dict) and isinstance(vb, dict):
            keys = [k for k in sorted(set(va) | set(vb)) if va.get(k, "<absent>") != vb.get(k, "<absent>")]
            va, vb = {k: va.get(k, "<absent>") for k in keys}, {k: vb.get(k, "<absent>") for k in keys}
        if va != vb:
            diffs.append(f"{rel}: {key!r} differs: {va} in A, {vb} in B")


def compare(a: Path, b: Path) -> int:
    """Compare two golden folders; print the verdict; return the exit status (0 identical, 1 not)."""
    for root in (a, b):
        for sub in ("results", "report/experiments"):
            if not (root / sub).is_dir():
                fail(f"{root / sub} is missing: is {root} a golden folder (python benchmarks/golden.py make {root})?")
    diffs: list[str] = []
    tables = values = 0
    skipped: set[str] = set()
    for kind, pattern in (("results", "**/results.parquet"), ("report", "report/experiments/*/*.csv")):
        found = [{p.relative_to(r) for p in r.glob(pattern)} for r in (a, b)]
        files_a, files_b = ({f for f in fs if kind == "report" or f.parts[0] != "report"} for fs in found)
        for rel in sorted(files_a ^ files_b):
            diffs.append(f"{rel}: only in {'A' if rel in files_a else 'B'}")
        for rel in sorted(files_a & files_b):
            if kind == "report" and rel.parts[2] in EXCLUDED_EXPERIMENTS:
                skipped.add(f"experiment {rel.parts[2]}")
                continue
            tables += 1
            if kind == "results":
                values += compare_results(a, b, rel, diffs, skipped)
                compare_configs(a, b, rel.parent / "config.json", diffs)
            else:
                frames = pd.read_csv(a / rel), pd.read_csv(b / rel)
                values += compare_frames(*frames, str(rel), normaliser(a, b), diffs, skipped, [])
    if tables == 0:
        diffs.append("no tables found to compare")
    for name, root in (("A", a), ("B", b)):  # information only: which code made each folder
        info = read_config(root / "manifest.json", []) if (root / "manifest.json").is_file() else {}
        print(
            f"golden: {name} = {root}: commit {str(info.get('git_commit', '?'))[:12]}, "
            f"source {str(info.get('source_sha256', '?'))[:12]}, probust {info.get('probust_version', '?')}"
        )
    excluded = ", ".join(sorted(skipped)) or "nothing"
    if diffs:
        print(f"golden: {len(diffs)} difference(s) between {a} and {b} (excluded: {excluded}):")
        print("\n".join(f"  - {d}" for d in diffs))
        return 1
    print(f"golden: identical ({tables} tables, {values} values; excluded: {excluded}; not compared: {NOT_COMPARED})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("make", "train/reuse models, estimate, report into DIR"),
        ("check", "make into a temporary folder with DIR's models and compare with DIR"),
    ):
        q = sub.add_parser(name, help=help_)
        q.add_argument("dir", type=Path)
        q.add_argument("--src", type=Path, help="run the probust of this src/ folder (default: the installed one)")
        if name == "check":
            q.add_argument("--keep", action="store_true", help="keep the temporary folder")
    c = sub.add_parser("compare", help="compare two golden folders (exit 1 on any difference)")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.command == "make":
        make(args.dir.resolve(), args.src and args.src.resolve())
        return 0
    if args.command == "compare":
        return compare(args.a.resolve(), args.b.resolve())
    ref = args.dir.resolve()
    if not all((ref / "models" / f"{name}.pt").is_file() for name in MODELS):
        fail(f"{ref / 'models'} must hold {', '.join(f'{n}.pt' for n in MODELS)} (run: golden.py make {args.dir})")
    tmp = Path(tempfile.mkdtemp(prefix="golden_check_"))
    shutil.copytree(ref / "models", tmp / "models", dirs_exist_ok=True)  # the same model files: no retraining
    make(tmp, args.src and args.src.resolve())
    status = compare(ref, tmp)
    if args.keep or status:
        print(f"golden: the new run is kept in {tmp}")
    else:
        shutil.rmtree(tmp)
    return status


if __name__ == "__main__":
    sys.exit(main())
