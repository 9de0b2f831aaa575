"""``TrackerCallback``: a :class:`~probust.issues.Tracker` updated by a Lightning ``Trainer``.

    tracker = probust.issues.Tracker(train_points)
    trainer = lightning.pytorch.Trainer(callbacks=[probust.issues.TrackerCallback(tracker)])
    trainer.fit(module, train_loader)
    tracker.find_issues()

The tracker's state travels in the Lightning checkpoint (``state_dict`` / ``load_state_dict``), so a
run resumed with ``trainer.fit(..., ckpt_path=...)`` goes on with the history it had. Needs the
``lightning`` extra.
"""

from __future__ import annotations

from typing import Any

from probust._extras import missing_extra
from probust.issues.tracker import Tracker
from probust.run import ConfigError

try:
    from lightning.pytorch import Callback
except ModuleNotFoundError as exc:  # Lightning missing: name the extra that installs it
    raise (missing_extra(exc, "probust.issues.TrackerCallback") or exc) from exc

__all__ = ["TrackerCallback"]


class TrackerCallback(Callback):
    """Updates ``tracker`` with the LightningModule at the end of every ``every_n_epochs``-th
    training epoch (under DDP each rank its shard: build the tracker after the process group, or
    give it ``shard=(rank, world)``).

    Args:
        tracker: the :class:`~probust.issues.Tracker` of the training points.
        every_n_epochs: update at epochs ``every_n_epochs - 1``, ``2 * every_n_epochs - 1``, ...
    """

    def __init__(self, tracker: Tracker, every_n_epochs: int = 1) -> None:
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ConfigError(f"must be an integer >= 1, got {every_n_epochs!r}", field="every_n_epochs")
        self.tracker = tracker
        self.every_n_epochs = every_n_epochs

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.tracker.update(pl_module)

    def state_dict(self) -> dict[str, Any]:
        return self.tracker.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state_dict)
