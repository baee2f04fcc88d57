"""Dashboard-only reads: the runs list with sparklines and filters, worst heads now, heads
over time, and comparisons of several runs (data and Plotly figures), plus the compare page.

Paths are absolute (``/api/v1/...`` and ``/compare``) so that the app registers this router
with one line.
"""

from __future__ import annotations

from typing import Annotated

import plotly.io as pio
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server import figures
from logitwatch.server.api.deps import INT32_MAX, ReadDep, RunIdDep, SessionDep, SettingsDep
from logitwatch.server.api.routes.pages import WEB
from logitwatch.server.api.routes.runs import MAX_PAGE, PAGE, paginate
from logitwatch.server.auth import Principal
from logitwatch.server.db.models import Run
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import (
    MAX_RANK,
    MAX_STEP,
    AlertOut,
    MetricOut,
    RunOut,
    SeriesOut,
)
from logitwatch.server.store import inbox, queries, views
from logitwatch.server.store import incidents as inc
from logitwatch.server.store.alerts import list_alerts
from logitwatch.server.store.inbox import InboxRunOut
from logitwatch.server.store.runs import read_run

__all__ = ["MAX_COMPARE", "router"]

router = APIRouter(tags=["dashboard"])
API = "/api/v1"
#: Runs one comparison may overlay.
MAX_COMPARE = 10

MetricName = Annotated[str, Query(max_length=128, description="metric name")]
Rank = Annotated[int, Query(ge=0, le=MAX_RANK)]
Step = Annotated[int | None, Query(ge=0, le=MAX_STEP)]


def _cache(request: Request) -> views.SparklineCache:
    """The app's sparkline cache (one per application, i.e. per database)."""
    cache: views.SparklineCache | None = getattr(request.app.state, "sparklines", None)
    if cache is None:
        cache = request.app.state.sparklines = views.SparklineCache()
    return cache


@router.get(f"{API}/dashboard/runs", response_model=list[views.RunSummaryOut])
def runs_overview(
    request: Request,
    response: Response,
    session: SessionDep,
    principal: ReadDep,
    project: Annotated[str | None, Query(max_length=128)] = None,
    status: Annotated[str | None, Query(max_length=16,
                                        description="running, finished, stopped, diverged "
                                        "or empty")] = None,
    alerting: Annotated[bool, Query(description="only runs with a firing alert")] = False,
    q: Annotated[str | None, Query(max_length=128, description="a substring (any case) of "
                                   "the run's name, project, a tag or its configuration")]
    = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="runs in this page")] = PAGE,
    offset: Annotated[int, Query(ge=0, le=2**31, description="runs to skip")] = 0,
) -> list[views.RunSummaryOut]:
    """The runs list: status, last step, open alerts and a loss sparkline per run; a page
    of ``limit`` runs from ``offset``, ``X-Total-Count`` saying how many match."""
    if principal.project is not None:
        if project is not None and project != principal.project:
            response.headers["X-Total-Count"] = "0"
            return []
        project = principal.project
    total: list[int] = []
    out = views.runs_overview(session, _cache(request), project=project, status=status or None,
                              alerting=alerting, q=q, limit=limit, offset=offset, total=total)
    paginate(request, response, total[0], limit, offset)
    return out


class RunPageOut(BaseModel):
    """Everything the run page needs before its charts, in one answer."""

    run: RunOut
    verdict: inc.VerdictOut
    incidents: list[inc.IncidentOut] = Field(description="earliest first")
    alerts: list[AlertOut]
    metrics: list[MetricOut]
    ranks: list[int] = Field(description="the ranks that sent frames")


@router.get(f"{API}/dashboard/runs/{{run_id}}", response_model=RunPageOut)
def run_page_data(run_id: RunIdDep, session: SessionDep, settings: SettingsDep) -> RunPageOut:
    """The run, its verdict, its alerts grouped into incidents (earliest first), its
    metrics and ranks: what the run page shows first, in one request."""
    read = read_run(session, run_id, active_seconds=settings.run_active_seconds)
    run = read.out
    alerts = list_alerts(session, run_id)
    found = inc.incidents(alerts, run.diverged_step)
    return RunPageOut(run=run, verdict=inc.verdict(run, alerts, found, last_loss=read.last_loss),
                      incidents=found,
                      alerts=alerts, metrics=queries.list_metrics(session, run_id),
                      ranks=views.ranks(session, run_id) or [0])


