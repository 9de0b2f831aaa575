"""A training objective for average-case robustness: mu * mean(-log p_robust(x)).

Used as the ``extra_loss`` of :func:`probust.training.train` (CLI: ``probust train --robust-loss MU
--robust-sigma S``), it is added to the cross-entropy, so a batch's loss is

    CE + mu * mean_i -log p_robust(x_i; sigma)

with p_robust the differentiable Taylor (or MMSE) estimate: the margins' input Jacobian is built
with its own graph (double backpropagation), then mapped through the mvn-cdf (gradient with
respect to its bounds and correlation, QMC points held fixed) or the mv-sigmoid. By default the
probability is that of keeping the *label* under noise, so that on misclassified examples the
term pulls towards the right class instead of making a wrong prediction robust, and the map is
the mv-sigmoid; the weight is ramped up over the first steps (see ``warmup_steps``).

Example:
    >>> loss = probust.RobustLoss(sigma=0.3, mu=1.0)
    >>> probust.training.train("fashion-mnist", "cnn", epochs=3, extra_loss=loss)
    >>> probust.RobustLoss.from_config(loss.config())  # the same settings, e.g. from a checkpoint
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from probust._checks import check_choice, check_positive_float, check_positive_int
from probust._options import declared, option
from probust.errors import OptionError, Placeholder, Setting
from probust.estimators import CDFS, MMSE, Taylor
from probust.execution import Execution
from probust.noise import Gaussian, Laplace, Noise, Uniform, as_noise

TARGETS = ("label", "prediction")
LINEARISATIONS = ("taylor", "mmse")
# The keys of RobustLoss.config(), in its order.
_CONFIG_KEYS = (
    "name",
    "mu",
    "sigma",
    "noise",
    "cdf",
    "linearisation",
    "target",
    "tol",
    "max_points",
    "min_p",
    "mmse_samples",
    "warmup_steps",
)


class RobustLoss:
    """``(model, x, y, logits) -> mu * mean(-log p_robust)``: the robust training term.

    Args:
        sigma: noise standard deviation per input coordinate (units of x), or a Noise.
        mu: weight of the term (>= 0).
        cdf: "mv-sigmoid" (default; closed form, -log p = softplus(logsumexp(-z))) or "mvn"
            (the multivariate normal CDF, differentiated through its QMC integral; slower).
            With target="label" prefer the mv-sigmoid: -log Phi(z) grows like z^2 / 2 for a
            misclassified example, the mv-sigmoid's linearly (docs/training.md).
        linearisation: "taylor" (at x) or "mmse" (``mmse_samples`` noisy copies; N times dearer).
        target: "label" (default: the probability that the noisy input is still classified
            correctly) or "prediction" (p_robust proper: keep the clean prediction; its
            Taylor z is >= 0, so -log p stays bounded).
        tol: absolute tolerance of the mvn-cdf (training tolerates a coarse one).
        max_points: use only the first this many examples of each batch (cost control); None: all.
        min_p: floor of p inside the log, for both maps: each example adds at most
            -log(min_p) and no gradient once below it (without it the label target diverges;
            docs/training.md).
        mmse_samples: copies of the MMSE linearisation.
        warmup_steps: the weight grows linearly from 0 to ``mu`` over this many calls (training
            steps), so that the cross-entropy shapes the features first (the full term from a
            random initialisation flattens the network; docs/training.md). The count lives in this
            object (:meth:`state_dict`); :func:`probust.training.train` saves it in its checkpoints,
            so a resumed run continues the ramp where the interrupted one stopped.

    The estimate is computed with the model in eval mode (rows must not interact for the
    vectorised Jacobian), then the model's mode is restored.
    """

    def __init__(
        self,
        sigma: float | Tensor | Noise,
        mu: float = 1.0,
        *,
        cdf: str = "mv-sigmoid",
        linearisation: str = "taylor",
        target: str = "label",
        tol: float = 1e-3,
        max_points: int | None = None,
        min_p: float = 1e-4,
        mmse_samples: int = 5,
        warmup_steps: int = 500,
    ) -> None:
        self.noise = as_noise(sigma)
        if not (isinstance(mu, (int, float)) and mu >= 0):
            raise OptionError(f"must be a number >= 0, got {mu!r}", field="mu")
        for value, allowed, name in (
            (cdf, CDFS, "cdf"),
            (linearisation, LINEARISATIONS, "linearisation"),
            (target, TARGETS, "target"),
        ):
            check_choice(value, allowed, name)
        self.mu = float(mu)
        self.cdf = cdf
        self.linearisation = linearisation
        self.target = target
        self.tol = check_positive_float(tol, "tol")
        self.max_points = None if max_points is None else check_positive_int(max_points, "max_points")
        self.min_p = check_positive_float(min_p, "min_p")
        self.mmse_samples = check_positive_int(mmse_samples, "mmse_samples")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise OptionError(f"must be an integer >= 0, got {warmup_steps!r}", field="warmup_steps")
        self.warmup_steps = warmup_steps
        self.calls = 0
        # train() records getattr(extra_loss, "__qualname__") in the checkpoint and refuses to
        # resume a run whose loss differs: name the settings, not just the class.
        self.__qualname__ = repr(self)

    def __repr__(self) -> str:
        noise = self.noise.describe()
        scale = noise.get("sigma", noise)
        return (
            f"RobustLoss(sigma={scale}, mu={self.mu:g}, cdf={self.cdf!r}, linearisation={self.linearisation!r}, "
            f"target={self.target!r}, max_points={self.max_points}, min_p={self.min_p:g}, warmup_steps={self.warmup_steps})"
        )

    def config(self) -> dict:
        """The loss's settings as a JSON-serialisable dict (``probust.training.train`` stores it in the
        checkpoint's metadata as ``extra_loss_config``).

        Keys: ``name`` ("RobustLoss"), ``mu``, ``sigma`` (the noise's standard deviation per
        coordinate; None for non-scalar noise, then ``noise`` describes it), ``noise`` (the
        noise's own description), ``cdf``, ``linearisation``, ``target``, ``tol``,
        ``max_points``, ``min_p``, ``mmse_samples``, ``warmup_steps``.
        """
        noise = self.noise.describe()
        sigma = noise.get("sigma")
        return {
            "name": type(self).__name__,
            "mu": self.mu,
            "sigma": float(sigma) if isinstance(sigma, (int, float)) else None,
            "noise": noise,
            "cdf": self.cdf,
            "linearisation": self.linearisation,
            "target": self.target,
            "tol": self.tol,
            "max_points": self.max_points,
            "min_p": self.min_p,
            "mmse_samples": self.mmse_samples,
            "warmup_steps": self.warmup_steps,
        }

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], *, noise: Noise | None = None) -> RobustLoss:
        """The loss :meth:`config` described, e.g. a checkpoint's ``meta["extra_loss_config"]``.

        ``from_config(loss.config())`` has the same settings (and the same ``config()`` and
        repr) as ``loss``; its warm-up count starts at 0 (restore it with :meth:`load_state_dict`).

        Args:
            cfg: a dict with the keys :meth:`config` returns.
            noise: the noise, needed when ``cfg["noise"]`` only summarises it (a Gaussian with a
                standard deviation per coordinate or a full covariance); it must be what
                ``cfg["noise"]`` describes.

        Raises:
            ValueError: ``cfg`` is not a RobustLoss config (naming the key at fault), or its noise
                cannot be rebuilt and ``noise`` is None, or ``noise`` does not match it.
        """
        if not isinstance(cfg, Mapping):
            raise ValueError(f"cfg must be a dict from RobustLoss.config(), got {type(cfg).__name__}")
        expected = set(_CONFIG_KEYS)
        if cfg.get("name") != cls.__name__:
            raise ValueError(f"cfg['name'] must be {cls.__name__!r}, got {cfg.get('name')!r}")
        missing, unknown = sorted(expected - set(cfg)), sorted(set(cfg) - expected)
        if missing or unknown:
            raise ValueError(f"cfg is not a RobustLoss config: missing keys {missing}, unknown keys {unknown}")
        described = cfg["noise"]
        if noise is None:
            kinds = {"gaussian": Gaussian, "uniform": Uniform, "laplace": Laplace}
            kind = described.get("noise") if isinstance(described, Mapping) else None
            if kind not in kinds or "sigma" not in described:
                raise ValueError(
                    f"cfg['noise'] = {described!r} does not determine the noise (only a summary of it is kept): "
                    "pass it as noise="
                )
            noise = kinds[kind](described["sigma"])
        elif noise.describe() != described:
            raise ValueError(f"noise describes itself as {noise.describe()!r}, cfg['noise'] is {described!r}")
        settings = {k: cfg[k] for k in expected - {"name", "sigma", "noise"}}
        return cls(noise, **settings)

    def estimator(self, model: nn.Module, batch: int) -> Taylor | MMSE:
        """The differentiable estimator this loss evaluates (for ``batch`` points at once)."""
        # vmap builds the double-backward graph in one vectorised pass (a per-class loop would not).
        # No trust check: the loss needs p and its gradient, and the check's forward passes and
        # warning would come with every training step.
        common: dict[str, Any] = dict(cdf=self.cdf, tol=self.tol, differentiable=True, check_draws=0)
        if self.linearisation == "taylor":
            return Taylor(model, self.noise, execution=Execution(batch_size=batch, jacobian="vmap"), **common)
        rows = batch * self.mmse_samples
        return MMSE(
            model,
            self.noise,
            n_samples=self.mmse_samples,
            execution=Execution(batch_size=rows, jacobian="vmap"),
            **common,
        )

    def neg_log_p(self, model: nn.Module, x: Tensor, y: Tensor | None = None) -> Tensor:
        """-log p_robust per example: float64 [B], differentiable in the model's parameters."""
        target = y if self.target == "label" else None
        r = self.estimator(model, x.shape[0])(x.detach(), target)
        if self.cdf == "mv-sigmoid":
            # -log(1 / (1 + sum_i exp(-z_i))); z = +inf at the target drops out of the sum. The
            # z clamp keeps logsumexp finite (an inf there turns the zero gradient into NaN).
            z = cast(Tensor, r.z)  # Taylor and MMSE always report z
            return F.softplus(torch.logsumexp(-z.clamp_min(-1e4), dim=1)).clamp_max(-math.log(self.min_p))
        return -torch.log(r.p.clamp_min(self.min_p))

    def weight(self) -> float:
        """The weight the next call uses: mu, ramped over the first ``warmup_steps`` calls."""
        if self.warmup_steps == 0:
            return self.mu
        return self.mu * min(1.0, (self.calls + 1) / self.warmup_steps)

    def state_dict(self) -> dict:
        """What changes during training (the calls counted by the warm-up), for checkpoints."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` (a resumed training run)."""
        calls = state["calls"]
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ValueError(f"state['calls'] must be an integer >= 0, got {calls!r}")
        self.calls = calls

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None = None) -> Tensor:
        """The term to add to the batch's loss: a scalar in x's dtype."""
        weight = self.weight()
        self.calls += 1
        if weight == 0:
            return x.new_zeros(())
        if self.max_points is not None:
            x, y = x[: self.max_points], y[: self.max_points]
        return weight * self.neg_log_p(model, x, y).mean().to(x.dtype)


