"""Input checks shared by every estimator: fail early, name the argument and what was expected.

A bad option value (a count, a level, a choice) raises :class:`probust.errors.OptionError` whose
``field`` is the argument's name; bad data (shapes, NaN inputs, logits) a plain ValueError."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from probust.errors import OptionError


def check_x(x: Tensor) -> Tensor:
    """Validate a batch of inputs [B, ...]; returns it unchanged."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape [B, ...], got {type(x).__name__}")
    if x.ndim < 2:
        raise ValueError(
            f"x must have a batch dimension and at least one input dimension [B, ...], got shape {tuple(x.shape)}"
        )
    if x.shape[0] == 0:
        raise ValueError("x is an empty batch (shape[0] == 0)")
    if not x.is_floating_point():
        raise ValueError(
            f"x must be floating point in the units the noise is measured in, got dtype {x.dtype}; "
            "for uint8 images use x.float() / 255"
        )
    if not torch.isfinite(x).all():
        bad = (~torch.isfinite(x.flatten(1))).any(1).nonzero().flatten()[:5].tolist()
        raise ValueError(f"x contains NaN or inf (rows {bad}{'...' if len(bad) == 5 else ''})")
    return x


def check_positive_int(value: int, name: str) -> int:
    """An integer >= 1 (not a bool); an :class:`~probust.errors.OptionError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"must be an integer >= 1, got {value!r}", field=name)
    return value


def check_positive_float(value: float, name: str) -> float:
    """A positive finite number, as a float; an :class:`~probust.errors.OptionError` naming ``name``."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"must be a positive number, got {value!r}", field=name) from None
    if not math.isfinite(value) or value <= 0:
        raise OptionError(f"must be a positive finite number, got {value!r}", field=name)
    return value


def check_fraction(value: float, name: str, *, closed_below: bool = False) -> float:
    """A number in (0, 1) (``[0, 1)`` when ``closed_below``), as a float; an
    :class:`~probust.errors.OptionError` naming ``name`` (a bool or a string is not a number)."""
    interval = "[0, 1)" if closed_below else "(0, 1)"
    if isinstance(value, (bool, str)):
        raise OptionError(f"must be a number in {interval}, got {value!r}", field=name)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"must be a number in {interval}, got {value!r}", field=name) from None
    if not (0 <= number < 1 if closed_below else 0 < number < 1):
        raise OptionError(f"must be in {interval}, got {value!r}", field=name)
    return number


def check_choice(value: object, choices: tuple, name: str) -> None:
    """``value`` is one of ``choices``; an :class:`~probust.errors.OptionError` naming ``name``."""
    try:
        known = value in choices
    except (TypeError, ValueError, RuntimeError):  # e.g. an array: no single truth value
        known = False
    if not known:
        raise OptionError(f"must be one of {choices}, got {value!r}", field=name)


def check_logits(logits: Tensor, batch: int) -> Tensor:
    """The model's output for a batch of ``batch`` rows must be finite logits [batch, C], C >= 2."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"the model must return a tensor of logits [B, C], got {type(logits).__name__}")
    if logits.ndim != 2 or logits.shape[0] != batch:
        raise ValueError(f"the model must return logits of shape [B, C] = [{batch}, C], got {tuple(logits.shape)}")
    if logits.shape[1] < 2:
        raise ValueError(f"the model must have at least 2 classes, got C = {logits.shape[1]}")
    if not torch.isfinite(logits).all():
        raise ValueError("the model returned NaN or inf logits")
    return logits


def finite_rows(logits: Tensor, copies: int) -> Tensor:
    """Which noisy copies gave finite logits: logits [P * copies, C] -> bool [P, copies].

    x * 0 is 0 for a finite x and NaN for NaN or +-inf, so a row's sum of them is finite exactly
    when all its logits are (no overflow: the sum is of zeros). Several times cheaper than
    ``isfinite(logits).all(1)`` for many classes, and no device synchronisation: callers sum it
    per point and check the sums once (:func:`check_noisy_logits`)."""
    return torch.isfinite((logits * 0).sum(dim=1)).view(-1, copies)


def check_noisy_logits(nonfinite: Tensor, copies: int, indices: Tensor, noise: str) -> None:
    """Raise ValueError when the model gave NaN or inf logits on any point's noisy copies.

    Such a copy has no prediction (argmax would return the NaN's index), so p_robust is
    undefined there: it is refused, never counted.

    Args:
        nonfinite: int [B], copies of each point whose logits held a NaN or an inf.
        copies: noisy copies drawn per point in the pass that was checked.
        indices: int [B], the points' indices in the data set (``index_offset + row``).
        noise: the noise, in words (e.g. its description), for the message.
    """
    if not bool(nonfinite.any()):
        return
    bad = nonfinite.nonzero().flatten()
    shown = ", ".join(f"point {int(indices[i])}: {int(nonfinite[i])} of {copies} copies" for i in bad[:5].tolist())
    more = f" and {len(bad) - 5} more points" if len(bad) > 5 else ""
    raise ValueError(
        f"the model returned NaN or inf logits on noisy copies x + eps under noise {noise} ({shown}{more}; "
        "point = data-set index, index_offset + row): p_robust is undefined there and such copies are never "
        "counted; make the model finite on noisy inputs (e.g. clamp before a log or an exp) or use a smaller noise"
    )


def check_target_shape(target: Tensor | None, batch: int, device: torch.device) -> Tensor | None:
    """``target`` as a tensor on ``device`` if it has one entry per point (None stays None), so
    that it can be split into chunks; the class range is checked against the logits later."""
    if target is None:
        return None
    target = torch.as_tensor(target, device=device)
    if target.is_floating_point() or target.shape != (batch,):
        raise ValueError(
            f"target must be an integer tensor of shape [{batch}], got {target.dtype} {tuple(target.shape)}"
        )
    return target


def check_target(target: Tensor | None, logits: Tensor) -> Tensor:
    """The class whose survival is measured: given, or the clean prediction (ties refused).

    The one policy for ties, shared with ``probust estimate``: p_robust of the prediction is
    undefined where the two largest clean logits are exactly equal, so such a point is refused
    (here naming its rows in the batch; the runner names data-set indices) unless a target is
    given explicitly."""
    batch, classes = logits.shape
    if target is None:
        top2 = logits.topk(2, dim=1).values
        tied = (top2[:, 0] == top2[:, 1]).nonzero().flatten()
        if len(tied):
            rows = tied[:5].tolist()
            raise ValueError(
                f"the prediction is tied between two classes at rows {rows}{'...' if len(tied) > 5 else ''}: "
                "p_robust is undefined there; pass target= to choose the class"
            )
        return logits.argmax(dim=1)
    target = torch.as_tensor(target, device=logits.device)
    if target.is_floating_point() or target.shape != (batch,):
        raise ValueError(
            f"target must be an integer tensor of shape [{batch}], got {target.dtype} {tuple(target.shape)}"
        )
    target = target.long()
    if (target < 0).any() or (target >= classes).any():
        raise ValueError(f"target must hold class indices in [0, {classes}), got values outside it")
    return target


def model_device(model: nn.Module) -> torch.device | None:
    """The device of the model's first parameter or buffer (None for a parameter-free model)."""
    for tensor in model.parameters():
        return tensor.device
    for buffer in model.buffers():
        return buffer.device
    return None


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode, and give each its own mode back afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
