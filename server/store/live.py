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
    scalar_ids = [i for i, m in metrics.items() if not m.layers]
    matrix_ids = [i for i, m in metrics.items() if m.layers]
    attn_ids = [i for i in matrix_ids if metrics[i].name.startswith("attn.")]
    out: dict[int, dict[str, Any]] = {f.id: {"step": f.step, "scalars": {}} for f in frames}
    # the page's scalars only: a page of 1,000 sampled frames holds 1,000 frames' matrices,
    # of which only the newest frame's are sent
    if scalar_ids:
        for fid, mid, data in session.execute(
            select(Point.frame_id, Point.metric_id, Point.data)
            .where(Point.metric_id.in_(scalar_ids), Point.frame_id.in_(ids))
        ):
            arr = np.frombuffer(data, dtype="<f4")
            out[fid]["scalars"][metrics[mid].name] = encode_float(float(arr[0]))
    # the newest frame with per-head matrices: a history flush or a closing frame after a
    # sampled one in the same page carries scalars (or q/k norms) only
    with_heads = set(session.scalars(
        select(Point.frame_id).where(Point.metric_id.in_(attn_ids), Point.frame_id.in_(ids))
        .distinct()
    )) if attn_ids else set()
    sampled = [f for f in frames if f.seq >= 0]
    newest = next((f for f in reversed(frames) if f.id in with_heads),
                  sampled[-1] if sampled else frames[-1])
    latest: dict[str, Any] = {"step": newest.step}
    if matrix_ids:
        for mid, data in session.execute(
            select(Point.metric_id, Point.data)
            .where(Point.metric_id.in_(matrix_ids), Point.frame_id == newest.id)
        ):
            m = metrics[mid]
            arr = np.frombuffer(data, dtype="<f4").astype(np.float64)
            latest[m.name] = [
                [encode_float(x) for x in row] for row in arr.reshape(m.layers, m.heads).tolist()
            ]
    return ids[-1], [out[i] for i in ids], latest