def _robust_weight(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
        raise OptionError(f"must be a number >= 0, got {value!r}", field=name)
    return float(value)


def _robust_sigma(value: Any, name: str) -> float | None:
    return None if value is None else check_positive_float(value, name)


def _warmup(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionError(f"must be an integer >= 0, got {value!r}", field=name)
    return value


@dataclass(frozen=True, kw_only=True)
class RobustLossOptions:
    """The robust training term as options (``probust train``'s ``--robust-*`` flags), each
    declared once: it sets the :class:`RobustLoss` argument its ``param`` names. A
    ``robust_loss`` of 0 adds no term (:meth:`loss` is None).

    Raises:
        OptionError: a bad value (``field`` names the option).
    """

    TITLE: ClassVar[str] = "average-case robustness term (probust.RobustLoss)"

    robust_loss: float = option(
        0.0,
        help="weight mu of the average-case robustness term mu * mean(-log p_robust(x)) added to the "
        "cross-entropy (probust.RobustLoss; needs --robust-sigma; 0: off)",
        metavar="MU",
        parse=float,
        check=_robust_weight,
        param="mu",
    )
    robust_sigma: float | None = option(
        None,
        help="noise sigma of --robust-loss, in pixel units",
        default_help="",
        metavar="S",
        parse=float,
        check=_robust_sigma,
        param="sigma",
    )
    robust_cdf: str = option(
        "mv-sigmoid",
        help="probability map of --robust-loss: mv-sigmoid or mvn (slower)",
        choices=("mv-sigmoid", "mvn"),
        param="cdf",
    )
    robust_warmup: int = option(
        500,
        help="steps over which the --robust-loss weight ramps up from 0 (from scratch the full term at once "
        "can collapse the model to a constant classifier)",
        metavar="STEPS",
        parse=int,
        check=_warmup,
        param="warmup_steps",
    )

    def __post_init__(self) -> None:
        for f, o in declared(self):
            value = getattr(self, f.name)
            if o.check is not None:
                value = o.check(value, f.name)
            elif o.choices is not None:
                check_choice(value, tuple(o.choices), f.name)
            object.__setattr__(self, f.name, value)
        if self.robust_loss > 0 and self.robust_sigma is None:
            raise OptionError(
                "needs ",
                Setting("robust_sigma", Placeholder("S")),
                ", the noise level whose p_robust is trained",
                field="robust_loss",
            )

    def loss(self) -> RobustLoss | None:
        """The :class:`RobustLoss` these options describe (None: no term); an error it raises
        names the option, not the argument."""
        if self.robust_loss == 0:
            return None
        params = {o.param: f.name for f, o in declared(self) if o.param is not None}
        try:
            return RobustLoss(**{param: getattr(self, name) for param, name in params.items()})
        except OptionError as exc:
            raise exc.renamed(params) from None
