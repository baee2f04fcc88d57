"""Read endpoints: runs, metrics, series, heatmaps, alerts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from sqlalchemy import select

from logitwatch.server.api.deps import (
    ProjectQuery,
    ReadDep,
    RunIdDep,
    RunRef,
    SessionDep,
    SettingsDep,
    client_address,
    credentials,
    resolve_run,
)
from logitwatch.server.db.models import Run
from logitwatch.server.db.session import session_scope
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import (
    MAX_RANK,
    MAX_STEP,
    AlertOut,
    DeletedOut,
    HeatmapOut,
    MetricOut,
    RunOut,
    SeriesOut,
)
from logitwatch.server.store import queries
from logitwatch.server.store.alerts import list_alerts

router = APIRouter(tags=["runs"])

MetricName = Annotated[str, Query(max_length=128, description="metric name, e.g. loss")]


TIME = 1e12  # unix seconds bound for time filters (year 33658)


#: Runs in one page of GET /runs (and the dashboard's list) by default, and at most.
PAGE = 500
MAX_PAGE = 10_000


def paginate(request: Request, response: Response, total: int, limit: int,
             offset: int) -> None:
    """``X-Total-Count`` and, while more follow, a ``Link`` to the next page."""
    response.headers["X-Total-Count"] = str(total)
    if offset + limit < total:
        url = request.url.include_query_params(offset=offset + limit, limit=limit)
        response.headers["Link"] = f'<{url.path}?{url.query}>; rel="next"'


@router.get("/runs", response_model=list[RunOut])
def runs(
    request: Request,
    response: Response,
    session: SessionDep,
    principal: ReadDep,
    settings: SettingsDep,
    project: Annotated[str | None, Query(max_length=128, description="only this project")]
    = None,
    tag: Annotated[str | None, Query(max_length=64, description="only runs with this tag")]
    = None,
    status: Annotated[
        queries.RunStatus | None,
        Query(description="`running`, `finished` (its job said it ended), `stopped` (no "
              "data: hung or crashed), `diverged`; `alerting`: an alert is firing; "
              "`active`: a frame within run_active_seconds; `idle`: none"),
    ] = None,
    since: Annotated[float | None, Query(ge=0, le=TIME, allow_inf_nan=False,
                                         description="active at or after this time (unix "
                                         "seconds)")] = None,
    until: Annotated[float | None, Query(ge=0, le=TIME, allow_inf_nan=False,
                                         description="first seen at or before this time "
                                         "(unix seconds)")] = None,
    name: Annotated[str | None, Query(max_length=128, description="run name contains")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="runs in this page")]
    = PAGE,
    offset: Annotated[int, Query(ge=0, le=2**31, description="runs to skip")] = 0,
) -> list[RunOut]:
    """Runs the caller may read (a read token: its project's), most recently active first,
    filtered by project, tag, status, activity window and name; a page of ``limit`` runs
    from ``offset``. ``X-Total-Count`` says how many match; ``Link: <...>; rel="next"``
    gives the next page while there is one."""
    if principal.project is not None:
        if project is not None and project != principal.project:
            response.headers["X-Total-Count"] = "0"
            return []
        project = principal.project
    total: list[int] = []
    out = queries.list_runs(session, project=project, tag=tag, status=status, since=since,
                            until=until, name=name, active_seconds=settings.run_active_seconds,
                            limit=limit, offset=offset, total=total)
    paginate(request, response, total[0], limit, offset)
    return out


@router.get("/runs/{run_id}", response_model=RunOut)
def run(run_id: RunIdDep, session: SessionDep, settings: SettingsDep) -> RunOut:
    return queries.get_run(session, run_id, active_seconds=settings.run_active_seconds)


def writable_run(run_id: RunRef, request: Request, project: ProjectQuery = None) -> int:
    """The id of the run the path names (id or name), once the caller may change it: open
    mode, or an ``ingest`` token of the run's project (another project's run answers 404,
    as for reads)."""
    principal = request.app.state.auth.authorize(credentials(request), scope="ingest",
                                                 client=client_address(request))
    with session_scope(request.app.state.sessions) as s:
        return resolve_run(s, principal, run_id, project)


@router.delete(
    "/runs/{run_id}",
    response_model=DeletedOut,
    responses={404: {"description": "no such run (`run-not-found`)"},
               422: {"description": "`confirm` is not the run's name (`confirm-mismatch`)"}},
)
def delete_run(
    run_id: Annotated[int, Depends(writable_run)],
    session: SessionDep,
    confirm: Annotated[str, Query(max_length=128,
                                  description="the run's name, repeated: deleting is final")],
) -> DeletedOut:
    """Delete a run with all its frames, values, alerts and tags. Needs an ``ingest`` token
    of the run's project (or open mode), and ``confirm`` must repeat the run's name, so a
    wrong id never deletes the wrong run. Also: ``logitwatch runs delete``."""
    have = session.scalar(select(Run.name).where(Run.id == run_id))
    if have is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    if confirm != have:
        raise BadRequest("confirm-mismatch",
                         f"confirm: run {run_id} is named {have!r}, not {confirm!r}; nothing "
                         "was deleted", field="confirm")
    return queries.delete_run(session, run_id)


@router.put(
    "/runs/{run_id}/config",
    responses={404: {"description": "no such run (`run-not-found`)"},
               422: {"description": "not a JSON object, or too large (`config-too-large`)"}},
)
def set_config(
    run_id: Annotated[int, Depends(writable_run)],
    session: SessionDep,
    config: Annotated[dict[str, Any], Body(description="a JSON object: hyperparameters, "
                                           "model, data... (replaces the previous one)")],
) -> dict[str, Any]:
    """Set what a run's job says about itself, shown in the runs list (``config`` of
    ``GET /runs``). Needs an ``ingest`` token of the run's project (or open mode); at most
    256 keys and 16 KiB of JSON."""
    try:
        return queries.set_config(session, run_id, config)
    except ValueError:
        raise BadRequest("bad-config", "config: numbers must be finite", field="config") from None


@router.get("/runs/{run_id}/metrics", response_model=list[MetricOut])
def metrics(run_id: RunIdDep, session: SessionDep) -> list[MetricOut]:
    """The run's metric names, with their kind (scalar or per head) and shape."""
    return queries.list_metrics(session, run_id)


