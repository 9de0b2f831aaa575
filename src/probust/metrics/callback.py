"""``RobustnessCallback``: log p_robust (and certified accuracy) every N validation epochs in Lightning.

    trainer = lightning.pytorch.Trainer(callbacks=[probust.metrics.RobustnessCallback(sigma=0.1)])

Needs the ``lightning`` extra (``lightning.pytorch``; the older ``pytorch_lightning`` package is not
used: its Trainer accepts only its own callbacks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from probust._extras import missing_extra
from probust.errors import OptionError
from probust.metrics.certified import CertifiedAccuracy
from probust.metrics.robustness import DEFAULT_QUANTILES, AverageCaseRobustness
from probust.noise import Noise

try:
    from lightning.pytorch import Callback
    from lightning.pytorch.trainer.states import TrainerFn
except ModuleNotFoundError as exc:  # Lightning missing: name the extra that installs it
    raise (missing_extra(exc, "probust.metrics.RobustnessCallback") or exc) from exc

#: Where :meth:`RobustnessCallback.get_inputs` looks in a dict batch, in this order.
INPUT_KEYS = ("x", "input", "inputs", "image", "images", "pixel_values")
LABEL_KEYS = ("y", "label", "labels", "target", "targets")

GetInputs = Callable[[Any], tuple[Tensor, Tensor | None]]


def _check_positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"must be an integer >= 1, got {value!r}", field=name)


class RobustnessCallback(Callback):
    """Every N validation epochs, measure p_robust on the validation batches and log its summary.

    On an active epoch the callback feeds the first ``max_points`` validation points (per
    process) to an :class:`~probust.metrics.AverageCaseRobustness` metric, one estimator call per
    validation batch, measuring the model's prediction; at the epoch's end it logs (with
    ``pl_module.log_dict``) ``p_robust/mean``, ``p_robust/q05`` ... (the quantiles),
    ``p_robust/below_<threshold>`` and ``p_robust/count``; with ``log_per_class``,
    ``p_robust/class_<c>`` (the mean p of the points labelled c); with ``certify_radii``,
    ``certified_accuracy/r<radius>`` and ``certified_accuracy/abstained`` from
    :class:`~probust.metrics.CertifiedAccuracy` on the same points. The sanity check before
    training is skipped. Under DDP the values are gathered over every rank by torchmetrics.

    The same points keep the same noise from one epoch to the next (each epoch's count starts
    at 0), so the epochs' values differ by the model only, as long as the validation data comes in
    the same order.

    Args:
        sigma: noise standard deviation per input coordinate, in the units of the batch's x (or a
            Noise; certification needs an isotropic Gaussian).
        method: the probust method ("mmse", "taylor", "mc", ...).
        every_n_epochs: measure on validation epochs whose ``current_epoch + 1`` is a multiple of
            this (a standalone ``trainer.validate`` always measures).
        max_points: the most points measured per process and epoch (None: every validation point).
        n_samples: MMSE copies or Monte Carlo draws (the method's default if None).
        seed: seed of every point's random streams.
        quantiles: the quantiles of p to log.
        threshold: log the share of points with p below it.
        certify_radii: radii (units of x) at which to log certified accuracy (randomized
            smoothing with the same sigma); None: no certification.
        certify_n0, certify_n, certify_alpha: CERTIFY's selection draws, most estimation draws
            and level (see :class:`~probust.metrics.CertifiedAccuracy`).
        log_per_class: also log the mean p per true label.
        dataloader_idx: measure the batches of this validation dataloader only.
        get_inputs: ``batch -> (x, y)``, y the labels or None; default :meth:`get_inputs`.
        **estimator_options: passed to the estimator (``tol``, ``execution``, ...).

    Attributes:
        metric: the :class:`AverageCaseRobustness` of the last active epoch (None before).
        certified: the :class:`CertifiedAccuracy` of the last active epoch (None without radii).
        last_values: what was logged last, as floats.
    """

    def __init__(
        self,
        sigma: float | Tensor | Noise,
        method: str = "mmse",
        *,
        every_n_epochs: int = 1,
        max_points: int | None = 256,
        n_samples: int | None = None,
        seed: int = 0,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        threshold: float = 0.5,
        certify_radii: Sequence[float] | None = None,
        certify_n0: int = 100,
        certify_n: int = 1000,
        certify_alpha: float = 0.001,
        log_per_class: bool = False,
        dataloader_idx: int = 0,
        get_inputs: GetInputs | None = None,
        **estimator_options: Any,
    ) -> None:
        _check_positive_int(every_n_epochs, "every_n_epochs")
        self.sigma = sigma
        self.method = method
        self.every_n_epochs = every_n_epochs
        self.max_points = max_points
        self.n_samples = n_samples
        self.seed = seed
        self.quantiles = tuple(quantiles)
        self.threshold = threshold
        self.certify_radii = None if certify_radii is None else tuple(certify_radii)
        self.certify_n0 = certify_n0
        self.certify_n = certify_n
        self.certify_alpha = certify_alpha
        self.log_per_class = log_per_class
        self.dataloader_idx = dataloader_idx
        self.estimator_options = estimator_options
        if get_inputs is not None:
            self.get_inputs = get_inputs  # type: ignore[method-assign,assignment]
        self.metric: AverageCaseRobustness | None = None
        self.certified: CertifiedAccuracy | None = None
        self.last_values: dict[str, float] = {}
        self._active = False

    def get_inputs(self, batch: Any) -> tuple[Tensor, Tensor | None]:
        """The inputs and labels of a validation batch: ``(x [B, *S], y int [B] or None)``.

        A tuple or list gives its first two items (a 1-tuple: no labels), a tensor is x alone, a
        dict its first key in :data:`INPUT_KEYS` and :data:`LABEL_KEYS`. Pass ``get_inputs=`` or
        override for other batches.
        """
        if isinstance(batch, Tensor):
            return batch, None
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
            return batch[0], batch[1] if len(batch) > 1 else None
        if isinstance(batch, Mapping):
            x = next((batch[k] for k in INPUT_KEYS if k in batch), None)
            if x is not None:
                return x, next((batch[k] for k in LABEL_KEYS if k in batch), None)
        raise OptionError(
            f"cannot find the inputs in a validation batch of type {type(batch).__name__}: pass "
            "get_inputs=lambda batch: (x, y) (y the labels or None) or override get_inputs",
            field="get_inputs",
        )

    def get_model(self, pl_module: Any) -> nn.Module:
        """The model to measure: the LightningModule itself (its forward must give logits [B, C]).
        Override to measure a submodule instead (e.g. ``pl_module.net``)."""
        return pl_module

    def _is_active(self, trainer: Any) -> bool:
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != TrainerFn.FITTING:
            return True
        return (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _build(self, pl_module: Any) -> None:
        model = self.get_model(pl_module)
        if self.metric is None or self.metric.model is not model:
            self.metric = AverageCaseRobustness(
                model,
                self.sigma,
                self.method,
                n_samples=self.n_samples,
                seed=self.seed,
                quantiles=self.quantiles,
                threshold=self.threshold,
                max_points=self.max_points,
                **self.estimator_options,
            )
            if self.certify_radii is not None:
                self.certified = CertifiedAccuracy(
                    model,
                    self.sigma,  # Certify refuses a non-Gaussian Noise itself
                    self.certify_radii,
                    n0=self.certify_n0,
                    n=self.certify_n,
                    alpha=self.certify_alpha,
                    seed=self.seed,
                    max_points=self.max_points,
                )
        for metric in (self.metric, self.certified):
            if metric is not None:
                metric.to(pl_module.device)
                metric.reset()

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._active = self._is_active(trainer)
        if self._active:
            self._build(pl_module)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self._active or dataloader_idx != self.dataloader_idx or self.metric is None:
            return
        if self.metric.full and (self.certified is None or self.certified.full):
            return  # max_points reached: skip even unpacking the batch
        x, y = self.get_inputs(batch)
        self.metric.update(x, labels=y)
        if self.certified is not None:
            if y is None:
                raise OptionError(
                    "certified accuracy needs the labels: get_inputs(batch) gave none", field="certify_radii"
                )
            self.certified.update(x, y)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._active or self.metric is None:
            return
        self._active = False
        values = self.metric.compute()
        logged = self.metric.loggable(values)
        if self.log_per_class:
            for c, mean in enumerate(values["class_mean_by_label"]):
                if not mean.isnan():
                    logged[f"p_robust/class_{c}"] = mean
        if self.certified is not None:
            logged.update(self.certified.loggable())
        # The values are already gathered over every rank (torchmetrics): no second reduction.
        pl_module.log_dict(logged, on_epoch=True, sync_dist=False)
        self.last_values = {k: float(v) for k, v in logged.items()}
