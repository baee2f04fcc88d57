"""The alert engine's memory of each (run, rank): what it holds, how it stays bounded, and
how it is rebuilt from the store.

:class:`RankState` owns the containers, all keyed by (run, rank) first: per-cell rule
memory and lifecycle (``_mem``, ``_tracks``, or ``_cells_of`` for a screened per-head rule),
per-head statistics waiting to be judged (``_thin``), the last clip threshold a rank said
(``_sticky``), the loss-rise and level trackers downgrades and ``Page.recover_within`` read
(``_loss``, ``_levels``: :mod:`.loss_levels`), the open alerts stored below their rule's
severity (``_down``), and which (run, rank)s are loaded and when they last sent a frame
(``_loaded``, ``_seen``). :meth:`RankState._evict` forgets the idle and least recently seen
ones; the engine rebuilds such a (run, rank), as after a restart, by replaying
:meth:`RankState._stored_frames` through its rules, putting back what the replay cannot
rebuild (the whole-run rule memory, :mod:`.rule_memory`), and then lining the lifecycles up
with the alerts the store holds open (:meth:`RankState._resume`).

The trackers of :mod:`.loss_levels` and the rule memory of :mod:`.rule_memory` are
re-exported here, where the engine's modules import them from.
"""

from __future__ import annotations

import time as _time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.alerts.loss_levels import (  # noqa: F401  (re-exported)
    LOSS_MIN_SAMPLES,
    RECOVER_MIN_SAMPLES,
    _Level,
    _level_key,
    _loss_key,
    _LossRise,
)
from logitwatch.server.alerts.rule_memory import (  # noqa: F401  (re-exported)
    LONG_EXTRA,
    RuleMemoryMixin,
    _fingerprint,
)
from logitwatch.server.alerts.rules import (
    KINDS,
    CellMemory,
    Memory,
    RuleSpec,
    State,
    Track,
)
from logitwatch.server.alerts.spec import SERIES_PARAMS
from logitwatch.server.db.models import Alert, Frame, Metric, Point

__all__ = [
    "HEAD_EVERY",
    "IDLE_SECONDS",
    "LOSS_MIN_SAMPLES",
    "MAX_RANKS",
    "RESTORE_FRAMES",
    "STICKY",
    "Cell",
    "Key",
    "RankState",
]

Cell = tuple[int | None, int | None]  # (layer, head), (None, None) for a run-level series
Key = tuple[str, int, int, int | None, int | None]  # rule, run_id, rank, layer, head

RESTORE_FRAMES = 400  # frames of history replayed to rebuild state after a restart
#: The run's first steps replayed too (its early baselines: every cell's first
#: ``EARLY_MAX`` samples, per-head cells judged once every ``HEAD_EVERY`` steps).
RESTORE_FIRST_STEPS = 320
#: In-memory state is kept for this many (run, rank)s at most, and dropped after this many
#: seconds without a frame (rebuilt from the store if it comes back).
MAX_RANKS = 2000
IDLE_SECONDS = 1800.0
#: Per-head statistics are judged at most once every this many steps (what the frames in
#: between held is folded in: max, or min for entropies): a job that samples every step
#: costs the engine what one sampling every 10 steps does, and per-head windows (in steps)
#: hold the same number of samples at any interval up to this one.
HEAD_EVERY = 10
STICKY = "grad.max_norm"  # a scalar of sampled frames that holds for the steps after them


@dataclass(slots=True)
class _Cells:
    """All cells of one screened per-head rule on one (run, rank)."""

    mem: CellMemory
    judged: np.ndarray  # cells whose detector gave a verdict once (the per-cell path's Tracks)
    tracks: dict[tuple[int, int], Track]  # cells whose lifecycle is not at rest
    calm: np.ndarray  # Track.calm of the cells at rest (a resolved one keeps its count)

    def track(self, cell: tuple[int, int]) -> Track:
        """The cell's Track, as the per-cell path holds it (at rest: rebuilt)."""
        t = self.tracks.get(cell)
        if t is None:
            t = self.tracks[cell] = Track(calm=int(self.calm[cell]))
        return t

    def settle(self, cell: tuple[int, int]) -> None:
        """Drop the cell's Track if it is at rest (then a rebuilt one behaves the same)."""
        t = self.tracks[cell]
        if t.streak == 0 and t.state in (State.INACTIVE, State.RESOLVED):
            self.calm[cell] = t.calm
            del self.tracks[cell]


