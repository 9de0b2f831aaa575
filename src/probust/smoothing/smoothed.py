"""Cohen, Rosenfeld and Kolter's CERTIFY and PREDICT (ICML 2019), batched over points.

    r = probust.certify(model, x, sigma=0.25)              # x [B, ...] -> CertifyResult
    r.prediction, r.radius                                 # int64 [B] (-1: abstain), float64 [B]
    r = probust.certify(model, x, 0.25, radii=[0, 0.25, 0.5, 0.75])   # sequential: fewer draws
    r.certified                                            # bool [B, 4]
    probust.predict(model, x, 0.25).prediction

The smoothed classifier is g(x) = argmax_c P[f(x + eps) = c], eps ~ N(0, sigma^2 I), with the
noise added to ``x`` itself: in the space of the tensors the model receives, per coordinate. A
model with its normalisation inside (probust's models, torchvision-style wrappers) gets the noise
in pixel space, and the radius is an L2 distance in pixels; a model fed normalised tensors gets
it, and the radius, in normalised units. Nothing is clipped.

The draws of a point are a pure function of (seed, its index ``index_offset + row``, purpose):
the selection draws, the estimation draws and PREDICT's draws come from three independent
streams (:mod:`probust.noise`), so results do not depend on how points are batched, split or
resumed. The forward passes are Monte Carlo's (:func:`probust.estimators.monte_carlo.noisy_predictions`,
with its declared plan and memory budget).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from scipy import special
from scipy import stats as scipy_stats
from torch import Tensor, nn

from probust._checks import check_positive_int
from probust._inputs import warn_pixels
from probust._progress import Progress, drop, interactive, progress
from probust._user_model import check_logits, weights_in_format
from probust.errors import OptionError
from probust.estimators import AffineLogits, PointwiseMethod, Taylor, check_noisy_copies, noisy_predictions
from probust.execution import Execution, ForwardPlan
from probust.noise import STREAM_CERTIFY_ESTIMATE, STREAM_CERTIFY_SELECT, STREAM_PREDICT, Gaussian, Noise, point_keys
from probust.smoothing import stats
from probust.smoothing.result import ABSTAIN, CertifyResult, PredictResult, _check_radii

# Sequential CERTIFY looks at the counts after FIRST_CHECK estimation draws, then each time the
# draws have grown by GROWTH (at least FIRST_CHECK more): 28 looks up to n = 100,000, and
# a point stops at most 25% past the draw where its last radius was decided. The schedule is
# the same for every point, so a point's draws do not depend on its batch.
FIRST_CHECK = 128
GROWTH = 1.25

#: The analytic-prior test looks more often (its last look is exact, so a look costs it no level
#: at n): after PRIOR_FIRST_CHECK draws, then each time the draws have grown by PRIOR_GROWTH.
PRIOR_FIRST_CHECK = 64
PRIOR_GROWTH = 1.1

#: A sequential test's verdicts on its points' radii after a look: (certified, given up), bool [k, R].
Verdicts = tuple[Tensor, Tensor]
#: Its decision step: (look, rows, hits [k, 1], trials [k, 1], certified, given up) -> the verdicts after the look.
Decide = Callable[[int, Tensor, Tensor, Tensor, Tensor, Tensor], Verdicts]

#: The estimation procedures of :class:`Certify` (``procedure=``).
PROCEDURES = ("fixed", "sequential", "prior")

#: :class:`Certify`'s default ``predictive_futility``.
PREDICTIVE_FUTILITY = 0.01


def effective_procedure(procedure: str | None, radii: Sequence[float] | Tensor | None) -> str:
    """The procedure :class:`Certify` runs for ``procedure`` and ``radii``: the one given, or
    (None) its default, "fixed" without radii and "prior" with them."""
    if procedure is not None:
        return procedure
    return "fixed" if radii is None else "prior"


def isotropic_sigma(sigma: float | Tensor | Noise) -> float:
    """The standard deviation of isotropic Gaussian noise, or an OptionError (field "sigma") saying why not.

    Cohen et al.'s radius ``sigma * Phi^-1(p)`` is a property of isotropic Gaussian noise
    N(0, sigma^2 I): it bounds the change of the smoothed class under any perturbation of L2
    norm below it. Per-coordinate standard deviations, a full covariance (the bound would hold
    in another norm) and non-Gaussian noise (another bound altogether) are refused.
    """
    if isinstance(sigma, Gaussian):
        if sigma.sigma is None:
            raise OptionError(
                "must be isotropic Gaussian noise (one standard deviation for every coordinate): the "
                "certified radius sigma * Phi^-1(p) holds for N(0, sigma^2 I) only, and this Gaussian has "
                "per-coordinate standard deviations or a full covariance",
                field="sigma",
            )
        return sigma.sigma
    if isinstance(sigma, Noise):
        raise OptionError(
            f"must be a number (isotropic Gaussian noise N(0, sigma^2 I)), got {type(sigma).__name__} noise: "
            "the certified radius sigma * Phi^-1(p) is a property of Gaussian noise and does not hold for others",
            field="sigma",
        )
    if isinstance(sigma, bool) or sigma is None:
        raise OptionError(
            f"must be a positive number, the noise standard deviation per coordinate, got {sigma!r}", field="sigma"
        )
    if isinstance(sigma, Tensor):
        if sigma.numel() != 1:
            raise OptionError(
                f"must be one number (isotropic Gaussian noise), got a tensor of shape {tuple(sigma.shape)}: "
                "the certified radius sigma * Phi^-1(p) holds for N(0, sigma^2 I) only",
                field="sigma",
            )
        sigma = float(sigma.item())
    return Gaussian(sigma).sigma  # type: ignore[return-value]  # a positive float, checked there


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Smoothing(PointwiseMethod):
    """The parts of CERTIFY and PREDICT in common: noise, level, counting the draws' votes."""

    def __init__(self, model: nn.Module, sigma: float | Tensor | Noise, *, alpha: float = 0.001, **kwargs) -> None:
        if kwargs.get("execution") is None:
            # A job of minutes: a bar over its draws by default where someone watches (a terminal
            # or a notebook, :func:`probust._progress.interactive`); an execution given says.
            kwargs["execution"] = Execution(show_progress=interactive())
        super().__init__(model, **kwargs)
        self.sigma = isotropic_sigma(sigma)
        self.noise = Gaussian(self.sigma)
        self.alpha = stats.check_level(alpha, "alpha")

    def _classes(self, x: Tensor) -> int:
        """C, from one clean pass on one row (checked: finite logits [1, C], C >= 2)."""
        with torch.no_grad():
            return check_logits(self.model(x[:1]), 1).shape[1]

    def _count(
        self,
        x: Tensor,
        keys: Tensor,
        indices: Tensor,
        start: int,
        n: int,
        plan: ForwardPlan,
        bar: Progress,
        *,
        classes: int | None = None,
        of: Tensor | None = None,
        affine: AffineLogits | None = None,
    ) -> Tensor:
        """Votes of the noisy copies (samples start..start+n-1 of each point's stream).

        With ``classes``: int64 [B, classes], the copies predicted as each class. With ``of``
        (int64 [B], one class per point): int64 [B], the copies predicted as that class. With
        ``affine`` (an affine model's logits at x), the copies' logits are drawn without the model.
        Raises ValueError (naming the points) if any copy gave NaN or inf logits.
        """
        batch = x.shape[0]
        votes = torch.zeros((batch, classes) if classes is not None else (batch,), dtype=torch.int64, device=x.device)
        nonfinite = torch.zeros(batch, dtype=torch.int64, device=x.device)
        for points, predicted, finite in noisy_predictions(self.model, self.noise, x, keys, start, n, plan, affine):
            if of is None:
                block = torch.zeros(predicted.shape[0], votes.shape[1], dtype=torch.int64, device=x.device)
                votes[points] += block.scatter_add_(1, predicted, finite.long())
            else:
                votes[points] += ((predicted == of[points, None]) & finite).sum(dim=1)
            nonfinite[points] += predicted.shape[1] - finite.sum(dim=1)
            bar.update(predicted.numel())
        check_noisy_copies(self.noise, nonfinite, n, indices)
        return votes


