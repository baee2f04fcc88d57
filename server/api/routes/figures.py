"""GET /api/v1/runs/{id}/figures/{kind}: Plotly figure JSON built by the pure builders; and
GET /api/v1/runs/{id}/figures?f=...&f=...: several of them in one request (the run page)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Annotated
from urllib.parse import parse_qsl

import plotly.graph_objects as go
import plotly.io as pio
from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server import figures
from logitwatch.server.api.deps import RunIdDep, SessionDep
from logitwatch.server.db.models import Metric
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import MAX_RANK, MAX_STEP, AlertOut, HeatmapOut, SeriesOut
from logitwatch.server.store import queries, views
from logitwatch.server.store.alerts import list_alerts
from logitwatch.server.store.incidents import locus

router = APIRouter(tags=["figures"])

HEATMAP_METRIC = "attn.logit_max"
#: Titles of the scalar charts the run page knows by name; any other name is titled by itself.
TITLES = {
    "lr": "learning rate",
    "final.hidden_rms": "final hidden RMS",
    "final.logz": "log Z",
    "final.logit_max": "max output logit",
}
MetricName = Annotated[str | None, Query(max_length=128, description="metric name")]


ColorParam = Annotated[figures.ColorScale, Query(
    description="heatmaps' colour scale: log, linear, or auto (log when the values span two "
    "decades or more)")]


class FigureQuery(BaseModel):
    """The parameters of one figure (those of ``GET /runs/{run}/figures/{kind}``)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(max_length=32)
    rank: int = Field(0, ge=0, le=MAX_RANK)
    start: int | None = Field(None, ge=0, le=MAX_STEP)
    end: int | None = Field(None, ge=0, le=MAX_STEP)
    max_points: int = Field(2000, ge=4, le=100_000)
    step: int | None = Field(None, ge=0, le=MAX_STEP)
    name: str | None = Field(None, max_length=128)
    layer: int | None = Field(None, ge=0, le=65_536)
    head: int | None = Field(None, ge=0, le=65_536)
    max_cols: int = Field(300, ge=4, le=2000)
    color: figures.ColorScale = "auto"


@router.get(
    "/runs/{run_id}/figures/{kind}",
    responses={200: {"content": {"application/json": {}},
                     "description": "A Plotly figure: {data, layout}"}},
)
def figure(
    run_id: RunIdDep,
    # as FigureQuery's: a longer one is refused here (422), not by the model inside (a 500)
    kind: Annotated[str, Path(max_length=32)],
    session: SessionDep,
    rank: Annotated[int, Query(ge=0, le=MAX_RANK)] = 0,
    start: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="first step")] = None,
    end: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="last step")] = None,
    max_points: Annotated[int, Query(ge=4, le=100_000)] = 2000,
    step: Annotated[
        int | None, Query(ge=0, le=MAX_STEP, description="heatmap: latest at or before")
    ] = None,
    name: MetricName = None,
    layer: Annotated[int | None, Query(ge=0, le=65_536)] = None,
    head: Annotated[int | None, Query(ge=0, le=65_536)] = None,
    max_cols: Annotated[int, Query(ge=4, le=2000, description="heads_time columns")] = 300,
    color: ColorParam = "auto",
) -> Response:
    """``kind`` is one of ``loss``, ``grad_norm``, ``heatmap`` (``name``: which per-head
    statistic, default attn.logit_max), ``series`` (any ``name``; ``layer`` and ``head``
    pick one head of a per-head metric, drawn over the run's envelope), ``clip_rate``
    (logged, or derived from grad.clipped) and ``heads_time`` (``name`` over steps for
    every head of ``layer``, or per layer without one). Non-finite values are ``null`` in
    the data and named in the hover text. Several at once: ``GET /runs/{run}/figures``."""
    q = FigureQuery(kind=kind, rank=rank, start=start, end=end, max_points=max_points,
                    step=step, name=name, layer=layer, head=head, max_cols=max_cols,
                    color=color)
    queries.get_run(session, run_id)  # 404 run-not-found first
    fig = build(session, run_id, q, list_alerts(session, run_id))
    return Response(pio.to_json(fig, validate=False), media_type="application/json",
                    headers={"Cache-Control": "no-store"})


