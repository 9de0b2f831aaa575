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
from typing import Any

import numpy as np
import pandas as pd

from probust import experiments
from probust.experiments import _style
from probust.experiments._base import Output
from probust.experiments.runs import Results

__all__ = ["Report", "build_report", "error_summary", "render_html"]

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


# -- numbers for the summary ----------------------------------------------------------------------


def error_summary(outputs: Iterable[Output], models: Iterable[str] | None = None) -> pd.DataFrame:
    """Mean |error| against Monte Carlo: one row per (model, estimator), one column per sigma.

    From experiment 1's table (or an empty frame when it did not run).
    """
    out = next((o for o in outputs if o.name == "estimation_error" and not o.skipped), None)
    if out is None:
        return pd.DataFrame()
    t = out.table
    if models is not None:
        t = t[t["model"].isin(list(models))]
    order = {m: i for i, m in enumerate(_style.METHOD_ORDER)}
    wide = t.pivot_table(index=["model", "method"], columns="sigma", values="mean_abs_error", aggfunc="first")
    half = t.drop_duplicates(["model", "sigma"]).pivot_table(index="model", columns="sigma", values="mc_mean_half_width")
    rows = []
    for model in dict.fromkeys(t["model"]):
        block = wide.loc[model]
        block = block.iloc[np.argsort([order.get(m, 99) for m in block.index])]
        for method, values in block.iterrows():
            rows.append({"model": model, "estimator": f"p^{method}", **{f"σ={s:g}": v for s, v in values.items()}})
        rows.append({"model": model, "estimator": "(MC 95% half-width)", **{f"σ={s:g}": v for s, v in half.loc[model].items()}})
    return pd.DataFrame(rows)


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
    if text.startswith("p^") and text[2:] in _style.METHOD_HTML:
        return _style.method_html(text[2:])
    return _esc(text)


def _table_html(frame: pd.DataFrame, caption: str | None = None, max_rows: int = 60) -> str:
    if frame is None or frame.empty:
        return ""
    shown = frame.head(max_rows)
    text_cols = {c for c in shown.columns if not pd.api.types.is_numeric_dtype(shown[c])}
    head = "".join(f'<th class="{"l" if c in text_cols else ""}">{_header(c)}</th>' for c in shown.columns)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if c in text_cols else ""}">{_cell(v)}</td>' for c, v in row.items()) + "</tr>"
        for _, row in shown.iterrows()
    )
    more = f'<tr><td class="l" colspan="{len(shown.columns)}">… {len(frame) - max_rows} more rows in the CSV file</td></tr>' if len(frame) > max_rows else ""
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}{more}</tbody></table></div>'


def _header(name: Any) -> str:
    text = _esc(name)
    for m in _style.METHOD_ORDER:
        text = text.replace(f"p^{m}", _style.method_html(m))
    return text.replace("_", " ") if "<sup>" not in text else text


