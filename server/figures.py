"""Pure figure builders for the dashboard: API models in, ``plotly.graph_objects`` out.

No I/O here: the routes fetch, these draw, and the tests assert on ``fig.data`` and
``fig.layout``. The browser extends the figures live, so every trace carries a ``meta``
role (``series``, ``clipped``, ``nonfinite``, ``alerts``) that the page looks traces up by.

Non-finite values are signals: they are never plotted as numbers (JSON has no literal for
them) but drawn as markers along the top of the chart, with the value as text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import plotly.graph_objects as go

from logitwatch.server.schemas import AlertOut, HeatmapOut, SeriesOut
from logitwatch.server.store.views import HeadsTimeOut
from logitwatch.wire import encode_float

__all__ = [
    "COLORS",
    "ColorScale",
    "FIGURE_KINDS",
    "PALETTE",
    "add_heatmap_alerts",
    "compare_figure",
    "grad_norm_figure",
    "heads_time_figure",
    "heatmap_figure",
    "line_figure",
    "loss_figure",
    "plain",
]

#: The figure kinds served by ``GET /runs/{run}/figures/{kind}``.
FIGURE_KINDS = ("loss", "grad_norm", "heatmap", "series", "clip_rate", "heads_time")

# --- look: every colour and size of the dashboard's figures --------------------------------
COLORS = {
    "loss": "#1f6feb",
    "grad_norm": "#8250df",
    "clipped": "#d1242f",
    "nonfinite": "#bf8700",
    "alert_firing": "#d1242f",
    "alert_resolved": "#8c959f",
    "grid": "#eaeef2",
    "axis": "#57606a",
    "text": "#24292f",
    "paper": "#ffffff",
    "lr": "#1a7f37",
    "clip_rate": "#cf222e",
    "final.hidden_rms": "#0a7ea4",
    "final.logz": "#9a6700",
    "final.logit_max": "#bc4c00",
    "series": "#57606a",
    "drill": "#8250df",
    "envelope": "#afb8c1",
}
#: Colours of the runs overlaid in a comparison, in order.
PALETTE = ("#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#0a7ea4", "#bc4c00",
           "#57606a", "#e85aad", "#2da44e")
HEATMAP_SCALE = "Inferno"
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12,
        "color": COLORS["text"]}
ALERT_SHADE_OPACITY = 0.12
MARKER_ROW = 0.96  # where event markers sit, as a fraction of the plot height
HEIGHT = 300


def plain(text: str) -> str:
    """``text`` made literal for Plotly, which renders a subset of HTML (``<br>``, ``<a>``,
    ``<b>``...) in titles, names and hover texts, and ``%{...}`` in hover templates.

    Every string a user can name (run, project, metric, alert text) goes through here, so
    ``<img src=x onerror=...>`` shows as those characters. Plotly decodes ``&lt;``,
    ``&gt;``, ``&amp;`` and numeric entities, but not ``&quot;``, hence the short list.
    """
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("%", "&#37;"))


def _finite(values: Sequence[float]) -> list[float | None]:
    """Floats for plotting: non-finite values become gaps (``None`` → JSON ``null``)."""
    return [v if math.isfinite(v) else None for v in values]


def _base_layout(title: str, revision: str, *, y_title: str, overlay: bool = True) -> go.Layout:
    axis = {"gridcolor": COLORS["grid"], "zeroline": False, "linecolor": COLORS["grid"],
            "tickfont": {"color": COLORS["axis"]}}
    layout = go.Layout(
        template=go.layout.Template(),  # no default template: small JSON, our own look
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        font=FONT,
        height=HEIGHT,
        margin={"l": 56, "r": 16, "t": 40, "b": 40},
        paper_bgcolor=COLORS["paper"],
        plot_bgcolor=COLORS["paper"],
        showlegend=True,
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
        hovermode="closest",
        # Same revision on every redraw: Plotly.react keeps the user's zoom and pan.
        uirevision=revision,
        xaxis={**axis, "title": {"text": "step"}},
        yaxis={**axis, "title": {"text": y_title}},
    )
    if overlay:
        # An overlay axis fixed to [0, 1] for markers that belong at the top of the plot
        # whatever the data's scale (alerts, non-finite values).
        layout.yaxis2 = {"overlaying": "y", "range": [0, 1], "visible": False,
                         "fixedrange": True}
    return layout


def _nonfinite_trace(series: SeriesOut) -> go.Scatter:
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


def _alert_label(a: AlertOut) -> str:
    where = f"layer {a.layer}, head {a.head}" if a.layer is not None else "run"
    value = "non-finite" if a.value is None else f"{a.value:.4g}"
    limit = "" if a.threshold is None else f" (limit {a.threshold:.3g})"
    return (
        f"{plain(a.rule)} ({plain(a.state)}): rank {a.rank}, {where}<br>"
        f"{plain(a.metric)} = {value}{limit}<br>"
        f"started step {a.started_step}, fired step {a.fired_step}"
    )


def _alert_color(a: AlertOut) -> str:
    return COLORS["alert_firing"] if a.state == "firing" else COLORS["alert_resolved"]


#: A span that starts at the first step of the data (a range "left at step 0") is clamped
#: to this fraction of the chart's steps before the alert fired, so it does not shade the
#: whole axis.
CLAMP_FRACTION = 0.1


def _span_start(a: AlertOut, first: int | None, extent: int | None) -> int:
    """Where an alert's shaded span starts: ``started_step``, clamped when it is the axis's
    start (or before it) so that a range left at step 0 does not shade the whole chart."""
    x0 = a.started_step
    if extent and (x0 <= (first or 0)) and a.fired_step - x0 > CLAMP_FRACTION * extent:
        x0 = int(a.fired_step - CLAMP_FRACTION * extent)
    return x0


def _add_alerts(fig: go.Figure, alerts: Sequence[AlertOut], *,
                own: Callable[[AlertOut], bool] | None = None,
                steps: Sequence[int] = ()) -> None:
    """Each alert about this chart (``own``, default: every alert): a shaded span from
    ``started_step`` (clamped, see :func:`_span_start`) to ``fired_step``, a vertical line at
    ``fired_step``, and a hoverable marker at the top naming its layer and head. Alerts about
    other charts get only a small grey marker (``meta`` ``alerts-other``)."""
    mine = [a for a in alerts if own is None or own(a)]
    others = [a for a in alerts if own is not None and not own(a)]
    first = steps[0] if len(steps) else None
    extent = (steps[-1] - steps[0]) if len(steps) > 1 else None
    shapes: list[dict[str, object]] = []
    for a in mine:
        color = _alert_color(a)
        shapes.append({"type": "rect", "xref": "x", "yref": "paper",
                       "x0": _span_start(a, first, extent), "x1": a.fired_step, "y0": 0,
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
        text=[_alert_label(a) for a in mine], hovertemplate="%{text}<extra></extra>",
        customdata=[a.id for a in mine],
        marker={"symbol": "triangle-down", "size": 12, "color": [_alert_color(a) for a in mine],
                "line": {"width": 1, "color": COLORS["paper"]}},
    ))
    if others:
        fig.add_trace(go.Scatter(
            x=[a.fired_step for a in others], y=[1.0] * len(others), yaxis="y2",
            mode="markers", name="other alerts", meta="alerts-other", showlegend=False,
            text=[_alert_label(a) for a in others], hovertemplate="%{text}<extra></extra>",
            customdata=[a.id for a in others],
            marker={"symbol": "line-ns-open", "size": 8, "color": COLORS["alert_resolved"],
                    "line": {"width": 1}},
        ))


def _no_data(fig: go.Figure, what: str) -> None:
    fig.add_annotation(text=f"no {plain(what)} yet", xref="paper", yref="paper", x=0.5, y=0.5,
                       showarrow=False, font={"color": COLORS["axis"], "size": 13})


def loss_figure(series: SeriesOut, alerts: Sequence[AlertOut] = (), *,
                own: Callable[[AlertOut], bool] | None = None) -> go.Figure:
    """Loss over steps; traces: ``series``, ``nonfinite``, ``alerts``."""
    return line_figure(series, alerts, title="loss", revision="loss", color=COLORS["loss"],
                       own=own)


def grad_norm_figure(
    norm: SeriesOut, clipped: SeriesOut | None = None, alerts: Sequence[AlertOut] = (), *,
    own: Callable[[AlertOut], bool] | None = None,
) -> go.Figure:
    """Gradient norm; steps where the optimizer clipped are red markers on the line.

    Traces: ``series``, ``clipped``, ``nonfinite``, ``alerts``. ``clipped`` is the
    ``grad.clipped`` series (1 where the norm exceeded ``max_grad_norm``), or None.
    """
    name = plain(norm.name)
    fig = go.Figure(layout=_base_layout("gradient norm", "grad_norm", y_title=name))
    fig.add_trace(go.Scatter(
        x=list(norm.steps), y=_finite(norm.values), mode="lines", name=name,
        meta="series", line={"color": COLORS["grad_norm"], "width": 1.5},
        hovertemplate="step %{x}<br>" + name + " %{y:.4g}<extra></extra>",
    ))
    clip_steps: list[int] = []
    if clipped is not None:
        clip_steps = [s for s, v in zip(clipped.steps, clipped.values, strict=True) if v > 0]
    # Each clipped step sits on the norm line; the two series are downsampled separately,
    # so a step missing from the norm gets the interpolated norm there.
    finite = [(s, v) for s, v in zip(norm.steps, norm.values, strict=True) if math.isfinite(v)]
    if clip_steps and finite:
        xs, ys = zip(*finite, strict=True)
        clip_y: list[float | None] = np.interp(clip_steps, xs, ys).tolist()
    else:
        clip_y = [None] * len(clip_steps)
    fig.add_trace(go.Scatter(
        x=clip_steps, y=clip_y, mode="markers", name="clipped", meta="clipped",
        marker={"color": COLORS["clipped"], "size": 7, "symbol": "circle"},
        hovertemplate="step %{x}: clipped (norm %{y:.4g})<extra></extra>",
    ))
    fig.add_trace(_nonfinite_trace(norm))
    _add_alerts(fig, alerts, own=own, steps=norm.steps)
    if not norm.steps:
        _no_data(fig, norm.name)
    return fig


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
    layout = _base_layout(title, "heatmap", y_title="layer", overlay=False)
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
        _no_data(fig, h.name)
    elif not any(math.isfinite(v) for row in h.values for v in row):
        fig.add_annotation(
            text=f"every value at step {h.step} is non-finite (NaN/Inf): the run has diverged",
            xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
            font={"color": COLORS["axis"], "size": 13},
        )
    return fig


def _cell(v: float) -> str:
    return f"{v:.4g}" if math.isfinite(v) else str(encode_float(v))


# --- generic line charts, derived series, per-head summaries, comparisons ------------------


def line_figure(
    series: SeriesOut,
    alerts: Sequence[AlertOut] = (),
    *,
    title: str | None = None,
    color: str | None = None,
    revision: str | None = None,
    y_range: tuple[float, float] | None = None,
    log_y: bool = False,
    envelope: SeriesOut | None = None,
    y_title: str | None = None,
    own: Callable[[AlertOut], bool] | None = None,
) -> go.Figure:
    """Any scalar series over steps (lr, clip rate, final hidden RMS, log Z, one head...).

    Traces: ``series``, ``nonfinite``, ``alerts``, and ``envelope`` first when given (a faint
    reference line, e.g. the max over all heads behind one head's series).
    """
    name = plain(series.name)
    shown = plain(title) if title is not None else name
    fig = go.Figure(layout=_base_layout(shown, revision or f"series:{series.name}",
                                        y_title=plain(y_title) if y_title else name))
    fig.layout.yaxis.exponentformat = "SI"
    finite = {v for v in series.values if math.isfinite(v)}
    if y_range is None and len(finite) == 1:
        # A constant (e.g. a flat learning rate): centre it rather than Plotly's +-1.
        (v,) = finite
        y_range = (v - abs(v) * 0.5, v + abs(v) * 0.5) if v else (-1.0, 1.0)
    if y_range is not None:
        fig.layout.yaxis.range = list(y_range)
    if log_y:
        fig.layout.yaxis.type = "log"
    if envelope is not None:
        env = plain(envelope.name)
        fig.add_trace(go.Scatter(
            x=list(envelope.steps), y=_finite(envelope.values), mode="lines", name=env,
            meta="envelope", line={"color": COLORS["envelope"], "width": 1},
            hovertemplate="step %{x}<br>" + env + " %{y:.4g}<extra></extra>",
        ))
    fig.add_trace(go.Scatter(
        x=list(series.steps), y=_finite(series.values), mode="lines", name=name,
        meta="series",
        line={"color": color or COLORS.get(series.name, COLORS["series"]), "width": 1.5},
        hovertemplate="step %{x}<br>" + name + " %{y:.4g}<extra></extra>",
    ))
    fig.add_trace(_nonfinite_trace(series))
    _add_alerts(fig, alerts, own=own, steps=series.steps)
    if not series.steps:
        _no_data(fig, series.name)
    return fig


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
    layout = _base_layout(title, "heads_time", y_title=rows_title, overlay=False)
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
    mine = [a for a in alerts if a.layer is not None
            and (h.layer is None or a.layer == h.layer)]
    for a in mine:
        fig.add_shape(type="line", xref="x", yref="paper", x0=a.fired_step, x1=a.fired_step,
                      y0=0, y1=1, line={"color": "#58a6ff" if a.state == "firing"
                                        else COLORS["alert_resolved"], "width": 1.5,
                                        "dash": "dot"},
                      name=f"alert-{a.id}")
    fig.add_trace(go.Scatter(
        x=[a.fired_step for a in mine],
        y=[a.head if h.layer is not None else a.layer for a in mine],
        mode="markers", name="alerts", meta="alerts", customdata=[a.id for a in mine],
        text=[_alert_label(a) for a in mine], hovertemplate="%{text}<extra></extra>",
        marker={"symbol": "triangle-right", "size": 11, "color": "#58a6ff",
                "line": {"width": 1, "color": COLORS["paper"]}},
    ))
    if not h.steps:
        _no_data(fig, h.name)
    return fig


def add_heatmap_alerts(fig: go.Figure, alerts: Sequence[AlertOut]) -> go.Figure:
    """Outline the cells of the layer x head heatmap whose head has a firing alert."""
    cells: dict[tuple[int, int], list[AlertOut]] = {}
    for a in alerts:
        if a.state == "firing" and a.layer is not None and a.head is not None:
            cells.setdefault((a.layer, a.head), []).append(a)
    # One outline per cell, whatever the number of rules firing on that head.
    fig.add_trace(go.Scatter(
        x=[h for _, h in cells], y=[layer for layer, _ in cells], mode="markers",
        name="alerts", meta="alerts", customdata=[[a.id for a in c] for c in cells.values()],
        text=["<br><br>".join(_alert_label(a) for a in c) for c in cells.values()],
        hovertemplate="%{text}<extra></extra>",
        marker={"symbol": "square-open", "size": 16, "color": "#58a6ff",
                "line": {"width": 2.5, "color": "#58a6ff"}},
    ))
    return fig


def compare_figure(
    name: str, runs: Sequence[tuple[int, str, SeriesOut | None]]
) -> go.Figure:
    """One series of several runs overlaid; each ``(run id, label, series)``, a run without
    the series is named in the legend as missing. Traces carry ``meta`` ``run:<id>``."""
    title = plain(name)
    fig = go.Figure(layout=_base_layout(title, f"compare:{name}", y_title=title))
    missing = []
    for i, (run_id, label, s) in enumerate(runs):
        color = PALETTE[i % len(PALETTE)]
        text = plain(label)
        if s is None:
            missing.append(text)
            continue
        fig.add_trace(go.Scatter(
            x=list(s.steps), y=_finite(s.values), mode="lines", name=text,
            meta=f"run:{run_id}", line={"color": color, "width": 1.5},
            hovertemplate=f"{text}<br>step %{{x}}<br>{title} %{{y:.4g}}<extra></extra>",
        ))
        bad = [(st, v) for st, v in zip(s.steps, s.values, strict=True) if not math.isfinite(v)]
        if bad:
            fig.add_trace(go.Scatter(
                x=[st for st, _ in bad], y=[MARKER_ROW] * len(bad), yaxis="y2",
                mode="markers", name=f"{text}: non-finite", meta=f"nonfinite:{run_id}",
                text=[f"{text}: {title} = {encode_float(v)} at step {st}" for st, v in bad],
                hovertemplate="%{text}<extra></extra>",
                marker={"symbol": "x", "size": 10, "color": color},
            ))
    if missing:
        fig.add_annotation(text="not logged by: " + ", ".join(missing), xref="paper",
                           yref="paper", x=0, y=-0.22, xanchor="left", showarrow=False,
                           font={"color": COLORS["axis"], "size": 11})
    if not fig.data:
        _no_data(fig, name)
    return fig