@dataclass(slots=True)
class _Thin:
    """Per-head statistics of one (run, rank) waiting to be judged: the engine judges them
    at most once every ``head_every`` steps, on what the frames since the last judgement
    held at their worst (max of maxima, min of entropies)."""

    last: int | None = None
    acc: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(slots=True)
class _Down:
    """The open alerts of one (run, rank) stored downgraded, by (rule, layer)."""

    keys: set[tuple[str, int | None]] = field(default_factory=set)


class RankState(RuleMemoryMixin):
    """The per-(run, rank) state of an alert engine (see the module's docstring).

    The engine sets ``_rules`` (the rule set in force), which :meth:`_stored_frames`,
    :meth:`_resume` and the rule memory (:class:`~.rule_memory.RuleMemoryMixin`) read.
    """

    _rules: list[RuleSpec]

    def __init__(self, *, max_ranks: int, idle_seconds: float) -> None:
        self._max_ranks = max(0, int(max_ranks))
        self._idle_seconds = float(idle_seconds)
        # (run_id, rank) -> when it last sent a frame (monotonic), least recent first
        self._seen: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._thin: dict[tuple[int, int], _Thin] = {}
        self._sticky: dict[tuple[int, int], float] = {}  # the last grad.max_norm a rank said
        # run_id, rank, loss window, recover span (0: none)
        self._loss: dict[tuple[int, int, int, int], _LossRise] = {}
        # run_id, rank, metric, steps: the levels Page.recover_within reads
        self._levels: dict[tuple[int, int, str, int], _Level] = {}
        self._down: dict[tuple[int, int], _Down] = {}  # open downgraded alerts
        self._mem: dict[Key, Memory] = {}
        self._tracks: dict[Key, Track] = {}
        self._cells_of: dict[tuple[str, int, int], _Cells] = {}  # rule, run_id, rank
        self._per_cell: set[tuple[str, int, int]] = set()  # screened rules gone per cell
        # (rule, run, rank) whose rule raised there: skipped until the rules change
        self._broken: set[tuple[str, int, int]] = set()
        self._loaded: set[tuple[int, int]] = set()
        # (run_id, rank) -> the rule_memory text last written or read (written on change)
        self._saved: dict[tuple[int, int], str] = {}
        # (run_id, rank) -> the highest seq and step judged: a frame numbered before the
        # one at a step at or below the other (an old spool pushed after newer frames) is
        # stored but not judged against newer memory
        self._newest_seq: dict[tuple[int, int], tuple[int, int]] = {}
        # run_id -> the run's created_at as first seen (a deleted run's id reused: another)
        self._created: dict[int, float] = {}

    def _clear_state(self) -> None:
        """Forget every (run, rank) (each is rebuilt from the store when it sends again)."""
        self._loss.clear()
        self._levels.clear()
        self._thin.clear()
        self._sticky.clear()
        self._down.clear()
        self._mem.clear()
        self._tracks.clear()
        self._cells_of.clear()
        self._per_cell.clear()
        self._broken.clear()
        self._loaded.clear()
        self._seen.clear()
        self._saved.clear()
        self._newest_seq.clear()
        self._created.clear()

    def _evict(self, seen: Iterable[tuple[int, int]], now: float | None = None) -> None:
        """Note that ``seen`` (run, rank)s sent frames now; forget every in-memory state
        of the (run, rank)s idle for ``idle_seconds`` and of the least recently seen past
        ``max_ranks``. Such a (run, rank) is rebuilt from the store
        (``AlertEngine._restore``) when it sends again, as after a restart, so memory stays
        bounded whatever the number of runs, and alerts are the same."""
        now = _time.monotonic() if now is None else now
        for key in seen:
            self._seen[key] = now
            self._seen.move_to_end(key)
        gone: set[tuple[int, int]] = set()
        for key, at in self._seen.items():
            if len(self._seen) - len(gone) <= self._max_ranks and now - at < self._idle_seconds:
                break
            gone.add(key)
        for key in gone:
            del self._seen[key]
        self._forget(gone)

    def _forget(self, gone: set[tuple[int, int]], *, late: bool = False) -> None:
        """Drop every in-memory state of the (run, rank)s ``gone``: each is rebuilt from the
        store when it sends again (``AlertEngine._restore``). ``late``: they got frames
        older than those judged; the highest seq judged is kept, so that the rest of such
        a spool is not judged either."""
        if not gone:
            return
        for key in gone:
            if not late:
                self._seen.pop(key, None)
                self._newest_seq.pop(key, None)
            self._loaded.discard(key)
            self._thin.pop(key, None)
            self._sticky.pop(key, None)
            self._down.pop(key, None)
            self._saved.pop(key, None)
        self._loss = {k: v for k, v in self._loss.items() if k[:2] not in gone}
        self._levels = {k: v for k, v in self._levels.items() if k[:2] not in gone}
        self._mem = {k: v for k, v in self._mem.items() if k[1:3] not in gone}
        self._tracks = {k: v for k, v in self._tracks.items() if k[1:3] not in gone}
        self._cells_of = {k: v for k, v in self._cells_of.items() if k[1:] not in gone}
        self._per_cell = {k for k in self._per_cell if k[1:] not in gone}
        self._broken = {k for k in self._broken if k[1:] not in gone}
        if not late:  # runs of which nothing is remembered need no creation time either
            live = {k[0] for k in self._seen}
            for run_id in {k[0] for k in gone} - live:
                self._created.pop(run_id, None)

    def _stored_frames(self, session: Session, run_id: int, rank: int, before_step: int
                       ) -> list[tuple[int, dict[str, float], dict[str, list[list[float]]]]]:
        """The stored history of (run, rank) before ``before_step`` that rebuilds its rule
        state, oldest first, as (step, scalars, heads) of the metrics the rules read; empty
        when there is none."""
        names = {r.metric for r in self._rules if r.enabled}
        for r in self._rules:
            if r.kind == "loss_jump":
                names |= {"lr", "grad.norm"}
            if r.downgrade is not None:
                names |= {r.downgrade.metric, "loss"}
                if r.downgrade.lr_climb is not None:
                    names.add("lr")
                if r.downgrade.capped_metric:
                    names.add(r.downgrade.capped_metric)
            if r.kind == "spike" and r.param("only_unclipped"):
                names |= {"grad.clipped", STICKY}
            # the series its kind's parameters name (spec.SERIES_PARAMS)
            for other in SERIES_PARAMS & KINDS[r.kind].defaults.keys():
                if r.param(other):
                    names.add(str(r.param(other)))
        metrics = session.execute(
            select(Metric.id, Metric.name, Metric.layers, Metric.heads)
            .where(Metric.run_id == run_id, Metric.name.in_(names))
        ).all()
        if not metrics:
            return []
        # the newest sampled frames, and every step's scalars (history rows, seq < 0) since
        # the oldest of them; and the run's first steps (its early baselines), the steps
        # between left out (what they did to the lowest levels is in rule_memory)
        frames = session.execute(
            select(Frame.id, Frame.step).where(Frame.run_id == run_id, Frame.rank == rank,
                                               Frame.step < before_step, Frame.seq >= 0)
            .order_by(Frame.step.desc()).limit(RESTORE_FRAMES)
        ).all()
        if not frames:
            return []
        history = session.execute(
            select(Frame.id, Frame.step).where(Frame.run_id == run_id, Frame.rank == rank,
                                               Frame.step < before_step, Frame.seq < 0,
                                               Frame.step >= frames[-1].step)
        ).all()
        early = []
        first = session.scalar(select(Frame.step).where(
            Frame.run_id == run_id, Frame.rank == rank).order_by(Frame.step).limit(1))
        if first is not None and first < frames[-1].step:
            end = min(first + RESTORE_FIRST_STEPS, frames[-1].step - 1, before_step - 1)
            early = session.execute(
                select(Frame.id, Frame.step).where(Frame.run_id == run_id, Frame.rank == rank,
                                                   Frame.step <= end)
                .order_by(Frame.step).limit(RESTORE_FRAMES + RESTORE_FIRST_STEPS)
            ).all()
        frames = sorted({r.id: r for r in [*frames, *history, *early]}.values(),
                        key=lambda r: r.step, reverse=True)
        by_id = {m.id: m for m in metrics}
        values: dict[int, tuple[dict[str, float], dict[str, list[list[float]]]]] = {
            fid: ({}, {}) for fid, _ in frames
        }
        ids = list(values)
        rows = [row for i in range(0, len(ids), 5000) for row in session.execute(
            select(Point.frame_id, Point.metric_id, Point.data)
            .where(Point.frame_id.in_(ids[i:i + 5000]), Point.metric_id.in_(list(by_id)))
        ).all()]
        for fid, mid, data in rows:
            m = by_id[mid]
            arr = np.frombuffer(data, dtype="<f4").astype(float)
            if m.layers:
                values[fid][1][m.name] = arr.reshape(m.layers, m.heads).tolist()
            else:
                values[fid][0][m.name] = float(arr[0])
        return [(step, *values[fid]) for fid, step in reversed(frames)]

    def _resume(self, session: Session, run_id: int, rank: int) -> None:
        """Line the replayed lifecycles of (run, rank) up with the alerts the store holds
        open: a cell of an open alert is firing, since the alert started; a firing one
        whose alert is not open resolved. Open alerts stored below their rule's severity
        wait to escalate again."""
        open_alerts = session.scalars(
            select(Alert).where(Alert.run_id == run_id, Alert.rank == rank,
                                Alert.state == State.FIRING.value)
        ).all()
        firing = {(a.rule, a.layer): a for a in open_alerts}
        severity = {r.name: r.severity for r in self._rules}
        down = _Down({(a.rule, a.layer) for a in open_alerts
                      if ("downgraded" in (a.evidence or {}) or "page" in (a.evidence or {}))
                      and a.severity != severity.get(a.rule, a.severity)})
        if down.keys:
            self._down[(run_id, rank)] = down
        for key, track in self._tracks.items():
            rule, rid, rk, layer, head = key
            if (rid, rk) != (run_id, rank):
                continue
            a = firing.get((rule, layer))
            active = a is not None and (
                head is None or head in (a.evidence.get("active_heads") or a.heads or [])
            )
            if active:
                assert a is not None
                track.state, track.started_step, track.streak = (State.FIRING,
                                                                 a.started_step, 0)
            elif track.state is State.FIRING:
                track.state = State.RESOLVED  # its alert was resolved (or never stored)
        for (rule, rid, rk), c in self._cells_of.items():
            if (rid, rk) != (run_id, rank):
                continue
            for (r_name, layer), a in firing.items():
                if r_name != rule or layer is None or not 0 <= layer < c.mem.shape[0]:
                    continue
                for head in a.evidence.get("active_heads") or a.heads or []:
                    if (isinstance(head, int) and 0 <= head < c.mem.shape[1]
                            and (c.judged[layer, head] or (layer, head) in c.tracks)):
                        track = c.track((layer, head))
                        track.state, track.started_step, track.streak = (State.FIRING,
                                                                         a.started_step, 0)
            for cell, track in list(c.tracks.items()):
                a = firing.get((rule, cell[0]))
                active = a is not None and cell[1] in (
                    a.evidence.get("active_heads") or a.heads or [])
                if not active and track.state is State.FIRING:
                    track.state = State.RESOLVED
                c.settle(cell)
