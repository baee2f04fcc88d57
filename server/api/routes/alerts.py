"""Alert management: rules, silences, acknowledgement.

* ``GET /alerts/rules``; ``PUT``/``DELETE /alerts/rules/{name}``: rules apply to every
  project, so changing them needs open mode (no tokens) or the YAML file
  (``$LOGITWATCH_ALERT_RULES``).
* ``GET``/``POST /alerts/silences``; ``DELETE /alerts/silences/{id}`` ends one now. A
  token's silences are confined to its project.
* ``POST /alerts/{id}/ack`` acknowledges an alert (who and when are stored).

Silencing and acknowledging change what a project's people are told: they need the
project's ingest token (the one that writes) or open mode; a read token only reads (403).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field
from sqlalchemy import select

from logitwatch.server.alerts.config import api_rules
from logitwatch.server.alerts.defaults import merge_rules
from logitwatch.server.alerts.rules import RuleError, RuleSpec
from logitwatch.server.api.deps import (
    INT32_MAX,
    AnyPrincipalDep,
    ReadDep,
    SessionDep,
    WriteDep,
)
from logitwatch.server.auth import Principal
from logitwatch.server.db.models import Alert, AlertRule, Run, Silence
from logitwatch.server.errors import BadRequest, Forbidden, NotFound
from logitwatch.server.schemas import AlertOut
from logitwatch.server.store.alerts import alert_out

__all__ = ["router"]

router = APIRouter(tags=["alerts"])

RuleName = Annotated[str, Path(max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class RuleIn(BaseModel):
    """A rule (see docs/ALERTS.md); ``name`` comes from the path."""

    kind: str = Field(max_length=32)
    metric: str = Field(max_length=128)
    params: dict[str, Any] = Field(default_factory=dict)
    over: str = "cell"
    for_samples: int = Field(1, ge=1, le=10_000)
    resolve_after: int = Field(3, ge=1, le=10_000)
    severity: str = "warning"
    inhibits: bool = False
    summary: str = Field("", max_length=500)
    enabled: bool = True
    keep_firing_for: int | None = Field(None, ge=0, le=100_000_000)
    downgrade: dict[str, Any] | None = None


class SilenceIn(BaseModel):
    project: str | None = Field(None, max_length=128)
    run: str | None = Field(None, max_length=128)
    rule: str | None = Field(None, max_length=64)
    rank: int | None = Field(None, ge=0, le=INT32_MAX)
    layer: int | None = Field(None, ge=0, le=INT32_MAX)
    duration_s: float = Field(3600.0, gt=0, le=366 * 86400)
    comment: str = Field("", max_length=500)


class SilenceOut(BaseModel):
    id: int
    project: str | None
    run: str | None
    rule: str | None
    rank: int | None
    layer: int | None
    starts_at: float
    ends_at: float
    comment: str
    created_by: str
    active: bool


def _admin(principal: Principal) -> None:
    if not principal.open:
        raise Forbidden("rules-admin-only",
                        "alert rules apply to every project: change them in open mode or "
                        "in the YAML file named by LOGITWATCH_ALERT_RULES")


def _apply(request: Request, session: Any) -> list[RuleSpec]:
    base = getattr(request.app.state, "base_rules", None) or request.app.state.alert_engine.rules
    rules = merge_rules(base, api_rules(session))
    request.app.state.alert_engine.set_rules(rules)
    return rules


@router.get("/alerts/rules")
def list_rules(request: Request, principal: ReadDep) -> list[dict[str, Any]]:
    """The rules in force: defaults, then the YAML file's, then the API's."""
    return [r.to_dict() for r in request.app.state.alert_engine.rules]


@router.put("/alerts/rules/{name}")
def put_rule(name: RuleName, body: RuleIn, request: Request, session: SessionDep,
             principal: AnyPrincipalDep) -> dict[str, Any]:
    """Create or replace rule ``name`` (a default of that name is overridden)."""
    _admin(principal)
    try:
        spec = RuleSpec.from_dict({"name": name, **body.model_dump()})
    except RuleError as e:
        raise BadRequest("invalid-rule", str(e)) from e
    row = session.scalar(select(AlertRule).where(AlertRule.name == name))
    if row is None:
        session.add(AlertRule(name=name, spec=spec.to_dict(), updated_at=time.time()))
    else:
        row.spec, row.updated_at = spec.to_dict(), time.time()
    session.flush()
    _apply(request, session)
    return spec.to_dict()


@router.delete("/alerts/rules/{name}")
def delete_rule(name: RuleName, request: Request, session: SessionDep,
                principal: AnyPrincipalDep) -> dict[str, Any]:
    """Remove an API rule (a default of that name comes back)."""
    _admin(principal)
    row = session.scalar(select(AlertRule).where(AlertRule.name == name))
    if row is None:
        raise NotFound("rule-not-found", f"no API rule named {name!r} (defaults and file "
                       "rules are changed by overriding them, or with enabled: false)")
    session.delete(row)
    session.flush()
    _apply(request, session)
    return {"deleted": name}


def _silence_out(s: Silence, now: float) -> SilenceOut:
    return SilenceOut(id=s.id, project=s.project, run=s.run, rule=s.rule, rank=s.rank,
                      layer=s.layer, starts_at=s.starts_at, ends_at=s.ends_at,
                      comment=s.comment, created_by=s.created_by,
                      active=s.starts_at <= now < s.ends_at)


@router.get("/alerts/silences", response_model=list[SilenceOut])
def list_silences(session: SessionDep, principal: ReadDep) -> list[SilenceOut]:
    """Silences of the caller's project (all of them in open mode), newest first."""
    q = select(Silence).order_by(Silence.id.desc())
    if principal.project is not None:
        q = q.where(Silence.project == principal.project)
    now = time.time()
    return [_silence_out(s, now) for s in session.scalars(q).all()]


