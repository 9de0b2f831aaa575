"""Running one ``probust estimate`` over several processes started by ``torchrun``.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR/PORT for the rendezvous). Each
rank computes a disjoint share of the work units and writes its own part files into the shared
results folder; results do not depend on which rank computed a point (per-point random
streams), so the merged table equals a single-process run. The only messages exchanged are
small Python objects (validation outcomes) and barriers, over a gloo group, whatever backend
the default group uses (nccl on GPUs).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: How long a rank may wait for the others at a barrier. Ranks finish their shares at
#: different times (a slower GPU, a larger last block), so this is generous.
TIMEOUT = datetime.timedelta(hours=24)


def environment_world() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) outside it."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise ValueError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {exc}") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={world}")
    return rank, world, local


@dataclass
class World:
    """The processes sharing one run.

    Attributes:
        rank: this process, in [0, world_size).
        world_size: number of processes.
        local_rank: this process on its machine (the GPU it uses).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    _group: Any = field(default=None, repr=False)
    _owns_default_group: bool = field(default=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items``: every world_size-th item, starting at ``rank``.

        Strided rather than contiguous, so that each rank gets a similar mix of easy and hard
        parts of the data set.
        """
        return list(items[self.rank :: self.world_size])

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (just ``[obj]`` in a single process)."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=self._group)

    def close(self) -> None:
        """Tear down the process group if this object created it."""
        if self.distributed and self._owns_default_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_default_group = False


def join(device_type: str) -> World:
    """Join the process group torchrun set up the environment for (a no-op outside torchrun).

    The default group uses nccl when ``device_type`` is "cuda" and gloo otherwise; control
    messages go over a separate gloo group so they need no GPU. A process group the caller
    initialised already is reused (and left open by :meth:`World.close`).

    Args:
        device_type: "cpu", "cuda", ... (the device the estimators run on).
    """
    rank, world_size, local_rank = environment_world()
    if world_size == 1:
        return World()
    import torch.distributed as dist

    owns = False
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"backend": backend, "timeout": TIMEOUT}
        if backend == "nccl":
            import torch

            kwargs["device_id"] = torch.device("cuda", local_rank)
        dist.init_process_group(**kwargs)
        owns = True
    group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=TIMEOUT)
    return World(dist.get_rank(), dist.get_world_size(), local_rank, group, owns)
