"""What the run page and the alerts inbox say first: a run's verdict and its incidents.

Pure functions over API models (no I/O): the routes read the run and its alerts, these
decide.

* :func:`incidents`: a run's alerts grouped into incidents, earliest first. An incident
  opens with an alert and takes in every alert that fires before all of its members have
  resolved. In it, the **cause** is its first alert that is not a consequence; the
  **divergence** is the run-level divergence alert (its ``fired_step`` is the run's
  ``diverged_step``); **consequences** are alerts inhibited by the divergence or fired at or
  after it in the same incident; a **duplicate** says what an earlier member says about
  the same metric and heads within :data:`DUPLICATE_STEPS`; the rest are **related**.
* :func:`verdict`: one word for the run (``diverged``, ``stopped``, ``warning``,
  ``finished_alerting``, ``finished``, ``healthy``, ``empty``) and one line saying why. A
  run diverged when a divergence alert paged on it or its last loss is not finite (whatever
  rules are enabled); a finished run with a warning or critical alert still open finished
  alerting (not green); one whose only open alerts are info finished.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, Field

from logitwatch.server.schemas import AlertOut, RunOut

__all__ = ["DUPLICATE_STEPS", "KINDS", "NONFINITE_LOSS", "IncidentOut", "MemberOut",
           "VerdictOut", "incidents", "locus", "verdict", "where_text"]

#: Two alerts on the same metric and heads fired this many steps apart or closer say the
#: same thing: the later one is a duplicate.
DUPLICATE_STEPS = 50
SEVERITY_RANK = {"critical": 3, "warning": 2, "info": 1}
PAGED = ("warning", "critical")
#: Every verdict kind, the ones that need a person first.
KINDS = ("diverged", "stopped", "warning", "finished_alerting", "finished", "healthy", "empty")
#: The verdict's text for a run whose last loss is not finite but that no divergence alert
#: marked (e.g. loss_nonfinite disabled).
NONFINITE_LOSS = "diverged: the last loss is not finite"


class MemberOut(BaseModel):
    id: int = Field(description="the alert's id")
    role: str = Field(description="cause, related, duplicate, divergence or consequence")
    duplicate_of: int | None = None


class IncidentOut(BaseModel):
    """Alerts that belong together, told from their first cause."""

    id: int = Field(description="the cause's alert id")
    cause: int = Field(description="the alert that opened the incident (not a consequence)")
    severity: str = Field(description="the highest severity among its members")
    state: str = Field(description="firing while any member fires, else resolved")
    rank: int
    layer: int | None = Field(description="the cause's layer (for an alert over every "
                              "head: the layer holding the max)")
    head: int | None
    heads: list[int] | None = Field(description="every head the cause names, sorted")
    started_step: int
    fired_step: int = Field(description="when the cause fired")
    paged_step: int | None = Field(description="when the cause became warning or critical")
    last_step: int = Field(description="the latest fired_step of a member")
    resolved_step: int | None = Field(description="once every member resolved: the last")
    diverged_step: int | None = Field(description="the divergence alert's step, if any")
    firing: int = Field(description="members firing now")
    members: list[MemberOut] = Field(description="every member, cause first, then by step")


class VerdictOut(BaseModel):
    kind: str = Field(description="diverged, stopped, warning, finished_alerting (finished "
                      "with a warning or critical alert still open), finished, healthy or "
                      "empty")
    text: str = Field(description="the verdict in a few words, e.g. 'diverged at step 959'")
    detail: str = Field(description="one line: the first alert, or what is known")
    first_alert: int | None = Field(None, description="id of the first incident's cause")


def locus(a: AlertOut) -> tuple[int | None, int | None, list[int] | None]:
    """(layer, head, heads) an alert fired on (``fired_layer``/``fired_heads``, read from
    its stored columns and evidence: store/alerts.py); an alert over every head (``over:
    max``) names the layer and head holding the max."""
    if a.fired_layer is not None and a.fired_heads:
        return a.fired_layer, a.fired_heads[0], list(a.fired_heads)
    if a.layer is not None:
        heads = sorted(set(a.heads)) if a.heads else ([a.head] if a.head is not None else None)
        return a.layer, (heads[0] if heads else a.head), heads
    ev = a.evidence or {}
    layer, head = ev.get("at_layer"), ev.get("at_head")
    if isinstance(layer, int) and isinstance(head, int):
        return layer, head, [head]
    return None, None, None


def _is_divergence(a: AlertOut, diverged_step: int | None) -> bool:
    return (diverged_step is not None and a.metric == "loss" and a.fired_step == diverged_step
            and a.severity in PAGED)


def _is_consequence(a: AlertOut, div: AlertOut | None) -> bool:
    """Inhibited by the divergence, or fired at or after it in the same incident."""
    if a.suppressed == "inhibited":
        return True
    return div is not None and a is not div and a.fired_step >= div.fired_step


def _same_subject(a: AlertOut, b: AlertOut) -> bool:
    if a.metric != b.metric or a.rank != b.rank:
        return False
    la, _, ha = locus(a)
    lb, _, hb = locus(b)
    if la != lb:
        return False
    if ha is None or hb is None:
        return ha is None and hb is None
    return bool(set(ha) & set(hb))


def _cluster(alerts: Sequence[AlertOut]) -> list[list[AlertOut]]:
    out: list[list[AlertOut]] = []
    end: float = -1  # the open cluster lasts until every member resolved
    for a in sorted(alerts, key=lambda x: (x.fired_step, x.id)):
        if not out or a.fired_step > end:
            out.append([a])
            end = -1
        else:
            out[-1].append(a)
        r = a.resolved_step if a.state == "resolved" and a.resolved_step is not None else None
        end = max(end, float("inf") if r is None else r)
    return out


def _incident(members: list[AlertOut], diverged_step: int | None) -> IncidentOut:
    div = next((a for a in members if _is_divergence(a, diverged_step)), None)
    causes = [a for a in members if a is not div and not _is_consequence(a, div)]
    cause = causes[0] if causes else (div or members[0])
    roles: list[MemberOut] = [MemberOut(id=cause.id, role="cause")]
    earlier: list[AlertOut] = [cause]
    for a in members:
        if a is cause:
            continue
        if a is div:
            roles.append(MemberOut(id=a.id, role="divergence"))
        elif _is_consequence(a, div):
            roles.append(MemberOut(id=a.id, role="consequence"))
        else:
            dup = next((b for b in earlier if _same_subject(a, b)
                        and abs(a.fired_step - b.fired_step) <= DUPLICATE_STEPS), None)
            roles.append(MemberOut(id=a.id, role="duplicate" if dup else "related",
                                   duplicate_of=dup.id if dup else None))
            earlier.append(a)
    layer, head, heads = locus(cause)
    firing = sum(a.state == "firing" for a in members)
    resolved = None if firing else max((a.resolved_step or a.fired_step) for a in members)
    return IncidentOut(
        id=cause.id, cause=cause.id,
        severity=max((a.severity for a in members), key=lambda s: SEVERITY_RANK.get(s, 0)),
        state="firing" if firing else "resolved", rank=cause.rank, layer=layer, head=head,
        heads=heads, started_step=cause.started_step, fired_step=cause.fired_step,
        paged_step=cause.paged_step, last_step=max(a.fired_step for a in members),
        resolved_step=resolved, diverged_step=div.fired_step if div else None,
        firing=firing, members=roles,
    )


def incidents(alerts: Sequence[AlertOut], diverged_step: int | None = None) -> list[IncidentOut]:
    """The alerts of one run grouped into incidents, earliest first (see the module)."""
    return [_incident(c, diverged_step) for c in _cluster(alerts)]


def where_text(layer: int | None, head: int | None, heads: list[int] | None) -> str:
    """"layer 1, head 3", "layer 1, heads 0, 1, 2, 3", "layer 1", or "" (run-level)."""
    if layer is None:
        return ""
    hs = heads or ([head] if head is not None else [])
    h = (f"head {hs[0]}" if len(hs) == 1 else "heads " + ", ".join(map(str, hs))) if hs else ""
    return f"layer {layer}, {h}" if h else f"layer {layer}"


def _where(layer: int | None, head: int | None, heads: list[int] | None, rank: int) -> str:
    w = where_text(layer, head, heads)
    return f"{w}, rank {rank}" if w else f"rank {rank}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _finished_text(step: int | None, open_paged: Sequence[AlertOut]) -> str:
    """"finished at step 399 with a critical alert open: grad_nonfinite", or with several:
    "... with 3 alerts open, the worst critical: grad_nonfinite" (the earliest of the
    worst)."""
    worst = min(open_paged, key=lambda a: (-SEVERITY_RANK.get(a.severity, 0), a.fired_step,
                                           a.id))
    if len(open_paged) == 1:
        return f"finished at step {step} with a {worst.severity} alert open: {worst.rule}"
    return (f"finished at step {step} with {len(open_paged)} alerts open, the worst "
            f"{worst.severity}: {worst.rule}")


def verdict(run: RunOut, alerts: Sequence[AlertOut],
            found: Sequence[IncidentOut] | None = None, *,
            last_loss: float | None = None) -> VerdictOut:
    """One word for the run and one line saying why (see the module). ``last_loss``: the
    run's last loss (rank 0), if known: a non-finite one is a divergence even when no
    divergence alert marked it (the runs list reads the same)."""
    found = incidents(alerts, run.diverged_step) if found is None else found
    by_id = {a.id: a for a in alerts}
    first = found[0] if found else None
    detail = ""
    if first is not None:
        c = by_id[first.cause]
        where = _where(first.layer, first.head, first.heads, first.rank)
        detail = f"first alert at step {c.fired_step}: {where}, {c.severity}: {c.rule}"
    open_paged = [a for a in alerts if a.state == "firing" and a.suppressed is None
                  and a.severity in PAGED]
    if run.last_step is None:
        return VerdictOut(kind="empty", text="no data yet", detail="the run has sent no step")
    if run.status == "diverged":
        text = f"diverged at step {run.diverged_step}"
        if first is not None and first.fired_step < (run.diverged_step or 0):
            before = (run.diverged_step or 0) - first.fired_step
            detail += f" ({_plural(before, 'step')} before)"
        kind = "diverged"
    elif last_loss is not None and not math.isfinite(last_loss):
        kind, text = "diverged", NONFINITE_LOSS
    elif run.status == "stopped":
        kind, text = "stopped", f"stopped reporting after step {run.last_step}"
    elif run.status == "finished":
        step = run.end_step if run.end_step is not None else run.last_step
        if open_paged:
            kind, text = "finished_alerting", _finished_text(step, open_paged)
        else:
            kind, text = "finished", f"finished at step {step}"
    elif open_paged:
        worst = max(open_paged, key=lambda a: SEVERITY_RANK.get(a.severity, 0)).severity
        kind, text = "warning", f"{worst}: {_plural(len(open_paged), 'alert')} firing"
    else:
        kind, text = "healthy", "healthy"
        if alerts:
            text += f" ({_plural(len(alerts), 'alert')}, none paging now)"
    if not detail:
        detail = "no alert" if kind in ("healthy", "finished") else f"last step {run.last_step}"
    return VerdictOut(kind=kind, text=text, detail=detail,
                      first_alert=first.cause if first else None)
