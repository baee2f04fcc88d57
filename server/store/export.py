"""A stored run read back out, in bounded memory: ``logitwatch runs export``.

Two shapes of the same rows:

* **wire frames** (:func:`wire_frames`), what ``logitwatch replay FILE`` reads and the
  hooks send: each sampled frame (``seq >= 0``) with its scalars and per-head matrices, the
  scalars-only *history* rows (``seq = -(step + 1)``, see :mod:`.ingest`) folded back into
  the ``history`` of the frame that carried them, and the run's end frame when it finished.
  Replayed into another store, every frame row comes back with its rank, seq, step, time
  and values: a history row with its seq, because it travels as history (a frame of its own
  would need a seq >= 0, and would become a sampled frame there); with its time, because
  ingest stamps a history row with its carrier's time, and the carrier chosen here is a
  sampled frame of the same rank, at a later step, *with that time*. Values are the stored
  float32s, written as the float64 numbers they are exactly (non-finite ones as the wire's
  strings), so they are stored again bit for bit.
* **long rows** (:func:`csv_rows`): ``step, rank, metric, layer, head, value``, one per
  stored value, history steps included, for pandas.

Frames are read a chunk at a time in (rank, step, seq) order: keyset pages on the
``(run_id, rank, step)`` index, each page's values by ``points.frame_id``; a page holds at
most :data:`CHUNK_BYTES` of values, so a run of a million frames costs one page of memory.

What the wire cannot carry: a per-head metric's envelope (``name#max``, the max over heads
that ingest computes from the matrix) is recomputed on ingest, so where retention thinned a
frame's matrices away the copy has no envelope for that frame (:attr:`RunExport.thinned`
counts them); a history row that no sampled frame of its time carries (a store's odd past:
no such row arises from the client) has no frame to travel with (:attr:`RunExport.left_out`).
The run's configuration, tags and status travel in the file's header line (:func:`header`),
whose configuration and tags ``replay`` applies to the copy.
"""

from __future__ import annotations

import struct
import time as _time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point, Run, RunTag
from logitwatch.server.errors import NotFound
from logitwatch.server.store.ingest import ENVELOPE
from logitwatch.server.store.lifecycle import run_status
from logitwatch.server.store.pruning import prune_frames, prune_points, run_bounds
from logitwatch.wire import MAX_HISTORY_SERIES, MAX_HISTORY_STEPS, encode_float

__all__ = ["CHUNK_BYTES", "EXPORT_VERSION", "ExportError", "RunExport", "Series",
           "StoredFrame", "count_frames", "csv_rows", "end_frame", "header", "prepare",
           "stored_frames", "wire_frames"]

#: The header line's ``logitwatch_export`` value: the version of what this module writes.
EXPORT_VERSION = 1
#: Most bytes of stored values one page of frames reads (and holds) at once.
CHUNK_BYTES = 16 << 20
#: Most frames a page reads, however small they are.
MAX_CHUNK = 512
#: History rows held while waiting for the sampled frame that carries them; past it the
#: oldest are given up as left out (:attr:`RunExport.left_out`). A carrier follows its
#: history within a frame or two, so only rows no frame carries ever pile up.
MAX_PENDING = 4 * MAX_HISTORY_STEPS

_F32 = struct.Struct("<f")


class ExportError(ValueError):
    """A filter that names nothing of the run (a rank it has no frame of, an unknown
    metric)."""


@dataclass(frozen=True, slots=True)
class Series:
    """One stored metric of the run: a scalar (``layers == heads == 0``) or a matrix."""

    id: int
    name: str
    layers: int
    heads: int


@dataclass(slots=True)
class RunExport:
    """What one export reads (:func:`prepare`), and what it found on the way."""

    run_id: int
    project: str
    name: str
    #: the ranks exported, ascending
    ranks: list[int]
    #: the series exported, by name (envelopes excluded: ingest recomputes them)
    series: list[Series]
    #: envelope metric id -> the id of its matrix series (to tell thinned frames)
    envelopes: dict[int, int]
    #: every series of the run was asked for (no ``metrics`` filter)
    whole: bool = True
    #: sampled frames and history steps written so far (:func:`wire_frames`)
    frames: int = 0
    history_steps: int = 0
    #: history steps no sampled frame of their rank and time carried (not in the file)
    left_out: int = 0
    #: matrices retention thinned away, whose envelope the file cannot carry
    thinned: int = 0
    #: whether the run's end frame was written
    ended: bool = False
    by_id: dict[int, Series] = field(default_factory=dict)