@router.get("/runs/{run_id}/series", response_model=SeriesOut)
def series(
    run_id: RunIdDep,
    session: SessionDep,
    name: MetricName,
    rank: Annotated[int, Query(ge=0, le=MAX_RANK, description="the rank to read")] = 0,
    merge: Annotated[
        queries.Merge | None,
        Query(description="read every rank and merge them per step (`rank` is ignored)"),
    ] = None,
    layer: Annotated[int | None, Query(ge=0, le=65_536, description="per-head metric: "
                                       "the layer (with head); default: max over heads")]
    = None,
    head: Annotated[int | None, Query(ge=0, le=65_536, description="with layer")] = None,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="first step")] = None,
    end: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="last step")] = None,
    start_time: Annotated[float | None, Query(ge=0, le=TIME, allow_inf_nan=False,
                                              description="first frame time (unix "
                                              "seconds)")] = None,
    end_time: Annotated[float | None, Query(ge=0, le=TIME, allow_inf_nan=False,
                                            description="last frame time (unix seconds)")]
    = None,
    max_points: Annotated[int, Query(ge=4, le=100_000)] = 2000,
) -> SeriesOut:
    """One series by metric name and labels (layer, head), over a step and/or time range,
    of one rank or all ranks merged, downsampled to about ``max_points`` with
    min/max-preserving buckets (no spike disappears; non-finite values are all kept)."""
    return queries.get_series(
        session, run_id=run_id, name=name, rank=rank, merge=merge, layer=layer, head=head,
        start=start, end=end, start_time=start_time, end_time=end_time,
        max_points=max_points,
    )


@router.get("/runs/{run_id}/heatmap", response_model=HeatmapOut)
def heatmap(
    run_id: RunIdDep,
    session: SessionDep,
    name: MetricName = "attn.logit_max",
    rank: Annotated[int, Query(ge=0, le=MAX_RANK)] = 0,
    step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="latest at or before")] = None,
    agg: Annotated[
        queries.Agg | None,
        Query(description="reduce every step between start and end (default: the whole "
              "run) per head: max, min or mean; `step` is then ignored"),
    ] = None,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="with agg")] = None,
    end: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="with agg")] = None,
) -> HeatmapOut:
    """A per-head metric as a layer x head matrix: at one step (default: the latest), or
    reduced over a step range with ``agg`` (e.g. each head's max over the whole run)."""
    return queries.get_heatmap(session, run_id=run_id, name=name, rank=rank, step=step,
                               agg=agg, start=start, end=end)


@router.get("/runs/{run_id}/alerts", response_model=list[AlertOut])
def alerts(run_id: RunIdDep, session: SessionDep) -> list[AlertOut]:
    queries.get_run(session, run_id)
    return list_alerts(session, run_id)