#: Figures one batched request may ask for.
MAX_BATCH = 32


@router.get(
    "/runs/{run_id}/figures",
    responses={200: {"content": {"application/json": {}},
                     "description": "{figures: [a Plotly figure {data, layout}, or {error: "
                     "{status, code, message}}, one per f, in order]}"}},
)
def figure_batch(
    run_id: RunIdDep,
    session: SessionDep,
    f: Annotated[list[str], Query(
        max_length=MAX_BATCH,
        description="one figure per f: the query string of GET /runs/{run}/figures/{kind} "
        "with its kind, URL-encoded, e.g. f=kind%3Dseries%26name%3Dlr")],
) -> Response:
    """Several figures of one run in one request (the run page's charts): each ``f`` is
    one figure's parameters. A figure that cannot be drawn (e.g. a metric the run has not
    logged) answers ``{error: {status, code, message}}`` in its place; a malformed ``f``
    fails the whole request (400)."""
    asked = [_figure_query(i, text) for i, text in enumerate(f)]
    if not asked:
        raise BadRequest("missing-f", "f: ask for at least one figure, e.g. f=kind%3Dloss",
                         field="f")
    queries.get_run(session, run_id)  # 404 run-not-found first
    alerts = list_alerts(session, run_id)
    parts = []
    for q in asked:
        try:
            parts.append(pio.to_json(build(session, run_id, q, alerts), validate=False))
        except (NotFound, BadRequest) as e:
            parts.append(json.dumps({"error": {"status": e.status, "code": e.code,
                                               "message": e.message}}))
    return Response('{"figures":[' + ",".join(parts) + "]}", media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def _figure_query(i: int, text: str) -> FigureQuery:
    if len(text) > 1000:
        raise BadRequest("bad-f", f"f[{i}]: at most 1000 characters", field="f")
    try:
        pairs = parse_qsl(text, keep_blank_values=False, strict_parsing=True,
                          max_num_fields=16)
        fields = dict(pairs)
        if len(fields) != len(pairs):
            raise ValueError("a parameter is given twice")
        return FigureQuery.model_validate(fields)
    except (ValueError, ValidationError) as e:
        what = (e.errors(include_url=False)[0] if isinstance(e, ValidationError)
                else {"msg": str(e), "loc": ()})
        where = ".".join(str(x) for x in what["loc"])
        raise BadRequest("bad-f", f"f[{i}] {text[:200]!r}: {where + ': ' if where else ''}"
                         f"{what['msg']}", field="f") from None


def build(session: Session, run_id: int, q: FigureQuery, all_alerts: list[AlertOut]) -> go.Figure:
    """One figure of a run, as ``GET /runs/{run}/figures/{kind}`` describes it."""
    kind, rank, start, end, name = q.kind, q.rank, q.start, q.end, q.name
    layer, head, color = q.layer, q.head, q.color
    if kind not in figures.FIGURE_KINDS:
        raise NotFound(
            "figure-not-found",
            f"no figure {kind!r}; choose one of {', '.join(figures.FIGURE_KINDS)}",
        )

    def series(name: str) -> SeriesOut | None:
        return _series_or_none(session, run_id=run_id, name=name, rank=rank, start=start,
                               end=end, max_points=q.max_points)

    def empty(name: str) -> SeriesOut:
        return SeriesOut(name=name, rank=rank, total=0, steps=[], values=[])

    fig: go.Figure
    alerts = [a for a in _alerts_in_range(all_alerts, start, end) if a.rank == rank]
    if kind == "heatmap":
        h = _heatmap(session, run_id=run_id, rank=rank, step=q.step,
                     name=name or HEATMAP_METRIC)
        nonfinite_from = None
        if q.step is None and h.step is not None and not all(
                math.isfinite(v) for row in h.values for v in row):
            # After a NaN: the heads at the last step where all were finite, and since when.
            h, nonfinite_from = _last_finite(session, run_id, rank, h)
        fig = figures.heatmap_figure(h, color=color, nonfinite_from=nonfinite_from)
        figures.add_heatmap_alerts(fig, [a for a in all_alerts if a.rank == rank])
    elif kind == "heads_time":
        h = views.heads_over_time(session, run_id=run_id, name=name or HEATMAP_METRIC,
                                  rank=rank, layer=layer, start=start, end=end,
                                  max_cols=q.max_cols)
        fig = figures.heads_time_figure(h, [a for a in alerts if a.metric == h.name],
                                        color=color)
    elif kind == "clip_rate":
        rate = views.clip_rate(session, run_id=run_id, rank=rank, start=start, end=end,
                               max_points=q.max_points)
        fig = figures.line_figure(
            rate or empty("clip rate"), alerts, title="clip rate", revision="clip_rate",
            color=figures.COLORS["clip_rate"], y_range=(-0.02, 1.02), y_title="clip rate",
            own=_about("grad.clipped", *views.CLIP_RATE_NAMES),
        )
    elif kind == "series":
        if not name:
            raise BadRequest("missing-name", "name: give the metric to draw, e.g. name=lr",
                             field="name")
        one = queries.get_series(session, run_id=run_id, name=name, rank=rank, layer=layer,
                                 head=head, start=start, end=end, max_points=q.max_points)
        envelope = None
        title = TITLES.get(name, name)
        if layer is not None and head is not None:
            envelope = queries.get_series(session, run_id=run_id, name=name, rank=rank,
                                          start=start, end=end, max_points=q.max_points)
            envelope.name = f"{name} (max over all heads)"
            one.name = f"{name} L{layer}.H{head}"
            title = f"{name}, layer {layer}, head {head}"
            alerts = [a for a in alerts if a.metric != name or _on_head(a, layer, head)]
        fig = figures.line_figure(
            one, alerts, title=title, envelope=envelope, revision=f"series:{name}:{layer}:{head}",
            color=figures.COLORS["drill"] if envelope is not None else None,
            y_title=name if envelope is not None else None, own=_about(name),
        )
    elif kind == "loss":
        fig = figures.loss_figure(series("loss") or empty("loss"), alerts, own=_about("loss"))
    else:
        fig = figures.grad_norm_figure(
            series("grad.norm") or empty("grad.norm"), series("grad.clipped"), alerts,
            own=_about("grad.norm", "grad.clipped"),
        )
    return fig


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


def _heatmap(
    session: Session, *, run_id: int, rank: int, step: int | None, name: str
) -> HeatmapOut:
    try:
        return queries.get_heatmap(session, run_id=run_id, name=name, rank=rank, step=step)
    except NotFound as e:
        if e.code == "metric-not-found":
            return HeatmapOut(name=name, rank=rank, step=None, values=[])
        raise


def _about(*metrics: str) -> Callable[[AlertOut], bool]:
    """Alerts about these metrics are shaded on a chart; the others get a thin mark."""
    return lambda a: a.metric in metrics


def _on_head(a: AlertOut, layer: int, head: int) -> bool:
    at_layer, _, heads = locus(a)
    return at_layer == layer and head in (heads or ())


def _last_finite(session: Session, run_id: int, rank: int,
                 latest: HeatmapOut) -> tuple[HeatmapOut, int | None]:
    m = session.scalar(select(Metric).where(Metric.run_id == run_id, Metric.name == latest.name))
    if m is None or not m.layers:
        return latest, None
    good = views.last_finite_step(session, run_id=run_id, metric_id=m.id, rank=rank,
                                  size=m.layers * m.heads)
    if good is None:
        return latest, None
    since = views.next_sample(session, run_id, rank, good, m.id)
    return _heatmap(session, run_id=run_id, rank=rank, step=good, name=latest.name), since


def _alerts_in_range(alerts: list[AlertOut], start: int | None, end: int | None) -> list[AlertOut]:
    return [
        a for a in alerts
        if (start is None or a.fired_step >= start) and (end is None or a.started_step <= end)
    ]