@dataclass(slots=True)
class StoredFrame:
    """One frame row: a sampled frame (``seq >= 0``) or a history step (``seq < 0``), with
    its values (stored float32 blobs) by metric id."""

    rank: int
    seq: int
    step: int
    time: float
    values: dict[int, bytes]


def prepare(session: Session, run_id: int, *, ranks: Sequence[int] | None = None,
            metrics: Sequence[str] | None = None) -> RunExport:
    """The export of run ``run_id``: its ranks (or ``ranks``), its series (or those named
    in ``metrics``).

    Raises:
        NotFound: no run ``run_id``.
        ExportError: a rank of ``ranks`` has no frame in the run, or a name of ``metrics``
            is not one of its series.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    where = f"run {run.project}/{run.name}"
    have = _ranks(session, run_id)
    if ranks is not None:
        missing = sorted(set(ranks) - set(have))
        if missing:
            raise ExportError(f"{where} has no frame of rank {_listed(missing)} (its ranks: "
                              f"{_listed(have) or 'none'})")
        have = sorted(set(ranks))
    rows = session.execute(select(Metric.id, Metric.name, Metric.layers, Metric.heads)
                           .where(Metric.run_id == run_id).order_by(Metric.name)).all()
    visible = [Series(r.id, r.name, r.layers, r.heads) for r in rows
               if not r.name.endswith(ENVELOPE)]
    chosen = visible
    if metrics is not None:
        names = {s.name for s in visible}
        unknown = [m for m in dict.fromkeys(metrics) if m not in names]
        if unknown:
            raise ExportError(f"{where} has no metric {_listed(unknown, quote=True)} (its "
                              f"metrics: {_listed(sorted(names), quote=True) or 'none'})")
        chosen = [s for s in visible if s.name in set(metrics)]
    by_name = {s.name: s.id for s in chosen if s.layers}
    envelopes = {r.id: by_name[r.name[:-len(ENVELOPE)]] for r in rows
                 if r.name.endswith(ENVELOPE) and r.name[:-len(ENVELOPE)] in by_name}
    return RunExport(run_id=run_id, project=run.project, name=run.name, ranks=have,
                     series=chosen, envelopes=envelopes, whole=len(chosen) == len(visible),
                     by_id={s.id: s for s in chosen})


def _listed(items: Sequence[object], *, quote: bool = False, most: int = 12) -> str:
    shown = [repr(x) if quote else str(x) for x in items[:most]]
    return ", ".join(shown) + (f" and {len(items) - most} more" if len(items) > most else "")


def _ranks(session: Session, run_id: int) -> list[int]:
    """The run's ranks, ascending: one index probe each (``min(rank) > r``), not a scan of
    its frames."""
    out: list[int] = []
    while True:
        q = select(func.min(Frame.rank)).where(Frame.run_id == run_id)
        if out:
            q = q.where(Frame.rank > out[-1])
        r = session.scalar(q)
        if r is None:
            return out
        out.append(int(r))


def count_frames(session: Session, export: RunExport, *, sampled_only: bool) -> int:
    """How many frame rows :func:`stored_frames` reads (``sampled_only``: the sampled
    frames, what :func:`wire_frames` writes a line each for)."""
    q = select(func.count()).select_from(Frame).where(Frame.run_id == export.run_id,
                                                      Frame.rank.in_(export.ranks))
    if sampled_only:
        q = q.where(Frame.seq >= 0)
    return int(session.scalar(prune_frames(q, run_bounds(session, export.run_id))) or 0)


def _page_size(export: RunExport) -> int:
    """Frames a page reads: as many as :data:`CHUNK_BYTES` of values hold, at most
    :data:`MAX_CHUNK`, at least one."""
    width = sum(4 * max(1, s.layers * s.heads) for s in export.series) + 4 * len(
        export.envelopes)
    return max(1, min(MAX_CHUNK, CHUNK_BYTES // max(width, 1)))


def stored_frames(session: Session, export: RunExport, *,
                  chunk: int | None = None) -> Iterator[StoredFrame]:
    """Every frame row of the export's ranks, in (rank, step, seq) order, a page of
    ``chunk`` frames (default :func:`_page_size`) at a time, with the values of its
    series (and envelopes) that are stored."""
    chunk = chunk or _page_size(export)
    bounds = run_bounds(session, export.run_id)
    ids = [*export.by_id, *export.envelopes]
    conn = session.connection()
    for rank in export.ranks:
        after: tuple[int, int] | None = None
        while True:
            q = select(Frame.id, Frame.seq, Frame.step, Frame.time).where(
                Frame.run_id == export.run_id, Frame.rank == rank)
            if after is not None:  # keyset: past (step, seq), a range on the index's step
                q = q.where(Frame.step >= after[0],
                            or_(Frame.step > after[0], Frame.seq > after[1]))
            rows = conn.execute(prune_frames(q, bounds).order_by(Frame.step, Frame.seq)
                                .limit(chunk)).all()
            if not rows:
                break
            values = _values(session, [r.id for r in rows], None if export.whole else ids,
                             (min(r.time for r in rows), max(r.time for r in rows))
                             if bounds is not None else None)
            for r in rows:
                yield StoredFrame(rank, int(r.seq), int(r.step), float(r.time),
                                  values.get(r.id, {}))
            if len(rows) < chunk:
                break
            after = (int(rows[-1].step), int(rows[-1].seq))


def _values(session: Session, frame_ids: list[int], metric_ids: list[int] | None,
            bounds: tuple[float, float] | None) -> dict[int, dict[int, bytes]]:
    """The stored blobs of ``frame_ids`` (of ``metric_ids`` only, unless None), by frame
    id then metric id. ``bounds``: the page's time range, which prunes the partitions of
    a PostgreSQL store partitioned by time to the page's days."""
    q = select(Point.frame_id, Point.metric_id, Point.data).where(
        Point.frame_id.in_(frame_ids))
    if metric_ids is not None:
        q = q.where(Point.metric_id.in_(metric_ids))
    out: dict[int, dict[int, bytes]] = {}
    for fid, mid, data in session.connection().execute(prune_points(q, bounds)):
        out.setdefault(fid, {})[mid] = bytes(data)
    return out


