"""The :class:`Fuse` base class (one action the job may take on a warning), the
:class:`Event` it records, and what the fuses share: :func:`alert_step`,
:func:`multi_rank`. The framework's overview is in :mod:`._base`; the set that runs the
fuses is :class:`~._fuseset.FuseSet`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from ._fuseset import FuseSet

__all__ = ["MODES", "Event", "Fuse", "alert_step", "multi_rank"]

log = logging.getLogger("logitwatch.hooks")

#: The modes of a fuse.
MODES = ("off", "suggest", "auto")


@dataclass
class Event:
    """One thing a fuse did (or would do): ``action`` is ``"suggest"``, ``"apply"``,
    ``"clip"``, ``"backoff"``, ``"restored"``, ``"armed"``, ``"rollback"``, ``"skipped"``,
    ``"no_snapshot"``, ``"limit"``, ``"undo"``, ``"unavailable"`` or ``"failed"``;
    ``detail`` says on what, with which factors."""

    step: int
    fuse: str
    action: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "fuse": self.fuse, "action": self.action, **self.detail}


def alert_step(alert: Mapping[str, Any]) -> int | None:
    """The step a collector alert speaks of: the latest of its ``fired_step``, its
    ``paged_step``, ``evidence.escalated_step`` (and a plain ``step``), i.e. the step of
    the frames that made it what it is now; None when it names none."""
    ev = alert.get("evidence")
    values = [alert.get("step"), alert.get("fired_step"), alert.get("paged_step"),
              ev.get("escalated_step") if isinstance(ev, Mapping) else None]
    steps = [int(v) for v in values
             if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
    return max(steps) if steps else None


class Fuse:
    """Base class of a fuse. Subclasses set :attr:`name` and override the hooks they need;
    every hook is called on the training thread, guarded by :class:`FuseSet` (an exception
    turns the fuse off, logged once), except :meth:`on_alert` (the client's sender
    thread: it may only queue work).

    Args:
        mode: ``"off"``, ``"suggest"`` (default) or ``"auto"``.
    """

    name: ClassVar[str] = "fuse"

    def __init__(self, mode: str = "suggest") -> None:
        if mode not in MODES:
            raise ValueError(f"{type(self).__name__}: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.engaged = mode == "auto"  # acting: auto, or applied by a person
        self.unavailable: str | None = None  # why it cannot apply here
        self.failed = False
        self.actions = 0  # since the last frame
        self.fuses: FuseSet | None = None

    # -- state -----------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        """Whether the fuse still watches (not off, not failed, not unavailable)."""
        return self.mode != "off" and not self.failed and self.unavailable is None

    @property
    def acting(self) -> bool:
        """Whether it acts on its trigger now (auto, or applied by a person)."""
        return self.live and self.engaged

    def state(self) -> float:
        """``fuse.<name>.state``: -1 unavailable or failed, 0 off, 1 suggesting, 2 acting."""
        if self.failed or self.unavailable is not None:
            return -1.0
        if self.mode == "off":
            return 0.0
        return 2.0 if self.engaged else 1.0

    def cannot(self, step: int, reason: str) -> None:
        """Say once why this fuse cannot apply here, and stop it (an event of the run)."""
        if self.unavailable is not None:
            return
        self.unavailable = reason
        log.warning("logitwatch: fuse %s cannot apply: %s; training continues unaffected",
                    self.name, reason)
        self.record(step, "unavailable", reason=reason)

    def fail(self, step: int, why: str = "") -> None:
        """This fuse failed (in a hook :class:`FuseSet` guards, or in an optimizer hook of its
        own): off for the rest of the run, logged once with the traceback, a ``failed``
        event recorded. ``why``: what it leaves behind."""
        if self.failed:
            return
        self.failed = True
        log.warning("logitwatch: fuse %s failed and is off for the rest of the run%s; "
                    "training continues unaffected", self.name, why, exc_info=True)
        self.record(step, "failed")

    def record(self, step: int, action: str, **detail: Any) -> None:
        """Add an event of the run (counted in the next frame)."""
        if action not in ("suggest", "unavailable", "failed", "armed", "no_snapshot",
                          "limit"):
            self.actions += 1
        if self.fuses is not None:
            self.fuses.events.append(Event(step, self.name, action, detail))

    # -- hooks (override) ------------------------------------------------------------------

    def bind(self, fuses: FuseSet) -> None:
        """At attach: find what the fuse acts on (call :meth:`cannot` if nothing)."""
        self.fuses = fuses

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer known only after attach (the Lightning callback)."""

    def step_end(self, step: int, sampled: bool) -> None:
        """The end of step ``step``, after the optimizer's update (``sampled``: the monitor
        measured it, its statistics are in the monitor's buffer)."""

    def before_frame(self, scalars: dict[str, Any], heads: dict[str, list[torch.Tensor]]
                     ) -> None:
        """Add device tensors to the frame being built (read back with it)."""

    def after_frame(self, step: int, scalars: dict[str, float],
                    heads: dict[str, list[list[float]]]) -> None:
        """The frame's values on the host: decide from them, add host scalars."""

    def apply(self, step: int, by: str) -> None:
        """A person applies the fuse (``by``: ``"control"`` or ``"job"``)."""
        if not self.engaged:
            self.engaged = True
            self.record(step, "apply", by=by)

    def undo(self, step: int, by: str) -> None:
        """Undo what the fuse did and stop acting (back to suggesting)."""
        self.engaged = False
        self.record(step, "undo", by=by)

    def matches(self, alert: Mapping[str, Any]) -> bool:
        """Whether this fuse addresses ``alert`` (a collector alert)."""
        return False

    def weight_state(self) -> Any:
        """A copy of what the fuse knows about what it did to the weights (QK-clip: the
        factors its undo divides by), kept with a rollback snapshot; None: nothing."""
        return None

    def load_weight_state(self, state: Any) -> None:
        """The weights went back to a snapshot (a rollback): ``state`` is what
        :meth:`weight_state` said when it was taken (None: nothing then)."""

    def describe(self) -> str:
        """What the fuse does, in one line (carried by suggestions)."""
        return self.name

    def on_alert(self, alert: Mapping[str, Any]) -> None:
        """A new alert this fuse addresses (sender thread: queue work only)."""

    def close(self) -> None:
        """Remove hooks (detach)."""


def multi_rank() -> bool:
    """Whether this process is one of several ranks (``torch.distributed``)."""
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1)
