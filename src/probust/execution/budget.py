"""Memory budgets: how many bytes an estimator may hold at once, and what one row costs.

Every estimator chooses its row and class chunks so that its peak memory stays under a
budget (``memory_budget=``). The default is a fraction of the memory free on the device when
the estimator is called; asking for work that cannot fit in the budget raises an error that
names the knob. Sizes here are estimates from the model itself (the tensors its forward pass
saves for the backward pass), measured once per model and input shape.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from probust._user_model import PerModel
from probust.errors import OptionError, Setting

if TYPE_CHECKING:  # the door's description of a batch; the door imports this module
    from probust.execution.engine import Inputs

#: Fraction of the free memory the default budget takes: the rest is left to the caller's own
#: tensors, the allocator's fragmentation and other processes.
DEFAULT_FRACTION = 0.5
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "t": 2**40,
    "tb": 2**40,
}


class MemoryBudgetError(OptionError):
    """The work cannot be split finely enough to fit ``memory_budget`` (its ``field``)."""

    prefixed = False  # the messages name the budget themselves

    def __init__(self, *parts: object, field: str | None = "memory_budget", **where: Any) -> None:
        super().__init__(*parts, field=field, **where)


def parse_bytes(value: int | float | str, name: str = "memory_budget") -> int:
    """Bytes from an int or a string such as ``"2GB"``, ``"512 MiB"`` or ``"1.5g"`` (binary units).

    Raises:
        OptionError: not a size (``field`` is ``name``).
    """
    if isinstance(value, bool):
        raise OptionError(f"must be a number of bytes or a size such as '2GB', got {value!r}", field=name)
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower().replace("ib", "b") if match else None
        if match is None or unit not in _UNITS:
            raise OptionError(
                f"must be a number of bytes or a size such as '2GB' or '512MB', got {value!r}", field=name
            )
        number = float(match.group(1)) * _UNITS[unit]
    else:
        raise OptionError(f"must be a number of bytes or a size such as '2GB', got {type(value).__name__}", field=name)
    if not math.isfinite(number) or number < 1:
        raise OptionError(f"must be a positive size, got {value!r}", field=name)
    return int(number)


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device`` now: CUDA's free memory, or the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30  # nothing to read: assume a small machine


def resolve_budget(memory_budget: int | float | str | None, device: torch.device) -> int:
    """The budget in bytes: the user's, or :data:`DEFAULT_FRACTION` of the free memory."""
    if memory_budget is None:
        return int(DEFAULT_FRACTION * free_memory(device))
    return parse_bytes(memory_budget)


def check_budget(memory_budget: int | float | str | None) -> int | float | str | None:
    """Validate a ``memory_budget`` argument early (None is the default: resolved per call)."""
    if memory_budget is not None:
        parse_bytes(memory_budget)
    return memory_budget


@dataclass(frozen=True)
class RowCost:
    """Bytes one input row costs in a forward pass of a model.

    Attributes:
        saved: bytes the forward pass keeps for the backward pass (activations), per row.
        largest: bytes of the largest single tensor the forward pass makes, per row; a
            forward pass without autograd holds about two such tensors at once.
        input: bytes of the input row itself.
        classes: C, the number of logits the model returns.
        smallest_map: the least height or width of any 2-D convolution's output (0: none).
    """

    saved: int
    largest: int
    input: int
    classes: int
    smallest_map: int = 0

    @property
    def inference(self) -> int:
        """Peak bytes per row of a forward pass without autograd (input, noise, two activations)."""
        return 2 * self.input + 3 * self.largest

    @property
    def backward(self) -> int:
        """Peak bytes per row of one forward pass with autograd and one backward pass through it.

        The saved activations, plus the gradient flowing back (about two of the largest
        tensors at once) and the input gradient.
        """
        return self.saved + 3 * self.largest + 2 * self.input


_COSTS: PerModel[RowCost] = PerModel()


def row_cost(model: nn.Module, inputs: Inputs) -> RowCost:
    """Measure :class:`RowCost` of ``model`` for rows like ``inputs`` (kept per model and input
    description while the model's structure stays: :mod:`probust._user_model`).

    Runs one forward pass with autograd on two copies of the batch's first row and counts the
    bytes of every tensor it saves for backward (each storage once, parameters left out) and of
    every tensor it produces, and the least feature map of its 2-D convolutions.
    """
    key = (inputs.shape, inputs.dtype, inputs.device)
    known = _COSTS.get(model, key)
    if known is not None:
        return known
    rows = inputs.first.expand(2, *inputs.shape).clone().requires_grad_(True)
    # Parameters are saved too (e.g. a linear layer's weight): they are not per-row costs.
    parameter_ptrs = (
        {p.untyped_storage().data_ptr() for p in model.parameters()} if isinstance(model, nn.Module) else set()
    )
    storages: dict[int, int] = {}
    largest = [0]

    def pack(tensor: Tensor) -> Tensor:
        if tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in parameter_ptrs:
                storages[storage.data_ptr()] = storage.nbytes()
                largest[0] = max(largest[0], tensor.numel() * tensor.element_size())
        return tensor

    maps: list[int] = []
    convolutions = [m for m in model.modules() if isinstance(m, nn.Conv2d)] if isinstance(model, nn.Module) else []
    hooks = [m.register_forward_hook(lambda m, a, out: maps.append(min(out.shape[-2:]))) for m in convolutions]
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = model(rows)
    finally:
        for hook in hooks:
            hook.remove()
    output_bytes = out.numel() * out.element_size() if isinstance(out, Tensor) else 0
    per_row_input = rows[0].numel() * rows.element_size()
    saved = sum(storages.values())
    cost = RowCost(
        saved=max(1, (saved + output_bytes) // 2),
        largest=max(per_row_input, largest[0] // 2, output_bytes // 2),
        input=per_row_input,
        classes=int(out.shape[-1]) if isinstance(out, Tensor) and out.ndim == 2 else 0,
        smallest_map=min(maps, default=0),
    )
    _COSTS.put(model, key, cost)
    return cost


def rows_within(budget: int, per_row: int, fixed: int = 0, *, what: str) -> int:
    """The most rows whose memory, ``fixed + rows * per_row``, fits ``budget`` (at least 1).

    Raises:
        MemoryBudgetError: not even one row fits; the message names ``memory_budget``.
    """
    rows = (budget - fixed) // max(1, per_row)
    if rows < 1:
        raise MemoryBudgetError(
            Setting("memory_budget"),
            f" of {human_bytes(budget)} is too small for {what}: one row needs about "
            f"{human_bytes(fixed + per_row)}; raise ",
            Setting("memory_budget"),
        )
    return int(rows)


def human_bytes(size: float) -> str:
    """A size for messages: ``1.5 GB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


@dataclass
class PeakMemory:
    """Filled in when a :func:`peak_memory` block exits: ``bytes`` above the level at its start
    (None where the platform does not say)."""

    bytes: int | None = None


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[PeakMemory]:
    """Measure the peak memory a block adds: CUDA's allocator peak on a GPU; on the CPU the
    process's resident-set high-water mark (Linux: reset through /proc/self/clear_refs, so
    blocks can be measured one after another in one process)."""
    result = PeakMemory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield result
        torch.cuda.synchronize(device)
        result.bytes = int(torch.cuda.max_memory_allocated(device) - start)
        return
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        start = _status_bytes("VmRSS")
    except (OSError, StopIteration):
        yield result
        return
    yield result
    result.bytes = max(0, _status_bytes("VmHWM") - start)
