"""``hfai.checkpoint.init`` and ``model.try_save``: the original client's automatic resume.

The hfai-models training scripts do, on every rank::

    start_epoch, start_step, others = hfai.checkpoint.init(model, optimizer, amp_scaler=scaler,
                                                           ckpt_path="out/latest.pt")
    for epoch in range(start_epoch, epochs):
        for step, batch in enumerate(loader, start=start_step):
            ...
            model.try_save(epoch, step + 1, others=best_acc)   # every step

:func:`init` loads ``ckpt_path`` if a finished checkpoint is there (model, optimizer, and the
scheduler and AMP scaler if given) and returns the ``(epoch, step, others)`` that
``try_save`` stored, or ``(0, 0, None)`` for a fresh start. It gives ``model`` a ``try_save``
method: when the platform asked the job to suspend, it saves the checkpoint (the directory form
of :func:`hfai.checkpoint.save`: every rank writes its share, one atomic commit) and then
acknowledges with :func:`hfai.go_suspend`, which ends the process. ``try_save(..., force=True)``
saves now, for a script's own cadence, and returns.

``try_save`` is a collective in a torch.distributed job: every rank calls it at the same step
(as these scripts do), so that all ranks agree whether to save. The answer is the suspend flag
all-reduced over the ranks (one small all-reduce per call): a suspend seen on any node saves on
all of them at the same step. ``init(..., check_every=N)`` asks only every N-th call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hfai._throughput import mark_step
from hfai.protocol.errors import HfaiError

#: Marks a checkpoint written by try_save, beside model and optimizer.
MARK = "hfai_auto_resume"


class CheckpointLoadError(HfaiError, RuntimeError):
    """The checkpoint at ``ckpt_path`` is there but cannot be restored. A RuntimeError too: some
    public scripts catch that around ``init`` to start from scratch instead."""


class AutoCheckpoint:
    """What ``init`` attached to the model: the objects to save, where, and how often to ask."""

    def __init__(self, model: Any, optimizer: Any, scheduler: Any, amp_scaler: Any, path: Path, check_every: int):
        self.model, self.optimizer, self.scheduler, self.amp_scaler = model, optimizer, scheduler, amp_scaler
        self.path = path
        self.check_every = check_every
        self._calls = 0

    def try_save(self, epoch: int, step: int, others: Any = None, *, force: bool = False) -> bool:
        """Save if a suspend was asked (then acknowledge it and exit) or if ``force``; every rank
        calls it at the same step. Returns whether it saved (only ever True with ``force``)."""
        self._calls += 1
        mark_step("save")  # a step, for the scheduler's throughput measure (hfai._throughput)
        asked = False
        if not force and self._calls % self.check_every == 0:
            from hfai.distributed import receive_suspend_command

            asked = receive_suspend_command()
        if not (asked or force):
            return False
        self.save(epoch, step, others)
        if asked:
            from hfai import go_suspend

            go_suspend()
        return True

    def save(self, epoch: int, step: int, others: Any = None) -> Path:
        from hfai.checkpoint import save_sharded

        extra: dict[str, Any] = {MARK: 1, "epoch": int(epoch), "step": int(step), "others": others}
        for name in ("scheduler", "amp_scaler"):
            obj = getattr(self, name)
            if obj is not None:
                extra[name] = obj.state_dict()
        return save_sharded(self.path, self.model, self.optimizer, extra)

    def restore(self) -> tuple[int, int, Any]:
        from hfai.checkpoint import load

        try:
            ck = load(self.path)
            if not isinstance(ck, dict) or MARK not in ck:
                raise CheckpointLoadError(f"{self.path} is not a checkpoint of model.try_save (saved otherwise?): "
                                          f"remove it or give init another ckpt_path")
            self.model.load_state_dict(ck["model"])
            if self.optimizer is not None and ck.get("optimizer") is not None:
                self.optimizer.load_state_dict(ck["optimizer"])
            for name in ("scheduler", "amp_scaler"):
                obj = getattr(self, name)
                if obj is not None and name in ck:
                    obj.load_state_dict(ck[name])
        except CheckpointLoadError:
            raise
        except Exception as e:
            raise CheckpointLoadError(f"cannot resume from {self.path}: {type(e).__name__}: {e}") from e
        return int(ck["epoch"]), int(ck["step"]), ck["others"]


def exists(path: Path) -> bool:
    """A finished checkpoint is at ``path`` (a committed directory, or a single file)."""
    from hfai.checkpoint import MANIFEST

    return (path / MANIFEST).is_file() if path.is_dir() else path.is_file()


def init(model: Any, optimizer: Any = None, *, scheduler: Any = None, amp_scaler: Any = None,
         ckpt_path: str | os.PathLike, check_every: int = 1) -> tuple[int, int, Any]:
    """Resume ``model`` (and ``optimizer``, ``scheduler``, ``amp_scaler``: anything with
    ``state_dict``/``load_state_dict``) from ``ckpt_path`` if a checkpoint is there; attach
    ``model.try_save(epoch, step, others=None, force=False)``. Returns ``(epoch, step, others)``
    as last saved, or ``(0, 0, None)``. Called on every rank. Raises :class:`CheckpointLoadError`
    when a checkpoint is there but does not fit these objects."""
    if ckpt_path is None:
        raise HfaiError("hfai.checkpoint.init needs ckpt_path=, where the checkpoint is saved and found")
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
        raise HfaiError(f"check_every must be an int >= 1, got {check_every!r}")
    for name, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler),
                      ("amp_scaler", amp_scaler)):
        if obj is not None and not (callable(getattr(obj, "state_dict", None))
                                    and callable(getattr(obj, "load_state_dict", None))):
            raise HfaiError(f"hfai.checkpoint.init: {name} ({type(obj).__name__}) has no state_dict/load_state_dict, "
                            f"so it cannot be saved and restored; leave it out and save its state in others")
    if model is None:
        raise HfaiError("hfai.checkpoint.init needs the model")
    auto = AutoCheckpoint(model, optimizer, scheduler, amp_scaler, Path(ckpt_path), check_every)
    model.try_save = auto.try_save
    if not exists(auto.path):
        return 0, 0, None
    return auto.restore()
