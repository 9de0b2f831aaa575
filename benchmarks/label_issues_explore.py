"""Research for issue 58 (temporary), stage 3: combinations of the label's and the prediction's p."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata, spearmanr
from sklearn.metrics import roc_auc_score

import probust
from probust import data as pdata

sys.path.insert(0, str(Path(__file__).parent))
from label_issues_research import make_model  # noqa: E402

warnings.simplefilter("ignore")
SIGMAS = (0.3, 0.5, 1.0)


def taylor(model, x, t, s):
    est = probust.Taylor(model, s, check_draws=0, execution=probust.Execution(show_progress=False))
    return est(x, target=t).p.numpy()


def fold_arrays(model, x, y, cache: Path):
    if cache.exists():
        return dict(np.load(cache))
    with torch.no_grad():
        lg = torch.cat([model(x[i : i + 1000]) for i in range(0, len(x), 1000)]).double()
    pred = lg.argmax(1)
    out = {"logits": lg.numpy()}
    diff = (pred != y).nonzero()[:, 0]
    for s in SIGMAS:
        pl = taylor(model, x, y, s)
        pp = pl.copy()
        if len(diff):
            pp[diff.numpy()] = taylor(model, x[diff], pred[diff], s)
        out[f"pl{s}"], out[f"pp{s}"] = pl, pp
    np.savez(cache, **out)
    return out


def main(folder: str, which: str = "oos") -> None:
    folder = Path(folder)
    meta = np.load(folder / "meta.npz")
    info = json.loads((folder / "meta.json").read_text())
    y, y_true, fold_of = meta["y"], meta["y_true"], meta["fold_of"]
    n = len(y)
    x = pdata.load("fashion-mnist", "train").tensors()[0][:n]
    yt = torch.as_tensor(y)
    bad = y != y_true
    arr: dict[str, np.ndarray] = {}
    parts = range(info["folds"]) if which == "oos" else [None]
    for k in parts:
        idx = np.flatnonzero(fold_of == k) if k is not None else np.arange(n)
        m = make_model(info["arch"])
        state = torch.load(folder / f"fold{k}.pt") if k is not None else torch.load(folder / "full.pt")["state"]
        m.load_state_dict(state)
        m.eval()
        a = fold_arrays(m, x[idx], yt[idx], folder / f"explore_{which}_{k}.npz")
        for key, v in a.items():
            if key not in arr:
                arr[key] = np.zeros((n, *v.shape[1:]))
            arr[key][idx] = v
    lg = arr["logits"]
    pr = np.exp(lg - lg.max(1, keepdims=True))
    pr /= pr.sum(1, keepdims=True)
    sc = pr[np.arange(n), y]
    mg = lg[np.arange(n), y] - np.where(np.eye(10, dtype=bool)[y], -np.inf, lg).max(1)
    pmax = pr.max(1)
    cand = {"self_conf": sc, "margin": mg, "pmax": pmax}
    for s in SIGMAS:
        pl, pp = arr[f"pl{s}"], arr[f"pp{s}"]
        cand[f"pl{s}"] = pl
        cand[f"pl-pp{s}"] = pl - pp
        cand[f"pl-pp*{s}"] = np.where(pl >= pp, pl, pl - pp)
        cand[f"sc*pl{s}"] = sc * pl
        cand[f"rank(sc)+rank(pl){s}"] = rankdata(sc) + rankdata(pl)
        cand[f"rank(sc)+rank(pl-pp){s}"] = rankdata(sc) + rankdata(pl - pp)
        cand[f"sc-pp{s}"] = sc - np.where(pr.argmax(1) != y, pp, 0)
    cand["pl_mean"] = np.mean([arr[f"pl{s}"] for s in SIGMAS], 0)
    cand["pl-pp_mean"] = np.mean([arr[f"pl{s}"] - arr[f"pp{s}"] for s in SIGMAS], 0)
    for key, v in cand.items():
        rho = spearmanr(v, mg)[0]
        print(f"  {which} {key:<28} AUROC {roc_auc_score(bad, -v):.4f} rho(margin) {rho:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "oos")
