"""The wire format shared by the client and the collector (no torch, no server deps).

A *frame* is one sampled training step of one rank, sent as a JSON object::

    {
      "run": "demo-unstable",       # run name: 1-128 chars of [A-Za-z0-9._:-]
      "project": "default",          # optional, same alphabet
      "rank": 0,                     # data-parallel rank (int >= 0)
      "seq": 42,                     # per (run, rank) sequence number, strictly increasing;
                                     # the collector deduplicates on (run, rank, seq)
      "step": 420,                   # optimizer step (int >= 0)
      "time": 1764430000.123,        # unix seconds when the step ended
      "scalars": {"loss": 3.1, "grad.norm": 0.8, "grad.clipped": 0.0, "lr": 0.001},
      "heads": {"attn.logit_max": [[h0, h1, ...], ...],   # one list per layer
                "attn.logit_p99": [[...], ...]},
      "history": {"steps": [411, 412, ..., 419],           # optional, see below
                  "scalars": {"loss": [3.2, ...], "grad.norm": [0.9, ...],
                              "grad.clipped": [0.0, ...], "lr": [0.001, ...]}}
    }

Frames travel in batches: ``POST /api/v1/ingest`` with body ``{"frames": [frame, ...]}``.

``history`` carries scalars of the steps that were *not* sampled: the steps after the
previous frame of the same (run, rank) and before this frame's ``step``. ``steps`` is
strictly increasing, every step is an int >= 0 and below the frame's ``step``; every list in
``scalars`` has as many values as ``steps`` (value *i* belongs to ``steps[i]``). A value is
a number, one of the non-finite strings below, or ``null`` (not measured at that step); a
series measured at none of the steps may be left out. At most :data:`MAX_HISTORY_STEPS`
steps and :data:`MAX_HISTORY_SERIES` series a frame, names in :data:`NAME_RE`'s alphabet.
The collector stores each history step as a frame of its own with scalars only (series
queries, retention and the alert engine see every step); a resent frame's history is
deduplicated with it.

An *end frame* says that the job ended normally after its last step::

    {"run": "demo-unstable", "project": "default", "rank": 0, "seq": 43, "step": 420,
     "time": 1764430001.5, "end": "finished"}

``end`` is ``"finished"`` (the only value); ``step`` is the last step the client sent;
``scalars``, ``heads`` and ``history`` are absent (or empty). It is numbered, queued,
spooled, replayed and deduplicated like any frame, after every frame of that client.
Rank 0's end frame makes the run ``finished`` (the collector's ``no_data`` rule then never
fires for it); a later frame of rank 0 (a higher ``seq``: the job was resumed) makes it
``running`` again, and an end frame numbered before a frame of rank 0 already stored
changes nothing. Other ranks' end frames are accepted and change nothing. The client sends
one from ``Client.shutdown()`` (so ``Monitor.close()``) and at interpreter exit, unless the
interpreter is exiting on an uncaught exception.

Non-finite numbers are signals, not errors, so they travel as what they are. JSON has no
literal for them, so a value position may hold one of the strings ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``; every other value is a JSON number. :func:`encode_float`
and :func:`decode_float` are the only two places that know this.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from typing import Any, Final

__all__ = [
    "MAX_HEADS",
    "MAX_HISTORY_SERIES",
    "MAX_HISTORY_STEPS",
    "MAX_MATRIX_VALUES",
    "MAX_SCALARS",
    "CONTROL_DETAIL_RANKS",
    "CONTROL_FUSES",
    "FUSE_RULES",
    "fuses_for",
    "RANK_OF_MAX",
    "NAME_RE",
    "MAX_REQUEST_HISTORY_STEPS",
    "NONFINITE",
    "WIRE_VERSION",
    "decode_float",
    "parse_retry_after",
    "encode_float",
    "encode_matrix",
]

WIRE_VERSION: Final = 1

#: Allowed alphabet for run, project and metric names.
NAME_RE: Final = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

#: Bounds of a frame's ``history``: steps, and series (names in ``history["scalars"]``).
MAX_HISTORY_STEPS: Final = 4096
MAX_HISTORY_SERIES: Final = 16
#: Most history steps one ingest request may carry, its frames together: the collector
#: refuses a request past it as a whole (422); ``logitwatch push`` keeps its requests under
#: it (a spool of frames with long histories holds segments past it).
MAX_REQUEST_HISTORY_STEPS: Final = 20_000

#: Bounds of one frame, the collector's hard ceilings (a deployment may set lower ones):
#: scalars, per-head matrices, and values (layers x heads) in one matrix.
MAX_SCALARS: Final = 256
MAX_HEADS: Final = 64
MAX_MATRIX_VALUES: Final = 65_536

#: Reduce before sending (``hooks/_reduce.py``): the per-head matrix of the global rank that
#: held each head's max in a frame that speaks for a data-parallel group, and the ingest
#: answer's ``control`` key naming the ranks asked to send their own frames too.
RANK_OF_MAX: Final = "attn.logit_max_rank"
CONTROL_DETAIL_RANKS: Final = "detail_ranks"
#: The ingest answer's ``control`` key carrying ``{fuse: "apply" | "undo"}`` (docs/FUSES.md).
CONTROL_FUSES: Final = "fuses"
#: The alert rules each fuse addresses (a trailing ``*``: a prefix): the job's fuses offer
#: themselves on these alerts, and the collector stores them with the alert.
FUSE_RULES: Final[dict[str, tuple[str, ...]]] = {
    "qk_clip": ("attn_logit*", "attn_p99*", "q_bias_refuge*", "k_bias_refuge*"),
    "lr_backoff": ("lr_jump", "lr_above_peak", "grad_norm_rising", "grad_norm_ramp", "grad_blowup",
                   "grad_spike", "loss_jump", "attn_logit_departure", "attn_logit_forecast"),
    "rollback": ("loss_nonfinite", "grad_nonfinite", "grad_blowup", "loss_jump", "loss_rise",
                 "attn_wiped"),
    "qk_norm": ("attn_logit*", "attn_p99*"),
    "soft_cap": ("attn_logit*", "attn_p99*"),
}


def fuses_for(rule: str) -> list[str]:
    """The fuses (:data:`FUSE_RULES`) that address alert rule ``rule``."""
    out = []
    for fuse, rules in FUSE_RULES.items():
        if any(rule.startswith(r[:-1]) if r.endswith("*") else rule == r for r in rules):
            out.append(fuse)
    return out

NONFINITE: Final[dict[str, float]] = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
}


def encode_float(x: float) -> float | str:
    """Return ``x`` as a JSON-safe value: the float itself, or its non-finite string."""
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def decode_float(v: Any) -> float:
    """Inverse of :func:`encode_float`. Raises ``ValueError`` for anything else."""
    if isinstance(v, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in NONFINITE:
        return NONFINITE[v]
    raise ValueError(f"expected a number or one of {sorted(NONFINITE)}, got {v!r}")


def encode_matrix(rows: list[list[float]]) -> list[list[float | str]]:
    """Encode a layer x head matrix of floats for the wire."""
    return [[encode_float(x) for x in row] for row in rows]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), at
    least 0; None when absent or unreadable. The collector sends it with 429 and 503, the
    client honours it, and the collector's webhooks honour a receiver's."""
    if not value or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