def _embed(png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f"data:image/png;base64,{data}"


def _rel(path: Path, start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:
        return str(path)


def _display(output: Output) -> list[tuple[str, pd.DataFrame]]:
    """The tables shown on the page (the CSV files hold everything)."""
    name, t = output.name, output.tables
    main = t.get(name, pd.DataFrame())
    methods_order = {m: i for i, m in enumerate(_style.METHOD_ORDER)}

    def sort_methods(frame: pd.DataFrame, col: str = "method") -> pd.DataFrame:
        return frame.assign(_o=frame[col].map(methods_order)).sort_values([c for c in ("model", "_o", "sigma") if c in frame or c == "_o"]).drop(columns="_o")

    if name == "estimation_error":
        view = main[["model", "sigma", "method", "n_points", "mean_abs_error", "sem_abs_error", "mean_rel_error", "frac_within_mc_ci", "mc_mean_half_width"]]
        view = sort_methods(view).assign(method=lambda f: "p^" + f["method"])
        return [("Mean |p̂ − p<sup>mc</sup>| ± SEM, mean relative error, share of points inside Monte Carlo's 95% interval", view)]
    if name == "convergence":
        return [("Error against the reference per sample count", main)]
    if name == "runtime":
        view = t["paper_layout"].assign(method=lambda f: "p^" + f["method"])
        return [("Wall time for all timed points (seconds), speed-up over Monte Carlo in the same mode, and the peak memory one call added (MB)", view)]
    if name == "mv_sigmoid":
        return [("mv-sigmoid vs mvn-cdf on the same z", main)]
    if name == "softmax_correlation":
        view = main[["model", "grad_reg", "sigma", "p_robust", "n_points", "pearson", "spearman", "mean_softmax", "mean_p"]]
        return [("Correlation of p<sup>softmax</sup> with p<sup>robust</sup>", view)]
    if name == "robust_models":
        view = main[main["method"].isin(["mmse", "taylor"])][["model", "grad_reg", "sigma", "method", "mean_abs_error", "sem_abs_error", "mean_p_mc", "mc_mean_half_width"]]
        return [("Errors of p<sup>mmse</sup> and p<sup>taylor</sup> for each λ", sort_methods(view).assign(method=lambda f: "p^" + f["method"]))]
    if name == "class_bias":
        view = main.assign(method=lambda f: "p^" + f["method"])
        return [("Kruskal–Wallis test of a class effect, and the least and most robust classes (by mean p)", view)]
    if name == "vulnerable_points":
        return []
    if name == "case_study":
        return [("Test accuracy of the high-vs-low classifier", main), ("Per seed", t.get("seeds", pd.DataFrame()).drop(columns=["model"], errors="ignore"))]
    if name == "distribution":
        models = t.get("models", pd.DataFrame()).drop(columns=["checkpoint", "results"], errors="ignore")
        return [("The models (from the checkpoints' metadata)", models), ("Distribution of p over the scored points", main.assign(method=lambda f: "p^" + f["method"]))]
    if name == "robust_training":
        view = main[["model", "sigma", "test_accuracy", "accuracy_cost", "median_p", "median_ci_low", "median_ci_high", "mean_p", "gain_median", "gain_ci_low", "gain_ci_high"]]
        matched = t.get("matched", pd.DataFrame())
        cols = ["model", "sigma", "test_accuracy", "median_p", "matched_median_p", "matched_between", "advantage", "advantage_ci_low", "advantage_ci_high", "verdict", "nearest_short", "nearest_accuracy", "nearest_median_p"]
        return [
            ("Median and mean p<sup>mc</sup> of each model, its gain over the plain model (paired bootstrap 95% CI) and its accuracy cost", view),
            ("At matched accuracy: the gradient-norm family interpolated at the robust model's accuracy", matched[[c for c in cols if c in matched]]),
        ]
    return [(name, main)]


def _config_html(results: Results, root: Path, extra: dict[str, Any] | None) -> str:
    rows = []
    for r in results:
        cfg = r.config.get("run", {})
        reqs = r.config.get("requests", [])
        grid = "; ".join(
            f"{q.get('n_points')} pts, σ {' '.join(f'{s:g}' for s in q.get('sigmas', []))}, "
            f"{' '.join(q.get('methods', []))}"
            + (f", mc n {' '.join(map(str, q['mc_samples']))}" if q.get("mc_samples") else "")
            + (f", mmse N {' '.join(map(str, q['mmse_samples']))}" if q.get("mmse_samples") else "")
            for q in reqs
        )
        argv = [h.get("argv") for h in r.config.get("history", []) if h.get("argv")]
        rows.append(
            {
                "model": r.label,
                "results folder": _rel(r.path, root),
                "data": f"{cfg.get('dataset')} ({cfg.get('split')}, {cfg.get('data_size')} points)",
                "checkpoint": _rel(Path(r.model_source), root) if r.model_source else "in-memory module",
                "seed": cfg.get("seed"),
                "settings": f"target {cfg.get('target')}, MC interval {cfg.get('interval')} {cfg.get('ci_level')}, "
                f"mvn-cdf tol {cfg.get('tol')}, MMSE sampling {cfg.get('mmse_sampling')}, softmax T {cfg.get('temperature')}",
                "requests (grid)": grid,
                "versions": f"probust {r.config.get('probust_version')}, torch {r.config.get('torch_version')}, {r.config.get('device')}",
                "command": " ".join(argv[-1]) if argv else "",
            }
        )
    html_ = _table_html(pd.DataFrame(rows), "Results folders (each a <code>probust estimate</code> run)", max_rows=100)
    if extra:
        html_ += "<h3>How these results were made</h3><pre>" + _esc(json.dumps(extra, indent=2, default=str)) + "</pre>"
    return html_


def _summary_html(outputs: list[Output], results: Results) -> str:
    parts = []
    errors = error_summary(outputs, [r.label for r in results.standard()] or None)
    if not errors.empty:
        parts.append(_table_html(errors, "Mean |p̂ − p<sup>mc</sup>| of each estimator against Monte Carlo, per σ (experiment 1)"))
    rt = next((o for o in outputs if o.name == "runtime" and not o.skipped), None)
    if rt is not None:
        t = rt.table
        keep = t[((t["method"] == "mc") & (t["n_samples"] == t[t["method"] == "mc"]["n_samples"].max())) | t["method"].isin(["taylor", "taylor_mvs", "softmax"]) | (t["method"].str.startswith("mmse") & (t["n_samples"] == 5))]
        view = keep.pivot_table(index=["method", "n_samples"], columns="mode", values="speedup_vs_mc", aggfunc="first").reset_index()
        view = view.iloc[np.argsort([_style.METHOD_ORDER.index(m) if m in _style.METHOD_ORDER else 99 for m in view["method"]], kind="stable")]
        view.columns = [f"speed-up vs MC, {c}" if c in ("serial", "batched") else c for c in view.columns]
        view["method"] = "p^" + view["method"]
        parts.append(_table_html(view, f"Speed-up over Monte Carlo ({_esc(t['speedup_reference'].iloc[0])}) on this machine (experiment 3)"))
    cb = next((o for o in outputs if o.name == "class_bias" and not o.skipped), None)
    if cb is not None:
        t = cb.table
        view = t[t["method"] == "mc"] if (t["method"] == "mc").any() else t
        view = view[["model", "sigma", "method", "least_robust_class", "least_robust_mean_p", "most_robust_class", "most_robust_mean_p", "p_value"]]
        parts.append(_table_html(view.assign(method=lambda f: "p^" + f["method"]), "Least and most robust classes (experiment 7; p value: Kruskal–Wallis)"))
    skipped = [o for o in outputs if o.skipped]
    if skipped:
        parts.append("<p class='meta'>Not shown: " + "; ".join(f"{_esc(o.title)} ({_esc(o.skipped)})" for o in skipped) + ".</p>")
    return "".join(parts)


def render_html(outputs: list[Output], results: Results, path: Path, *, title: str = "probust report",
                extra: dict[str, Any] | None = None) -> str:  # fmt: skip
    """The report page as a string (figures embedded)."""
    from probust import __version__

    root = path.parent
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    toc = "".join(f'<li><a href="#{o.name}">{_esc(o.title)}</a>{" (not run)" if o.skipped else ""}</li>' for o in outputs)
    sections = []
    for o in outputs:
        s = [f'<section id="{o.name}"><h2>{_esc(o.title)}</h2><p class="desc">{o.description}</p>']
        if o.skipped:
            s.append(f'<p class="skipped">Not run: {_esc(o.skipped)}</p></section>')
            sections.append("".join(s))
            continue
        for png in o.figures:
            links = [f'<a href="{_esc(_rel(png, root))}">PNG</a>', f'<a href="{_esc(_rel(png.with_suffix(".svg"), root))}">SVG</a>']
            s.append(f'<figure><img alt="{_esc(o.title)}" src="{_embed(png)}"><figcaption>{png.stem}: {" · ".join(links)}</figcaption></figure>')
        if o.reading:
            s.append('<div class="reading"><h3>Reading</h3><ul>' + "".join(f"<li>{line}</li>" for line in o.reading) + "</ul></div>")
        for caption, frame in _display(o):
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
from {len(results)} results folder(s) under <code>{_esc(_rel(results.root, root))}</code>.</p>
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
) -> Report:
    """Run the experiments on the results under ``results_dir`` and write ``report.html``.

    Args:
        results_dir: a results folder, or a folder holding several (searched a few levels
            deep), or already loaded :class:`~probust.experiments.Results`.
        out: where ``report.html`` and ``experiments/`` go (default: ``results_dir``).
        only, skip: experiment names to run / leave out (see :data:`probust.experiments.EXPERIMENTS`).
        options: per-experiment keyword arguments, e.g. ``{"runtime": {"points": 10}}``.
        title: the page title.
        extra: a JSON-serialisable description of how the results were made, shown in the
            configuration section (``probust demo`` passes its settings).
        on_done: called with each experiment's output as it finishes.

    Returns:
        The :class:`Report`.

    Raises:
        FileNotFoundError: no results folder under ``results_dir``.
    """
    results = results_dir if isinstance(results_dir, Results) else experiments.load_results(results_dir)
    out_dir = Path(out) if out is not None else (results.root if results.root.is_dir() else Path("."))
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = experiments.run_all(results, out_dir / EXPERIMENTS_DIR, only=only, skip=skip, options=options, on_done=on_done)
    path = out_dir / REPORT_NAME
    text = render_html(outputs, results, path, title=title, extra=extra)
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return Report(path=path, outputs=outputs, results=results, extra=extra or {})