def _scalar(blob: bytes) -> float | str:
    return encode_float(_F32.unpack(blob)[0])


def _matrix(blob: bytes, s: Series) -> list[list[Any]]:
    """A stored matrix as wire rows: the float32 values as the float64s they are exactly
    (parsed back and cast to float32 they are the same bits), non-finite ones as strings."""
    a = np.frombuffer(blob, dtype="<f4").astype(np.float64).reshape(s.layers, s.heads)
    if np.isfinite(a).all():
        return a.tolist()  # type: ignore[no-any-return]
    return [[encode_float(x) for x in row] for row in a.tolist()]


def _sampled(f: StoredFrame, export: RunExport, history: list[StoredFrame]) -> dict[str, Any]:
    """The wire frame of sampled frame ``f``, carrying ``history``."""
    scalars: dict[str, float | str] = {}
    heads: dict[str, list[list[Any]]] = {}
    for mid, blob in f.values.items():
        s = export.by_id.get(mid)
        if s is None:
            continue  # an envelope
        if s.layers:
            heads[s.name] = _matrix(blob, s)
        else:
            scalars[s.name] = _scalar(blob)
    for env, mid in export.envelopes.items():
        if env in f.values and mid not in f.values:
            export.thinned += 1
    frame: dict[str, Any] = {"run": export.name, "project": export.project, "rank": f.rank,
                             "seq": f.seq, "step": f.step, "time": f.time,
                             "scalars": dict(sorted(scalars.items())),
                             "heads": dict(sorted(heads.items()))}
    if history:
        names = sorted({export.by_id[m].name for h in history for m in h.values})
        ids = {export.by_id[m].name: m for h in history for m in h.values}
        frame["history"] = {
            "steps": [h.step for h in history],
            "scalars": {n: [_scalar(h.values[ids[n]]) if ids[n] in h.values else None
                            for h in history] for n in names},
        }
    return frame


class _Pending:
    """A rank's history rows waiting for their carrier, by time in arrival (step) order."""

    def __init__(self, export: RunExport) -> None:
        self.export = export
        self.by_time: OrderedDict[float, list[StoredFrame]] = OrderedDict()
        self.size = 0

    def add(self, h: StoredFrame) -> None:
        self.by_time.setdefault(h.time, []).append(h)
        self.size += 1
        while self.size > MAX_PENDING:  # the oldest time's rows: no frame carried them
            _, old = self.by_time.popitem(last=False)
            self.size -= len(old)
            self.export.left_out += len(old)

    def carry(self, f: StoredFrame) -> list[StoredFrame]:
        """The waiting rows that sampled frame ``f`` carries: its time, steps before its
        own, as many as one frame's history may hold (the rest wait on)."""
        rows = self.by_time.get(f.time)
        if not rows:
            return []
        taken: list[StoredFrame] = []
        names: set[int] = set()
        kept: list[StoredFrame] = []
        for h in rows:
            fits = (h.step < f.step and len(taken) < MAX_HISTORY_STEPS
                    and len(names | h.values.keys()) <= MAX_HISTORY_SERIES)
            if fits:
                taken.append(h)
                names |= h.values.keys()
            else:
                kept.append(h)
        if kept:
            self.by_time[f.time] = kept
        else:
            del self.by_time[f.time]
        self.size -= len(taken)
        return taken

    def drop(self) -> None:
        """The rank ends: what still waits has no frame to travel with."""
        self.export.left_out += self.size
        self.by_time.clear()
        self.size = 0


