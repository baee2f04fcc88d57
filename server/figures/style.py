"""The look of every dashboard figure (colours, fonts, sizes) and the helpers each builder
shares: literal text for Plotly, gaps for non-finite values, the base layout, "no data"."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

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
    "alert_heads": "#58a6ff",  # firing alerts on the heatmaps (on Inferno's dark cells)
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


def gaps_for_nonfinite(values: Sequence[float]) -> list[float | None]:
    """Floats for plotting: non-finite values become gaps (``None`` → JSON ``null``)."""
    return [v if math.isfinite(v) else None for v in values]


def base_layout(title: str, revision: str, *, y_title: str, overlay: bool = True) -> go.Layout:
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


def no_data(fig: go.Figure, what: str) -> None:
    fig.add_annotation(text=f"no {plain(what)} yet", xref="paper", yref="paper", x=0.5, y=0.5,
                       showarrow=False, font={"color": COLORS["axis"], "size": 13})
