"""The :class:`FuseSet`: the monitor's fuses (``mon.fuses``), run on the training thread
and guarded (a fuse that raises is turned off, never training): people's apply and undo,
the collector's control, the loop's rollback calls, the monitor's step and frame calls,
the events of the run. The framework's overview is in :mod:`._base`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ._fuse import Event, Fuse
from ._spec import FusesArg, parse

if TYPE_CHECKING:
    from .._monitor import Monitor

__all__ = ["MAX_EVENTS", "FuseSet"]

log = logging.getLogger("logitwatch.hooks")

#: Events kept in :attr:`FuseSet.events` (the oldest are dropped first).
MAX_EVENTS = 1024


class FuseSet:
    """The fuses of one monitor (``mon.fuses``); empty (and free) unless
    ``attach(fuses=...)`` names some. Training-thread API: :meth:`apply`, :meth:`undo`,
    :attr:`events`, ``mon.fuses["qk_clip"]``."""

    def __init__(self, fuses: Sequence[Fuse], monitor: Monitor | None) -> None:
        self.monitor = monitor
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self._fuses = list(fuses)
        self._control: dict[str, str] = {}  # the last control value seen per fuse
        # the first control seen after attach is the baseline, not acted on (a resumed
        # job's collector still carries what a person asked of its previous process):
        # until an answer replaces the client's control object, none has been seen
        client = getattr(monitor, "client", None) if monitor is not None else None
        answered = getattr(client, "_answered", None)  # the client's "an answer came"
        self._control_at_attach: Any = getattr(client, "control", None)
        self._baselined = False
        if callable(getattr(answered, "is_set", None)) and answered.is_set():
            # a client that had an answer already (shared with an earlier monitor): its
            # control now is the baseline; a click after attach acts
            self._take_baseline(self._control_at_attach)
        self._in_step = False  # inside step_end
        self._stale = False  # weights restored inside this step_end
        self._step = 0
        self.optimizer: torch.optim.Optimizer | None = (
            getattr(monitor, "_step_optimizer", None) if monitor is not None else None)
        for fuse in self._fuses:
            fuse.fuses = self  # (a bind that fails still has its failure recorded here)
            self._guard(fuse, fuse.bind, self)
        if self._fuses and monitor is not None:
            add = getattr(monitor.client, "add_alert_annotator", None)
            if callable(add):
                add(self._annotate)
            log.info("logitwatch: fuses %s", ", ".join(
                f"{f.name} ({f.mode})" for f in self._fuses))

    @classmethod
    def build(cls, spec: FusesArg | None, monitor: Monitor | None) -> FuseSet:
        """The fuses ``attach(fuses=spec)`` names.

        Raises:
            TypeError, ValueError: ``spec`` is not a list of fuses or a mapping of known
                fuse names to a mode or options, or names a fuse twice.
        """
        return cls(parse(spec), monitor)

    def __bool__(self) -> bool:
        return bool(self._fuses)

    def __iter__(self) -> Any:
        return iter(self._fuses)

    def __getitem__(self, name: str) -> Fuse:
        for fuse in self._fuses:
            if fuse.name == name:
                return fuse
        raise KeyError(name)

    # -- people ----------------------------------------------------------------------------

    def apply(self, name: str, by: str = "job") -> None:
        """Apply fuse ``name`` now (what a person does for a suggestion)."""
        fuse = self[name]
        if fuse.live:
            self._guard(fuse, fuse.apply, self._step, by)

    def undo(self, name: str, by: str = "job") -> None:
        """Undo what fuse ``name`` did; it goes back to suggesting."""
        fuse = self[name]
        if fuse.mode == "off" or fuse.failed:
            return
        # a fuse that became unavailable (its part of the monitor failed, the model
        # changed) after it scaled weights can still scale them back
        if fuse.unavailable is None or self._guard(fuse, fuse.weight_state) is not None:
            self._guard(fuse, fuse.undo, self._step, by)

    def weight_states(self) -> dict[str, Any]:
        """Each fuse's :meth:`Fuse.weight_state`, by name (the ones that say something)."""
        out: dict[str, Any] = {}
        for fuse in self._fuses:
            state = self._guard(fuse, fuse.weight_state)
            if state is not None:
                out[fuse.name] = state
        return out

    def load_weight_states(self, states: Mapping[str, Any] | None) -> None:
        """The weights went back to a snapshot taken with ``states``: tell every fuse.
        Inside :meth:`step_end` this makes the step's measurements :attr:`stale`."""
        if self._in_step:
            self._stale = True
        for fuse in self._fuses:
            self._guard(fuse, fuse.load_weight_state, (states or {}).get(fuse.name))

    def trigger(self, name: str, step: int, reason: str) -> None:
        """Another fuse's (or the set's) trigger for fuse ``name``, if present."""
        for fuse in self._fuses:
            if fuse.name == name and fuse.live:
                trig = getattr(fuse, "trigger", None)
                if callable(trig):
                    self._guard(fuse, trig, step, reason)

    # -- the loop's calls (rollback; never raise) -------------------------------------------

    def skip_batch(self) -> bool:
        """Whether the training loop should skip its next batch (a rollback's skip window):
        ``if mon.fuses.skip_batch(): continue``. False without a rollback fuse."""
        for fuse in self._fuses:
            skip = getattr(fuse, "skip_batch", None)
            if callable(skip) and fuse.live:
                if self._guard(fuse, skip):
                    return True
        return False

    def rollback_pending(self) -> dict[str, Any] | None:
        """Once per rollback, ``{"from_step", "to_step", "skip"}`` (for a loop that rewinds
        its data); None otherwise."""
        for fuse in self._fuses:
            pending = getattr(fuse, "rollback_pending", None)
            if callable(pending):
                got = self._guard(fuse, pending)
                if got is not None:
                    return got
        return None

    def drop_update(self, optimizer: Any) -> bool:
        """In a rollback's skip window, drop this step's update (every gradient of
        ``optimizer`` set to None; the Lightning callback calls it before the step)."""
        for fuse in self._fuses:
            drop = getattr(fuse, "drop_update", None)
            if callable(drop) and fuse.live and self._guard(fuse, drop, optimizer):
                return True
        return False

    def bind_scheduler(self, scheduler: Any) -> None:
        """The job's LR scheduler (the callbacks hand theirs), for the rollback's
        snapshots."""
        for fuse in self._fuses:
            bind = getattr(fuse, "bind_scheduler", None)
            if callable(bind) and fuse.live:
                self._guard(fuse, bind, scheduler)

    # -- the monitor's calls (never raise) -------------------------------------------------

    def observe(self, step: int, loss: float | None) -> None:
        """A step's loss the monitor read without a device sync (its spike watch)."""
        for fuse in self._fuses:
            seen = getattr(fuse, "observe", None)
            if callable(seen) and fuse.live:
                self._guard(fuse, seen, step, loss)

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The Lightning callback's optimizer (attached without one)."""
        self.optimizer = optimizer
        for fuse in self._fuses:
            if fuse.live:
                self._guard(fuse, fuse.bind_optimizer, optimizer)

    @property
    def stale(self) -> bool:
        """Whether a rollback (or its undo) restored the weights during this step's end:
        the step's measurements (max logits, raw maxima) are of weights that are gone, so
        the fuses that change weights from them (QK-clip, QK-norm's rescale) skip them."""
        return self._stale

    def step_end(self, step: int, sampled: bool) -> None:
        """End of a step, after the optimizer's update: control first, then each fuse."""
        self._step = step + 1
        self._in_step, self._stale = True, False
        try:
            try:
                self._read_control(step)
            except Exception:
                log.warning("logitwatch: the fuses' control could not be read",
                            exc_info=True)
            for fuse in self._fuses:
                if fuse.live:
                    self._guard(fuse, fuse.step_end, step, sampled)
        finally:
            self._in_step, self._stale = False, False

    def before_frame(self, scalars: dict[str, Any], heads: dict[str, list[torch.Tensor]]
                     ) -> None:
        for fuse in self._fuses:
            if fuse.live:
                self._guard(fuse, fuse.before_frame, scalars, heads)

    def after_frame(self, step: int, scalars: dict[str, float],
                    heads: dict[str, list[list[float]]]) -> None:
        """Host values of the frame: each fuse decides, then the set adds its scalars."""
        for fuse in self._fuses:
            if fuse.live:
                self._guard(fuse, fuse.after_frame, step, scalars, heads)
        for fuse in self._fuses:
            scalars[f"fuse.{fuse.name}.state"] = fuse.state()
            scalars[f"fuse.{fuse.name}.actions"] = float(fuse.actions)
            fuse.actions = 0

    def close(self) -> None:
        for fuse in self._fuses:
            try:
                fuse.close()
            except Exception:
                log.warning("logitwatch: fuse %s failed to close", fuse.name, exc_info=True)

    # -- inside ----------------------------------------------------------------------------

    def _guard(self, fuse: Fuse, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            fuse.fail(self._step)
            return None

    def _take_baseline(self, current: Any) -> None:
        """Record ``current`` (a client's control) as the baseline: what it asks of these
        fuses is taken as done, not acted on."""
        control = current.get("fuses") if isinstance(current, Mapping) else None
        self._control = {f.name: control[f.name] for f in self._fuses
                         if isinstance(control, Mapping) and isinstance(control.get(f.name), str)}
        self._baselined, self._control_at_attach = True, None

    def _read_control(self, step: int) -> None:
        """``control["fuses"] = {name: "apply" | "undo"}`` from the collector's answer:
        acted on when the value changes (a control repeated in every answer acts once).

        The first answer's control after attach is the baseline: recorded, not acted on.
        The collector carries a run's control in every answer for as long as the run
        exists, so a job restarted or resumed under the same run name would otherwise
        redo what a person asked of its previous process (a rollback, an undo)."""
        monitor = self.monitor
        if monitor is None:
            return
        current = monitor.client.control
        if not self._baselined:
            if current is self._control_at_attach and self._control_at_attach is not None:
                return  # no answer yet (the client replaces its control at each answer)
            self._take_baseline(current)
            if self._control:
                log.info("logitwatch: fuses: the collector's control %s was there before "
                         "this job's first answer (asked of an earlier process of this "
                         "run): recorded, not acted on; a new apply or undo acts",
                         self._control)
            return
        control = current.get("fuses") if isinstance(current, Mapping) else None
        if not isinstance(control, Mapping):
            self._control = {}
            return
        seen: dict[str, str] = {}
        for fuse in self._fuses:
            value = control.get(fuse.name)
            if not isinstance(value, str):
                continue
            seen[fuse.name] = value
            if self._control.get(fuse.name) == value:
                continue
            if value == "apply":
                self.apply(fuse.name, by="control")
            elif value == "undo":
                self.undo(fuse.name, by="control")
        self._control = seen

    def _annotate(self, alert: dict[str, Any]) -> None:
        """Client annotator (sender thread): the fuses that address a new alert, with how
        to apply them; auto fuses queue their trigger."""
        carried = []
        for fuse in self._fuses:
            if not fuse.live or not fuse.matches(alert):
                continue
            carried.append({
                "fuse": fuse.name, "mode": fuse.mode, "acting": fuse.engaged,
                "does": fuse.describe(),
                "apply": {"control": {"fuses": {fuse.name: "apply"}},
                          "job": f"mon.fuses.apply({fuse.name!r})"},
            })
            try:
                fuse.on_alert(alert)
            except Exception:
                log.warning("logitwatch: fuse %s failed on an alert", fuse.name,
                            exc_info=True)
        if carried:
            alert["fuses"] = carried
