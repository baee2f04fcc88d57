"""Pure figure builders for the dashboard: API models in, ``plotly.graph_objects`` out.

No I/O here: the routes fetch, these draw, and the tests assert on ``fig.data`` and
``fig.layout``. The browser extends the figures live, so every trace carries a ``meta``
role (``series``, ``clipped``, ``nonfinite``, ``alerts``) that the page looks traces up by.

Non-finite values are signals: they are never plotted as numbers (JSON has no literal for
them) but drawn as markers along the top of the chart, with the value as text.

The builders live by concern: :mod:`.style` (colours, layout, shared helpers),
:mod:`.marks` (non-finite markers and alerts on a chart), :mod:`.lines` and
:mod:`.heatmaps`; this package exports the public ones.
"""

from __future__ import annotations

from .heatmaps import ColorScale, add_heatmap_alerts, heads_time_figure, heatmap_figure
from .lines import compare_figure, grad_norm_figure, line_figure, loss_figure
from .style import COLORS, PALETTE, plain

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