@router.get(f"{API}/dashboard/alerts", response_model=list[InboxRunOut])
def alerts_inbox(
    session: SessionDep,
    principal: ReadDep,
    settings: SettingsDep,
    project: Annotated[str | None, Query(max_length=128)] = None,
    state: Annotated[str | None, Query(pattern="^(firing|resolved)$",
                                       description="only incidents in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="runs")] = 100,
) -> list[InboxRunOut]:
    """Every run with alerts (the caller's project for a read token), its verdict and its
    incidents; runs with a firing incident first, then by their latest alert."""
    if principal.project is not None:
        if project not in (None, principal.project):
            return []
        project = principal.project
    return inbox.alerts_inbox(session, project=project, state=state, limit=limit,
                              active_seconds=settings.run_active_seconds)


@router.get("/alerts", include_in_schema=False)
def alerts_page() -> FileResponse:
    return FileResponse(WEB / "alerts.html")


@router.get(f"{API}/runs/{{run_id}}/worst_heads", response_model=views.WorstHeadsOut)
def worst_heads(
    run_id: RunIdDep,
    session: SessionDep,
    name: MetricName = "attn.logit_max",
    rank: Rank = 0,
    k: Annotated[int, Query(ge=1, le=100)] = 10,
    window: Annotated[int, Query(ge=1, le=1000, description="samples of trend")] = 50,
) -> views.WorstHeadsOut:
    """The ``k`` heads with the highest ``name`` now (lowest for entropy), with trends."""
    return views.worst_heads(session, run_id=run_id, name=name, rank=rank, k=k, window=window,
                             alerts=list_alerts(session, run_id))


@router.get(f"{API}/runs/{{run_id}}/heads_time", response_model=views.HeadsTimeOut)
def heads_time(
    run_id: RunIdDep,
    session: SessionDep,
    name: MetricName = "attn.logit_max",
    rank: Rank = 0,
    layer: Annotated[int | None, Query(ge=0, le=65_536)] = None,
    start: Step = None,
    end: Step = None,
    max_cols: Annotated[int, Query(ge=4, le=2000)] = 300,
) -> views.HeadsTimeOut:
    """``name`` over steps for every head of ``layer`` (without it: per-layer envelope)."""
    return views.heads_over_time(session, run_id=run_id, name=name, rank=rank, layer=layer,
                                 start=start, end=end, max_cols=max_cols)


def _visible_runs(session: Session, principal: Principal, runs: str) -> list[Run]:
    try:
        ids = [int(x) for x in runs.split(",") if x.strip()]
    except ValueError:
        raise BadRequest("bad-runs", f"runs: expected run ids separated by commas, got {runs!r}",
                         field="runs") from None
    if not ids:
        raise BadRequest("bad-runs", "runs: give at least one run id, e.g. runs=1,2",
                         field="runs")
    if any(not 1 <= i <= INT32_MAX for i in ids):
        raise BadRequest("bad-runs", f"runs: run ids are between 1 and {INT32_MAX}",
                         field="runs")
    if len(ids) > MAX_COMPARE:
        raise BadRequest("too-many-runs", f"runs: at most {MAX_COMPARE} runs in one comparison",
                         field="runs")
    found = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(ids)))}
    out = []
    for i in dict.fromkeys(ids):
        r = found.get(i)
        if r is None or not principal.sees(r.project):
            raise NotFound("run-not-found", f"no run with id {i}")
        out.append(r)
    return out


Runs = Annotated[str, Query(max_length=200, description="run ids, comma-separated")]


@router.get(f"{API}/compare/metrics")
def compare_metrics(session: SessionDep, principal: ReadDep, runs: Runs) -> dict[str, object]:
    """The runs and the union of their metric names (with kind and shape)."""
    chosen = _visible_runs(session, principal, runs)
    names: dict[str, MetricOut] = {}
    for r in chosen:
        for m in queries.list_metrics(session, r.id):
            names.setdefault(m.name, m)
    return {
        "runs": [{"id": r.id, "name": r.name, "project": r.project, "last_step": r.last_step}
                 for r in chosen],
        "metrics": [m.model_dump() for m in sorted(names.values(), key=lambda m: m.name)],
    }


@router.get(
    f"{API}/compare/figure",
    responses={200: {"content": {"application/json": {}},
                     "description": "A Plotly figure: {data, layout}"}},
)
def compare_figure(
    session: SessionDep,
    principal: ReadDep,
    runs: Runs,
    name: MetricName = "loss",
    rank: Rank = 0,
    layer: Annotated[int | None, Query(ge=0, le=65_536)] = None,
    head: Annotated[int | None, Query(ge=0, le=65_536)] = None,
    start: Step = None,
    end: Step = None,
    max_points: Annotated[int, Query(ge=4, le=100_000)] = 2000,
) -> Response:
    """``name`` of each run overlaid (per-head metrics: one head, or the max over heads)."""
    chosen = _visible_runs(session, principal, runs)
    lines: list[tuple[int, str, SeriesOut | None]] = []
    for r in chosen:
        try:
            s: SeriesOut | None = queries.get_series(
                session, run_id=r.id, name=name, rank=rank, layer=layer, head=head,
                start=start, end=end, max_points=max_points)
        except NotFound as e:
            if e.code != "metric-not-found":
                raise
            s = None
        lines.append((r.id, r.name, s))
    title = name if layer is None or head is None else f"{name}, layer {layer}, head {head}"
    fig = figures.compare_figure(title, lines)
    return Response(pio.to_json(fig, validate=False), media_type="application/json",
                    headers={"Cache-Control": "no-store"})


@router.get("/compare", include_in_schema=False)
def compare_page() -> FileResponse:
    return FileResponse(WEB / "compare.html")