class Certify(_Smoothing):
    """Cohen et al.'s CERTIFY, batched: the smoothed class and a certified L2 radius per point.

    Without ``radii`` it is the authors' procedure exactly. Per point: ``n0`` selection draws
    x + eps choose the class c_A predicted most often (the lowest index among ties); ``n``
    estimation draws, independent of those, count the copies predicted as c_A; p_lower is the
    one-sided Clopper-Pearson lower bound of that proportion at level ``alpha``; the point
    abstains where p_lower < 1/2 and is otherwise certified at radius sigma * Phi^-1(p_lower).

    With ``radii`` the estimation draws are sequential: every point draws, in rounds, only until
    each radius r in ``radii`` is decided, up to ``n``. A radius is certified once the
    anytime-valid test of the confidence sequence (:func:`probust.smoothing.stats.log_evidence_above`)
    rejects p_A <= Phi(r / sigma) at level ``alpha``; it is given up once the mirror test shows
    p_A < Phi(r / sigma) at level ``futility``, or once even all the remaining draws could not
    certify it. The guarantee is the same as CERTIFY's and holds whatever the stopping time:
    with probability at least 1 - alpha, every radius certified for a point is right.

    The noise N(0, sigma^2 I) is added to the tensors the model receives, per coordinate (pixel
    space for a model with its normalisation inside): the radius is an L2 distance in those units.

    Args:
        model: maps float inputs [B, *S] to logits [B, C] (C >= 2).
        sigma: the noise's standard deviation per input coordinate, in the units of x: a
            positive number or an isotropic :class:`probust.Gaussian` (other noise is refused).
        n0: selection draws per point (Cohen et al.: 100).
        n: estimation draws per point (with ``radii``: the most).
        alpha: the probability that the result is wrong for a point (Cohen et al.: 0.001).
        radii: radii to decide (units of x, >= 0), or None for fixed-n CERTIFY.
        procedure: how the estimation draws are made and read. "fixed": Cohen et al.'s n draws
            and Clopper-Pearson (with ``radii``, ``certified`` reads that bound at each radius);
            "sequential": the uniform-mixture confidence sequence above; "prior" (the default
            with ``radii``): the analytic-prior test (docs/certify.md): per point and radius, a
            mixture test centred on Taylor's estimate of p_A for the selected class (computed
            before the estimation draws, from no noise draws), certified at the interim looks by
            Ville's inequality and at the last look (n draws) by the failures its exact level
            leaves room for, radii certified in increasing order; ``p_lower`` is then the
            largest certified threshold Phi(r / sigma) and ``radius`` the largest certified r (a
            point with none abstains). None: "fixed" without ``radii``, "prior" with them.
        futility: with ``radii``: the level of the test that gives a radius up. Per point and
            radius, the probability of giving up a radius the point has (p_A above Phi(r / sigma))
            is at most this; it can lower the share certified, never the guarantee.
        predictive_futility: with ``procedure="prior"``: also give a radius up at a look where
            the predictive probability that the last look certifies it (the failures still to
            come under a Beta(F + 1/2, S + 1/2) posterior, a beta-binomial law) is below this; 0
            turns it off. A heuristic that saves draws on points near a threshold: it can lower
            the share certified (with no stated bound), never the guarantee.
        seed, execution: see :class:`probust.estimators.base.PointwiseMethod` (the execution's
            ``batch_size`` bounds the noisy copies per forward pass). Without ``execution`` a
            progress bar counts the draws where the session is interactive (stderr a terminal,
            or a notebook); ``execution=probust.Execution(show_progress=False)`` turns it off.
            With ``radii`` the bar's total is the most draws still planned: a point that stops
            takes its remaining draws off it, so it ends at 100%.
    """

    method = "certify"

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        *,
        n0: int = 100,
        n: int = 100_000,
        alpha: float = 0.001,
        radii: Sequence[float] | Tensor | None = None,
        futility: float = 0.001,
        procedure: str | None = None,
        predictive_futility: float = PREDICTIVE_FUTILITY,
        **kwargs,
    ) -> None:
        super().__init__(model, sigma, alpha=alpha, **kwargs)
        self.n0 = check_positive_int(n0, "n0")
        self.n = check_positive_int(n, "n")
        self.radii = None if radii is None else _check_radii(radii)
        self.futility = stats.check_level(futility, "futility")
        procedure = effective_procedure(procedure, self.radii)
        if procedure not in PROCEDURES:
            raise OptionError(f"must be one of {', '.join(PROCEDURES)}, got {procedure!r}", field="procedure")
        if procedure != "fixed" and self.radii is None:
            raise OptionError(
                f"{procedure!r} decides the radii given in radii, and none were given (fixed-n CERTIFY needs none)",
                field="procedure",
            )
        self.procedure = procedure
        if isinstance(predictive_futility, bool) or not isinstance(predictive_futility, (int, float)):
            raise OptionError(f"must be a number in [0, 1), got {predictive_futility!r}", field="predictive_futility")
        if not 0.0 <= predictive_futility < 1.0:
            raise OptionError(f"must be in [0, 1), got {predictive_futility!r}", field="predictive_futility")
        self.predictive_futility = float(predictive_futility)

    def __call__(self, x: Tensor, *, index_offset: int = 0) -> CertifyResult:
        """Certify each row of ``x``.

        Args:
            x: float inputs [B, *S], in the units the noise is measured in.
            index_offset: the index of row 0 in the whole data set (each point's random streams).

        Returns:
            :class:`probust.smoothing.CertifyResult`, one row per point, on x's device.
        """
        x, indices = self._prepare(x, index_offset)
        with self._evaluating():
            return self._certify(x, indices)

    def _certify(self, x: Tensor, indices: Tensor) -> CertifyResult:
        batch = x.shape[0]
        classes = self._classes(x)
        plan, affine = self._noisy_plan(x, self.noise)
        seconds = torch.zeros(batch, dtype=torch.float64)
        with (
            torch.no_grad(),
            weights_in_format(self.model, plan.channels_last),
            progress(batch * (self.n0 + self.n), "certify", self.show_progress, unit="draw") as bar,
        ):
            started = time.perf_counter()
            keys = point_keys(self.seed, indices, STREAM_CERTIFY_SELECT)
            votes = self._count(x, keys, indices, 0, self.n0, plan, bar, classes=classes, affine=affine)
            selected = votes.argmax(dim=1)
            keys = point_keys(self.seed, indices, STREAM_CERTIFY_ESTIMATE)
            thresholds = (
                None
                if self.radii is None
                else torch.as_tensor(special.ndtr(np.array(self.radii) / self.sigma), dtype=torch.float64)
            )
            if self.procedure == "fixed":
                hits = self._count(x, keys, indices, 0, self.n, plan, bar, of=selected, affine=affine)
                trials = torch.full_like(hits, self.n)
                _sync(x.device)
                seconds += (time.perf_counter() - started) / batch
                p_lower = stats.clopper_pearson_lower(hits, trials, self.alpha).cpu()
                certified = None if thresholds is None else p_lower[:, None] >= thresholds
            elif self.procedure == "prior":
                _sync(x.device)
                seconds += (time.perf_counter() - started) / batch
                assert thresholds is not None
                rounds, decide = self._prior(self._centers(x, selected, votes, seconds))
                hits, trials, certified = self._draw_until_decided(
                    x, keys, indices, selected, plan, bar, seconds, affine, rounds, decide
                )
                # Only the tests at the thresholds were made: the bound is the largest certified one.
                p_lower = torch.where(certified.cpu(), thresholds, 0.0).amax(dim=1)
            else:
                _sync(x.device)
                seconds += (time.perf_counter() - started) / batch
                rounds, decide = self._sequential()
                hits, trials, certified = self._draw_until_decided(
                    x, keys, indices, selected, plan, bar, seconds, affine, rounds, decide
                )
                p_lower = stats.cs_lower(hits, trials, self.alpha).cpu()
                # The confidence sequence holds at every look at once, so each radius certified at
                # an earlier look stays certified, and the bound is at least its threshold.
                assert thresholds is not None
                floor = torch.where(certified.cpu(), thresholds, 0.0).amax(dim=1)
                p_lower = torch.maximum(p_lower, floor)
        abstain = p_lower < 0.5
        radius = torch.where(abstain, 0.0, self.sigma * torch.special.ndtri(p_lower))
        if certified is not None and self.procedure != "fixed":
            # The radius is at least every radius certified (sigma * Phi^-1(Phi(r / sigma)) may round below r).
            largest = torch.where(certified.cpu(), torch.tensor(self.radii, dtype=torch.float64), 0.0).amax(dim=1)
            # The prior test decided the thresholds only: its radius is the largest one certified, exactly.
            radius = torch.where(abstain, 0.0, largest if self.procedure == "prior" else torch.maximum(radius, largest))
        device = x.device
        return CertifyResult(
            prediction=torch.where(abstain.to(device), ABSTAIN, selected),
            radius=radius.to(device),
            p_lower=p_lower.to(device),
            selected=selected,
            hits=hits,
            n_drawn=trials + self.n0,
            seconds=seconds.to(device),
            sigma=self.sigma,
            alpha=self.alpha,
            radii=self.radii,
            certified=None if certified is None else certified.to(device),
            classes=classes,
        )

    def _centers(self, x: Tensor, selected: Tensor, votes: Tensor, seconds: Tensor) -> np.ndarray:
        """The prior's center per point: Phi^-1 of Taylor's p for the selected class (float64 [B]).

        From the model's margins and gradients at x only (no noise draws), capped by what the
        selection draws allow (Phi^-1 of their one-sided 0.999 Clopper-Pearson upper bound),
        which are independent of the estimation draws; clipped to [-10, 40]. Its time is added
        to ``seconds``, shared equally."""
        started = time.perf_counter()
        with torch.enable_grad():
            estimate = Taylor(self.model, self.sigma, p_fail=True, check_draws=0, seed=self.seed)(x, selected)
        fail = estimate.p_fail.detach().double().cpu().numpy()  # type: ignore[union-attr]  # p_fail=True
        z = -special.ndtri(np.clip(fail, 1e-300, 1.0))
        k = votes.gather(1, selected[:, None]).flatten().double().cpu().numpy()
        upper = np.where(k >= self.n0, 1.0, special.betaincinv(k + 1.0, self.n0 - k, 0.999))
        z = np.minimum(z, special.ndtri(upper))
        _sync(x.device)
        seconds += (time.perf_counter() - started) / x.shape[0]
        return np.clip(np.nan_to_num(z, nan=0.0), -10.0, 40.0)

    def _draw_until_decided(
        self,
        x: Tensor,
        keys: Tensor,
        indices: Tensor,
        selected: Tensor,
        plan: ForwardPlan,
        bar: Progress,
        seconds: Tensor,
        affine: AffineLogits | None,
        rounds: list[tuple[int, int]],
        decide: Decide,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Estimation draws in ``rounds`` until every radius of every point is decided.

        After each round, ``decide(look, rows, s, t, certified, given_up)`` (the round's index,
        the points that drew, their hits and trials int64 [k, 1], their verdicts so far bool
        [k, R], copies it may change in place) returns their verdicts after it; a point draws on
        while one of its radii is neither certified nor given up.
        Returns (hits int64 [B], trials int64 [B], certified bool [B, R]) on x's device; adds
        each round's wall time to ``seconds`` (float64 [B], CPU) of the points it drew for."""
        assert self.radii is not None
        batch, device = x.shape[0], x.device
        hits = torch.zeros(batch, dtype=torch.int64)
        trials = torch.zeros(batch, dtype=torch.int64)
        certified = torch.zeros(batch, len(self.radii), dtype=torch.bool)
        given_up = torch.zeros_like(certified)
        active = torch.ones(batch, dtype=torch.bool)
        for look, (start, stop) in enumerate(rounds):
            rows = active.nonzero().flatten()
            if len(rows) == 0:
                break
            started = time.perf_counter()
            on = rows.to(device)
            hits[rows] += self._count(
                x[on],
                keys[on],
                indices[on],
                start,
                stop - start,
                plan,
                bar,
                of=selected[on],
                affine=None if affine is None else affine.subset(on),
            ).cpu()
            trials[rows] = stop
            certified[rows], given_up[rows] = decide(
                look, rows, hits[rows, None], trials[rows, None], certified[rows], given_up[rows]
            )
            active[rows] = (~certified[rows] & ~given_up[rows]).any(dim=1)
            seconds[rows] += (time.perf_counter() - started) / len(rows)
            # The bar was opened over n draws a point; a point that stops takes the rest off.
            stopped = rows[~active[rows]]
            drop(bar, int((self.n - trials[stopped]).sum()))
        return hits.to(device), trials.to(device), certified

    def _sequential(self) -> tuple[list[tuple[int, int]], Decide]:
        """The sequential test's looks (:func:`checkpoints`) and verdicts, for :meth:`_draw_until_decided`.

        A radius is certified at a look where the uniform mixture's evidence that p_A > Phi(r / sigma)
        reaches 1 / ``alpha``; given up where the mirror test shows p_A < Phi(r / sigma) at level
        ``futility``, or where even n - t more hits could not certify it."""
        assert self.radii is not None
        thresholds = torch.as_tensor(special.ndtr(np.array(self.radii) / self.sigma), dtype=torch.float64)
        certify_at, give_up_at = math.log(1 / self.alpha), math.log(1 / self.futility)

        def decide(look: int, rows: Tensor, s: Tensor, t: Tensor, certified: Tensor, given_up: Tensor) -> Verdicts:
            certified = certified | (stats.log_evidence_above(s, t, thresholds) >= certify_at)
            below = stats.log_evidence_below(s, t, thresholds) >= give_up_at
            reach = stats.log_evidence_above(s + (self.n - t), torch.full_like(t, self.n), thresholds) >= certify_at
            return certified, given_up | below | ~reach

        return list(checkpoints(self.n)), decide

    def _prior(self, centers: np.ndarray) -> tuple[list[tuple[int, int]], Decide]:
        """The analytic-prior test's looks (:func:`checkpoints` with :data:`PRIOR_FIRST_CHECK` and
        :data:`PRIOR_GROWTH`) and verdicts, for :meth:`_draw_until_decided`.

        Per point and radius j, :func:`probust.smoothing.stats.prior_allowances` gives the most
        failures each look certifies (fixed before the draws). Radius j is certified at a look
        where the failures are within its allowance and radius j - 1 is certified; it is given
        up where no later look could certify it (more failures than every later allowance),
        where the mirror test of the uniform mixture shows p_A < Phi(r / sigma) at level
        ``futility``, where the predictive chance of the last look certifying it is below
        ``predictive_futility``, or where radius j - 1 was given up."""
        assert self.radii is not None
        rounds = list(checkpoints(self.n, PRIOR_FIRST_CHECK, PRIOR_GROWTH))
        stops = [stop for _, stop in rounds]
        thresholds = special.ndtr(np.array(self.radii) / self.sigma)
        # allowed[b, j, l]: failures certified at look l; reachable[b, j, l]: the most any look >= l allows.
        allowed = stats.prior_allowances_table(stops, thresholds, self.alpha, centers)
        reachable = np.maximum.accumulate(allowed[..., ::-1], axis=-1)[..., ::-1]
        allowed_t, reachable_t = torch.from_numpy(allowed), torch.from_numpy(reachable.copy())
        give_up_at = math.log(1 / self.futility)

        def decide(look: int, rows: Tensor, s: Tensor, t: Tensor, certified: Tensor, given_up: Tensor) -> Verdicts:
            stop = stops[look]
            failures = t - s
            passes = failures <= allowed_t[rows, :, look]
            below = stats.log_evidence_below(s, t, torch.as_tensor(thresholds)) >= give_up_at
            unreachable = failures > reachable_t[rows, :, look]
            if self.predictive_futility > 0 and stop < self.n:
                # P(F_n - F_t <= c_n - F_t) for the n - t draws to come, F_n - F_t ~ BetaBinomial(n - t, F + 1/2, S + 1/2).
                room = (torch.from_numpy(allowed[..., -1])[rows] - failures).numpy()
                chance = scipy_stats.betabinom.cdf(room, self.n - stop, failures.numpy() + 0.5, s.numpy() + 0.5)
                unreachable |= torch.from_numpy(np.asarray(chance) < self.predictive_futility)
            done = certified | given_up
            for j in range(len(thresholds)):  # in increasing order: radius j needs radius j - 1
                lower_ok = certified[:, j - 1] if j > 0 else torch.ones(len(rows), dtype=torch.bool)
                lower_lost = given_up[:, j - 1] if j > 0 else torch.zeros(len(rows), dtype=torch.bool)
                newly = ~done[:, j] & lower_ok & passes[:, j]
                certified[:, j] |= newly
                given_up[:, j] |= ~done[:, j] & ~newly & (below[:, j] | unreachable[:, j] | lower_lost)
            return certified, given_up

        return rounds, decide


def checkpoints(n: int, first: int = FIRST_CHECK, growth: float = GROWTH) -> Iterator[tuple[int, int]]:
    """The rounds of sequential CERTIFY: (first draw, end) pairs covering [0, n), each look
    ``growth`` (:data:`GROWTH`) times the draws before it (at least ``first``, :data:`FIRST_CHECK`, more)."""
    start = 0
    while start < n:
        stop = min(n, max(start + first, math.ceil(start * growth)))
        yield start, stop
        start = stop


class Predict(_Smoothing):
    """Cohen et al.'s PREDICT, batched: the smoothed class, or abstain.

    Per point: ``n`` draws x + eps; the two classes predicted most often, with counts n_A and
    n_B; the class is returned where the two-sided binomial test of n_A out of n_A + n_B
    rejects p = 1/2 at level ``alpha``, otherwise it abstains. The probability of returning a
    class other than the smoothed classifier's is at most ``alpha``.

    Args:
        model, sigma, alpha, seed, execution: as :class:`Certify`.
        n: draws per point (Cohen et al.: 100,000).
    """

    method = "predict"

    def __init__(self, model: nn.Module, sigma: float | Tensor | Noise, *, n: int = 100_000, **kwargs) -> None:
        super().__init__(model, sigma, **kwargs)
        self.n = check_positive_int(n, "n")

    def __call__(self, x: Tensor, *, index_offset: int = 0) -> PredictResult:
        """The smoothed prediction for each row of ``x``.

        Args:
            x: float inputs [B, *S], in the units the noise is measured in.
            index_offset: the index of row 0 in the whole data set (each point's random stream).

        Returns:
            :class:`probust.smoothing.PredictResult`, one row per point, on x's device.
        """
        x, indices = self._prepare(x, index_offset)
        with self._evaluating():
            return self._predict(x, indices)

    def _predict(self, x: Tensor, indices: Tensor) -> PredictResult:
        batch = x.shape[0]
        classes = self._classes(x)
        plan, affine = self._noisy_plan(x, self.noise)
        keys = point_keys(self.seed, indices, STREAM_PREDICT)
        with (
            torch.no_grad(),
            weights_in_format(self.model, plan.channels_last),
            progress(batch * self.n, "predict", self.show_progress, unit="draw") as bar,
        ):
            started = time.perf_counter()
            votes = self._count(x, keys, indices, 0, self.n, plan, bar, classes=classes, affine=affine)
            _sync(x.device)
            seconds = torch.full((batch,), (time.perf_counter() - started) / batch, dtype=torch.float64)
        count_top, top = votes.max(dim=1)
        count_second = votes.scatter(1, top[:, None], -1).amax(dim=1)
        p_value = stats.binomial_test_half(count_top, count_top + count_second)
        return PredictResult(
            prediction=torch.where(p_value <= self.alpha, top, ABSTAIN),
            top=top,
            count_top=count_top,
            count_second=count_second,
            p_value=p_value,
            n_drawn=torch.full_like(count_top, self.n),
            seconds=seconds.to(x.device),
            sigma=self.sigma,
            alpha=self.alpha,
        )


def certify(
    model: nn.Module,
    x: Tensor,
    sigma: float | Tensor | Noise,
    *,
    n0: int = 100,
    n: int = 100_000,
    alpha: float = 0.001,
    radii: Sequence[float] | Tensor | None = None,
    procedure: str | None = None,
    seed: int = 0,
    index_offset: int = 0,
    **kwargs,
) -> CertifyResult:
    """Cohen et al.'s CERTIFY for each row of ``x``: ``Certify(model, sigma, ...)(x, index_offset=...)``.

    Args:
        model: maps float inputs [B, *S] to logits [B, C], a ModelOutput with ``.logits`` or a
            tuple whose first item is the logits (:class:`probust.estimators.base.PointwiseMethod`).
        x: float inputs [B, *S]; the noise N(0, sigma^2 I) is added to x itself, in the units
            the model receives (pixel space for a model with its normalisation inside).
        sigma: noise standard deviation per input coordinate (isotropic Gaussian only).
        n0, n, alpha, radii, procedure: see :class:`Certify` (Cohen et al.'s defaults; ``radii``
            makes the estimation sequential: the analytic-prior test unless ``procedure`` says
            "sequential" or "fixed").
        seed: see :class:`Certify`.
        index_offset: the index of row 0 in the data set (each point's random streams).
        **kwargs: passed to :class:`Certify` (``futility``, ``execution``).

    Returns:
        :class:`probust.smoothing.CertifyResult`: ``prediction`` int64 [B] (-1 where it
        abstains), ``radius`` float64 [B] (0 there), ``p_lower``, ``n_drawn``, and with ``radii``
        ``certified`` bool [B, len(radii)].
    """
    warn_pixels(x)
    return Certify(
        model,
        sigma,
        n0=n0,
        n=n,
        alpha=alpha,
        radii=radii,
        procedure=procedure,
        seed=seed,
        **kwargs,
    )(x, index_offset=index_offset)


def predict(
    model: nn.Module,
    x: Tensor,
    sigma: float | Tensor | Noise,
    *,
    n: int = 100_000,
    alpha: float = 0.001,
    seed: int = 0,
    index_offset: int = 0,
    **kwargs,
) -> PredictResult:
    """Cohen et al.'s PREDICT for each row of ``x``: ``Predict(model, sigma, ...)(x, index_offset=...)``.

    Args:
        model, x, sigma, seed, index_offset: as :func:`certify`.
        n: draws per point.
        alpha: the level of the binomial test.
        **kwargs: passed to :class:`Predict` (``execution``).

    Returns:
        :class:`probust.smoothing.PredictResult`: ``prediction`` int64 [B], -1 where it abstains.
    """
    warn_pixels(x)
    return Predict(
        model,
        sigma,
        n=n,
        alpha=alpha,
        seed=seed,
        **kwargs,
    )(x, index_offset=index_offset)
