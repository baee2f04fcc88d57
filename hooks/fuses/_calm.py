"""QK-clip's calm schedule: while every measured head stays well under tau, measure less
often (``docs/FUSES.md``, QK-clip, *Cost*).

An acting QK-clip measures the heads' max logits every ``every`` steps. :class:`Calm`
reads each measured step's per-layer maxima (a few floats) on the host and, once
``steps`` consecutive readings are all below ``threshold`` (QK-clip's ``calm * tau``),
says to measure only every ``every``-th of those steps; the first reading at or above it
(or NaN, or a reading lost) goes back to every step at once.

Reading costs no host-device sync: a CPU tensor's values are host memory, read at once; an
accelerator's maxima are copied, non-blocking, into pinned host memory (one of
``SLOTS`` slots, made once) with a CUDA event, and read once the event has completed
(typically a step or two later, polled at every step's end: ``event.query()`` only). Until
a reading is available the schedule stays at every step. No event to poll (an accelerator
other than CUDA), no pinned memory, or layers on several devices: the schedule stays at
every step for the run.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

__all__ = ["SLOTS", "Calm"]

#: Pinned staging slots: accelerator readings in flight at once (more are counted as lost).
SLOTS = 8


class _Slot:
    """One pinned staging buffer, its CUDA event and its numpy view (made once)."""

    def __init__(self, n: int) -> None:
        self.pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
        self.event = torch.cuda.Event()
        self.view = self.pinned.numpy()  # host memory: read without a sync


class Calm:
    """The calm schedule of one acting QK-clip.

    Args:
        threshold: A reading under this everywhere is calm (QK-clip's ``calm * tau``).
        steps: Consecutive calm readings before measuring less often.
        every: While calm, measure one of this many measuring steps (1: always measure).
    """

    def __init__(self, threshold: float, steps: int, every: int) -> None:
        self.threshold = float(threshold)
        self.steps = steps
        self.every = every
        self.calm = False
        self.run = 0  # consecutive readings under the threshold
        self.skipped = 0  # measuring steps left out since the last measured one
        self.lost = 0  # accelerator readings not staged (every slot in flight)
        self.staging = True  # False: no event or pinned memory here (never calm)
        self._free: list[_Slot] = []
        self._pending: deque[_Slot | None] = deque()  # None: a reading lost there
        self._size = 0

    @property
    def on(self) -> bool:
        return self.every > 1 and self.staging

    def reset(self) -> None:
        """Back to every step (undo, a new start); what is in flight is dropped (its slot
        reused: a later copy into it is ordered after it on the stream, and read only after
        its own event)."""
        self._not_calm()
        while self._pending:
            slot = self._pending.popleft()
            if slot is not None:
                self._free.append(slot)

    def skip(self) -> bool:
        """At a step that would be measured: whether calm leaves it out."""
        if not (self.calm and self.on) or self.skipped >= self.every - 1:
            self.skipped = 0
            return False
        self.skipped += 1
        return True

    def measured(self, maxima: list[torch.Tensor]) -> None:
        """A measured step's per-head maxima (one tensor a layer): read now (CPU), or staged
        to be read when their copy has completed (accelerator)."""
        if not self.on or not maxima:
            return
        try:
            per_layer = torch.stack([m.detach().float().amax() for m in maxima])
        except Exception:  # layers on several devices: every step for the run
            self.staging = False
            self.reset()
            return
        if per_layer.device.type == "cpu":
            self._read(per_layer.tolist())
            return
        self.poll()
        if per_layer.device.type != "cuda":
            self.staging = False  # no event to poll: every step for the run
            self.reset()
            return
        self._stage(per_layer)

    def _stage(self, per_layer: torch.Tensor) -> None:
        """Copy an accelerator reading into a free pinned slot and record its event."""
        try:
            n = per_layer.numel()
            if n != self._size:  # made once (again only if the layer count changes)
                self._free = [_Slot(n) for _ in range(SLOTS)]
                self._pending, self._size = deque(), n
                self._not_calm()
            if not self._free:  # every slot in flight: this reading is lost (not calm, now
                self.lost += 1  # and again when the readings before it have been read)
                self._not_calm()
                if self._pending[-1] is not None:
                    self._pending.append(None)
                return
            slot = self._free.pop()
            slot.pinned.copy_(per_layer, non_blocking=True)
            slot.event.record()
            self._pending.append(slot)
        except Exception:
            self.staging = False  # no pinned memory or events: every step for the run
            self.reset()

    def poll(self) -> None:
        """Read the staged readings whose copies have completed, oldest first (no sync:
        ``event.query()`` and host memory)."""
        while self._pending:
            slot = self._pending[0]
            if slot is None:  # a reading lost after the ones before it
                self._pending.popleft()
                self._not_calm()
                continue
            if not slot.event.query():
                return
            self._pending.popleft()
            self._read([float(x) for x in slot.view])
            self._free.append(slot)

    def _read(self, values: list[float]) -> None:
        if all(v < self.threshold for v in values):  # NaN compares False: not calm
            self.run += 1
            if self.run >= self.steps:
                self.calm = True
        else:
            self._not_calm()

    def _not_calm(self) -> None:
        self.calm, self.run, self.skipped = False, 0, 0

    def state(self) -> dict[str, Any]:
        """For tests and the log: ``calm``, ``run``, ``pending``, ``lost``."""
        pending = sum(slot is not None for slot in self._pending)
        return {"calm": self.calm, "run": self.run, "pending": pending,
                "lost": self.lost, "staging": self.staging}


def check(calm: Any, calm_steps: Any, calm_every: Any) -> None:
    """QKClip's calm options (raises ValueError)."""
    if not (isinstance(calm, (int, float)) and not isinstance(calm, bool)
            and 0 < calm <= 1):
        raise ValueError(f"QKClip: calm must be a number in (0, 1], got {calm!r}")
    for name, v in (("calm_steps", calm_steps), ("calm_every", calm_every)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"QKClip: {name} must be an int >= 1, got {v!r}")
