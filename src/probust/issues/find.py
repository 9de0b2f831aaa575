"""``probust.find_issues``: label errors, memorised and atypical points, ranked by p_robust.

    df = probust.find_issues(model, loader)                        # in sample: one trained model
    df = probust.find_issues(None, (x, y), folds=[(m1, idx1), ...])  # out of sample (cleanlab's setting)
    df.sort_values("label_score").head(20)                          # the most suspect labels

Every point gets, from the model that scores it (its fold's, out of sample), two Taylor
linearisations of its margins under Gaussian noise of scale ``sigma``: ``p_label``, the
probability that the model's prediction at ``x + eps`` is the *given* label, and ``p_robust``, the
same for its clean prediction (one computation where the two agree). Both come from one forward
pass and C - 1 backward passes per point (the second only for the points predicted otherwise).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from probust._extras import import_extra
from probust._inputs import NO_LABEL, as_dataset, batch, check_labels, check_sigma, check_x, warn_pixels
from probust._progress import Share, counting, run_bar
from probust.estimators import LinearisationWarning, Taylor
from probust.execution import Execution
from probust.issues import counting as issue_counting
from probust.issues.folds import assign
from probust.issues.store import ChunkStore, fingerprint
from probust.run import ConfigError
from probust.run.sources import class_names

__all__ = ["COLUMNS", "default_sigma", "find_issues", "given_labels", "read_sample", "with_class_names"]

#: The columns of :func:`find_issues`' DataFrame, in order (``label_name`` and
#: ``prediction_name`` follow ``label`` and ``prediction`` where the data set names its classes).
COLUMNS = (
    "index",
    "fold",
    "label",
    "prediction",
    "label_score",
    "is_label_issue",
    "outlier_score",
    "memorisation_score",
    "p_label",
    "p_robust",
    "self_confidence",
    "sigma",
)
#: Points per Taylor call: the unit of the progress bar's steps and of ``out``'s chunks.
CHUNK = 2048
#: The default sigma as a fraction of the inputs' spread (:func:`default_sigma`).
SIGMA_FRACTION = 1.0
#: At most this many points (drawn with the seed) estimate the inputs' spread for the default sigma.
SIGMA_POINTS = 4096


def default_sigma(x: Tensor) -> float:
    """The noise scale used when none is given: :data:`SIGMA_FRACTION` times the root-mean-square
    over coordinates of the inputs' standard deviation across ``x`` [N, *S], in the units of x
    (:func:`find_issues` passes the data set's points, up to :data:`SIGMA_POINTS` of them drawn
    with its seed).

    For Fashion-MNIST's training pixels in [0, 1] this is 0.295. There (docs/issues.md) the
    label score's AUROC rises from sigma 0.1 to 0.3, is within 0.004 of its best from 0.3 to 1.0,
    and the mvn-cdf's cost grows with sigma: the default sits at the knee."""
    flat = x.reshape(len(x), -1).to(torch.float64)
    spread = float(flat.var(0, unbiased=False).mean().sqrt())
    if not math.isfinite(spread) or spread <= 0:
        raise ConfigError("the inputs do not vary across the data set: give sigma= explicitly", field="sigma")
    return SIGMA_FRACTION * spread


