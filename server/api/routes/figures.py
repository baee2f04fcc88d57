"""GET /api/v1/runs/{id}/figures/{kind}: Plotly figure JSON built by the pure builders."""

from __future__ import annotations

from typing import Annotated

import plotly.graph_objects as go
import plotly.io as pio
from fastapi import APIRouter, Query, Response
from sqlalchemy.orm import Session

from logitwatch.server import figures
from logitwatch.server.api.deps import RunIdDep, SessionDep
from logitwatch.server.errors import NotFound
from logitwatch.server.schemas import MAX_RANK, MAX_STEP, AlertOut, HeatmapOut, SeriesOut
from logitwatch.server.store import queries
from logitwatch.server.store.alerts import list_alerts

router = APIRouter(tags=["figures"])

HEATMAP_METRIC = "attn.logit_max"


@router.get(
    "/runs/{run_id}/figures/{kind}",
    responses={200: {"content": {"application/json": {}},
                     "description": "A Plotly figure: {data, layout}"}},
)
def figure(
    run_id: RunIdDep,
    kind: str,
    session: SessionDep,
    rank: Annotated[int, Query(ge=0, le=MAX_RANK)] = 0,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="first step")] = None,
    end: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="last step")] = None,
    max_points: Annotated[int, Query(ge=4, le=100_000)] = 2000,
    step: Annotated[
        int | None, Query(ge=0, le=MAX_STEP, description="heatmap: latest at or before")
    ] = None,
) -> Response:
    """``kind`` is one of ``loss``, ``grad_norm``, ``heatmap``. Non-finite values are
    ``null`` in the data and named in the hover text."""
    if kind not in figures.FIGURE_KINDS:
        raise NotFound(
            "figure-not-found",
            f"no figure {kind!r}; choose one of {', '.join(figures.FIGURE_KINDS)}",
        )
    queries.get_run(session, run_id)  # 404 run-not-found first

    def series(name: str) -> SeriesOut | None:
        return _series_or_none(session, run_id=run_id, name=name, rank=rank, start=start,
                               end=end, max_points=max_points)

    def empty(name: str) -> SeriesOut:
        return SeriesOut(name=name, rank=rank, total=0, steps=[], values=[])

    fig: go.Figure
    if kind == "heatmap":
        fig = figures.heatmap_figure(_heatmap(session, run_id=run_id, rank=rank, step=step))
    else:
        alerts = _alerts_in_range(list_alerts(session, run_id), start, end)
        if kind == "loss":
            fig = figures.loss_figure(series("loss") or empty("loss"), alerts)
        else:
            fig = figures.grad_norm_figure(
                series("grad.norm") or empty("grad.norm"), series("grad.clipped"), alerts
            )
    return Response(
        pio.to_json(fig, validate=False), media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def _series_or_none(
    session: Session, *, run_id: int, name: str, rank: int, start: int | None,
    end: int | None, max_points: int,
) -> SeriesOut | None:
    """A run that has not logged ``name`` (yet) gets an empty chart, not an error."""
    try:
        return queries.get_series(session, run_id=run_id, name=name, rank=rank, start=start,
                                  end=end, max_points=max_points)
    except NotFound as e:
        if e.code == "metric-not-found":
            return None
        raise


def _heatmap(session: Session, *, run_id: int, rank: int, step: int | None) -> HeatmapOut:
    try:
        return queries.get_heatmap(session, run_id=run_id, name=HEATMAP_METRIC, rank=rank,
                                   step=step)
    except NotFound as e:
        if e.code == "metric-not-found":
            return HeatmapOut(name=HEATMAP_METRIC, rank=rank, step=None, values=[])
        raise


def _alerts_in_range(alerts: list[AlertOut], start: int | None, end: int | None) -> list[AlertOut]:
    return [
        a for a in alerts
        if (start is None or a.fired_step >= start) and (end is None or a.started_step <= end)
    ]
