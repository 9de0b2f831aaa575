"""``probust certify``: Cohen et al.'s CERTIFY over a data set into a resumable results folder
(see probust.run.certify)."""

from __future__ import annotations

import argparse
from typing import Any

_EPILOG = """\
examples:
  probust certify --data cifar10 --model resnet.pt --sigma 0.25 --indices 0-9999:20 --out cert/
  probust certify --data digits --model m.pt --sigma 0.12 0.25 0.5 --N 10000 --radii 0 0.25 0.5 0.75 \\
      --estimate taylor --out cert/
  torchrun --standalone --nproc-per-node 4 -m probust certify ... --device cuda --out cert/

Where the noise enters: N(0, sigma^2 I) is added to the tensors the model receives, per coordinate.
A model with its normalisation inside (probust's models) gets it in pixel space ([0, 1] images),
and the radius is an L2 distance there; a model fed normalised tensors gets both in normalised
units. Nothing is clipped; integer inputs are refused.

Writes OUT/results.parquet (one row per point and sigma; probust.run.certify.read_certified(OUT))
and OUT/certify_sigma<S>.tsv per sigma in Cohen et al.'s format (idx label predict radius correct
time; predict -1 and radius 0 where CERTIFY abstains). Run the same command again to resume an
interrupted run: only missing points are computed, and the table is the uninterrupted one.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``certify`` sub-command: one flag per declared field of
    :class:`probust.run.certify.CertifySettings` (by group) and of :class:`probust.data.FileOptions`."""
    from probust.cli.flags import add_options
    from probust.data import FileOptions
    from probust.run.certify import GROUPS
    from probust.run.settings import SourceOptions

    p = subparsers.add_parser(
        "certify",
        help="certify L2 radii by randomized smoothing (Cohen et al.'s CERTIFY) into a results table",
        description="Certify, per point and noise level sigma, the L2 radius within which the smoothed classifier\n"
        "g(x) = argmax_c P[f(x + eps) = c], eps ~ N(0, sigma^2 I), keeps its class (Cohen, Rosenfeld and Kolter,\n"
        "ICML 2019), with probability at least 1 - alpha, into a Parquet results folder that survives\n"
        "interruption, plus the authors' certify TSV per sigma (docs/certify.md).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for group in GROUPS:
        add_options(p, group, required=("data", "model", "sigmas", "out"))
        if group is SourceOptions:
            add_options(p, FileOptions)
    p.set_defaults(func=run)


def flags() -> dict[str, str]:
    """Every argument of a certification and the flag that sets it."""
    from probust.cli.results_command import flags_of
    from probust.run.certify import CertifySettings

    return flags_of(CertifySettings)


def settings_from(args: argparse.Namespace) -> Any:
    """The :class:`~probust.run.certify.CertifySettings` of the flags given.

    Raises:
        ProbustError: a bad value (``field`` names the argument).
    """
    from probust.cli.results_command import settings_of
    from probust.run.certify import CertifySettings

    return settings_of(args, CertifySettings)


def run(args: argparse.Namespace) -> int:
    """Run ``probust certify``; returns the exit status."""
    from probust.cli.results_command import run_prepared
    from probust.run.certify import CertifySettings, execute_certify, prepare_certify

    return run_prepared("certify", args, CertifySettings, prepare_certify, execute_certify)
