"""Shared helpers of ``bench_fuses.py``'s sub-benches: :class:`Recorder`, a client that
keeps the frames in memory (no collector), and the frame readers :func:`_max`,
:func:`windows` and :func:`clip_steps`."""

from __future__ import annotations

import math
from typing import Any

from logitwatch.client import Client


class Recorder(Client):
    """A client that keeps the frames the monitor sends (no collector)."""

    def __init__(self) -> None:
        super().__init__(None, run="bench")
        self.frames: list[dict[str, Any]] = []

    def send(self, step: int, scalars: Any, heads: Any, time: float | None = None,
             history: Any = None) -> None:
        self.frames.append({"step": step, "scalars": dict(scalars), "heads": dict(heads)})


def _max(rows: list[list[float]] | None) -> float | None:
    vals = [v for row in rows or [] for v in row if isinstance(v, float) and not math.isnan(v)]
    return max(vals) if vals else None


def windows(frames: list[dict], name: str, width: int = 100) -> dict[int, float]:
    """Max over heads of matrix ``name``, maxed per ``width``-step window (key: start)."""
    out: dict[int, float] = {}
    for f in frames:
        m = _max(f["heads"].get(name))
        if m is None:
            continue
        key = f["step"] // width * width
        out[key] = m if key not in out else max(out[key], m)
    return out


def clip_steps(frames: list[dict]) -> list[int]:
    return [f["step"] for f in frames if f["scalars"].get("fuse.qk_clip.heads", 0) > 0]
