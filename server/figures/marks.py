"""What figures mark on top of their data: non-finite values along the top, and alerts
(a shaded span, a line at the step they fired, a hoverable marker)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from logitwatch.server.schemas import AlertOut, SeriesOut
from logitwatch.server.store.incidents import locus, where_text
from logitwatch.wire import encode_float

from .style import ALERT_SHADE_OPACITY, COLORS, MARKER_ROW, plain


def nonfinite_trace(series: SeriesOut) -> go.Scatter:
    steps = [s for s, v in zip(series.steps, series.values, strict=True) if not math.isfinite(v)]
    text = [
        f"{plain(series.name)} = {encode_float(v)} at step {s}"
        for s, v in zip(series.steps, series.values, strict=True)
        if not math.isfinite(v)
    ]
    return go.Scatter(
        x=steps, y=[MARKER_ROW] * len(steps), yaxis="y2", mode="markers", name="non-finite",
        meta="nonfinite", text=text, hovertemplate="%{text}<extra></extra>",
        marker={"symbol": "x", "size": 10, "color": COLORS["nonfinite"]},
    )


def alert_where(a: AlertOut) -> str:
    """Where it fired, as its card says: "layer 1, heads 0, 1, 2, 3", "layer 1, head 3",
    "max over heads: layer 1, head 3" (an alert over every head), or "run"."""
    layer, head, heads = locus(a)
    where = where_text(layer, head, heads)
    if not where:
        return "run"
    return where if a.layer is not None else f"max over heads: {where}"


def alert_label(a: AlertOut) -> str:
    where = alert_where(a)
    value = "non-finite" if a.value is None else f"{a.value:.4g}"
    limit = "" if a.threshold is None else f" (limit {a.threshold:.3g})"
    return (
        f"{plain(a.rule)} ({plain(a.state)}): rank {a.rank}, {where}<br>"
        f"{plain(a.metric)} = {value}{limit}<br>"
        f"started step {a.started_step}, fired step {a.fired_step}"
    )


def alert_color(a: AlertOut) -> str:
    return COLORS["alert_firing"] if a.state == "firing" else COLORS["alert_resolved"]


#: A span that starts at the first step of the data (a range "left at step 0") is clamped
#: to this fraction of the chart's steps before the alert fired, so it does not shade the
#: whole axis.
CLAMP_FRACTION = 0.1


def span_start(a: AlertOut, first: int | None, extent: int | None) -> int:
    """Where an alert's shaded span starts: ``started_step``, clamped when it is the axis's
    start (or before it) so that a range left at step 0 does not shade the whole chart."""
    x0 = a.started_step
    if extent and (x0 <= (first or 0)) and a.fired_step - x0 > CLAMP_FRACTION * extent:
        x0 = int(a.fired_step - CLAMP_FRACTION * extent)
    return x0


def add_alerts(fig: go.Figure, alerts: Sequence[AlertOut], *,
               own: Callable[[AlertOut], bool] | None = None,
               steps: Sequence[int] = ()) -> None:
    """Each alert about this chart (``own``, default: every alert): a shaded span from
    ``started_step`` (clamped, see :func:`span_start`) to ``fired_step``, a vertical line at
    ``fired_step``, and a hoverable marker at the top naming its layer and head. Alerts about
    other charts get only a small grey marker (``meta`` ``alerts-other``)."""
    mine = [a for a in alerts if own is None or own(a)]
    others = [a for a in alerts if own is not None and not own(a)]
    first = steps[0] if len(steps) else None
    extent = (steps[-1] - steps[0]) if len(steps) > 1 else None
    shapes: list[dict[str, object]] = []
    for a in mine:
        color = alert_color(a)
        shapes.append({"type": "rect", "xref": "x", "yref": "paper",
                       "x0": span_start(a, first, extent), "x1": a.fired_step, "y0": 0,
                       "y1": 1, "fillcolor": color, "opacity": ALERT_SHADE_OPACITY,
                       "line": {"width": 0}, "layer": "below", "name": f"alert-{a.id}-span"})
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": a.fired_step,
                       "x1": a.fired_step, "y0": 0, "y1": 1,
                       "line": {"color": color, "width": 1.5, "dash": "dot"},
                       "name": f"alert-{a.id}"})
    # One layout update: fig.add_shape per alert re-validates the whole layout each time
    # (2.8 s for a run with 96 alerts; this is ~50 ms).
    if shapes:
        fig.update_layout(shapes=list(fig.layout.shapes or ()) + shapes)
    fig.add_trace(go.Scatter(
        x=[a.fired_step for a in mine], y=[MARKER_ROW] * len(mine), yaxis="y2",
        mode="markers", name="alerts", meta="alerts",
        text=[alert_label(a) for a in mine], hovertemplate="%{text}<extra></extra>",
        customdata=[a.id for a in mine],
        marker={"symbol": "triangle-down", "size": 12, "color": [alert_color(a) for a in mine],
                "line": {"width": 1, "color": COLORS["paper"]}},
    ))
    if others:
        fig.add_trace(go.Scatter(
            x=[a.fired_step for a in others], y=[1.0] * len(others), yaxis="y2",
            mode="markers", name="other alerts", meta="alerts-other", showlegend=False,
            text=[alert_label(a) for a in others], hovertemplate="%{text}<extra></extra>",
            customdata=[a.id for a in others],
            marker={"symbol": "line-ns-open", "size": 8, "color": COLORS["alert_resolved"],
                    "line": {"width": 1}},
        ))
