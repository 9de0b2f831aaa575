"""Facts kept per model object (row costs, plans, whether forward mode runs), dropped when the
model's structure changes.

A notebook changes a model in place: a new head (``model.fc = nn.Linear(512, 10)``), a layer
swapped for another, ``model.half()``. Facts measured before would then describe another
network: its class count, its memory per row, whether torch.func runs through it, and so the
route and the numbers of the next call. Each fact is therefore kept under the model's structure
token (:func:`structure_token`), read again at every look-up: a replaced module, parameter or
buffer, or one of another shape, dtype or device, a ``forward`` replaced on a module object, or
a forward hook added or removed, empties the model's entries. New values in
the same tensors (a training step, ``load_state_dict``) keep them.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from torch import nn

V = TypeVar("V")


def structure_token(model: Any) -> tuple:
    """What a model's kept facts depend on: the identity and class of each of its modules, a
    ``forward`` set on a module object (``model.forward = f``) and the module's own forward hooks,
    and the identity, shape, dtype and device of each parameter and buffer (not their values,
    nor their memory format). Empty for a callable that is not a module. One walk over the
    modules, parameters and buffers, reading no values: cheap enough for every look-up."""
    if not isinstance(model, nn.Module):
        return ()
    return (
        tuple(
            (
                id(module),
                type(module),
                id(module.__dict__.get("forward")),
                tuple(module._forward_pre_hooks),
                tuple(module._forward_hooks),
            )
            for module in model.modules()
        ),
        tuple((id(t), t.shape, t.dtype, t.device) for t in (*model.parameters(), *model.buffers())),
    )


class PerModel(Generic[V]):
    """Values kept per model object, weakly, and per key (e.g. an input shape), under the model's
    :func:`structure_token`: a look-up after the structure changed finds nothing. A model that
    cannot be held weakly keeps nothing."""

    def __init__(self) -> None:
        self._held: weakref.WeakKeyDictionary[Any, tuple[tuple, dict[Hashable, V]]] = weakref.WeakKeyDictionary()

    def _entries(self, model: Any) -> dict[Hashable, V] | None:
        token = structure_token(model)
        try:
            held = self._held.get(model)
            if held is None or held[0] != token:
                held = (token, {})
                self._held[model] = held
        except TypeError:  # not weakly referable or not hashable
            return None
        return held[1]

    def get(self, model: Any, key: Hashable) -> V | None:
        """The value kept for ``model`` under ``key``, or None."""
        entries = self._entries(model)
        return None if entries is None else entries.get(key)

    def put(self, model: Any, key: Hashable, value: V) -> None:
        """Keep ``value`` for ``model`` under ``key`` (for as long as its structure and the model last)."""
        entries = self._entries(model)
        if entries is not None:
            entries[key] = value

    def holds(self, model: Any) -> bool:
        """Whether anything is kept for ``model`` under its current structure."""
        return bool(self._entries(model))

    def forget(self, model: Any) -> None:
        """Drop everything kept for ``model``."""
        try:
            self._held.pop(model, None)
        except TypeError:
            pass


__all__ = ["PerModel", "structure_token"]
