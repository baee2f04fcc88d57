"""The fuse framework: :class:`Fuse` (one action the job may take on a warning) and
:class:`FuseSet` (the monitor's fuses: modes, control from the collector, events, frames).

A fuse is off unless ``attach(fuses=...)`` names it. Each one runs in one of three modes:

* ``"off"``: nothing, not even a suggestion;
* ``"suggest"``: it watches on the monitor's ordinary sampled steps and says what it would
  do: an event of the run (``fuse.<name>.suggested`` in the frame), one log line, and the
  alerts the job receives (``Client.on_alert``) carry it under ``"fuses"``. It acts only
  once a person applies it: ``mon.fuses.apply(name)`` in the job, or the collector's
  ingest answer ``control = {"fuses": {name: "apply"}}``;
* ``"auto"``: it acts on its own trigger.

Every action is an event of the run: kept in :attr:`FuseSet.events` (bounded), counted in
the next frame's scalars (``fuse.<name>.actions``, ``fuse.<name>.state`` and what the fuse
adds: per-head factors, the lr multiplier), so it reaches the collector's charts. Every
action can be undone (``mon.fuses.undo(name)``, ``control = {"fuses": {name: "undo"}}``).

A fuse never raises into training: an exception inside one is logged once with its
traceback and turns that fuse off for the rest of the run; a fuse that cannot apply here
(no q/k projections found, several ranks, no optimizer) says why once, in the log and as
``fuse.<name>.state = -1`` in the frames.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from .._monitor import Monitor

__all__ = ["MODES", "Event", "Fuse", "FuseSet", "FusesArg", "alert_step"]

log = logging.getLogger("logitwatch.hooks")

#: The modes of a fuse.
MODES = ("off", "suggest", "auto")
#: Events kept in :attr:`FuseSet.events` (the oldest are dropped first).
MAX_EVENTS = 1024
#: ``attach(fuses=...)``: fuse objects, or ``{name: mode | {option: value}}``.
FusesArg = Sequence["Fuse"] | Mapping[str, "str | Mapping[str, Any]"]


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


def parse(spec: FusesArg | None) -> list[Fuse]:
    """Fuse objects from ``attach(fuses=...)`` (see :data:`FusesArg`)."""
    from ._lr import LRBackoff
    from ._qkclip import QKClip
    from ._qknorm import QKNorm
    from ._rollback import Rollback
    from ._softcap import SoftCap

    known: dict[str, type[Fuse]] = {QKClip.name: QKClip, LRBackoff.name: LRBackoff,
                                    Rollback.name: Rollback, QKNorm.name: QKNorm,
                                    SoftCap.name: SoftCap}
    if spec is None:
        return []
    out: list[Fuse] = []
    if isinstance(spec, Mapping):
        for name, options in spec.items():
            if name not in known:
                raise ValueError(f"attach: unknown fuse {name!r}; known: {sorted(known)}")
            if isinstance(options, str):
                out.append(known[name](mode=options))
            elif isinstance(options, Mapping):
                out.append(known[name](**dict(options)))
            else:
                raise TypeError(f"attach: fuses[{name!r}] must be a mode or a dict of "
                                f"options, got {options!r}")
    elif isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
        for fuse in spec:
            if not isinstance(fuse, Fuse):
                raise TypeError(f"attach: fuses must be Fuse objects, got {fuse!r}")
            out.append(fuse)
    else:
        raise TypeError(f"attach: fuses must be a list of fuses or a mapping, got {spec!r}")
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise ValueError(f"attach: a fuse is named twice in {names}")
    return out


def multi_rank() -> bool:
    """Whether this process is one of several ranks (``torch.distributed``)."""
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1)