def find_issues(
    model: nn.Module | None,
    data: Any,
    *,
    folds: Sequence[tuple[nn.Module, Any]] | None = None,
    sigma: float | None = None,
    seed: int = 0,
    out: str | os.PathLike | None = None,
    show_progress: bool = True,
    execution: Execution | None = None,
    keys: tuple[Any, Any] | None = None,
) -> Any:
    """Suspect labels, atypical and memorised points of a labelled data set, one row per point.

    Args:
        model: a classifier, [B, *S] -> logits [B, C]. Without ``folds`` it scores every point;
            with them, the points no fold holds out (in sample). None: the folds cover every point.
        data: what :func:`probust.score` takes: a map-style Dataset (``ds[i] -> (x, label)``), a
            DataLoader over one (read in index order), or tensors ``(x [N, *S], labels [N])``.
            Inputs in the units the noise is added in (pixels in [0, 1] for images).
        folds: ``[(model_1, held_out_1), ..., (model_K, held_out_K)]``, each model with the
            data-set indices it did not train on (a list, an int tensor or array, or a boolean
            mask [N]); each scores its own. Disjoint; :func:`probust.issues.train_folds` trains
            them from a model factory.
        sigma: noise standard deviation per input coordinate, in the units of x; default
            :func:`default_sigma` of the data.
        seed: of the random streams (the multivariate normal CDF's quasi-Monte Carlo points).
        out: a folder to keep the results in as they are computed (``issues.json`` and a file per
            chunk of 2,048 points): a call interrupted or repeated with the same models, data,
            sigma and seed computes only what is missing. None: nothing is written.
        show_progress: one bar over the call's points (stderr).
        execution: how the Taylor estimator runs (:class:`probust.Execution`); no number changes.
        keys: ``(inputs_key, label_key)`` of a data set whose items are dicts, where they are not
            among the names read by default (``image``, ``pixel_values``, ``img``, ``x``; ``label``,
            ``labels``, ``y``: :mod:`probust._inputs`).

    Returns:
        A pandas DataFrame in data-set order with :data:`COLUMNS`:

        - ``index``, ``label`` (given), ``prediction`` (the scoring model's argmax on the clean
          input), ``fold`` (k for ``folds[k]``, -1 for ``model``: in sample);
        - ``label_score`` in [0, 1], low = the label is suspect: ``p_label``
          (:func:`label_quality`; docs/issues.md measures it against cleanlab's scores);
        - ``is_label_issue``: the points flagged, per given class the number of label errors
          estimated by the confident joint (Northcutt et al. 2021) on the clean softmax, taken
          lowest ``label_score`` first (:mod:`probust.issues.counting`);
        - ``outlier_score`` in [0, 1], high = atypical: 1 - ``p_robust``, the probability that the
          noise changes the clean prediction;
        - ``memorisation_score`` in [0, 1], high = the model holds the given label at the point
          but not around it: ``1 - p_label`` where it predicts the label, 0 where it does not (in
          sample, the points a model fits only by memorising them);
        - ``p_label``, ``p_robust``, ``self_confidence`` (the clean softmax of the given label,
          cleanlab's default score), ``sigma``.

    Raises:
        ConfigError: no label, a label outside [0, C), integer or non-finite inputs, items that
            are not (x, label), sigma not one positive number (the :mod:`probust._inputs` errors,
            named by field: ``data``, ``sigma``), overlapping or incomplete folds (``folds``,
            ``model``), a folder of another call (``out``).
        ModelOutputError: a model whose output is not logits [B, C] (probabilities included).
    """
    pd = import_extra("pandas", extra="run", feature="probust.find_issues")
    ds = as_dataset(data, keys)
    n = len(ds)
    labels = given_labels(ds, n)
    plan = assign(n, model, folds)
    sample, sigma = read_sample(ds, sigma, seed)
    classes = _classes(plan.models, sample[:2])
    check_labels(labels, n, classes)
    store = ChunkStore(
        out,
        {
            "n": n,
            "sigma": sigma,
            "seed": seed,
            "classes": classes,
            "fold": _digest(plan.fold),
            "models": [fingerprint(m) for m in plan.models],
            "labels": _digest(labels.numpy()),
        },
    )
    rows = _compute(plan, ds, labels, classes, sigma, seed, store, show_progress, execution)
    return with_class_names(_frame(pd, rows, plan.fold, labels.numpy(), sigma), class_names(ds))


def with_class_names(frame: Any, names: list[str] | None) -> Any:
    """``frame`` with ``label_name`` and ``prediction_name`` after ``label`` and ``prediction``,
    where the data set names its classes (``names``; None: ``frame`` as it is)."""
    if names is not None:
        for column in ("label", "prediction"):
            frame.insert(
                frame.columns.get_loc(column) + 1,
                f"{column}_name",
                [names[c] if 0 <= c < len(names) else None for c in frame[column]],
            )
    return frame


def read_sample(ds: Any, sigma: Any, seed: int) -> tuple[Tensor, float]:
    """The points of ``ds`` that check its units and, where ``sigma`` is None, set the default
    sigma (up to :data:`SIGMA_POINTS` drawn with ``seed``; else its first 8): ``(x [B, *S] checked,
    sigma)``. Warns where the inputs look like pixels in 0..255.

    Raises:
        SigmaError: ``sigma`` is not one positive number.
        InputError: the points are integers, NaN or inf (field ``data``).
    """
    n = len(ds)
    if sigma is not None:
        sigma = check_sigma(sigma)
        picked = np.arange(min(n, 8))
    else:
        picked = np.sort(
            np.random.default_rng(seed).choice(n, SIGMA_POINTS, replace=False) if n > SIGMA_POINTS else np.arange(n)
        )
    sample = check_x(batch(ds, picked)[0], "data", picked)
    warn_pixels(sample)
    return sample, default_sigma(sample) if sigma is None else sigma


def given_labels(ds: Any, n: int) -> Tensor:
    """The given labels, int64 [N], checked (:func:`probust._inputs.check_labels`): the data
    set's ``targets`` where it has them, else read point by point.

    Raises:
        ConfigError: an empty data set, or points without labels (field ``data``).
        LabelError: labels that are not class indices >= 0.
    """
    if n == 0:
        raise ConfigError("the data set is empty", field="data")
    targets = getattr(ds, "targets", None)
    if targets is None or len(targets) != n:
        targets = [int(ds[i][1]) for i in range(n)]
    labels = torch.as_tensor(np.asarray(targets))
    if bool((labels == NO_LABEL).all()):
        raise ConfigError(
            "the points have no labels: give (x, labels), or a data set of (x, label) pairs", field="data"
        )
    return check_labels(labels, n)


