"""Pydantic request/response models (separate from the SQLAlchemy tables).

Split by concern, and every name re-exported here, the one module the routes, the store and
the tests import them from:

* :mod:`.wire_values`: what a value on the wire may be (:data:`WireFloat`, the bounds of
  steps and ranks) and the one-pass checks of a frame's scalars, heads and history;
* :mod:`.ingest_schemas`: the ingest request (:class:`IngestIn`, :class:`FrameIn`,
  :class:`HistoryIn`) and the bounds one request may carry;
* :mod:`.response_schemas`: the read API's responses (:class:`AlertOut`, :class:`RunOut`,
  :class:`SeriesOut`, ...).
"""

from __future__ import annotations

from logitwatch.server.ingest_schemas import (  # noqa: F401  (re-exported)
    _FRAME_FIELDS,
    MAX_AHEAD,
    MAX_REQUEST_RANKS,
    MAX_REQUEST_RUNS,
    FrameIn,
    HistoryIn,
    HistoryValue,
    IngestIn,
    Name,
    request_limits_problem,
)
from logitwatch.server.response_schemas import (  # noqa: F401  (re-exported)
    AlertOut,
    DeletedOut,
    HeatmapOut,
    IngestOut,
    MetricOut,
    RunOut,
    SeriesOut,
)
from logitwatch.server.wire_values import (  # noqa: F401  (re-exported)
    _EXPECTED,
    MAX_PROBLEMS,
    MAX_RANK,
    MAX_STEP,
    WireFloat,
    _check_matrix,
    _history_value,
    _history_value_ok,
    _show,
    _wire_value,
    _wire_value_ok,
    check_heads,
    check_history,
    check_scalars,
)
from logitwatch.wire import MAX_REQUEST_HISTORY_STEPS

__all__ = [
    "AlertOut",
    "DeletedOut",
    "FrameIn",
    "HeatmapOut",
    "HistoryIn",
    "IngestIn",
    "IngestOut",
    "MAX_REQUEST_HISTORY_STEPS",
    "MAX_REQUEST_RANKS",
    "MAX_REQUEST_RUNS",
    "MetricOut",
    "RunOut",
    "SeriesOut",
    "WireFloat",
    "request_limits_problem",
]
