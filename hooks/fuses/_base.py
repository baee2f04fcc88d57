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

Where it lives: :mod:`._fuse` (:class:`Fuse`, :class:`Event`, :data:`MODES` and what the
fuses share: :func:`alert_step`, :func:`multi_rank`), :mod:`._fuseset` (:class:`FuseSet`,
:data:`MAX_EVENTS`) and :mod:`._spec` (the ``fuses=`` argument: :data:`FusesArg`,
:func:`parse`). This module re-exports them: the fuses and the monitor import from here.
"""

from __future__ import annotations

from ._fuse import MODES, Event, Fuse, alert_step, log, multi_rank  # noqa: F401  (re-exported)
from ._fuseset import MAX_EVENTS, FuseSet  # noqa: F401  (re-exported)
from ._spec import FusesArg, parse  # noqa: F401  (re-exported)

__all__ = ["MODES", "Event", "Fuse", "FuseSet", "FusesArg", "alert_step"]