@router.post("/alerts/silences", response_model=SilenceOut, status_code=201)
def create_silence(body: SilenceIn, session: SessionDep, principal: WriteDep) -> SilenceOut:
    """Silence matching alerts for ``duration_s``: they are stored but not notified. Null
    fields match anything; a token's silence is confined to its project."""
    project = body.project
    if principal.project is not None:
        if project not in (None, principal.project):
            raise Forbidden("project-forbidden", f"project: this token may silence project "
                            f"{principal.project!r} only")
        project = principal.project
    now = time.time()
    s = Silence(project=project, run=body.run, rule=body.rule, rank=body.rank,
                layer=body.layer, starts_at=now, ends_at=now + body.duration_s,
                comment=body.comment, created_by=principal.name or principal.scope)
    session.add(s)
    session.flush()
    return _silence_out(s, now)


@router.delete("/alerts/silences/{silence_id}", response_model=SilenceOut)
def expire_silence(silence_id: Annotated[int, Path(ge=1, le=INT32_MAX)], session: SessionDep,
                   principal: WriteDep) -> SilenceOut:
    """End a silence now."""
    s = session.get(Silence, silence_id)
    if s is None or (principal.project is not None and s.project != principal.project):
        raise NotFound("silence-not-found", f"no silence with id {silence_id}")
    now = time.time()
    s.ends_at = min(s.ends_at, now)
    return _silence_out(s, now)


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut)
def acknowledge(alert_id: Annotated[int, Path(ge=1, le=INT32_MAX)], session: SessionDep,
                principal: WriteDep) -> AlertOut:
    """Acknowledge an alert: someone is on it (it keeps firing until it resolves)."""
    row = session.execute(select(Alert, Run).join(Run, Run.id == Alert.run_id)
                          .where(Alert.id == alert_id)).first()
    if row is None or not principal.sees(row[1].project):
        raise NotFound("alert-not-found", f"no alert with id {alert_id}")
    a, run = row
    if a.acked_at is None:
        a.acked_at = time.time()
        a.acked_by = principal.name or principal.scope
    return alert_out(a, run)
