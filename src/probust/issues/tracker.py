"""``probust.issues.Tracker``: label errors, memorised and atypical points from the history of one
training run.

    tracker = probust.issues.Tracker((x, labels))           # data as find_issues takes it
    for epoch in range(epochs):
        train_one_epoch(model)
        tracker.update(model)
    df = tracker.find_issues()                               # find_issues' columns, and the history's

A finished network has memorised its noisy labels, so its scores no longer tell them apart; the
way it got there does. At every update the tracker computes, for each point ``x`` with given
label ``y``, the logit margin of the label over its strongest rival ``j``, ``m = f_y(x) - f_j(x)``,
and, at every ``gradient_every``-th update, the norm of its input gradient. ``z = m / (sigma *
||grad m||)`` is the linearised distance from ``x`` to the boundary between ``y`` and ``j``, in
units of the noise scale: Taylor's z of the binding boundary, whose ``Phi(z)`` is the probability
that Gaussian noise of scale ``sigma`` leaves the prediction on the label's side of it. Each
update's margin is divided by the gradient norm of the next update that computes one (the last
one for the updates after it), so a margin is always measured against a boundary of the same
stage of training. A mislabelled point stays on the wrong side of its label's boundary, or close
to it, for most of the run even once the network has fitted it; a clean hard point crosses it
early and moves away. The label score is the mean z over the updates (docs/issues.md measures it
against the loss history, the Area Under the Margin and 5-fold cleanlab).

Cost per update: one forward pass over the tracked points (no autograd), and at every
``gradient_every``-th update one forward and one backward pass to the inputs instead.
What it keeps is O(N) per point, whatever the number of updates: running sums, the forgetting
count, when each point was learned, the last update's logits and the running sum of the softmax
[N, C]. ``keep_history=True`` also keeps every update's margin and loss ([updates, N] float32 each).

Under DDP each rank tracks its shard of the points (``rank::world``); :meth:`Tracker.find_issues`
gathers them into one frame (every rank gets it); :meth:`Tracker.merge` does the same for trackers
built apart (``shard=(rank, world)``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from probust._extras import import_extra
from probust._inputs import as_dataset, batch, call_error, check_labels, check_x
from probust._io import atomic_write_bytes
from probust._user_model import eval_mode, logits_reading, read_logits, to_format, weights_in_format
from probust.execution import Execution, ForwardPlan
from probust.issues.find import given_labels, read_sample, with_class_names
from probust.run import ConfigError, ConfigMismatchError
from probust.run.sources import class_names

__all__ = ["HISTORY_COLUMNS", "Tracker"]

#: The columns :meth:`Tracker.find_issues` adds to :data:`probust.issues.COLUMNS`.
HISTORY_COLUMNS = ("updates", "cumulative_loss", "mean_margin", "forgetting", "learned_at")
#: z is clipped to [-Z_CLIP, Z_CLIP] (a zero gradient gives an infinite distance).
Z_CLIP = 1e3
#: Per point: sums over updates (float64), counts and states (int64).
_SUMS = ("loss", "margin", "z", "pending")
_COUNTS = ("forgetting", "learned_at", "correct")
_FORMAT = 1


class Tracker:
    """Watches a training run: each point's margin, loss and distance to its label's decision
    boundary at every :meth:`update`, and label issues from that history (:meth:`find_issues`).

    Args:
        data: the training points, as :func:`probust.find_issues` takes them: tensors ``(x [N, *S],
            labels [N])``, a map-style Dataset of ``(x, label)`` pairs or dict items, or a
            DataLoader over one (read in index order, without its shuffling). Give them without
            augmentation: every update must read the same points (checked).
        sigma: noise standard deviation per input coordinate, in the units of x: the unit of z
            (it scales every z alike, so it changes no ranking and no flag); default
            :func:`probust.issues.default_sigma` of the data.
        gradient_every: the margins' input gradients are computed at updates 0, k, 2k, ... (k =
            ``gradient_every``); the other updates cost one forward pass. 1: at every update.
        seed: draws the points that set the default sigma.
        batch_size: points per forward-and-backward pass (a gradient update); a margin-only
            update runs the rows and memory format ``execution`` declares for forward passes.
        shard: ``(rank, world)``: track the points ``rank::world`` only. Default: the default
            ``torch.distributed`` group's rank and size where one is initialised, else ``(0, 1)``.
        keep_history: also keep every update's margin and loss, [updates, N] float32 each.
        keys: the keys of a dict item's input and label, where they are not the common ones
            (as :func:`probust.find_issues` takes them).
        execution: how the passes run (:class:`probust.Execution`: rows per forward pass, memory
            budget, channels_last; declared from the model at the first update); no number changes.

    Raises:
        ConfigError: empty or unlabelled data, integer or non-finite inputs, labels that are not
            class indices, a bad sigma, gradient_every, batch_size or shard (the
            :mod:`probust._inputs` errors where they apply, named by field).
    """

    def __init__(
        self,
        data: Any,
        *,
        sigma: float | None = None,
        gradient_every: int = 4,
        seed: int = 0,
        batch_size: int = 256,
        shard: tuple[int, int] | None = None,
        keep_history: bool = False,
        keys: Sequence[Any] | None = None,
        execution: Execution | None = None,
    ) -> None:
        for name, value in (("gradient_every", gradient_every), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"must be an integer >= 1, got {value!r}", field=name)
        self._ds = as_dataset(data, keys)
        n = len(self._ds)
        self.labels = given_labels(self._ds, n).numpy()
        self.sigma = float(read_sample(self._ds, sigma, seed)[1])
        self.gradient_every = gradient_every
        self.batch_size = batch_size
        self.rank, self.world = _shard(shard)
        self.n = n
        self.indices = np.arange(self.rank, n, self.world, dtype=np.int64)
        self.keep_history = keep_history
        self.execution = Execution(show_progress=False) if execution is None else execution
        self._plan: ForwardPlan | None = None
        self.updates = 0
        self.classes: int | None = None
        m = len(self.indices)
        self._sums = {key: np.zeros(m) for key in _SUMS}
        self._counts = {key: np.zeros(m, dtype=np.int64) for key in _COUNTS}
        self._counts["learned_at"][:] = -1
        self._norm = np.zeros(m)  # the last computed gradient norm of each point's margin
        self._pending = 0  # updates whose margins wait for the next gradient norm
        self._logits: np.ndarray | None = None
        self._sum_probs: np.ndarray | None = None
        self._fingerprint: np.ndarray | None = None
        self._history: dict[str, list[np.ndarray]] = {"margin": [], "loss": []}

    # -- watching --------------------------------------------------------------------------

    def update(self, model: nn.Module) -> None:
        """Record every tracked point's margin and loss under ``model`` (in eval mode; each
        submodule's mode is given back), and its margin's input-gradient norm at every
        ``gradient_every``-th update. Cost: one forward pass per point without autograd (in the
        rows and memory format ``execution`` declares), or one forward and one backward pass to the
        inputs (not the parameters) in chunks of ``batch_size`` where the gradient is computed.
        Under DDP pass the module the wrapper holds (``ddp_model.module``): each rank runs its
        own shard, with no collective until :meth:`find_issues`.

        Raises:
            ConfigError: the points changed since the first update (field ``data``), a model with
                another number of classes than before (field ``model``), labels outside the
                model's classes (field ``data``).
            ModelOutputError: a model whose output is not logits [B, C].
        """
        gradient = self.updates % self.gradient_every == 0
        parts: dict[str, list[Tensor]] = {"loss": [], "margin": [], "norm": [], "logits": [], "fingerprint": []}
        device = _device(model)
        plan = self._forward_plan(model, device)
        rows = self.batch_size if gradient else plan.rows
        with eval_mode(model), torch.set_grad_enabled(gradient), weights_in_format(model, plan.channels_last):
            for start in range(0, len(self.indices), rows):
                idx = self.indices[start : start + rows]
                x = batch(self._ds, idx)[0]
                if self.updates == 0:
                    check_x(x, "data", idx)
                parts["fingerprint"].append(_fingerprint(x))
                y = torch.from_numpy(self.labels[idx]).to(device)
                x = to_format(x.to(device), plan.channels_last).requires_grad_(gradient)
                out = _call(model, x, self.updates == 0 and start == 0)
                logits = read_logits(out, logits_reading(out, len(idx))).float()
                if start == 0:
                    self._check_classes(int(logits.shape[1]))
                rival = logits.detach().scatter(1, y[:, None], -math.inf).argmax(1)
                margin = logits.gather(1, y[:, None])[:, 0] - logits.gather(1, rival[:, None])[:, 0]
                if gradient:
                    (grad,) = torch.autograd.grad(margin.sum(), x)
                    parts["norm"].append(grad.flatten(1).norm(dim=1).to("cpu", torch.float64))
                logits = logits.detach().to("cpu", torch.float64)
                parts["margin"].append(margin.detach().to("cpu", torch.float64))
                parts["loss"].append(torch.logsumexp(logits, 1) - logits.gather(1, y.cpu()[:, None])[:, 0])
                parts["logits"].append(logits)
        got = {key: torch.cat(value).numpy() for key, value in parts.items() if value}
        self._check_points(got["fingerprint"])
        self._record(got)

    def _forward_plan(self, model: nn.Module, device: torch.device) -> ForwardPlan:
        """The declared rows per forward pass and memory format, planned once on two points (the
        model's architecture is the same at every update of a run)."""
        if self._plan is None:
            probe = check_x(batch(self._ds, self.indices[:2])[0], "data", self.indices[:2]).to(device)
            with eval_mode(model), torch.no_grad():
                _call(model, probe, True)  # a model failing on x's shape is explained first
                self._plan = self.execution.forward_plan(model, probe)
        return self._plan

    def _check_classes(self, classes: int) -> None:
        if self.classes is None:
            check_labels(self.labels[self.indices], len(self.indices), classes, indices=self.indices)
            self.classes = classes
        elif classes != self.classes:
            raise ConfigError(
                f"this model gives {classes} classes where the {self.updates} earlier update(s) gave {self.classes}: "
                "a tracker follows one model through one training run",
                field="model",
            )

    def _check_points(self, fingerprint: np.ndarray) -> None:
        if self._fingerprint is None:
            self._fingerprint = fingerprint
            return
        changed = np.flatnonzero(fingerprint != self._fingerprint)
        if changed.size:
            raise ConfigError(
                f"{changed.size} point(s) changed since the first update (point {int(self.indices[changed[0]])} "
                "first): give the tracker the training points without random augmentation, the same at every update",
                field="data",
            )

    def _record(self, got: dict[str, np.ndarray]) -> None:
        margin, loss = got["margin"], got["loss"]
        correct = margin > 0
        if self.updates:
            self._counts["forgetting"] += self._counts["correct"].astype(bool) & ~correct
        learned = self._counts["learned_at"]
        learned[~correct] = -1
        learned[correct & (learned < 0)] = self.updates
        self._counts["correct"] = correct.astype(np.int64)
        self._sums["loss"] += loss
        self._sums["margin"] += margin
        self._sums["pending"] += margin
        self._pending += 1
        if "norm" in got:
            # The margins since the last gradient, this one's included, are measured against it.
            self._norm = got["norm"]
            self._sums["z"] += _z(self._sums["pending"], self._norm, self.sigma, self._pending)
            self._sums["pending"][:] = 0.0
            self._pending = 0
        self._logits = got["logits"].astype(np.float32)
        probs = _softmax(got["logits"])
        self._sum_probs = probs if self._sum_probs is None else self._sum_probs + probs
        if self.keep_history:
            self._history["margin"].append(margin.astype(np.float32))
            self._history["loss"].append(loss.astype(np.float32))
        self.updates += 1

    # -- results ---------------------------------------------------------------------------

    def find_issues(self) -> Any:
        """Suspect labels, memorised and atypical points from the history so far, one row per point
        of the data set (every rank's shard under DDP; every rank gets the whole frame).

        Returns:
            A pandas DataFrame in data-set order with :data:`probust.issues.COLUMNS` (``fold`` is
            -1: in sample) and then :data:`HISTORY_COLUMNS`:

            - ``label_score`` (low = the label is suspect): the mean over updates of z, the
              linearised distance to the boundary between the label and its strongest rival in
              units of sigma (negative on the rival's side); unbounded, so suspects do not tie;
            - ``is_label_issue``: ``label_score < 0``, the points that spent the run on the wrong
              side of their label's boundary, on average;
            - ``outlier_score`` in [0, 1] (high = atypical): 1 - the last update's largest softmax
              (on planted atypical training points it ranked them best of what was measured, the
              binding boundary's 1 - ``p_robust`` included: docs/issues.md);
            - ``memorisation_score`` in [0, 1] (high = fitted only by memorising): for a point the
              last update predicts as its label, ``1 / (1 + exp(mean_margin))``, 0 elsewhere (the
              Area Under the Margin: the z history ranked memorised points no better there,
              docs/issues.md);
            - ``p_label`` = Phi(z) and ``p_robust`` = Phi(|z|) at the last update (Taylor's
              probabilities of the binding boundary alone: of staying on the label's side of it,
              and on the side the point is on), ``self_confidence`` (the last update's softmax of the
              label), ``sigma``;
            - ``updates``, ``cumulative_loss`` (the sum of the losses at the updates),
              ``mean_margin`` (the mean logit margin over the updates: the Area Under the Margin),
              ``forgetting`` (updates at which a point predicted as its label was not any more),
              ``learned_at`` (the update from which the point is predicted as its label, -1 if it
              is not at the last).

        Raises:
            ConfigError: no update yet (field ``model``).
        """
        pd = import_extra("pandas", extra="run", feature="probust.issues.Tracker.find_issues")
        if self.updates == 0:
            raise ConfigError("no update yet: call tracker.update(model) during training first", field="model")
        state = _gather(self.state_dict()) if _distributed(self.world) else [self.state_dict()]
        return _frame(pd, _merged(state, self.n), self.labels, self.sigma, class_names(self._ds))

    @classmethod
    def merge(cls, trackers: Sequence[Tracker]) -> Any:
        """:meth:`find_issues` over trackers that each watched one shard (``shard=(r, world)`` for
        every r), built apart: the frame one tracker of every point would give."""
        if not trackers:
            raise ConfigError("no tracker to merge", field="trackers")
        first = trackers[0]
        pd = import_extra("pandas", extra="run", feature="probust.issues.Tracker.merge")
        merged = _merged([t.state_dict() for t in trackers], first.n)
        return _frame(pd, merged, first.labels, first.sigma, class_names(first._ds))

    @property
    def history(self) -> dict[str, np.ndarray]:
        """Every update's ``margin`` and ``loss``, float32 [updates, tracked points] each
        (``keep_history=True``; the tracked points are :attr:`indices`)."""
        if not self.keep_history:
            raise ConfigError("the tracker keeps no history: build it with keep_history=True", field="keep_history")
        m = len(self.indices)
        return {k: np.stack(v) if v else np.zeros((0, m), np.float32) for k, v in self._history.items()}

    # -- saving and resuming ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What :meth:`load_state_dict` restores: plain numpy arrays and numbers."""
        state: dict[str, Any] = {
            "format": _FORMAT,
            "n": self.n,
            "rank": self.rank,
            "world": self.world,
            "sigma": self.sigma,
            "gradient_every": self.gradient_every,
            "updates": self.updates,
            "pending": self._pending,
            "norm": self._norm,
            "classes": -1 if self.classes is None else self.classes,
            "indices": self.indices,
            "labels": self.labels,
        }
        state.update({f"sum_{k}": v for k, v in self._sums.items()})
        state.update({f"count_{k}": v for k, v in self._counts.items()})
        if self._logits is not None:
            state["logits"] = self._logits
            state["sum_probs"] = self._sum_probs
        if self._fingerprint is not None:
            state["fingerprint"] = self._fingerprint
        if self.keep_history and self.updates:
            state.update({f"history_{k}": np.stack(v) for k, v in self._history.items()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of a tracker of the same points, shard and sigma.

        Raises:
            ConfigMismatchError: the state is of other points, labels, shard or sigma (field ``state``).
        """
        mine = self.state_dict()
        for key in ("format", "n", "rank", "world", "sigma", "gradient_every"):
            if float(state[key]) != float(mine[key]):
                raise ConfigMismatchError(
                    f"the saved tracker has {key} {state[key]!r}, this one {mine[key]!r}",
                    field="state",
                    differences=[key],
                )
        if not np.array_equal(np.asarray(state["labels"]), self.labels):
            raise ConfigMismatchError(
                "the saved tracker watched points with other labels", field="state", differences=["labels"]
            )
        self.updates = int(state["updates"])
        self._pending = int(state["pending"])
        self._norm = np.array(state["norm"], dtype=np.float64)
        self.classes = None if int(state["classes"]) < 0 else int(state["classes"])
        self._sums = {k: np.array(state[f"sum_{k}"], dtype=np.float64) for k in _SUMS}
        self._counts = {k: np.array(state[f"count_{k}"], dtype=np.int64) for k in _COUNTS}
        self._logits = np.array(state["logits"], dtype=np.float32) if "logits" in state else None
        self._sum_probs = np.array(state["sum_probs"], dtype=np.float64) if "sum_probs" in state else None
        self._fingerprint = np.array(state["fingerprint"]) if "fingerprint" in state else None
        self._history = {k: list(np.asarray(state.get(f"history_{k}", []))) for k in self._history}

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`state_dict` to ``path`` (an ``.npz``, read without pickle), atomically."""
        import io

        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.asarray(v) for k, v in self.state_dict().items()})  # type: ignore[arg-type]
        atomic_write_bytes(Path(path), buffer.getvalue())

    def load(self, path: str | os.PathLike) -> Tracker:
        """Continue from a file :meth:`save` wrote; returns self."""
        with np.load(Path(path), allow_pickle=False) as stored:
            self.load_state_dict({key: stored[key] for key in stored.files})
        return self


def _shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    if shard is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1
    if (
        not isinstance(shard, (tuple, list))
        or len(shard) != 2
        or not all(isinstance(v, int) for v in shard)
        or not 0 <= shard[0] < shard[1]
    ):
        raise ConfigError(f"expected (rank, world) with 0 <= rank < world, got {shard!r}", field="shard")
    return int(shard[0]), int(shard[1])


def _distributed(world: int) -> bool:
    return world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()


def _gather(state: dict[str, Any]) -> list[dict[str, Any]]:
    states: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return states


def _call(model: nn.Module, x: Tensor, first: bool) -> Any:
    """``model(x)``; on the first chunk a failure is explained by x's shape (a missing channel
    dimension names its fix), as the estimators explain it."""
    if not first:
        return model(x)
    try:
        return model(x)
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        raise call_error(model, x.detach(), len(x), error) from error


def _device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


#: Fixed weights of :func:`_fingerprint` (a flip or crop of a point changes it).
_WEIGHTS: dict[int, Tensor] = {}


def _fingerprint(x: Tensor) -> Tensor:
    """float64 [B]: one number per point that changes when any of its values does (a weighted sum
    with fixed, distinct weights; exact for the same values read again)."""
    flat = x.reshape(len(x), -1).to(torch.float64)
    d = flat.shape[1]
    if d not in _WEIGHTS:
        _WEIGHTS[d] = torch.cos(torch.arange(d, dtype=torch.float64) * 0.7548776662466927) + 1.5
    return flat @ _WEIGHTS[d]


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _z(margin: np.ndarray, norm: np.ndarray, sigma: float, count: int = 1) -> np.ndarray:
    """Sum of ``count`` margins over sigma times their gradient norm, each z clipped to +-Z_CLIP."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.nan_to_num(margin / (sigma * norm), nan=0.0, posinf=Z_CLIP * count, neginf=-Z_CLIP * count)
    return np.clip(z, -Z_CLIP * count, Z_CLIP * count)


def _merged(states: Sequence[dict[str, Any]], n: int) -> dict[str, np.ndarray]:
    """The shards' numbers in data-set order (every point tracked once, the same number of updates)."""
    updates = {int(s["updates"]) for s in states}
    if len(updates) != 1:
        raise ConfigError(f"the shards saw different numbers of updates: {sorted(updates)}", field="trackers")
    seen = np.concatenate([np.asarray(s["indices"]) for s in states])
    if len(seen) != n or len(np.unique(seen)) != n:
        raise ConfigError(f"the shards cover {len(np.unique(seen))} of the {n} points once each", field="trackers")
    out: dict[str, Any] = {"updates": updates.pop(), "pending": int(states[0]["pending"])}
    keys = [f"sum_{k}" for k in _SUMS] + [f"count_{k}" for k in _COUNTS] + ["logits", "sum_probs", "norm"]
    for key in keys:
        first = np.asarray(states[0][key])
        whole = np.zeros((n, *first.shape[1:]), dtype=first.dtype)
        for s in states:
            whole[np.asarray(s["indices"])] = np.asarray(s[key])
        out[key] = whole
    return out


def _frame(pd: Any, st: dict[str, Any], labels: np.ndarray, sigma: float, names: list[str] | None) -> Any:
    from scipy.special import expit, ndtr

    updates = st["updates"]
    # The margins after the last gradient are measured against it.
    mean_z = (st["sum_z"] + _z(st["sum_pending"], st["norm"], sigma, st["pending"])) / updates
    probs = _softmax(st["logits"].astype(np.float64))
    prediction = probs.argmax(1)
    rows = np.arange(len(labels))
    z_last = _z(st["logits"][rows, labels] - _rival(st["logits"], labels), st["norm"], sigma)
    mean_margin = st["sum_margin"] / updates
    fits = prediction == labels
    frame = pd.DataFrame(
        {
            "index": rows.astype(np.int64),
            "fold": np.full(len(labels), -1, dtype=np.int64),
            "label": labels.astype(np.int64),
            "prediction": prediction.astype(np.int64),
            "label_score": mean_z,
            "is_label_issue": mean_z < 0,
            "outlier_score": 1.0 - probs.max(1),
            "memorisation_score": np.where(fits, expit(-mean_margin), 0.0),
            "p_label": ndtr(z_last),
            "p_robust": ndtr(np.abs(z_last)),
            "self_confidence": probs[rows, labels],
            "sigma": np.full(len(labels), sigma),
            "updates": np.full(len(labels), updates, dtype=np.int64),
            "cumulative_loss": st["sum_loss"],
            "mean_margin": mean_margin,
            "forgetting": st["count_forgetting"],
            "learned_at": st["count_learned_at"],
        }
    )
    return with_class_names(frame, names)


def _rival(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The largest logit other than the label's, [N]."""
    others = logits.astype(np.float64, copy=True)
    others[np.arange(len(labels)), labels] = -np.inf
    return others.max(1)
