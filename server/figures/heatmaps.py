"""Heatmaps: the layer x head matrix at one step, heads (or layers) over steps, and the
cells of heads with a firing alert outlined."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import plotly.graph_objects as go

from logitwatch.server.schemas import AlertOut, HeatmapOut
from logitwatch.server.store.incidents import locus
from logitwatch.server.store.views import HeadsTimeOut
from logitwatch.wire import encode_float

from .marks import alert_label
from .style import COLORS, HEATMAP_SCALE, base_layout, no_data, plain

ColorScale = Literal["auto", "log", "linear"]
#: ``auto`` colours a heatmap on a log scale when its positive values span this ratio or more.
LOG_SPAN = 100.0


def _log_colors(rows: Sequence[Sequence[float | None]], mode: str,
                name: str) -> tuple[list[list[float | None]], dict[str, object], bool]:
    """(z, colour bar, log?) for a heatmap. On a log scale z is log10 of each value, values
    at or below 0 take the smallest positive one's colour, and the colour bar is labelled in
    the values themselves (1, 10, 100, 1k ...)."""
    flat = [v for row in rows for v in row if v is not None and math.isfinite(v)]
    pos = [v for v in flat if v > 0]
    lo, hi = (min(pos), max(pos)) if pos else (1.0, 1.0)
    use = mode == "log" or (mode == "auto" and "entropy" not in name and len(pos) >= 2
                            and hi / lo >= LOG_SPAN)
    bar: dict[str, object] = {"title": {"text": name, "side": "right"}, "thickness": 12}
    if not use or not pos:
        return [[v if v is not None and math.isfinite(v) else None for v in row]
                for row in rows], bar, False
    floor = math.log10(lo)
    z = [[(math.log10(v) if v > 0 else floor) if v is not None and math.isfinite(v) else None
          for v in row] for row in rows]
    ticks = list(range(math.floor(floor), math.ceil(math.log10(hi)) + 1))
    bar.update(tickvals=ticks, ticktext=[_si(10.0 ** t) for t in ticks])
    bar["title"] = {"text": f"{name} (log)", "side": "right"}
    return z, bar, True


def _si(v: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


def heatmap_figure(h: HeatmapOut, *, color: ColorScale = "auto",
                   nonfinite_from: int | None = None) -> go.Figure:
    """Layer x head matrix (layers on y, heads on x) with a colour bar; step in the title.

    Non-finite cells are gaps in the colour field; their hover text says what they are.
    ``color``: see :func:`_log_colors` (``auto``: log when values span two decades).
    ``nonfinite_from``: the matrix shown is the last finite one, NaN/Inf from that step on.
    """
    layers = len(h.values)
    heads = len(h.values[0]) if layers else 0
    name = plain(h.name)
    base_title = f"{name} by layer × head"
    title = f"{base_title}, step {h.step}" if h.step is not None else base_title
    if nonfinite_from is not None:
        title += f" (last finite; NaN/Inf from step {nonfinite_from})"
    z, bar, log = _log_colors(h.values, color, name)
    layout = base_layout(title, "heatmap", y_title="layer", overlay=False)
    layout.update(
        # The page restyles z live; it reads the step shown and the title's stem from meta.
        meta={"step": h.step, "title": base_title, "metric": h.name, "log": log,
              "log_floor": min((v for row in z for v in row if v is not None), default=None)
              if log else None, "nonfinite_from": nonfinite_from},
        showlegend=False, plot_bgcolor=COLORS["grid"],
        xaxis={"title": {"text": "head"}, "dtick": 1, "showgrid": False},
        yaxis={"title": {"text": "layer"}, "dtick": 1, "showgrid": False,
               "autorange": "reversed"},
        margin={"l": 56, "r": 16, "t": 40, "b": 40},
    )
    fig = go.Figure(layout=layout)
    fig.add_trace(go.Heatmap(
        z=z, x=list(range(heads)), y=list(range(layers)),
        text=[[_cell(v) for v in row] for row in h.values],
        hovertemplate="layer %{y}, head %{x}<br>" + name + " %{text}<extra></extra>",
        colorscale=HEATMAP_SCALE, meta="series", xgap=1, ygap=1, colorbar=bar,
    ))
    if h.step is None:
        no_data(fig, h.name)
    elif not any(math.isfinite(v) for row in h.values for v in row):
        fig.add_annotation(
            text=f"every value at step {h.step} is non-finite (NaN/Inf): the run has diverged",
            xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
            font={"color": COLORS["axis"], "size": 13},
        )
    return fig


def _cell(v: float) -> str:
    return f"{v:.4g}" if math.isfinite(v) else str(encode_float(v))


def heads_time_figure(h: HeadsTimeOut, alerts: Sequence[AlertOut] = (), *,
                      color: ColorScale = "auto") -> go.Figure:
    """A heatmap over time: heads of one layer (or layers: per-layer envelope) on y, steps on
    x; alerts of that layer as vertical lines and as markers on their head's row. ``color``:
    see :func:`_log_colors`."""
    name = plain(h.name)
    if h.layer is None:
        what, rows_title = f"{name}, {h.reduce} over heads, per layer", "layer"
    else:
        what, rows_title = f"{name}, layer {h.layer}, per head", "head"
    res = "full resolution" if h.bucket <= 1 else f"{h.reduce} of ~{h.bucket} samples per column"
    title = f"{what} over steps ({res})"
    layout = base_layout(title, "heads_time", y_title=rows_title, overlay=False)
    z, bar, log = _log_colors(h.values, color, name)
    layout.update(
        meta={"layer": h.layer, "metric": h.name, "bucket": h.bucket, "total": h.total,
              "log": log},
        showlegend=False, plot_bgcolor=COLORS["grid"],
        yaxis={"title": {"text": rows_title}, "dtick": 1 if len(h.values) <= 32 else None,
               "showgrid": False, "autorange": "reversed"},
        xaxis={"title": {"text": "step"}, "showgrid": False},
    )
    fig = go.Figure(layout=layout)
    fig.add_trace(go.Heatmap(
        z=z, x=list(h.steps), y=list(range(len(h.values))),
        colorscale=HEATMAP_SCALE, meta="series", ygap=1 if len(h.values) <= 32 else 0,
        # on a log scale z is log10: the hover reads the value itself from the text
        text=[["—" if v is None else _cell(v) for v in row] for row in h.values] if log else None,
        hovertemplate=(f"step %{{x}}<br>{rows_title} %{{y}}<br>{name} "
                       f"{'%{text}' if log else '%{z:.4g}'}<extra></extra>"),
        colorbar=bar, hoverongaps=False,
    ))
    # where each alert fired: its own layer and head, or for a rule over every head (over:
    # max) the layer and head that held the max
    at = {a.id: locus(a) for a in alerts}
    mine = [a for a in alerts if at[a.id][0] is not None
            and (h.layer is None or at[a.id][0] == h.layer)]
    # one layout update, as marks.add_alerts (fig.add_shape re-validates the layout each time)
    if mine:
        fig.update_layout(shapes=list(fig.layout.shapes or ()) + [
            {"type": "line", "xref": "x", "yref": "paper", "x0": a.fired_step,
             "x1": a.fired_step, "y0": 0, "y1": 1,
             "line": {"color": COLORS["alert_heads"] if a.state == "firing"
                      else COLORS["alert_resolved"], "width": 1.5, "dash": "dot"},
             "name": f"alert-{a.id}"} for a in mine])
    fig.add_trace(go.Scatter(
        x=[a.fired_step for a in mine],
        y=[at[a.id][1] if h.layer is not None else at[a.id][0] for a in mine],
        mode="markers", name="alerts", meta="alerts", customdata=[a.id for a in mine],
        text=[alert_label(a) for a in mine], hovertemplate="%{text}<extra></extra>",
        marker={"symbol": "triangle-right", "size": 11, "color": COLORS["alert_heads"],
                "line": {"width": 1, "color": COLORS["paper"]}},
    ))
    if not h.steps:
        no_data(fig, h.name)
    return fig


def add_heatmap_alerts(fig: go.Figure, alerts: Sequence[AlertOut]) -> go.Figure:
    """Outline the cells of the layer x head heatmap whose head has a firing alert."""
    cells: dict[tuple[int, int], list[AlertOut]] = {}
    for a in alerts:
        layer, head, heads = locus(a)
        if a.state == "firing" and layer is not None:
            for one in heads or ([head] if head is not None else []):
                cells.setdefault((layer, one), []).append(a)
    # One outline per cell, whatever the number of rules firing on that head.
    fig.add_trace(go.Scatter(
        x=[h for _, h in cells], y=[layer for layer, _ in cells], mode="markers",
        name="alerts", meta="alerts", customdata=[[a.id for a in c] for c in cells.values()],
        text=["<br><br>".join(alert_label(a) for a in c) for c in cells.values()],
        hovertemplate="%{text}<extra></extra>",
        marker={"symbol": "square-open", "size": 16, "color": COLORS["alert_heads"],
                "line": {"width": 2.5, "color": COLORS["alert_heads"]}},
    ))
    return fig
