"""``probust report``: every experiment on a results folder, gathered into one HTML page.

The page holds every figure (embedded as base64 PNG, so it opens offline and can be mailed as
one file; the PNG, SVG and CSV files lie beside it in ``experiments/``), the tables, the
configuration that produced the results, and a short reading of each result computed from the
numbers.

Example:
    >>> report = probust.report.build_report("runs/demo")     # -> runs/demo/report.html
    >>> report.path, [o.name for o in report.outputs]
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from probust._extras import MissingExtraError

try:  # the 'report' extra (matplotlib, and the 'run' extra's pandas)
    import matplotlib  # noqa: F401
    import pandas as pd
except ModuleNotFoundError as exc:
    raise MissingExtraError(exc.name or "matplotlib", "report", "the report (probust report)") from exc

from probust import experiments
from probust._io import atomic_write_text
from probust._options import declared, option
from probust.errors import OptionError
from probust.experiments import REGISTRY, Output, Results, style
from probust.experiments import estimation_error as _estimation_error

__all__ = ["Report", "ReportSettings", "build_report", "error_summary", "render_html"]


def _at_least_one(value: Any, name: str) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise OptionError(f"must be at least 1, got {value!r}", field=name)
    return value


#: When the measuring experiments (``Experiment.measuring``: runtime, case_study) run.
MEASURE_CHOICES = ("auto", "on", "off")


def _experiments(value: Any, name: str) -> Any:
    if value is None:
        return None
    unknown = [v for v in value if v not in experiments.EXPERIMENTS]
    if unknown:
        raise OptionError(f"unknown experiment {unknown[0]!r}; known: {', '.join(experiments.EXPERIMENTS)}", field=name)
    return tuple(value)


@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    """What ``probust report`` runs and with which experiment settings (each declared once: the
    command's flags and help are derived from these fields)."""

    TITLE: ClassVar[str] = "experiments"

    only: tuple[str, ...] | None = option(
        None,
        help=f"run only these experiments: {' '.join(experiments.EXPERIMENTS)}",
        default_help="all",
        metavar="NAME",
        many=True,
        check=_experiments,
    )
    skip: tuple[str, ...] = option(
        (),
        help="leave these experiments out (e.g. runtime case_study, which measure and train)",
        default_help="none",
        metavar="NAME",
        many=True,
        check=_experiments,
    )
    title: str = option("probust report", help="page title")
    runtime_points: int = option(
        5, help="points the runtime experiment times (the paper: 50)", metavar="N", parse=int, check=_at_least_one
    )
    runtime_sigma: float = option(0.1, help="noise level of the runtime experiment", metavar="S", parse=float)
    case_seeds: int = option(5, help="repetitions of the case study", metavar="N", parse=int, check=_at_least_one)
    case_epochs: int = option(
        30, help="training epochs of the case study's CNN", metavar="N", parse=int, check=_at_least_one
    )
    case_k: int = option(
        25, help="images per class and end in the case study", metavar="K", parse=int, check=_at_least_one
    )
    measure: str = option(
        "auto",
        help="run the experiments that time the estimators (runtime: Monte Carlo up to n = 10,000) and "
        "train models (case_study): auto runs them on results of probust-trained models of a built-in data "
        "set (the paper's setting, e.g. probust demo's) and holds them back on one's own model or data; "
        "on; off (naming one with --only also runs it)",
        choices=MEASURE_CHOICES,
        metavar="WHEN",
    )
    threads: int | None = option(
        None, help="CPU threads for torch", default_help="torch's choice", metavar="N", parse=int, check=_at_least_one
    )

    def __post_init__(self) -> None:
        if self.measure not in MEASURE_CHOICES:
            raise OptionError(f"must be one of {', '.join(MEASURE_CHOICES)}, got {self.measure!r}", field="measure")
        for f, o in declared(self):
            if o.check is not None:
                object.__setattr__(self, f.name, o.check(getattr(self, f.name), f.name))

    def experiment_options(self) -> dict[str, dict[str, Any]]:
        """The options of the experiments that take some (``build_report``'s ``options``)."""
        return {
            "runtime": {"points": self.runtime_points, "sigma": self.runtime_sigma},
            "case_study": {"seeds": self.case_seeds, "epochs": self.case_epochs, "k": self.case_k},
        }


REPORT_NAME = "report.html"
EXPERIMENTS_DIR = "experiments"


@dataclass
class Report:
    """What :func:`build_report` made.

    Attributes:
        path: the HTML file.
        outputs: every experiment's :class:`~probust.experiments.Output`, in the paper's order.
        results: the runs the report was made from.
    """

    path: Path
    outputs: list[Output]
    results: Results
    extra: dict[str, Any] = field(default_factory=dict)

    def output(self, name: str) -> Output | None:
        return next((o for o in self.outputs if o.name == name), None)


#: What each measuring experiment costs, for the reason it is held back.
_COSTS = {
    "runtime": "it times every estimator at the paper's sample counts (Monte Carlo up to n = 10,000), "
    "minutes that say nothing about these results",
    "case_study": "it trains small CNNs on the k = 25 highest- and lowest-p images of each class, and "
    "needs at least 50 scored points per class to say more than chance",
}


def held_back(results: Results, measure: str = "auto", only: Iterable[str] | None = None) -> dict[str, str]:
    """The measuring experiments (:attr:`Experiment.measuring <probust.experiments.Experiment.measuring>`)
    that ``measure`` holds back on ``results``, each with the reason shown in the report.

    Raises:
        OptionError: ``measure`` is not one of :data:`MEASURE_CHOICES`.
    """
    if measure not in MEASURE_CHOICES:
        raise OptionError(f"must be one of {', '.join(MEASURE_CHOICES)}, got {measure!r}", field="measure")
    asked = set(only or ())
    if measure == "on" or (measure == "auto" and results.paper_setting()):
        return {}
    if measure == "off":
        return {e.name: "held back (measure='off')" for e in REGISTRY if e.measuring and e.name not in asked}
    ask = "ask for it with `probust report --measure on` (Python: build_report(..., measure='on'))"
    return {
        e.name: f"held back on one's own model or data: {_COSTS.get(e.name, 'it measures on this machine')}; {ask}"
        for e in REGISTRY
        if e.measuring and e.name not in asked
    }


# -- numbers for the summary ----------------------------------------------------------------------


def error_summary(outputs: Iterable[Output], models: Iterable[str] | None = None) -> pd.DataFrame:
    """Mean |error| against Monte Carlo: one row per (model, estimator), one column per sigma.

    From experiment 1's table (or an empty frame when it did not run); see
    :func:`probust.experiments.estimation_error.error_summary`.
    """
    out = next((o for o in outputs if o.name == "estimation_error" and not o.skipped), None)
    if out is None:
        return pd.DataFrame()
    return _estimation_error.error_summary(out.table, models)


# -- HTML -------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1180px; margin: 2em auto;
       padding: 0 1.2em; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.7em; margin-bottom: 0.2em; } h2 { font-size: 1.35em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em;
margin-top: 2.2em; } h3 { font-size: 1.05em; margin-bottom: 0.3em; }
.meta { color: #555; font-size: 0.92em; } .desc { color: #333; }
figure { margin: 1em 0; text-align: center; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.86em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f6; } td.l, th.l { text-align: left; }
caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: 4px; font-size: 1.0em; }
.reading { background: #f6f8fb; border-left: 4px solid #1f5fa8; padding: 0.5em 1em; margin: 0.8em 0; }
.reading li { margin: 0.25em 0; } .skipped { background: #fff6e5; border-left: 4px solid #e0a030; padding: 0.5em 1em; }
nav ol { columns: 2; font-size: 0.95em; } code { background: #f2f2f2; padding: 0 3px; border-radius: 3px; }
details { margin: 0.5em 0 1em; } summary { cursor: pointer; color: #1f5fa8; }
.scroll { overflow-x: auto; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "–"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v == 0:
            return "0"
        if abs(v) >= 1e4 or abs(v) < 1e-3:
            return f"{v:.3g}"
        return f"{v:.4g}"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}" if abs(int(value)) >= 10_000 else str(int(value))
    text = str(value)
    if text.startswith("p^") and text[2:] in style.METHOD_HTML:
        return style.method_html(text[2:])
    return _esc(text)


def _table_html(frame: pd.DataFrame, caption: str | None = None, max_rows: int = 60) -> str:
    if frame is None or frame.empty:
        return ""
    shown = frame.head(max_rows)
    text_cols = {c for c in shown.columns if not pd.api.types.is_numeric_dtype(shown[c])}
    head = "".join(f'<th class="{"l" if c in text_cols else ""}">{_header(c)}</th>' for c in shown.columns)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"l" if c in text_cols else ""}">{_cell(v)}</td>' for c, v in row.items())
        + "</tr>"
        for _, row in shown.iterrows()
    )
    more = (
        f'<tr><td class="l" colspan="{len(shown.columns)}">… {len(frame) - max_rows} more rows in the CSV file</td></tr>'
        if len(frame) > max_rows
        else ""
    )
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}{more}</tbody></table></div>'


def _header(name: Any) -> str:
    text = _esc(name)
    for m in style.METHOD_ORDER:
        text = text.replace(f"p^{m}", style.method_html(m))
    return text.replace("_", " ") if "<sup>" not in text else text


def _embed(png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f"data:image/png;base64,{data}"


def _rel(path: Path, start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:
        return str(path)


def _noise_text(noise: dict[str, Any]) -> str:
    """The run's noise in words (config.json "run" -> "noise")."""
    kind = str(noise.get("kind", "gaussian"))
    if noise.get("scale") == "std":
        return f"{kind}, σ × each coordinate's std over the data"
    for key, what in (("std", "σ × per-coordinate multipliers"), ("cov", "covariance σ² C")):
        if isinstance(noise.get(key), dict):
            source = noise[key].get("file") or "an array"
            return f"{kind}, {what} from {Path(source).name if noise[key].get('file') else source}"
    return f"{kind}, σ per coordinate"


def _folders_text(results: Results) -> str:
    """ "3 results folder(s)", with the ``probust certify`` ones counted apart."""
    text = f"{len(results.runs) + len(results.certified)} results folder(s)"
    return text + (f" ({len(results.certified)} of probust certify)" if results.certified else "")


def _certified_row(r: Any, root: Path) -> dict[str, Any]:
    """A ``probust certify`` folder's configuration (its own "run" settings), as a table row."""
    config = r.config
    run = config.get("run") if isinstance(config.get("run"), dict) else {}
    history = config.get("history") if isinstance(config.get("history"), list) else []
    argv = [[str(a) for a in h["argv"]] for h in history if isinstance(h, dict) and h.get("argv")]
    grid = "; ".join(
        f"{q.get('n_points')} pts, σ {' '.join(f'{s:g}' for s in q.get('sigmas', []))}"
        for q in config.get("requests") or []
        if isinstance(q, dict)
    )
    keys = ("n0", "n", "alpha", "futility", "predictive_futility", "procedure", "radii", "estimate")
    return {
        "model": r.label,
        "results folder": _rel(r.path, root),
        "data": f"{run.get('dataset')} ({run.get('split')}, {run.get('data_size')} points)",
        "checkpoint": _rel(Path(r.model_source), root) if r.model_source else "in-memory module",
        "classes": ", ".join(r.classes[:12]) + (", ..." if len(r.classes) > 12 else ""),
        "noise": "gaussian, σ per coordinate",
        "seed": run.get("seed"),
        "settings": "probust certify: " + ", ".join(f"{k} {run[k]}" for k in keys if run.get(k) is not None),
        "requests (grid)": grid,
        "versions": f"probust {config.get('probust_version')}, torch {config.get('torch_version')}, {config.get('device')}",
        "command": " ".join(argv[-1]) if argv else "",
    }


def _config_html(results: Results, root: Path, extra: dict[str, Any] | None) -> str:
    rows = []
    for r in results:
        config = r.results_config
        cfg = config.settings
        grid = "; ".join(
            f"{q.get('n_points')} pts, σ {' '.join(f'{s:g}' for s in q.get('sigmas', []))}, "
            f"{' '.join(q.get('methods', []))}"
            + (f", mc n {' '.join(map(str, q['mc_samples']))}" if q.get("mc_samples") else "")
            + (f", mmse N {' '.join(map(str, q['mmse_samples']))}" if q.get("mmse_samples") else "")
            for q in config.requests
        )
        argv = [h.argv for h in config.history if h.argv]
        rows.append(
            {
                "model": r.label,
                "results folder": _rel(r.path, root),
                "data": f"{cfg.dataset} ({cfg.split}, {cfg.data_size} points)",
                "checkpoint": _rel(Path(r.model_source), root) if r.model_source else "in-memory module",
                "classes": ", ".join(config.classes[:12]) + (", ..." if len(config.classes) > 12 else ""),
                "noise": _noise_text(cfg.noise),
                "seed": cfg.seed,
                "settings": f"target {cfg.target}, MC interval {cfg.interval} {cfg.confidence}, "
                f"mvn-cdf tol {cfg.tol}, MMSE sampling {cfg.sampling}, softmax T {cfg.temperature}",
                "requests (grid)": grid,
                "versions": f"probust {config.probust_version}, torch {config.torch_version}, {config.device}",
                "command": " ".join(argv[-1]) if argv else "",
            }
        )
    rows += [_certified_row(r, root) for r in results.certified]
    html_ = _table_html(
        pd.DataFrame(rows),
        "Results folders (each a <code>probust estimate</code> or <code>probust certify</code> run)",
        max_rows=100,
    )
    if extra:
        html_ += "<h3>How these results were made</h3><pre>" + _esc(json.dumps(extra, indent=2, default=str)) + "</pre>"
    return html_


def _summary_html(outputs: list[Output], results: Results) -> str:
    parts = []
    by_name = {o.name: o for o in outputs}
    for name in REGISTRY.names():  # in the registry's order, whatever the order of ``outputs``
        output = by_name.get(name)
        if output is None or output.skipped:
            continue
        for caption, frame in REGISTRY.get(name).summary(output, results):
            parts.append(_table_html(frame, caption))
    skipped = [o for o in outputs if o.skipped]
    if skipped:
        parts.append(
            "<p class='meta'>Not shown: " + "; ".join(f"{_esc(o.title)} ({_esc(o.skipped)})" for o in skipped) + ".</p>"
        )
    return "".join(parts)


def render_html(
    outputs: list[Output],
    results: Results,
    path: Path,
    *,
    title: str = "probust report",
    extra: dict[str, Any] | None = None,
) -> str:
    """The report page as a string (figures embedded)."""
    from probust import __version__

    root = path.parent
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    toc = "".join(
        f'<li><a href="#{o.name}">{_esc(o.title)}</a>{" (not run)" if o.skipped else ""}</li>' for o in outputs
    )
    sections = []
    for o in outputs:
        s = [f'<section id="{o.name}"><h2>{_esc(o.title)}</h2><p class="desc">{o.description}</p>']
        if o.skipped:
            s.append(f'<p class="skipped">Not run: {_esc(o.skipped)}</p></section>')
            sections.append("".join(s))
            continue
        for png in o.figures:
            links = [
                f'<a href="{_esc(_rel(png, root))}">PNG</a>',
                f'<a href="{_esc(_rel(png.with_suffix(".svg"), root))}">SVG</a>',
            ]
            s.append(
                f'<figure><img alt="{_esc(o.title)}" src="{_embed(png)}"><figcaption>{png.stem}: {" · ".join(links)}</figcaption></figure>'
            )
        if o.reading:
            s.append(
                '<div class="reading"><h3>Reading</h3><ul>'
                + "".join(f"<li>{line}</li>" for line in o.reading)
                + "</ul></div>"
            )
        for caption, frame in REGISTRY.get(o.name).display(o):
            s.append(_table_html(frame, caption))
        csvs = [f for f in o.files if f.suffix == ".csv"]
        meta = []
        if csvs:
            meta.append("Data: " + " · ".join(f'<a href="{_esc(_rel(f, root))}">{_esc(f.name)}</a>' for f in csvs))
        if o.settings:
            meta.append("settings: <code>" + _esc(json.dumps(o.settings, default=str)) + "</code>")
        meta.append(f"{o.seconds:.1f} s")
        s.append('<p class="meta">' + " · ".join(meta) + "</p></section>")
        sections.append("".join(s))
    host = f"{platform.node()} ({platform.system()} {platform.machine()})"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>
<body>
<h1>{_esc(title)}</h1>
<p class="meta">Average-case robustness p<sub>σ</sub><sup>robust</sup>(x) = P[argmax f(x + ε) = argmax f(x)], ε ~ N(0, σ²I),
estimated as in Han, Srinivas &amp; Lakkaraju (UAI 2024). Made {now} on {_esc(host)} by probust {__version__}
from {_folders_text(results)} under <code>{_esc(_rel(results.root, root))}</code>.</p>
<nav><ol>{toc}<li><a href="#configuration">Configuration</a></li></ol></nav>
<section id="summary"><h2>Summary</h2>{_summary_html(outputs, results)}</section>
{"".join(sections)}
<section id="configuration"><h2>Configuration</h2>{_config_html(results, root, extra)}</section>
</body></html>
"""


def build_report(
    results_dir: str | os.PathLike | Results,
    out: str | os.PathLike | None = None,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    options: dict[str, dict[str, Any]] | None = None,
    title: str = "probust report",
    extra: dict[str, Any] | None = None,
    on_done: Callable[[Output], None] | None = None,
    measure: str = "auto",
) -> Report:
    """Run the experiments on the results under ``results_dir`` and write ``report.html``.

    Args:
        results_dir: a results folder, or a folder holding several (searched a few levels
            deep), or already loaded :class:`~probust.experiments.Results`.
        out: where ``report.html`` and ``experiments/`` go (default: ``results_dir``).
        only, skip: experiment names to run / leave out (registered in
            :data:`probust.experiments.REGISTRY`; :data:`probust.experiments.EXPERIMENTS` lists them).
        options: per-experiment keyword arguments, e.g. ``{"runtime": {"points": 10}}``.
        title: the page title.
        extra: a JSON-serialisable description of how the results were made, shown in the
            configuration section (``probust demo`` passes its settings).
        on_done: called with each experiment's output as it finishes.
        measure: when the experiments that time the estimators or train models (runtime,
            case_study) run: "auto" on results of the paper's kind only
            (:meth:`~probust.experiments.Results.paper_setting`: probust-trained models of a
            built-in data set, as ``probust demo`` makes), "on", "off". Named in ``only``, one runs
            whatever this says. Held back, it is listed as not run, with the reason.

    Returns:
        The :class:`Report`.

    Raises:
        FileNotFoundError: no results folder under ``results_dir``.
    """
    results = results_dir if isinstance(results_dir, Results) else experiments.load_results(results_dir)
    out_dir = Path(out) if out is not None else (results.root if results.root.is_dir() else Path("."))
    out_dir.mkdir(parents=True, exist_ok=True)
    hold = held_back(results, measure, only)
    outputs = experiments.run_all(
        results, out_dir / EXPERIMENTS_DIR, only=only, skip=skip, options=options, on_done=on_done, hold=hold
    )
    path = out_dir / REPORT_NAME
    text = render_html(outputs, results, path, title=title, extra=extra)
    atomic_write_text(path, text)
    return Report(path=path, outputs=outputs, results=results, extra=extra or {})
