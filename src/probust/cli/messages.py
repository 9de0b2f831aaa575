"""How library errors read on the command line: Python argument names become flags."""

from __future__ import annotations

import re

#: run_estimate's keyword arguments and the flags that set them: the library's messages name the
#: arguments, this command's name its flags (see :func:`cli_message`).
ARGUMENT_FLAGS = {
    "data": "--data",
    "split": "--split",
    "model": "--model",
    "sigmas": "--sigma",
    "methods": "--methods",
    "mc_samples": "--mc-samples",
    "mmse_samples": "--mmse-samples",
    "limit": "--limit",
    "indices": "--indices",
    "target": "--target",
    "device": "--device",
    "seed": "--seed",
    "batch_size": "--batch-size",
    "eval_batch_size": "--eval-batch-size",
    "mc_half_width": "--mc-half-width",
    "memory_budget": "--memory-budget",
    "channels_last": "--channels-last",
    "jacobian": "--jacobian",
    "temperature": "--temperature",
    "tol": "--tol",
    "ci_level": "--confidence",
    "interval": "--interval",
    "mmse_sampling": "--mmse-sampling",
    "p_fail": "--p-fail",
    "prune": "--prune",
    "out": "--out",
    "overwrite": "--overwrite",
    "extend": "--extend",
    "data_root": "--data-root",
    "download": "--download",
    "allow_pickle": "--allow-pickle",
    "allow_version_change": "--allow-version-change",
    "data_options": "--data",
    "weights": "--weights",
    "noise": "--noise",
    "noise_std": "--noise-std",
    "noise_cov": "--noise-cov",
    "noise_scale": "--noise-scale",
}
#: The options of ``data_options`` (:class:`probust.data.FileOptions`) and their flags.
FILE_OPTION_FLAGS = {
    "x_key": "--x-key",
    "y_key": "--y-key",
    "label_column": "--label-column",
    "feature_columns": "--feature-columns",
    "image_size": "--image-size",
    "channels": "--channels",
}
_FLAGS = {**ARGUMENT_FLAGS, **FILE_OPTION_FLAGS}
_ASSIGNMENT = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(?:'([^']*)'|(\w+))")


def cli_message(message: str) -> str:
    """A library message in this command's words: a leading ``name:`` becomes the flag, and
    hints such as ``overwrite=True`` or ``device='cpu'`` become ``--overwrite``, ``--device cpu``
    (a hint's own "(CLI: ...)" aside is then dropped)."""
    message = re.sub(r" \(CLI: [^)]*\)", "", message)
    name, colon, rest = message.partition(":")
    if colon and name in _FLAGS:
        message = _FLAGS[name] + colon + rest

    def flag(m: re.Match) -> str:
        value = m.group(2) if m.group(2) is not None else m.group(3)
        return _FLAGS[m.group(1)] + ("" if value == "True" else f" {value}")

    return _ASSIGNMENT.sub(flag, message).replace("another out folder", "another --out")
