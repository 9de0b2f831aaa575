"""The suite's strength, tested: plant single-line bugs one at a time and check a test kills each.

Each mutant is a textual replacement in one file of ``src/probust`` that must match exactly once
(so a refactoring that moves the line fails this check loudly instead of planting nothing). The
bugs are planted in a temporary copy of ``src/``, never in the working tree, and the tests named
for each run against that copy (``PYTHONPATH`` puts it ahead of the editable install; the check
asserts ``probust`` is imported from it). The same tests also run against the unplanted copy, beside
the mutants, and must pass: a test that fails on the real code kills nothing.

The first five mutants are the bugs of issue 33 that passed, or nearly passed, the fast suite; the ones
after them are the same kinds of bug next to them. A mutant survives when its tests pass; the check
then exits 1 naming it.

    python benchmarks/mutation_check.py            # all mutants (make mutation), one per CPU at once
    python benchmarks/mutation_check.py 1 4        # some of them, by number or name
    python benchmarks/mutation_check.py --jobs 1   # one at a time
    python benchmarks/mutation_check.py --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to src/probust
    old: str
    new: str
    tests: tuple[str, ...]


SCREENING = "tests/linearisation/test_screening_guarantees.py"
LEVEL = "tests/smoothing/test_level.py"
TRUST = "tests/estimators/test_trust_statistics.py"
CENTRING = "tests/mvn/test_centring.py"
DEFAULTS = "tests/estimators/test_stated_defaults.py"
ISSUES = "tests/issues/test_find_issues.py"
TRACKER = "tests/issues/test_tracker.py"
MUTANTS = (
    Mutant(
        "screening-failure-left-out-of-cdf-error",
        "linearisation/routes.py",
        "kept = drop(z, target, budget=budget, delta=delta, forced=unknown,",
        "kept = drop(z, target, budget=budget, delta=0.0, forced=unknown,",
        (f"{SCREENING}::test_a_screened_points_cdf_error_holds_the_screenings_failure_share",),
    ),
    Mutant(
        "sketch-bound-without-union-over-boundaries",
        "linearisation/screening.py",
        "q = variance_factor(probes, failure / max(classes - 1, 1))",
        "q = variance_factor(probes, failure)",
        (SCREENING,),
    ),
    Mutant(
        "table-sigma-rounded-to-2-decimals",
        "run/work_units.py",
        '"sigma": np.full(n, task.sigma),',
        '"sigma": np.full(n, round(task.sigma, 2)),',
        ("tests/run/test_sigma_values.py",),
    ),
    Mutant(
        "mmse-centred-draws-without-n-over-n-minus-1",
        "estimators/mmse.py",
        "eps = (eps - eps.mean(dim=1, keepdim=True)) * (self.n_samples / (self.n_samples - 1)) ** 0.5",
        "eps = eps - eps.mean(dim=1, keepdim=True)",
        ("tests/estimators/test_mmse_draws.py",),
    ),
    Mutant(
        "mvn-error-with-the-normal-quantile-not-t7",
        "mvn/qmc.py",
        "e_act = _T_99 * torch.sqrt(",
        "e_act = 2.5758 * torch.sqrt(",
        ("tests/mvn/test_error_scale.py",),
    ),
    # The same kinds of bug next to them.
    Mutant(
        "certify-table-sigma-rounded-to-2-decimals",
        "run/certify.py",
        '"sigma": np.full(n, task.sigma),',
        '"sigma": np.full(n, round(task.sigma, 2)),',
        ("tests/run/test_sigma_values.py",),
    ),
    Mutant(
        "sketch-union-over-all-c-columns-not-the-c-minus-1-boundaries",
        "linearisation/screening.py",
        "q = variance_factor(probes, failure / max(classes - 1, 1))",
        "q = variance_factor(probes, failure / classes)",
        (f"{SCREENING}::test_the_sketch_bound_is_the_chi_square_quantile_at_the_failure_shared_over_the_boundaries",),
    ),
    Mutant(
        "mc-cv-interval-with-a-one-sided-quantile",
        "estimators/control_variate.py",
        "half = float(special.ndtri(1.0 - alpha / 2)) * stderr",
        "half = float(special.ndtri(1.0 - alpha)) * stderr",
        ("tests/estimators/test_interval_quantiles.py",),
    ),
    Mutant(
        "mc-is-interval-with-a-one-sided-quantile",
        "estimators/importance.py",
        "half = float(special.ndtri(1 - (1 - self.confidence) / 2)) * stderr",
        "half = float(special.ndtri(self.confidence)) * stderr",
        ("tests/estimators/test_interval_quantiles.py",),
    ),
    # Issue 34: what is computed must not depend on a clock.
    Mutant(
        "forward-mode-cost-read-off-a-clock",
        "linearisation/counting.py",
        'return JVP_IN_PULLS.get(device.type, JVP_IN_PULLS["cpu"])',
        'return JVP_IN_PULLS.get(device.type, JVP_IN_PULLS["cpu"]) * 10 ** (__import__("time").perf_counter() % 2)',
        (
            "tests/linearisation/test_routes.py::test_the_routes_are_decided_before_any_timing",
            "tests/estimators/test_clock.py",
        ),
    ),
    # The screenings' guarantees at C = 1,000 (stop 45): a statistic that is not an upper bound,
    # stages each spending the whole failure share, and a share counted only where the last stage ran.
    Mutant(
        "spectral-bound-from-the-grams-smallest-eigenvalue",
        "linearisation/screening.py",
        "top = torch.linalg.eigvalsh(gram.to(torch.float64))[:, -1]",
        "top = torch.linalg.eigvalsh(gram.to(torch.float64))[:, 0]",
        (
            "tests/linearisation/test_routes.py::test_the_spectral_bound_fails_exactly_as_often_as_stated_for_a_rank_one_covariance",
        ),
    ),
    Mutant(
        "sketch-stages-each-at-the-whole-failure-share",
        "linearisation/screening.py",
        "return failure * STAGE_SHARES[stage]",
        "return failure",
        (f"{SCREENING}::test_the_staged_sketchs_bounds_fail_together_no_more_often_than_the_sketchs_share",),
    ),
    Mutant(
        "sketch-failure-counted-only-where-the-last-stage-ran",
        "linearisation/screening.py",
        "        if stage == 0:",
        "        if stage == len(SKETCH_STAGES) - 1:",
        (f"{SCREENING}::test_a_screened_points_cdf_error_holds_the_screenings_failure_share",),
    ),
    Mutant(
        "spectral-best-without-the-quantile-ratio",
        "linearisation/screening.py",
        "return z_lower * math.sqrt(variance_factor(more, more_failure) / variance_factor(probes, failure))",
        "return z_lower",
        (
            "tests/linearisation/test_routes.py::test_the_second_spectral_stage_runs_where_its_probes_could_drop_more_than_they_cost",
        ),
    ),
    Mutant(
        "spectral-stages-each-at-the-whole-failure-share",
        "linearisation/screening.py",
        "return failure * SPECTRAL_STAGE_SHARES[stages][stage]",
        "return failure",
        (
            "tests/linearisation/test_routes.py::test_the_two_spectral_stages_fail_together_no_more_often_than_the_whole_share",
        ),
    ),
    # The GPU's sums: a slot's rows added in another order than the CPU's (atomics' kind of bug).
    Mutant(
        "sums-into-slots-by-rank-in-reverse",
        "mvn/numerics.py",
        "for k in range(int(rank.max()) + 1):",
        "for k in reversed(range(int(rank.max()) + 1)):",
        ("tests/mvn/test_add_rows.py",),
    ),
    # Issue 50: the trust check's stages and the drawn logits of affine models.
    Mutant(
        "trust-first-stage-clears-whatever-the-residuals",
        "estimators/trust.py",
        "        cleared &= rate <= CLEAR_RATE",
        "        cleared &= rate <= 1.0",
        (
            "tests/estimators/test_trust.py::test_the_first_two_draws_stop_a_point_only_where_they_agree_and_their_residuals_cannot_flip_it",
        ),
    ),
    Mutant(
        "trust-flip-rate-without-widening",
        "estimators/trust.py",
        "widen = RESIDUAL_SPREAD * (high - low) + RESIDUAL_SLACK * torch.maximum(low.abs(), high.abs())",
        "widen = 0.0 * (high - low)",
        ("tests/estimators/test_trust.py::test_flip_rate_is_the_union_of_the_flipping_bands",),
    ),
    Mutant(
        "trust-later-stages-draw-the-first-stages-draws-again",
        "estimators/linearised.py",
        "open_, start = open_[trust.undecided(agreeing[open_], draws[open_], rate)], upto",
        "open_, start = open_[trust.undecided(agreeing[open_], draws[open_], rate)], 0",
        ("tests/estimators/test_trust.py::test_later_stages_stop_where_the_draws_so_far_all_agree_or_flag_the_point",),
    ),
    Mutant(
        "affine-factor-transposed",
        "estimators/affine.py",
        "noisy = torch.matmul(z, self.factor.T) + self.clean[points, None]",
        "noisy = torch.matmul(z, self.factor) + self.clean[points, None]",
        ("tests/estimators/test_affine.py::test_the_drawn_logits_have_the_covariance_of_j_s_j",),
    ),
    Mutant(
        "normal-radius-without-the-factor-two",
        "noise.py",
        "_unit(scratch, radius).log_().mul_(-2.0).sqrt_()",
        "_unit(scratch, radius).log_().mul_(-1.0).sqrt_()",
        ("tests/test_random_streams.py::test_normal_and_uniform_have_their_laws",),
    ),
    # Issue 60: the bugs that passed the fast suite (a test of level 2 alpha, the trust level at
    # 10%, a later trust stage drawing from draw 0, the dropped tails' bias subtracted whole, the
    # lock opened following a link), then an audit of the constants and formulas the docstrings
    # and docs/ state, each held by a test that only the stated value passes.
    Mutant(
        "sequential-certify-at-twice-its-level",
        "smoothing/smoothed.py",
        "certify_at, give_up_at = math.log(1 / self.alpha), math.log(1 / self.futility)",
        "certify_at, give_up_at = math.log(1 / (2 * self.alpha)), math.log(1 / self.futility)",
        (f"{LEVEL}::test_sequential_certify_certifies_a_radius_the_point_just_misses_at_the_rate_of_its_level",),
    ),
    Mutant(
        "trust-level-at-ten-percent",
        "estimators/trust.py",
        "TRUST_LEVEL = 0.05",
        "TRUST_LEVEL = 0.1",
        (f"{TRUST}::test_three_of_sixteen_disagreeing_flag_a_point_at_five_percent_and_would_not_at_ten",),
    ),
    Mutant(
        "trust-later-stages-sample-from-draw-0",
        "estimators/linearised.py",
        "eps = self._check_eps(x[open_], indices[open_], start, upto - start)",
        "eps = self._check_eps(x[open_], indices[open_], 0, upto - start)",
        (f"{TRUST}::test_each_stage_draws_the_streams_next_draws_from_where_the_last_stopped",),
    ),
    Mutant(
        "mvn-dropped-tails-bias-subtracted-whole",
        "mvn/cdf.py",
        "p = torch.where(dead, 0.0, (p - 0.5 * bias).clamp(0.0, 1.0))",
        "p = torch.where(dead, 0.0, (p - bias).clamp(0.0, 1.0))",
        (f"{CENTRING}::test_the_closed_forms_estimate_is_centred_in_what_the_dropped_tails_may_cost",),
    ),
    Mutant(
        "mvn-dropped-tails-bias-subtracted-whole-where-sampled",
        "mvn/cdf.py",
        "p = torch.where(dead, 0.0, (p - 0.5 * bias).clamp(0.0, 1.0))",
        "p = torch.where(dead, 0.0, (p - torch.where(k_eff >= 3, 1.0, 0.5) * bias).clamp(0.0, 1.0))",
        (f"{CENTRING}::test_the_sampled_estimate_is_centred_in_what_the_dropped_tails_may_cost_on_average",),
    ),
    Mutant(
        "mvn-dropped-tails-may-cost-ten-percent-of-tol",
        "mvn/cdf.py",
        "_DROP_FRACTION = 0.05",
        "_DROP_FRACTION = 0.1",
        (f"{CENTRING}::test_a_coordinate_is_dropped_only_where_the_dropped_tails_cost_at_most_five_percent_of_tol",),
    ),
    Mutant(
        "mvn-error-holds-half-the-dropped-tails",
        "mvn/cdf.py",
        "err = torch.where(dead, 0.0, err + bias)",
        "err = torch.where(dead, 0.0, err + 0.5 * bias)",
        (f"{CENTRING}::test_the_closed_forms_estimate_is_centred_in_what_the_dropped_tails_may_cost",),
    ),
    Mutant(
        "results-lock-opened-following-a-link",
        "run/store.py",
        "fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)",
        "fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)",
        ("tests/run/test_lock_link_race.py::test_a_lock_linked_after_the_folders_checks_is_refused_by_its_open",),
    ),
    # The audit: smoothing's levels and radius.
    Mutant(
        "sequential-thresholds-at-half-the-radius",
        "smoothing/smoothed.py",
        "assert self.radii is not None\n        thresholds = torch.as_tensor(special.ndtr(np.array(self.radii) / self.sigma)",
        "assert self.radii is not None\n        thresholds = torch.as_tensor(special.ndtr(np.array(self.radii) / (2 * self.sigma))",
        (f"{LEVEL}::test_sequential_certify_certifies_a_radius_the_point_just_misses_at_the_rate_of_its_level",),
    ),
    Mutant(
        "sequential-looks-doubling",
        "smoothing/smoothed.py",
        "stop = min(n, max(start + first, math.ceil(start * growth)))",
        "stop = min(n, max(start + first, math.ceil(start * 2)))",
        (f"{LEVEL}::test_the_looks_are_the_documented_schedule",),
    ),
    Mutant(
        "sequential-first-look-at-64",
        "smoothing/smoothed.py",
        "FIRST_CHECK = 128",
        "FIRST_CHECK = 64",
        (f"{LEVEL}::test_the_looks_are_the_documented_schedule",),
    ),
    Mutant(
        "sequential-futility-at-twice-its-level",
        "smoothing/smoothed.py",
        "certify_at, give_up_at = math.log(1 / self.alpha), math.log(1 / self.futility)",
        "certify_at, give_up_at = math.log(1 / self.alpha), math.log(1 / (2 * self.futility))",
        (f"{LEVEL}::test_sequential_certify_gives_a_radius_up_when_its_futility_test_says_so",),
    ),
    Mutant(
        "analytic-radius-with-half-sigma",
        "smoothing/analytic.py",
        "return torch.where(p > 0.5, scale * z, 0.0)",
        "return torch.where(p > 0.5, scale / 2 * z, 0.0)",
        ("tests/smoothing/test_analytic.py::test_the_estimate_is_the_distance_to_the_boundary_for_a_linear_model",),
    ),
    Mutant(
        "certify-clopper-pearson-at-twice-alpha",
        "smoothing/stats.py",
        "bound = special.betaincinv(np.maximum(k, 1.0), n - k + 1.0, alpha)",
        "bound = special.betaincinv(np.maximum(k, 1.0), n - k + 1.0, 2 * alpha)",
        (f"{LEVEL}::test_certify_overstates_the_radius_at_the_rate_of_its_level",),
    ),
    Mutant(
        "certify-radius-with-half-sigma",
        "smoothing/smoothed.py",
        "radius = torch.where(abstain, 0.0, self.sigma * torch.special.ndtri(p_lower))",
        "radius = torch.where(abstain, 0.0, self.sigma / 2 * torch.special.ndtri(p_lower))",
        (f"{LEVEL}::test_certify_overstates_the_radius_at_the_rate_of_its_level",),
    ),
    Mutant(
        "certify-abstains-below-0.4-not-one-half",
        "smoothing/smoothed.py",
        "abstain = p_lower < 0.5",
        "abstain = p_lower < 0.4",
        ("tests/smoothing/test_certify.py::test_certify_abstains_where_the_bound_is_below_one_half",),
    ),
    Mutant(
        "predict-at-twice-its-level",
        "smoothing/smoothed.py",
        "prediction=torch.where(p_value <= self.alpha, top, ABSTAIN),",
        "prediction=torch.where(p_value <= 2 * self.alpha, top, ABSTAIN),",
        (f"{LEVEL}::test_predict_returns_a_class_at_a_tie_at_the_rate_of_its_level",),
    ),
    Mutant(
        "predict-binomial-test-one-sided",
        "smoothing/stats.py",
        "np.minimum(1.0, 2.0 * tail)",
        "np.minimum(1.0, tail)",
        (f"{LEVEL}::test_predict_returns_a_class_at_a_tie_at_the_rate_of_its_level",),
    ),
    Mutant(
        "predict-default-alpha-0.01",
        "smoothing/smoothed.py",
        "*, alpha: float = 0.001, **kwargs) -> None:",
        "*, alpha: float = 0.01, **kwargs) -> None:",
        ("tests/smoothing/test_defaults.py::test_predict_defaults_to_cohens_settings",),
    ),
    Mutant(
        "certify-default-futility-0.01",
        "smoothing/smoothed.py",
        "futility: float = 0.001,",
        "futility: float = 0.01,",
        ("tests/smoothing/test_defaults.py::test_certify_defaults_to_cohens_settings",),
    ),
    Mutant(
        "certify-function-default-n0-10",
        "smoothing/smoothed.py",
        "\n    n0: int = 100,\n",
        "\n    n0: int = 10,\n",
        ("tests/smoothing/test_defaults.py::test_certify_defaults_to_cohens_settings",),
    ),
    # Monte Carlo's intervals.
    Mutant(
        "mc-wilson-interval-with-a-one-sided-quantile",
        "estimators/monte_carlo.py",
        "zq = float(special.ndtri(1.0 - alpha / 2))",
        "zq = float(special.ndtri(1.0 - alpha))",
        (f"{LEVEL}::test_monte_carlos_interval_misses_p_at_the_rate_its_confidence_implies[wilson]",),
    ),
    Mutant(
        "mc-clopper-pearson-lower-end-at-alpha",
        "estimators/monte_carlo.py",
        "low = torch.from_numpy(stats.beta.ppf(alpha / 2, kn, tn - kn + 1))",
        "low = torch.from_numpy(stats.beta.ppf(alpha, kn, tn - kn + 1))",
        (f"{LEVEL}::test_monte_carlos_interval_misses_p_at_the_rate_its_confidence_implies[clopper-pearson]",),
    ),
    Mutant(
        "mc-default-confidence-90-percent",
        "estimators/monte_carlo.py",
        "DEFAULT_CONFIDENCE = 0.95",
        "DEFAULT_CONFIDENCE = 0.9",
        (f"{DEFAULTS}::test_monte_carlo_draws_the_papers_ten_thousand_copies_with_a_95_percent_wilson_interval",),
    ),
    Mutant(
        "mc-default-draws-1000",
        "estimators/monte_carlo.py",
        "DEFAULT_DRAWS = 10_000",
        "DEFAULT_DRAWS = 1_000",
        (f"{DEFAULTS}::test_the_monte_carlo_variants_draw_ten_thousand_copies_at_95_percent_by_default",),
    ),
    Mutant(
        "mc-is-count-bound-below-5-failures-not-10",
        "estimators/importance.py",
        "MIN_FAILURES = 10",
        "MIN_FAILURES = 5",
        (f"{DEFAULTS}::test_mc_is_switches_to_its_count_bound_below_ten_failures_and_not_at_ten",),
    ),
    # The trust check's statistics.
    Mutant(
        "trust-level-at-six-percent",
        "estimators/trust.py",
        "TRUST_LEVEL = 0.05",
        "TRUST_LEVEL = 0.06",
        (f"{TRUST}::test_the_fewest_disagreements_that_flag_are_the_five_percent_tests_at_every_number_of_draws",),
    ),
    Mutant(
        "trust-level-at-ten-percent-seen-by-its-rate",
        "estimators/trust.py",
        "TRUST_LEVEL = 0.05",
        "TRUST_LEVEL = 0.1",
        (f"{TRUST}::test_a_point_at_the_trust_level_is_flagged_at_the_rate_its_staged_test_implies",),
    ),
    Mutant(
        "trust-confidence-at-90-percent",
        "estimators/trust.py",
        "TRUST_CONFIDENCE = 0.95",
        "TRUST_CONFIDENCE = 0.9",
        (f"{TRUST}::test_the_fewest_disagreements_that_flag_are_the_five_percent_tests_at_every_number_of_draws",),
    ),
    Mutant(
        "trust-clear-rate-at-1.5-percent",
        "estimators/trust.py",
        "CLEAR_RATE = 0.01",
        "CLEAR_RATE = 0.015",
        (f"{TRUST}::test_a_point_whose_first_draws_agree_stops_at_a_flip_rate_of_one_percent_and_not_above",),
    ),
    Mutant(
        "trust-clear-rate-strict",
        "estimators/trust.py",
        "        cleared &= rate <= CLEAR_RATE",
        "        cleared &= rate < CLEAR_RATE",
        (f"{TRUST}::test_a_point_whose_first_draws_agree_stops_at_a_flip_rate_of_one_percent_and_not_above",),
    ),
    Mutant(
        "trust-residuals-widened-by-their-range-once",
        "estimators/trust.py",
        "RESIDUAL_SPREAD = 2.0",
        "RESIDUAL_SPREAD = 1.0",
        ("tests/estimators/test_trust.py::test_flip_rate_is_the_union_of_the_flipping_bands",),
    ),
    Mutant(
        "trust-residuals-widened-by-a-quarter-of-their-size",
        "estimators/trust.py",
        "RESIDUAL_SLACK = 0.5",
        "RESIDUAL_SLACK = 0.25",
        ("tests/estimators/test_trust.py::test_flip_rate_is_the_union_of_the_flipping_bands",),
    ),
    Mutant(
        "trust-second-stage-ends-at-10",
        "estimators/trust.py",
        "STAGE_DRAWS = (2, 8)",
        "STAGE_DRAWS = (2, 10)",
        (f"{TRUST}::test_each_stage_draws_the_streams_next_draws_from_where_the_last_stopped",),
    ),
    Mutant(
        "trust-first-stage-of-3",
        "estimators/trust.py",
        "STAGE_DRAWS = (2, 8)",
        "STAGE_DRAWS = (3, 8)",
        ("tests/estimators/test_trust.py::test_check_stages_are_the_cumulative_draw_counts",),
    ),
    Mutant(
        "trust-taylor-checks-40-draws",
        "estimators/trust.py",
        "TAYLOR_CHECK_DRAWS = 32",
        "TAYLOR_CHECK_DRAWS = 40",
        ("tests/estimators/test_trust.py::test_check_stages_are_the_cumulative_draw_counts",),
    ),
    Mutant(
        "find-issues-flags-the-highest-label-scores",
        "issues/counting.py",
        'order = members[np.argsort(scores[members], kind="stable")]',
        'order = members[np.argsort(-scores[members], kind="stable")]',
        (f"{ISSUES}::test_planted_label_errors_are_flagged_and_ranked_first_and_clean_points_are_not",),
    ),
    Mutant(
        "find-issues-folds-may-overlap",
        "issues/folds.py",
        "        if taken.any():",
        "        if False:",
        (f"{ISSUES}::test_bad_folds_are_refused_with_the_reason",),
    ),
    Mutant(
        "find-issues-prediction-scored-at-the-label",
        "issues/find.py",
        "estimator(x[other], target=prediction[other], indices=index[other])",
        "estimator(x[other], target=labels[other], indices=index[other])",
        (f"{ISSUES}::test_p_label_and_p_robust_are_the_exact_probabilities_of_a_linear_model",),
    ),
    Mutant(
        "tracker-margins-against-the-previous-gradient",
        "issues/tracker.py",
        '            self._norm = got["norm"]\n            self._sums["z"] += _z(',
        '            self._sums["z"] += _z(',
        (f"{TRACKER}::test_each_margin_is_measured_against_the_next_computed_gradient",),
    ),
    Mutant(
        "tracker-rival-is-the-prediction-not-the-strongest-other-class",
        "issues/tracker.py",
        "rival = logits.detach().scatter(1, y[:, None], -math.inf).argmax(1)",
        "rival = logits.detach().argmax(1)",
        (f"{TRACKER}::test_the_cumulative_scores_are_the_hand_computed_sums_over_updates",),
    ),
    Mutant(
        "tracker-resumes-without-its-gradient-norms",
        "issues/tracker.py",
        '        self._norm = np.array(state["norm"], dtype=np.float64)',
        '        self._norm = np.zeros(len(state["norm"]))',
        (f"{TRACKER}::test_resuming_from_a_saved_tracker_gives_the_uninterrupted_numbers",),
    ),
    Mutant(
        "estimator-indices-ignored",
        "estimators/base.py",
        "            rows = _row_indices(indices, x)",
        "            _row_indices(indices, x)",
        (f"{ISSUES}::test_an_estimator_given_indices_matches_each_row_at_its_own_offset",),
    ),
)


def _copy_src(dest: Path) -> Path:
    src = dest / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return src


def _run_tests(src: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import probust; print(probust.__file__)"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(src)):
        raise SystemExit(f"probust was imported from {where}, not from the copy {src}: the check would test nothing")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", *tests]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def _plant(src: Path, mutant: Mutant) -> None:
    path = src / "probust" / mutant.path
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: {mutant.old!r} occurs {count} times in src/probust/{mutant.path}, not once")
    path.write_text(text.replace(mutant.old, mutant.new))


def _verdict(code: int) -> str | None:
    """killed (the tests ran and failed), SURVIVED (they passed), or None (pytest's error)."""
    return {1: "killed", 0: "SURVIVED"}.get(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", nargs="*", help="mutants by number (1-based) or name; default all")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="mutants tested at once (default: one per CPU)"
    )
    args = parser.parse_args(argv)
    if args.list:
        for i, m in enumerate(MUTANTS, 1):
            print(f"{i}. {m.name} (src/probust/{m.path}): {' '.join(m.tests)}")
        return 0
    chosen = [m for i, m in enumerate(MUTANTS, 1) if not args.which or str(i) in args.which or m.name in args.which]
    if not chosen:
        parser.error(f"no mutant matches {args.which}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="probust-mutation-") as tmp:
        # Every planted line must be found in the real code before anything runs.
        sources = {}
        for m in chosen:
            sources[m.name] = _copy_src(Path(tmp) / m.name)
            _plant(sources[m.name], m)
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        real = _copy_src(Path(tmp) / "real")

        def timed(src: Path, selection: tuple[str, ...]) -> tuple[int, str, float]:
            t0 = time.perf_counter()
            code, out = _run_tests(src, selection)
            return code, out, time.perf_counter() - t0

        # The unplanted run and the mutants side by side (each a pytest process on one CPU); the
        # verdicts count only once the tests are seen to pass on the unplanted code.
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            unplanted = pool.submit(timed, real, tests)
            runs = {m.name: pool.submit(timed, sources[m.name], m.tests) for m in chosen}
            code, out, seconds = unplanted.result()
            if code != 0:
                print(out[-4000:])
                print(f"the tests fail on the unplanted code (exit {code}): fix them before counting kills")
                return 1
            print(f"unplanted: the {len(tests)} test selections pass ({seconds:.0f} s)")
            survivors = []
            for m in chosen:
                code, out, seconds = runs[m.name].result()
                verdict = _verdict(code)
                if verdict is None:
                    print(out[-4000:])
                    print(f"{m.name}: pytest exit {code} (an error, not a verdict)")
                    return 1
                if verdict == "SURVIVED":
                    survivors.append(m.name)
                failed = [line for line in out.splitlines() if line.startswith("FAILED")]
                print(f"{verdict:8s} {m.name} ({seconds:.0f} s) {failed[0] if failed else ''}")
    print(
        f"{len(chosen) - len(survivors)}/{len(chosen)} mutants killed in {time.perf_counter() - start:.0f} s "
        f"({args.jobs} at once)"
    )
    if survivors:
        print("survived: " + ", ".join(survivors))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
