"""Line charts: loss, gradient norm with its clipped steps, any scalar series, and one
series of several runs overlaid."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

from logitwatch.server.schemas import AlertOut, SeriesOut
from logitwatch.wire import encode_float

from .marks import add_alerts, nonfinite_trace
from .style import COLORS, MARKER_ROW, PALETTE, base_layout, gaps_for_nonfinite, no_data, plain


def _line(x: Sequence[int], y: Sequence[float], name: str, *, meta: str, color: str,
          width: float = 1.5) -> go.Scatter:
    """A series as a line (``name`` already made literal): gaps where it is non-finite, the
    step and value on hover."""
    return go.Scatter(
        x=list(x), y=gaps_for_nonfinite(y), mode="lines", name=name, meta=meta,
        line={"color": color, "width": width},
        hovertemplate="step %{x}<br>" + name + " %{y:.4g}<extra></extra>",
    )


def _finish(fig: go.Figure, series: SeriesOut, alerts: Sequence[AlertOut],
            own: Callable[[AlertOut], bool] | None) -> go.Figure:
    """What every single-series chart ends with: its non-finite values along the top, its
    alerts, and "no data" while it has no step."""
    fig.add_trace(nonfinite_trace(series))
    add_alerts(fig, alerts, own=own, steps=series.steps)
    if not series.steps:
        no_data(fig, series.name)
    return fig


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
    fig = go.Figure(layout=base_layout("gradient norm", "grad_norm", y_title=name))
    fig.add_trace(_line(norm.steps, norm.values, name, meta="series",
                        color=COLORS["grad_norm"]))
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
    return _finish(fig, norm, alerts, own)


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
    fig = go.Figure(layout=base_layout(shown, revision or f"series:{series.name}",
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
        fig.add_trace(_line(envelope.steps, envelope.values, env, meta="envelope",
                            color=COLORS["envelope"], width=1))
    fig.add_trace(_line(series.steps, series.values, name, meta="series",
                        color=color or COLORS.get(series.name, COLORS["series"])))
    return _finish(fig, series, alerts, own)


def compare_figure(
    name: str, runs: Sequence[tuple[int, str, SeriesOut | None]]
) -> go.Figure:
    """One series of several runs overlaid; each ``(run id, label, series)``, a run without
    the series is named in the legend as missing. Traces carry ``meta`` ``run:<id>``."""
    title = plain(name)
    fig = go.Figure(layout=base_layout(title, f"compare:{name}", y_title=title))
    missing = []
    for i, (run_id, label, s) in enumerate(runs):
        color = PALETTE[i % len(PALETTE)]
        text = plain(label)
        if s is None:
            missing.append(text)
            continue
        fig.add_trace(go.Scatter(
            x=list(s.steps), y=gaps_for_nonfinite(s.values), mode="lines", name=text,
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
        no_data(fig, name)
    return fig