def _digest(array: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def _classes(models: list[nn.Module], probe: Tensor) -> int:
    """C, the same for every model (checked on one point; each model's contract is checked by its
    estimator)."""
    counts = set()
    for m in models:
        estimate = Taylor(m, 1.0, check_draws=0, execution=Execution(show_progress=False))(probe)
        counts.add(int(_margins(estimate).shape[1]))
    if len(counts) != 1:
        raise ConfigError(f"the models give different numbers of classes: {sorted(counts)}", field="folds")
    return counts.pop()


def _margins(estimate: Any) -> Tensor:
    """Taylor's margins [B, C] (always computed; ``Estimate.margin`` is optional for other methods)."""
    assert estimate.margin is not None
    return estimate.margin


def _compute(plan, ds, labels, classes, sigma, seed, store, show_progress, execution) -> dict[str, np.ndarray]:
    """Every chunk's numbers, each chunk's points read from ``ds`` when it is computed (or checked
    against a stored chunk: its inputs' digest is kept beside its numbers)."""
    n = len(labels)
    rows = {key: np.zeros(n, dtype=np.float64) for key in ("p_label", "p_robust", "self_confidence", "prediction")}
    rows["probs"] = np.zeros((n, classes))
    chunks = [(k, s) for k, idx in enumerate(plan.indices) for s in range(0, len(idx), CHUNK)]
    work = Execution(show_progress=False) if execution is None else execution
    with run_bar(n, "find_issues", show_progress) as bar, warnings.catch_warnings():
        warnings.simplefilter("ignore", LinearisationWarning)  # no trust check is run (check_draws=0)
        for k, start in chunks:
            idx = plan.indices[k][start : start + CHUNK]
            x = check_x(batch(ds, idx)[0], "data", idx)
            inputs = np.array(_digest(x.numpy()))
            found = store.load(k, start)
            if found is None or found.pop("inputs") != inputs:
                share = Share(bar, len(idx)) if bar is not None else None
                with counting(share):
                    found = _chunk(plan.models[k], x, labels[idx], torch.from_numpy(idx), sigma, seed, work)
                store.save(k, start, {**found, "inputs": inputs})
                if share is not None:
                    share.finish()
            elif bar is not None:
                bar.update(len(idx))
            for key, value in found.items():
                rows[key][idx] = value
    return rows


def _chunk(model, x, labels, index, sigma, seed, execution) -> dict[str, np.ndarray]:
    """One chunk's numbers: the given label's Taylor p and margins, then the prediction's p where
    the model predicts another class (each point's stream from its own data-set index)."""
    estimator = Taylor(model, sigma, check_draws=0, seed=seed, execution=execution)
    at_label = estimator(x, target=labels, indices=index)
    # Taylor's margins at the label are c_i = f_label - f_i, so softmax(f) = softmax(-c).
    probs = torch.softmax(-_margins(at_label).to("cpu", torch.float64), 1)
    prediction = probs.argmax(1)
    p_label = at_label.p.to("cpu", torch.float64)
    p_robust = p_label.clone()
    other = torch.nonzero(prediction != labels)[:, 0]
    if len(other):
        p_robust[other] = estimator(x[other], target=prediction[other], indices=index[other]).p.to("cpu", torch.float64)
    return {
        "p_label": p_label.numpy(),
        "p_robust": p_robust.numpy(),
        "self_confidence": probs.gather(1, labels[:, None])[:, 0].numpy(),
        "prediction": prediction.to(torch.float64).numpy(),
        "probs": probs.numpy(),
    }


def _frame(pd, rows, fold, labels, sigma):
    p_label, p_robust = rows["p_label"], rows["p_robust"]
    prediction = rows["prediction"].astype(np.int64)
    label_score = label_quality(p_label, p_robust, prediction, labels)
    issues = issue_counting.estimated_issues(labels, rows["probs"])
    return pd.DataFrame(
        {
            "index": np.arange(len(labels), dtype=np.int64),
            "fold": fold,
            "label": labels.astype(np.int64),
            "prediction": prediction,
            "label_score": label_score,
            "is_label_issue": issue_counting.flag(labels, label_score, issues),
            "outlier_score": 1.0 - p_robust,
            "memorisation_score": np.where(prediction == labels, 1.0 - p_label, 0.0),
            "p_label": p_label,
            "p_robust": p_robust,
            "self_confidence": rows["self_confidence"],
            "sigma": np.full(len(labels), sigma),
        }
    )


def label_quality(p_label: np.ndarray, p_robust: np.ndarray, prediction: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The label score in [0, 1] (low = suspect): ``p_label``, the probability that the noisy
    prediction is the given label. (Subtracting or discounting by the robustness of another
    predicted class ranked label errors worse: docs/issues.md.)"""
    del p_robust, prediction, labels
    return p_label
