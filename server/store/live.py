"""What the live stream needs: frames stored after a given frame id."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point
from logitwatch.wire import encode_float

__all__ = ["frames_since"]


def frames_since(
    session: Session, *, run_id: int, after_id: int, rank: int = 0, limit: int = 1000
) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
    """Return (last frame id, new frames' scalars, latest per-head matrices).

    Each frame is ``{"step", "scalars": {name: value}}`` with non-finite values encoded as
    on the wire; the steps of a frame's history (scalars-only rows, ``seq < 0``) come as
    frames too. The matrices are those of the newest frame with attention matrices,
    ``{"step", name: matrix}`` (only ``{"step"}`` when the page holds none: history steps,
    a history flush or a closing frame only).
    """
    frames = session.execute(
        select(Frame.id, Frame.step, Frame.seq)
        .where(Frame.run_id == run_id, Frame.rank == rank, Frame.id > after_id)
        .order_by(Frame.id)
        .limit(limit)
    ).all()
    if not frames:
        return after_id, [], None
    ids = [f.id for f in frames]
    metrics = {m.id: m for m in session.scalars(select(Metric).where(Metric.run_id == run_id))
               if "#" not in m.name}  # hidden rollups (store/ingest.py ENVELOPE)
    out: dict[int, dict[str, Any]] = {f.id: {"step": f.step, "scalars": {}} for f in frames}
    rows = session.execute(
        select(Point.frame_id, Point.metric_id, Point.data).where(Point.frame_id.in_(ids))
    ).all()
    # the newest frame with per-head matrices: a history flush or a closing frame after a
    # sampled one in the same page carries scalars (or q/k norms) only
    with_heads = {fid for fid, mid, _ in rows
                  if (m := metrics.get(mid)) is not None and m.layers
                  and m.name.startswith("attn.")}
    sampled = [f for f in frames if f.seq >= 0]
    newest = next((f for f in reversed(frames) if f.id in with_heads),
                  sampled[-1] if sampled else frames[-1])
    latest: dict[str, Any] = {"step": newest.step}
    for fid, mid, data in rows:
        m = metrics.get(mid)
        if m is None:
            continue
        arr = np.frombuffer(data, dtype="<f4").astype(np.float64)
        if not m.layers:
            out[fid]["scalars"][m.name] = encode_float(float(arr[0]))
        elif fid == newest.id:
            latest[m.name] = [
                [encode_float(x) for x in row] for row in arr.reshape(m.layers, m.heads).tolist()
            ]
    return ids[-1], [out[i] for i in ids], latest
