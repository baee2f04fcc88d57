"""Fuses on the collector (docs/FUSES.md): what a run's job says of its fuses, what a
person asks of them, and the fuses an alert carries.

A run's ``control`` (``runs.control``, a JSON object, migration 0010):

* ``fuses``: ``{name: "apply" | "undo"}``, the last thing a person asked of each fuse
  (:func:`set_fuse`, ``POST /api/v1/runs/{run}/fuses``). The ingest answer's ``control``
  carries it to the run's job (:func:`answer_control`), which acts when a value changes;
* ``job``: ``{name: state}``, the newest ``fuse.<name>.state`` the job sent (-1
  unavailable, 0 off, 1 suggesting, 2 acting), kept by :func:`note_job_states` at ingest;
* ``log``: the last :data:`MAX_LOG` actions asked here, ``{"fuse", "action", "at", "by",
  "step", "alert_id"}``.

An alert stores, when it is first written, the fuses that address its rule
(``evidence.fuses``, :data:`logitwatch.wire.FUSE_RULES`, a mapper event in
``store/alerts.py``); :func:`alert_fuses` adds what the job and the people did with them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Run
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.store.ingest import NewFrame
from logitwatch.wire import CONTROL_FUSES, FUSE_RULES

__all__ = ["ACTIONS", "MAX_LOG", "alert_fuses", "answer_control", "note_job_states",
           "run_fuses", "set_fuse"]

ACTIONS = ("apply", "undo")
#: Actions kept in a run's control log.
MAX_LOG = 64
STATES = {-1: "unavailable", 0: "off", 1: "suggesting", 2: "acting"}


def _control(run: Run) -> dict[str, Any]:
    return dict(run.control) if isinstance(run.control, dict) else {}


def note_job_states(session: Session, frames: Sequence[NewFrame]) -> None:
    """Keep the newest ``fuse.<name>.state`` of each run in this batch (rank 0's)."""
    newest: dict[int, tuple[int, dict[str, int]]] = {}
    for f in frames:
        if f.rank != 0:
            continue
        states = {k[5:-6]: v for k, v in f.scalars.items()
                  if k.startswith("fuse.") and k.endswith(".state")}
        states = {k: int(v) for k, v in states.items()
                  if k in FUSE_RULES and isinstance(v, (int, float)) and math.isfinite(v)}
        if states and (f.run_id not in newest or f.step >= newest[f.run_id][0]):
            newest[f.run_id] = (f.step, states)
    for run_id, (_, states) in newest.items():
        run = session.get(Run, run_id)
        if run is None:
            continue
        control = _control(run)
        if control.get("job") != states:
            run.control = {**control, "job": states}


def answer_control(session: Session, run_ids: Iterable[int]) -> dict[str, str] | None:
    """``control["fuses"]`` for the ingest answer: a batch of one run's frames gets what
    people asked of its fuses (a client sends one run)."""
    ids = list(run_ids)
    if len(ids) != 1:
        return None
    run = session.get(Run, ids[0])
    fuses = _control(run).get(CONTROL_FUSES) if run is not None else None
    return dict(fuses) if isinstance(fuses, dict) and fuses else None


def run_fuses(run: Run) -> dict[str, Any]:
    """What the collector knows of a run's fuses: ``{"fuses", "job", "log"}``."""
    control = _control(run)
    return {"fuses": dict(control.get(CONTROL_FUSES) or {}),
            "job": {k: STATES.get(v, str(v)) for k, v in (control.get("job") or {}).items()},
            "log": list(control.get("log") or [])}


def set_fuse(session: Session, run_id: int, fuse: str, action: str, *, by: str | None,
             alert_id: int | None = None) -> dict[str, Any]:
    """Ask the run's job to apply or undo ``fuse`` (through the next ingest answer);
    returns :func:`run_fuses`.

    Raises:
        BadRequest: an unknown fuse or action, or an alert of another run.
        NotFound: no such run.
    """
    if fuse not in FUSE_RULES:
        raise BadRequest("unknown-fuse", f"fuse: one of {sorted(FUSE_RULES)}, not {fuse!r}",
                         field="fuse")
    if action not in ACTIONS:
        raise BadRequest("bad-action", f"action: one of {list(ACTIONS)}, not {action!r}",
                         field="action")
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    if alert_id is not None:
        alert = session.get(Alert, alert_id)
        if alert is None or alert.run_id != run_id:
            raise BadRequest("alert-not-of-run", f"alert_id: run {run_id} has no alert "
                             f"{alert_id}", field="alert_id")
    control = _control(run)
    entry = {"fuse": fuse, "action": action, "at": time.time(), "by": by,
             "step": run.last_step, "alert_id": alert_id}
    log = [*list(control.get("log") or []), entry][-MAX_LOG:]
    run.control = {**control, CONTROL_FUSES: {**dict(control.get(CONTROL_FUSES) or {}),
                                              fuse: action}, "log": log}
    session.flush()
    return run_fuses(run)


def alert_fuses(a: Alert, run: Run) -> list[dict[str, Any]] | None:
    """The fuses an alert carries (stored when it fired), each with the job's state of it
    (``job``: null when the job never said it has it), what people last asked
    (``control``), the actions asked here (``actions``) and how to apply it."""
    names = (a.evidence or {}).get("fuses")
    if not isinstance(names, list) or not names:
        return None
    control = _control(run)
    job = control.get("job") or {}
    asked = control.get(CONTROL_FUSES) or {}
    log = control.get("log") or []
    out = []
    for name in names:
        if not isinstance(name, str):
            continue
        state = job.get(name)
        out.append({
            "fuse": name, "job": STATES.get(state, None) if state is not None else None,
            "control": asked.get(name),
            "actions": [e for e in log if isinstance(e, dict) and e.get("fuse") == name],
            "apply": {"control": {CONTROL_FUSES: {name: "apply"}},
                      "job": f"mon.fuses.apply({name!r})"},
        })
    return out or None