def wire_frames(session: Session, export: RunExport, *,
                chunk: int | None = None) -> Iterator[dict[str, Any]]:
    """The export's wire frames, in (rank, step, seq) order, then its end frame (when the
    run finished and rank 0 is exported): what ``logitwatch replay`` reads, one a line.

    Each history row travels in the ``history`` of the first sampled frame of its rank that
    comes after it with its time (module docstring). Counts what it writes, leaves out and
    cannot carry in ``export`` (``frames``, ``history_steps``, ``left_out``, ``thinned``,
    ``ended``) as it goes."""
    pending = _Pending(export)
    rank: int | None = None
    for f in stored_frames(session, export, chunk=chunk):
        if f.rank != rank:
            pending.drop()
            rank = f.rank
        if f.seq < 0:
            if f.values:  # a step without a value of the chosen series is not stored
                pending.add(f)
            continue
        history = pending.carry(f)
        export.frames += 1
        export.history_steps += len(history)
        yield _sampled(f, export, history)
    pending.drop()
    end = end_frame(session, export)
    if end is not None:
        export.ended = True
        yield end


def end_frame(session: Session, export: RunExport) -> dict[str, Any] | None:
    """The end frame that finished the run (rank 0's, as stored: its seq, step and time),
    or None when the run is not finished or rank 0 is not exported."""
    run = session.get(Run, export.run_id)
    if (run is None or run.status != "finished" or run.end_seq is None
            or 0 not in export.ranks):
        return None
    return {"run": export.name, "project": export.project, "rank": 0, "seq": run.end_seq,
            "step": run.end_step, "time": run.ended_at, "end": "finished"}


def header(session: Session, export: RunExport, *, frames: int) -> dict[str, Any]:
    """The file's first line: what the run is beyond its frames (configuration, tags,
    status), for a person or a tool; ``replay`` applies its configuration and tags (it has
    no ``seq``: no frame). ``frames``: the sampled frames that follow."""
    run = session.get(Run, export.run_id)
    assert run is not None
    tags = list(session.scalars(select(RunTag.tag).where(RunTag.run_id == export.run_id)
                                .order_by(RunTag.tag)))
    return {"logitwatch_export": EXPORT_VERSION, "project": run.project, "run": run.name,
            "run_id": run.id, "status": run_status(run), "created_at": run.created_at,
            "last_step": run.last_step, "end_step": run.end_step,
            "diverged_step": run.diverged_step, "config": run.config or {}, "tags": tags,
            "ranks": export.ranks, "metrics": [s.name for s in export.series],
            "frames": frames, "exported_at": _time.time()}


#: The long format's columns (:func:`csv_rows`).
CSV_COLUMNS = ("step", "rank", "metric", "layer", "head", "value")


def csv_rows(session: Session, export: RunExport, *,
             chunk: int | None = None) -> Iterator[list[list[Any]]]:
    """The export as long rows ``[step, rank, metric, layer, head, value]``, a list per
    frame row (sampled or history), in (rank, step, seq) order and by metric name within
    it; a scalar's layer and head are empty, a value is a float or the wire's string for a
    non-finite one. Counts frames, history steps and thinned matrices in ``export``."""
    for f in stored_frames(session, export, chunk=chunk):
        if f.seq < 0:
            export.history_steps += 1
        else:
            export.frames += 1
            for env, mid in export.envelopes.items():
                if env in f.values and mid not in f.values:
                    export.thinned += 1
        out: list[list[Any]] = []
        for s in export.series:  # by name
            blob = f.values.get(s.id)
            if blob is None:
                continue
            if not s.layers:
                out.append([f.step, f.rank, s.name, "", "", _scalar(blob)])
                continue
            for layer, row in enumerate(_matrix(blob, s)):
                out.extend([f.step, f.rank, s.name, layer, head, v]
                           for head, v in enumerate(row))
        yield out
