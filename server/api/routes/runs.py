"""Read endpoints: runs, metrics, series, heatmaps, alerts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from logitwatch.server.api.deps import ReadDep, RunIdDep, SessionDep
from logitwatch.server.schemas import (
    MAX_RANK,
    MAX_STEP,
    AlertOut,
    HeatmapOut,
    MetricOut,
    RunOut,
    SeriesOut,
)
from logitwatch.server.store import queries
from logitwatch.server.store.alerts import list_alerts

router = APIRouter(tags=["runs"])

MetricName = Annotated[str, Query(max_length=128, description="metric name, e.g. loss")]


@router.get("/runs", response_model=list[RunOut])
def runs(session: SessionDep, principal: ReadDep) -> list[RunOut]:
    """All runs the caller may read (a read token: its project's), most recently active
    first."""
    return queries.list_runs(session, project=principal.project)


@router.get("/runs/{run_id}", response_model=RunOut)
def run(run_id: RunIdDep, session: SessionDep) -> RunOut:
    return queries.get_run(session, run_id)


@router.get("/runs/{run_id}/metrics", response_model=list[MetricOut])
def metrics(run_id: RunIdDep, session: SessionDep) -> list[MetricOut]:
    """The run's metric names, with their kind (scalar or per head) and shape."""
    return queries.list_metrics(session, run_id)


@router.get("/runs/{run_id}/series", response_model=SeriesOut)
def series(
    run_id: RunIdDep,
    session: SessionDep,
    name: MetricName,
    rank: Annotated[int, Query(ge=0, le=MAX_RANK)] = 0,
    layer: Annotated[int | None, Query(ge=0, le=65_536)] = None,
    head: Annotated[int | None, Query(ge=0, le=65_536)] = None,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="first step")] = None,
    end: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="last step")] = None,
    max_points: Annotated[int, Query(ge=4, le=100_000)] = 2000,
) -> SeriesOut:
    """One series, downsampled to about ``max_points`` with min/max-preserving buckets."""
    return queries.get_series(
        session, run_id=run_id, name=name, rank=rank, layer=layer, head=head, start=start,
        end=end, max_points=max_points,
    )


@router.get("/runs/{run_id}/heatmap", response_model=HeatmapOut)
def heatmap(
    run_id: RunIdDep,
    session: SessionDep,
    name: MetricName = "attn.logit_max",
    rank: Annotated[int, Query(ge=0, le=MAX_RANK)] = 0,
    step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="latest at or before")] = None,
) -> HeatmapOut:
    """A per-head metric as a layer x head matrix at one step (default: the latest)."""
    return queries.get_heatmap(session, run_id=run_id, name=name, rank=rank, step=step)


@router.get("/runs/{run_id}/alerts", response_model=list[AlertOut])
def alerts(run_id: RunIdDep, session: SessionDep) -> list[AlertOut]:
    queries.get_run(session, run_id)
    return list_alerts(session, run_id)
