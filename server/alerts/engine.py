"""The alert engine: runs the rules over newly stored frames and persists alerts.

``AlertEngine.process(session, new_frames)`` is called inside the ingest transaction. Rule
memory and lifecycle live in memory per (rule, run, rank, layer, head); when the engine
meets a (run, rank) for the first time (a fresh process, or after a collector restart) it
rebuilds them by replaying the stored history silently, so a restart resumes where it
stopped and never fires twice.

Around the pure rules (:mod:`.rules`) the engine adds:

* grouping: heads of one layer that fire under one rule share one alert (``heads``), the
  first head named as where the trouble started;
* inhibition: while a rule with ``inhibits`` (the run-level divergence alert) fires on a
  rank, new alerts of the other rules on that rank (per-head ones above all) are stored
  ``suppressed="inhibited"``;
* silences: an alert matching an active silence is stored ``suppressed="silenced"``;
* no data: :meth:`AlertEngine.check_stale` fires ``no_data`` for runs that stopped
  reporting, and the next frame of the run resolves it;
* hold (``keep_firing_for``): a breach within the hold of a firing alert updates that alert
  (value, evidence, ``evidence.reopened``) instead of creating one, and is not notified;
* downgrade (:class:`~.rules.Downgrade`): an alert that fires while its rule's downgrade
  holds on the frame (a wide attention dtype, no loss-side harm) is stored with the lower
  severity and says why; a later frame of the same episode without it escalates the alert.

Suppressed alerts are not returned by :meth:`process`, so they are neither notified nor
streamed as new.

Cost: a per-head rule whose kind has a whole-matrix screen (:data:`~.rules.SCREENS`) keeps
its cells' memory in arrays (:class:`~.rules.CellMemory`) and judges all layers x heads of
a sample with numpy; only the cells the screen cannot clear (near or past their limit, or
with a pending/firing lifecycle) go through the rule's own detector, so the decisions are
the per-cell ones. Other rules run per cell.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time as _time
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

import numpy as np
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.rules import (
    KINDS,
    SCREENS,
    CellMemory,
    FrameView,
    Memory,
    Page,
    RuleSpec,
    State,
    Track,
    Transition,
    Verdict,
    remedies_for,
)
from logitwatch.server.db.models import Alert, Frame, Metric, Point, Run, Silence
from logitwatch.server.store.ingest import NewFrame

__all__ = ["AlertEngine"]

log = logging.getLogger("logitwatch.alerts")

Cell = tuple[int | None, int | None]  # (layer, head), (None, None) for a run-level series
Key = tuple[str, int, int, int | None, int | None]  # rule, run_id, rank, layer, head

RESTORE_FRAMES = 400  # frames of history replayed to rebuild state after a restart
#: In-memory state is kept for this many (run, rank)s at most, and dropped after this many
#: seconds without a frame (rebuilt from the store if it comes back).
MAX_RANKS = 2000
IDLE_SECONDS = 1800.0
#: Per-head statistics are judged at most once every this many steps (what the frames in
#: between held is folded in: max, or min for entropies): a job that samples every step
#: costs the engine what one sampling every 10 steps does, and per-head windows (in steps)
#: hold the same number of samples at any interval up to this one.
HEAD_EVERY = 10
LOSS_MIN_SAMPLES = 5  # the fewest loss samples a downgrade's loss median is taken over
STICKY = "grad.max_norm"  # a scalar of sampled frames that holds for the steps after them
MAX_BREACHES = 20  # re-breaches within a hold kept in an alert's evidence (the newest)
PAGING = ("warning", "critical")  # severities that page: an alert's paged_step


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
class _Pending:
    rule: RuleSpec
    layer: int | None
    heads: list[int]
    transition: Transition
    severity: str = ""  # the alert's severity when it fires (a downgrade may lower it)
    downgraded: dict[str, object] | None = None  # why, when it was lowered
    unpaged: dict[str, object] | None = None  # what would page it, while its Page holds it


@dataclass(slots=True)
class _LossRise:
    """How far the median of the loss over the last ``span`` steps sits above the lowest
    such median of the run (a run's loss-side harm, for :class:`~.rules.Downgrade`). At a
    wide sampling interval without every-step history the median takes the newest
    :data:`LOSS_MIN_SAMPLES` samples; it counts once the run has ``span`` steps of loss."""

    span: int
    recent: deque[tuple[int, float]] = field(default_factory=deque)
    first: int | None = None
    best: float = math.inf
    rise: float = 0.0

    def push(self, step: int, v: float | None) -> None:
        if v is None:
            return
        if not math.isfinite(v):
            self.rise = math.inf  # a non-finite loss is harm
            return
        if self.first is None:
            self.first = step
        self.recent.append((step, v))
        while (len(self.recent) > LOSS_MIN_SAMPLES
               and self.recent[0][0] <= step - self.span):
            self.recent.popleft()
        if len(self.recent) >= LOSS_MIN_SAMPLES and step - self.first >= self.span - 1:
            m = median(x for _, x in self.recent)
            self.best = min(self.best, m)
            self.rise = m - self.best
        else:
            self.rise = 0.0


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


class AlertEngine:
    """Evaluates the rules for every new frame, inside the ingest transaction.

    Args:
        rules: The rule set (default :data:`~.defaults.DEFAULT_RULES`).
        screen: Judge per-head rules with the whole-matrix screens (default); False runs
            every cell through its detector (the reference the screens must equal).
    """

    def __init__(self, rules: Iterable[RuleSpec] | None = None, *, screen: bool = True,
                 head_every: int = HEAD_EVERY, max_ranks: int = MAX_RANKS,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self._max_ranks = max(0, int(max_ranks))
        self._idle_seconds = float(idle_seconds)
        # (run_id, rank) -> when it last sent a frame (monotonic), least recent first
        self._seen: OrderedDict[tuple[int, int], float] = OrderedDict()
        self._rules: list[RuleSpec] = list(DEFAULT_RULES if rules is None else rules)
        self._screen = screen
        self._head_every = max(1, int(head_every))
        self._thin: dict[tuple[int, int], _Thin] = {}
        self._sticky: dict[tuple[int, int], float] = {}  # the last grad.max_norm a rank said
        self._loss: dict[tuple[int, int, int], _LossRise] = {}  # run_id, rank, window
        self._down: dict[tuple[int, int], _Down] = {}  # open downgraded alerts
        self._mem: dict[Key, Memory] = {}
        self._tracks: dict[Key, Track] = {}
        self._cells_of: dict[tuple[str, int, int], _Cells] = {}  # rule, run_id, rank
        self._per_cell: set[tuple[str, int, int]] = set()  # screened rules gone per cell
        self._broken: set[str] = set()  # rules that raised: skipped until the rules change
        self._loaded: set[tuple[int, int]] = set()
        self._lock = threading.RLock()

    @property
    def rules(self) -> list[RuleSpec]:
        """The rules in force (a copy)."""
        return list(self._rules)

    def set_rules(self, rules: Iterable[RuleSpec]) -> None:
        """Replace the rule set; memory of changed rules starts over (rebuilt from the store)."""
        with self._lock:
            self._rules = list(rules)
            self._loss.clear()
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

    # -- ingest ------------------------------------------------------------------------------

    def process(self, session: Session, frames: Sequence[NewFrame]) -> list[Alert]:
        """Advance the rules over ``frames`` (in step order); return alerts created or
        changed that people should hear about (suppressed ones are stored, not returned)."""
        changed: list[Alert] = []
        with self._lock:
            seen_runs: set[int] = set()
            for f in sorted(frames, key=lambda f: (f.run_id, f.rank, f.step)):
                if (f.run_id, f.rank) not in self._loaded:
                    self._restore(session, f.run_id, f.rank, before_step=f.step)
                if f.run_id not in seen_runs:  # the run's first frame resolves no_data
                    seen_runs.add(f.run_id)
                    changed.extend(self._resolve_no_data(session, f))
                pending = self._advance(f.run_id, f.rank, f.step, f.scalars, f.heads)
                changed.extend(self._persist(session, f, pending))
                if self._down.get((f.run_id, f.rank)):
                    changed.extend(self._escalate(session, f))
            self._evict({(f.run_id, f.rank) for f in frames})
        return changed

    def _evict(self, seen: Iterable[tuple[int, int]], now: float | None = None) -> None:
        """Note that ``seen`` (run, rank)s sent frames now; forget every in-memory state
        of the (run, rank)s idle for ``idle_seconds`` and of the least recently seen past
        ``max_ranks``. Such a (run, rank) is rebuilt from the store (:meth:`_restore`) when
        it sends again, as after a restart, so memory stays bounded whatever the number
        of runs, and alerts are the same."""
        now = _time.monotonic() if now is None else now
        for key in seen:
            self._seen[key] = now
            self._seen.move_to_end(key)
        gone: set[tuple[int, int]] = set()
        for key, at in self._seen.items():
            if len(self._seen) - len(gone) <= self._max_ranks and now - at < self._idle_seconds:
                break
            gone.add(key)
        if not gone:
            return
        for key in gone:
            del self._seen[key]
            self._loaded.discard(key)
            self._thin.pop(key, None)
            self._sticky.pop(key, None)
            self._down.pop(key, None)
        self._loss = {k: v for k, v in self._loss.items() if k[:2] not in gone}
        self._mem = {k: v for k, v in self._mem.items() if k[1:3] not in gone}
        self._tracks = {k: v for k, v in self._tracks.items() if k[1:3] not in gone}
        self._cells_of = {k: v for k, v in self._cells_of.items() if k[1:] not in gone}
        self._per_cell = {k for k in self._per_cell if k[1:] not in gone}

    # -- downgrade -------------------------------------------------------------------------

    def _track_loss(self, run_id: int, rank: int, step: int,
                    scalars: dict[str, float]) -> None:
        """Advance the loss-rise trackers the rules' downgrades read (every frame)."""
        loss = scalars.get("loss")
        seen: set[tuple[int, int, int]] = set()
        for r in self._rules:
            d = r.downgrade
            if d is None or d.loss_rise is None or not r.enabled:
                continue
            key = (run_id, rank, d.loss_window)
            if key in seen:
                continue
            seen.add(key)
            lr = self._loss.get(key)
            if lr is None:
                lr = self._loss[key] = _LossRise(d.loss_window)
            lr.push(step, None if loss is None else float(loss))

    def _downgrade(self, rule: RuleSpec, run_id: int, rank: int,
                   fv: FrameView) -> dict[str, object] | None:
        """Why this frame lowers ``rule``'s severity, or None when it does not."""
        d = rule.downgrade
        if d is None:
            return None
        x = fv.get(d.metric)
        capped = d.capped_metric is not None and d.capped_metric in fv.heads
        if not capped and (x is None or not x > d.above):
            return None  # no word on the dtype, or one that can overflow: as severe as ever
        why: dict[str, object] = {"from": rule.severity, "to": d.to, "metric": d.metric,
                                  "value": _json(x), "above": d.above}
        if capped:
            why["capped_metric"] = d.capped_metric
        if d.loss_rise is not None:
            lr = self._loss.get((run_id, rank, d.loss_window))
            rise = 0.0 if lr is None else lr.rise
            if rise >= d.loss_rise:
                return None  # the loss shows harm
            why.update(loss_rise=round(rise, 4), loss_rise_limit=d.loss_rise,
                       loss_window=d.loss_window)
        if d.note:
            why["note"] = d.note
        return why

    def _escalate(self, session: Session, f: NewFrame) -> list[Alert]:
        """Raise the open alerts of (run, rank) stored below their rule's severity once
        neither holds them any longer: the downgrade (re-judged on frames that carry
        per-head statistics, where the job says its dtype) and the page policy (judged on
        the rule's newest breach)."""
        down = self._down[(f.run_id, f.rank)]
        fv = FrameView(f.scalars, f.heads)
        rules = {r.name: r for r in self._rules}
        out: list[Alert] = []
        for name, layer in sorted(down.keys, key=lambda k: (k[0], k[1] is not None, k[1] or 0)):
            rule = rules.get(name)
            a = self._open_alert(session, f.run_id, f.rank, name, layer)
            if rule is None or a is None or a.severity == rule.severity:
                down.keys.discard((name, layer))
                continue
            ev = dict(a.evidence or {})
            reasons: list[str] = []
            d = rule.downgrade
            if d is not None and "downgraded" in ev and not ev.get("downgrade_lifted"):
                if not f.heads or self._downgrade(rule, f.run_id, f.rank, fv) is not None:
                    continue  # still lowered (or a frame that cannot say)
                x = fv.get(d.metric)
                if x is None or not x > d.above:
                    because = (f"{d.metric} = {_fmt(x)}" if x is not None else
                               f"the job no longer sends {d.metric}")
                else:
                    lr = self._loss.get((f.run_id, f.rank, d.loss_window))
                    rise = math.inf if lr is None else lr.rise
                    because = (f"the loss (median of its last {d.loss_window} steps) rose "
                               f"{_fmt(rise)} nats above its best")
                ev["downgrade_lifted"] = f.step
                reasons.append(because)
            if "page" in ev and not ev.get("page_due"):
                due = self._page_due(rule, f.run_id, f.rank, a, f.step)
                if due is None:
                    a.evidence = ev
                    continue  # not persisted yet
                ev["page_due"] = f.step
                reasons.append(due)
            down.keys.discard((name, layer))
            because = "; ".join(reasons) or "its condition held"
            a.severity = rule.severity
            if a.paged_step is None and rule.severity in PAGING:
                a.paged_step = f.step
            if rule.inhibits:  # a run-level divergence alert, confirmed now
                _diverged(session.get(Run, f.run_id), a.fired_step)
            ev.update(escalated_step=f.step, escalated_because=because)
            a.evidence = ev
            a.message = (f"{a.message} Escalated to {rule.severity} at step {f.step}: "
                         f"{because}.")
            log.warning("ALERT escalated: %s", a.message)
            if a.suppressed is None:
                out.append(a)
        return out

    def _unpaged(self, rule: RuleSpec, run_id: int, rank: int,
                 t: Transition) -> dict[str, object] | None:
        """What would page a firing alert that its rule's :class:`~.rules.Page` holds back
        at ``info`` on the firing sample, or None when it pages at once."""
        pg = rule.page
        if pg is None or rule.severity == "info":
            return None
        if pg.after is not None and t.step - t.started_step >= pg.after:
            return None
        eta = t.verdict.evidence.get("eta_steps")
        if pg.eta_within is not None and eta is not None and eta <= pg.eta_within:
            return None
        if self._corroborated(pg, run_id, rank, t.step) is not None:
            return None
        return {"after": pg.after, "eta_within": pg.eta_within, "note": pg.note,
                "with_rules": list(pg.with_rules)}

    def _corroborated(self, pg: Page, run_id: int, rank: int, step: int) -> str | None:
        """The first of ``pg.with_rules`` that breached on (run, rank) within ``pg.within``
        steps of ``step``, with where, or None."""
        for name in pg.with_rules:
            t = self._tracks.get((name, run_id, rank, None, None))
            if t is not None and t.last_breach is not None \
                    and abs(t.last_breach[0] - step) <= pg.within:
                return f"{name} breached at step {t.last_breach[0]}"
        return None

    def _page_due(self, rule: RuleSpec, run_id: int, rank: int, a: Alert,
                  step: int) -> str | None:
        """Why the alert ``a``, held back by ``rule.page``, pages now (its cells breach at
        ``step`` and have persisted, or forecast a crossing close enough), else None."""
        pg = rule.page
        if pg is None:
            return "its condition held"
        if a.layer is None:
            tracks = [self._tracks.get((rule.name, run_id, rank, None, None))]
        else:
            c = self._cells_of.get((rule.name, run_id, rank))
            tracks = [(c.tracks.get((a.layer, h)) if c is not None else
                       self._tracks.get((rule.name, run_id, rank, a.layer, h)))
                      for h in (a.heads or [])]
        for t in tracks:
            if t is None or t.last_breach is None:
                continue
            own = t.last_breach[0]
            if pg.with_rules and step - own <= pg.within:
                other = self._corroborated(pg, run_id, rank, own)
                if other is not None:
                    return f"corroborated: {other}"
            if own != step:
                continue
            if pg.after is not None and step - a.started_step >= pg.after:
                return (f"it persisted {step - a.started_step} steps (since step "
                        f"{a.started_step})")
            eta = t.last_breach[1].evidence.get("eta_steps")
            if pg.eta_within is not None and eta is not None and eta <= pg.eta_within:
                return f"the crossing is now ~{eta} steps away"
        return None

    def _cells(self, rule: RuleSpec, scalars: dict[str, float],
               heads: dict[str, list[list[float]]],
               arrays: dict[str, np.ndarray]) -> list[tuple[Cell, float]]:
        if rule.metric in scalars:
            return [((None, None), float(scalars[rule.metric]))]
        metric = _judged_metric(rule, heads)
        m = heads.get(metric)
        if m is None:
            return []
        if rule.over == "cell":
            return [((li, hi), float(x)) for li, row in enumerate(m) for hi, x in enumerate(row)]
        a = _matrix(arrays, heads, metric)
        if a is None:  # not a plain matrix: as the per-cell path always did
            flat = [float(x) for row in m for x in row]
            if not flat:
                return []
            if any(math.isnan(x) for x in flat):
                return [((None, None), math.nan)]
            return [((None, None), max(flat) if rule.over == "max" else min(flat))]
        if not a.size:
            return []
        if np.isnan(a).any():
            return [((None, None), math.nan)]
        return [((None, None), float(a.max() if rule.over == "max" else a.min()))]

    def _thinned(self, run_id: int, rank: int, step: int,
                 heads: dict[str, list[list[float]]]) -> dict[str, list[list[float]]]:
        """The per-head statistics to judge on this frame: none until ``head_every`` steps
        have passed since the last judgement (the frames in between are folded in)."""
        if not heads or self._head_every <= 1:
            return heads
        th = self._thin.get((run_id, rank))
        if th is None:
            th = self._thin[(run_id, rank)] = _Thin()
        try:
            arrays = {k: np.asarray(m, dtype=float) for k, m in heads.items()}
        except (TypeError, ValueError):
            return heads  # not plain matrices: judged as they are
        if any(a.ndim != 2 for a in arrays.values()):
            return heads
        for k, a in arrays.items():
            th.acc[k] = _fold(k, th.acc.get(k), a)
        if th.last is not None and th.last <= step < th.last + self._head_every:
            return {}
        th.last = step
        out, th.acc = th.acc, {}
        return out  # type: ignore[return-value]

    def _advance(self, run_id: int, rank: int, step: int, scalars: dict[str, float],
                 heads: dict[str, list[list[float]]]) -> list[_Pending]:
        """Run every rule over one frame; return the transitions, grouped per layer."""
        # the job's clip threshold travels on sampled frames only: every step's scalars
        # (history rows) are judged against the last one it said
        bound = scalars.get(STICKY)
        if bound is not None:
            self._sticky[(run_id, rank)] = bound
        elif (run_id, rank) in self._sticky:
            scalars = {**scalars, STICKY: self._sticky[(run_id, rank)]}
        fv = FrameView(scalars, heads)
        self._track_loss(run_id, rank, step, scalars)
        heads = self._thinned(run_id, rank, step, heads)
        arrays: dict[str, np.ndarray] = {}
        out: list[_Pending] = []
        for rule in self._rules:
            if not rule.enabled or rule.kind == "no_data" or rule.name in self._broken:
                continue
            try:
                out.extend(self._advance_rule(rule, run_id, rank, step, scalars, heads,
                                              arrays, fv))
            except Exception:  # one rule must never stop ingest
                self._broken.add(rule.name)
                log.exception("alert rule %r failed on run %s rank %s step %s; it is skipped "
                              "from now on (fix or replace it: PUT /api/v1/alerts/rules/%s)",
                              rule.name, run_id, rank, step, rule.name)
        for p in out:
            p.severity = p.rule.severity
            if p.transition.state is State.FIRING and not p.transition.reopened:
                p.downgraded = self._downgrade(p.rule, run_id, rank, fv)
                if p.downgraded is not None:
                    assert p.rule.downgrade is not None
                    p.severity = p.rule.downgrade.to
                p.unpaged = self._unpaged(p.rule, run_id, rank, p.transition)
                if p.unpaged is not None:
                    p.severity = "info"
        return out

    def _advance_rule(self, rule: RuleSpec, run_id: int, rank: int, step: int,
                      scalars: dict[str, float], heads: dict[str, list[list[float]]],
                      arrays: dict[str, np.ndarray], fv: FrameView) -> list[_Pending]:
        """One rule over one frame."""
        kind = KINDS[rule.kind]
        if (self._screen and rule.over == "cell" and rule.kind in SCREENS
                and not rule.params.get("smooth")
                and rule.metric not in scalars and rule.metric in heads):
            a = _matrix(arrays, heads, rule.metric)
            if self._screened(rule, run_id, rank, a):
                assert a is not None
                return self._advance_screened(rule, run_id, rank, step, a, fv)
        groups: dict[tuple[State, bool, int | None], _Pending] = {}
        for cell, value in self._cells(rule, scalars, heads, arrays):
            key = (rule.name, run_id, rank, *cell)
            mem = self._mem.get(key)
            if mem is None:
                mem = self._mem[key] = Memory() if cell[0] is None else Memory.per_head()
            verdict = kind.detect(rule, mem, step, value, fv, cell)
            if verdict is not None and verdict.breach and rule.over in ("max", "min"):
                verdict = _with_where(verdict, arrays.get(_judged_metric(rule, heads)),
                                      rule.over)
            if verdict is not None:
                track = self._tracks.get(key)
                if track is None:
                    track = self._tracks[key] = Track()
                t = track.advance(rule, step, verdict)
                if t is not None:
                    _group(groups, rule, cell, t)
            if not (kind.hold_breaches and verdict is not None and verdict.breach):
                mem.push(step, value)
            else:
                mem.seen += 1
                mem.last = (step, value)
        return list(groups.values())

    def _screened(self, rule: RuleSpec, run_id: int, rank: int, a: np.ndarray | None) -> bool:
        """Whether this rule's cells go the whole-matrix way on (run, rank); a matrix whose
        shape changed moves them to the per-cell path for good (same memory, same tracks)."""
        key = (rule.name, run_id, rank)
        if key in self._per_cell:
            return False
        c = self._cells_of.get(key)
        if a is not None and a.ndim == 2 and (c is None or c.mem.shape == a.shape):
            if c is None:
                self._cells_of[key] = _Cells(CellMemory(a.shape), np.zeros(a.shape, bool), {},
                                             np.zeros(a.shape, dtype=np.int64))
            return True
        self._per_cell.add(key)
        if c is not None:
            del self._cells_of[key]
            for li, hi in zip(*np.nonzero(c.mem.count >= 0), strict=True):
                cell = (int(li), int(hi))
                self._mem[(*key, *cell)] = c.mem.memory(*cell)
                if c.judged[cell] or cell in c.tracks:
                    self._tracks[(*key, *cell)] = c.track(cell)
        return False

    def _advance_screened(self, rule: RuleSpec, run_id: int, rank: int, step: int,
                          a: np.ndarray, fv: FrameView) -> list[_Pending]:
        """One screened per-head rule over one sample: the screen clears the calm cells at
        rest, the rule's detector judges the others (in layer, head order)."""
        kind = KINDS[rule.kind]
        c = self._cells_of[(rule.name, run_id, rank)]
        with np.errstate(all="ignore"):
            judged, todo = SCREENS[rule.kind](rule, c.mem, step, a)
        for cell in c.tracks:
            todo[cell] = True
        c.judged |= judged & ~todo
        keep = np.ones(a.shape, dtype=bool)
        groups: dict[tuple[State, bool, int | None], _Pending] = {}
        for li, hi in zip(*np.nonzero(todo), strict=True):
            cell = (int(li), int(hi))
            verdict = kind.detect(rule, c.mem.memory(*cell), step, float(a[cell]), fv, cell)
            if verdict is None:
                continue
            c.judged[cell] = True
            t = c.track(cell).advance(rule, step, verdict)
            if t is not None:
                _group(groups, rule, cell, t)
            c.settle(cell)
            if kind.hold_breaches and verdict.breach:
                keep[cell] = False
        c.mem.push(step, a, keep)
        return list(groups.values())

    # -- persistence -----------------------------------------------------------------------

    def _persist(self, session: Session, f: NewFrame, pending: list[_Pending]) -> list[Alert]:
        changed: list[Alert] = []
        if not pending:
            return changed
        run = session.get(Run, f.run_id)
        # resolutions first, then run-level firings (they inhibit), then per-head firings
        order = sorted(pending, key=lambda p: (p.transition.state is State.FIRING,
                                               p.layer is not None))
        for p in order:
            if p.transition.state is State.RESOLVED:
                a = self._resolve(session, f, p)
                if a is not None and a.suppressed is None:
                    changed.append(a)
                continue
            open_alert = self._open_alert(session, f.run_id, f.rank, p.rule.name, p.layer)
            if open_alert is not None and p.transition.reopened:
                _reopen(open_alert, p)  # a breach within the hold: the same episode
                continue
            if open_alert is not None and p.layer is not None:
                # grouping: more heads of this layer joined the firing alert (a head that
                # resolved earlier in it is active again: stored, not news)
                heads = list(open_alert.heads or [])
                new = [h for h in p.heads if h not in heads]
                ev = dict(open_alert.evidence)
                active = set(ev.get("active_heads", heads))
                if not set(p.heads) <= active:
                    ev["active_heads"] = sorted(active | set(p.heads))
                    open_alert.evidence = ev
                if new:
                    open_alert.heads = heads + new
                    if open_alert.suppressed is None:
                        changed.append(open_alert)
                continue
            if open_alert is not None:
                continue  # deduplicated: already firing
            a = self._new_alert(session, f, run, p)
            if a.suppressed is None:
                changed.append(a)
        return changed

    def _open_alert(self, session: Session, run_id: int, rank: int, rule: str,
                    layer: int | None) -> Alert | None:
        q = select(Alert).where(Alert.run_id == run_id, Alert.rank == rank, Alert.rule == rule,
                                Alert.state == State.FIRING.value)
        q = q.where(Alert.layer.is_(None) if layer is None else Alert.layer == layer)
        return session.scalars(q.order_by(Alert.id.desc())).first()

    def _resolve(self, session: Session, f: NewFrame, p: _Pending) -> Alert | None:
        a = self._open_alert(session, f.run_id, f.rank, p.rule.name, p.layer)
        if a is None:
            return None
        if p.layer is not None:
            ev = dict(a.evidence)
            active = [h for h in ev.get("active_heads", a.heads or []) if h not in p.heads]
            ev["active_heads"] = active
            a.evidence = ev
            if active:
                return None
        a.state = State.RESOLVED.value
        a.resolved_step = p.transition.step
        down = self._down.get((f.run_id, f.rank))
        if down is not None:
            down.keys.discard((p.rule.name, p.layer))
        ev = a.evidence or {}
        if "page" in ev and a.paged_step is None and p.rule.severity != a.severity:
            # held back by its Page and cleared first: a bump that recovered
            a.evidence = {**ev, "recovered": True, "recovered_step": p.transition.step}
            a.message = (f"{a.message} Recovered at step {p.transition.step} without "
                         f"paging.")
        return a

    def _inhibited(self, session: Session, run_id: int, rank: int) -> str | None:
        names = [r.name for r in self._rules if r.inhibits]
        if not names:
            return None
        return session.scalar(
            select(Alert.rule).where(Alert.run_id == run_id, Alert.rank == rank,
                                     Alert.rule.in_(names), Alert.state == State.FIRING.value)
            .limit(1)
        )

    def _silenced(self, session: Session, run: Run | None, rule: str, rank: int,
                  layer: int | None, now: float) -> int | None:
        q = select(Silence.id).where(Silence.starts_at <= now, Silence.ends_at > now)
        if run is not None:
            q = q.where(or_(Silence.project.is_(None), Silence.project == run.project),
                        or_(Silence.run.is_(None), Silence.run == run.name))
        q = q.where(or_(Silence.rule.is_(None), Silence.rule == rule),
                    or_(Silence.rank.is_(None), Silence.rank == rank))
        if layer is not None:
            q = q.where(or_(Silence.layer.is_(None), Silence.layer == layer))
        else:
            q = q.where(Silence.layer.is_(None))
        return session.scalar(q.limit(1))

    def _new_alert(self, session: Session, f: NewFrame, run: Run | None,
                   p: _Pending) -> Alert:
        t, rule = p.transition, p.rule
        v = t.verdict
        suppressed = None
        ev: dict[str, object] = {k: _json(x) for k, x in v.evidence.items()}
        if not rule.inhibits:
            by = self._inhibited(session, f.run_id, f.rank)
            if by is not None:
                suppressed = "inhibited"
                ev["inhibited_by"] = by
        sid = self._silenced(session, run, rule.name, f.rank, p.layer, _time.time())
        if sid is not None and suppressed is None:
            suppressed = "silenced"
            ev["silence"] = sid
        head = p.heads[0] if p.heads else None
        if p.heads:
            ev["active_heads"] = list(p.heads)
        ev.update({"rule_kind": rule.kind, "params": {k: _json(x) for k, x in
                                                       rule.params.items()},
                   "for_samples": rule.for_samples, "keep_firing_for": rule.hold})
        message = _message(run, rule, f.rank, p.layer, p.heads, t)
        if p.downgraded is not None:
            ev["downgraded"] = p.downgraded
            message += _downgrade_text(p.downgraded)
            self._down.setdefault((f.run_id, f.rank), _Down()).keys.add((rule.name, p.layer))
        if p.unpaged is not None:
            ev["page"] = p.unpaged
            message += _page_text(p.unpaged, rule.severity)
            self._down.setdefault((f.run_id, f.rank), _Down()).keys.add((rule.name, p.layer))
        fin = v.value if math.isfinite(v.value) else None
        a = Alert(
            run_id=f.run_id, rule=rule.name, metric=rule.metric,
            severity=p.severity or rule.severity,
            state=State.FIRING.value, rank=f.rank, layer=p.layer, head=head,
            started_step=t.started_step, fired_step=t.step, fired_at=f.time,
            value=fin, baseline=_finite(v.baseline), threshold=_finite(v.limit),
            message=message, evidence=ev,
            remedies=remedies_for(rule.metric, rule.kind), heads=list(p.heads) or None,
            suppressed=suppressed,
            paged_step=t.step if (p.severity or rule.severity) in PAGING else None,
        )
        session.add(a)
        if rule.inhibits and a.severity == rule.severity:  # not held back at a lower one
            _diverged(run, t.step)
        session.flush()
        (log.info if suppressed else log.warning)("ALERT %s%s", a.message,
                                                  f" ({suppressed})" if suppressed else "")
        return a

    # -- restart -----------------------------------------------------------------------------

    def _restore(self, session: Session, run_id: int, rank: int, before_step: int) -> None:
        """Replay stored history (silently) to rebuild rule state for one (run, rank)."""
        self._loaded.add((run_id, rank))
        names = {r.metric for r in self._rules if r.enabled}
        for r in self._rules:
            if r.kind == "loss_jump":
                names |= {"lr", "grad.norm"}
            if r.kind == "ratio":
                names.add(str(r.param("other")))
                if r.param("logit"):
                    names.add(str(r.param("logit")))
            if r.downgrade is not None:
                names |= {r.downgrade.metric, "loss"}
                if r.downgrade.capped_metric:
                    names.add(r.downgrade.capped_metric)
            if r.kind == "spike" and r.param("only_unclipped"):
                names |= {"grad.clipped", STICKY}
            if r.kind == "forecast":
                names |= {str(r.param("capped_metric")), str(r.param("critical_metric"))}
        metrics = session.execute(
            select(Metric.id, Metric.name, Metric.layers, Metric.heads)
            .where(Metric.run_id == run_id, Metric.name.in_(names))
        ).all()
        if not metrics:
            return
        # the newest sampled frames, and every step's scalars (history rows, seq < 0) since
        # the oldest of them
        frames = session.execute(
            select(Frame.id, Frame.step).where(Frame.run_id == run_id, Frame.rank == rank,
                                               Frame.step < before_step, Frame.seq >= 0)
            .order_by(Frame.step.desc()).limit(RESTORE_FRAMES)
        ).all()
        if not frames:
            return
        history = session.execute(
            select(Frame.id, Frame.step).where(Frame.run_id == run_id, Frame.rank == rank,
                                               Frame.step < before_step, Frame.seq < 0,
                                               Frame.step >= frames[-1].step)
        ).all()
        frames = sorted([*frames, *history], key=lambda r: r.step, reverse=True)
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
        for fid, step in reversed(frames):
            self._advance(run_id, rank, step, *values[fid])  # transitions dropped: replay
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

    # -- no data ---------------------------------------------------------------------------

    def check_stale(self, session: Session, now: float | None = None, *,
                    runs: Collection[int] | None = None) -> list[Alert]:
        """Fire ``no_data`` for every run that has not finished and whose last frame is
        older than the rule's ``seconds`` (and that has no open ``no_data`` alert): the run
        is then ``stopped``. Resolve the open ``no_data`` alerts of finished runs. Only the
        runs of ``runs`` when given (the ingest route passes those that just finished).
        Returns the alerts fired or resolved that people should hear about."""
        names = [r.name for r in self._rules if r.kind == "no_data"]
        if not names:
            return []
        now = _time.time() if now is None else now
        out: list[Alert] = []
        ended = (select(Alert, Run).join(Run, Run.id == Alert.run_id)
                 .where(Alert.rule.in_(names), Alert.state == State.FIRING.value,
                        Run.status == "finished"))
        if runs is not None:
            ended = ended.where(Run.id.in_(list(runs)))
        for a, run in session.execute(ended).all():
            a.state = State.RESOLVED.value  # the job said it ended: it did not hang
            a.resolved_step = run.end_step if run.end_step is not None else a.fired_step
            if a.suppressed is None:
                out.append(a)
        for rule in self._rules:
            if rule.kind != "no_data" or not rule.enabled:
                continue
            seconds = float(rule.param("seconds"))
            q = select(Run).where(Run.last_time.is_not(None), Run.last_time < now - seconds,
                                  Run.status != "finished")
            if runs is not None:
                q = q.where(Run.id.in_(list(runs)))
            for run in session.scalars(q).all():
                if self._open_alert(session, run.id, 0, rule.name, None) is not None:
                    run.status = "stopped"  # (a run alerted before statuses were stored)
                    continue
                if session.scalar(select(Alert.id).where(
                        Alert.run_id == run.id, Alert.rule == rule.name,
                        Alert.fired_step == (run.last_step or 0)).limit(1)) is not None:
                    continue  # already alerted for this silence of the run
                assert run.last_time is not None
                silent = now - run.last_time
                msg = (f"{run.name}: no data for {silent:.0f} s since step {run.last_step} "
                       f"(limit {seconds:.0f} s) and its job did not say it ended: it may "
                       "have hung or crashed.")
                sid = self._silenced(session, run, rule.name, 0, None, now)
                a = Alert(
                    run_id=run.id, rule=rule.name, metric="*", severity=rule.severity,
                    state=State.FIRING.value, rank=0, layer=None, head=None,
                    started_step=run.last_step or 0, fired_step=run.last_step or 0,
                    fired_at=now, value=silent, baseline=None, threshold=seconds,
                    message=msg, evidence={"silent_s": silent, "last_time": run.last_time,
                                           "rule_kind": "no_data"},
                    remedies=remedies_for("*", "no_data"),
                    suppressed="silenced" if sid is not None else None,
                    paged_step=(run.last_step or 0) if rule.severity in PAGING else None,
                )
                session.add(a)
                run.status = "stopped"
                session.flush()
                if a.suppressed is None:
                    out.append(a)
        return out

    def _resolve_no_data(self, session: Session, f: NewFrame) -> list[Alert]:
        names = [r.name for r in self._rules if r.kind == "no_data"]
        if not names:
            return []
        rows = session.scalars(select(Alert).where(
            Alert.run_id == f.run_id, Alert.rule.in_(names),
            Alert.state == State.FIRING.value)).all()
        for a in rows:
            a.state = State.RESOLVED.value
            a.resolved_step = f.step
        if rows:  # the stopped run reports again
            session.execute(update(Run).where(Run.id == f.run_id, Run.status == "stopped")
                            .values(status="running")
                            .execution_options(synchronize_session="evaluate"))
        return [a for a in rows if a.suppressed is None]


def _judged_metric(rule: RuleSpec, heads: dict[str, list[list[float]]]) -> str:
    """The per-head series a rule reads on this frame: its metric, or for a forecast the
    soft-capped scores (``capped_metric``) where the frame has them: overflow is judged on
    what the softmax receives."""
    if rule.kind == "forecast":
        capped = rule.param("capped_metric")
        if capped and capped in heads:
            return str(capped)
    return rule.metric


def _with_where(v: Verdict, a: np.ndarray | None, over: str) -> Verdict:
    """A max/min-over-heads verdict with the layer and head that hold that value."""
    if a is None or not a.size or a.ndim != 2:
        return v
    with np.errstate(all="ignore"):
        flat = int(np.nanargmax(a) if over == "max" else np.nanargmin(a)) \
            if not np.isnan(a).all() else 0
    layer, head = divmod(flat, a.shape[1])
    return dataclasses.replace(v, evidence={**v.evidence, "at_layer": layer, "at_head": head})


def _fold(name: str, acc: np.ndarray | None, a: np.ndarray) -> np.ndarray:
    """Fold one frame's matrix into what waits to be judged: its worst (the max, or the min
    of an entropy); the newest for q/k norms and for a matrix whose shape changed."""
    if acc is None or acc.shape != a.shape or name.startswith("qk."):
        return a
    return np.minimum(acc, a) if "entropy" in name else np.maximum(acc, a)


def _group(groups: dict[tuple[State, bool, int | None], _Pending], rule: RuleSpec,
           cell: Cell, t: Transition) -> None:
    """Add a cell's transition to its layer's group (one alert per rule and layer)."""
    g = groups.get((t.state, t.reopened, cell[0]))
    if g is None:
        groups[(t.state, t.reopened, cell[0])] = _Pending(
            rule, cell[0], [] if cell[1] is None else [cell[1]], t)
    elif cell[1] is not None:
        g.heads.append(cell[1])


def _matrix(arrays: dict[str, np.ndarray], heads: dict[str, list[list[float]]],
            name: str) -> np.ndarray | None:
    """``heads[name]`` as a float64 matrix (converted once per sample), None if it is not
    a plain rectangular matrix of numbers."""
    if name in arrays:
        return arrays[name]
    try:
        a = np.asarray(heads[name], dtype=float)
    except (TypeError, ValueError):
        return None
    if a.ndim != 2:
        return None
    arrays[name] = a
    return a


def _diverged(run: Run | None, step: int) -> None:
    """A run-level divergence alert (a rule with ``inhibits``) fired at its own severity
    on ``run`` at ``step``: the run's status is ``diverged`` from now on."""
    if run is not None and (run.diverged_step is None or step < run.diverged_step):
        run.diverged_step = step


def _reopen(a: Alert, p: _Pending) -> None:
    """A breach within the hold of the open alert ``a``: added to ``evidence.breaches``
    (the newest :data:`MAX_BREACHES`, ``breaches_dropped`` counts the older ones) and
    ``evidence.latest``; what the alert showed when it fired (``value``, ``baseline``,
    ``threshold``, message, the rest of its evidence) stays as it was."""
    t = p.transition
    v = t.verdict
    ev = dict(a.evidence)
    breach: dict[str, object] = {"step": t.step, "value": _json(v.value),
                                 "baseline": _json(v.baseline), "limit": _json(v.limit)}
    if p.heads:
        breach["heads"] = list(p.heads)
    breaches = [*ev.get("breaches", []), breach]
    if len(breaches) > MAX_BREACHES:
        ev["breaches_dropped"] = (int(ev.get("breaches_dropped", 0))
                                  + len(breaches) - MAX_BREACHES)
        breaches = breaches[-MAX_BREACHES:]
    ev["breaches"] = breaches
    ev["latest"] = {**breach, "evidence": {k: _json(x) for k, x in v.evidence.items()}}
    ev["reopened"] = int(ev.get("reopened", 0)) + 1
    ev["last_breach_step"] = t.step
    if p.heads:
        active = list(ev.get("active_heads", a.heads or []))
        ev["active_heads"] = sorted(set(active) | set(p.heads))
        a.heads = list(a.heads or []) + [h for h in p.heads if h not in (a.heads or [])]
    a.evidence = ev


def _page_text(why: dict[str, object], severity: str) -> str:
    """What an alert held back by its page policy adds to its message."""
    conds = []
    if why.get("after") is not None:
        conds.append(f"if it persists {why['after']} steps")
    if why.get("eta_within") is not None:
        conds.append(f"once the crossing is within {why['eta_within']} steps")
    if why.get("with_rules"):
        conds.append("if " + " or ".join(str(r) for r in why["with_rules"])  # type: ignore[attr-defined]
                     + " breaches with it")
    cond = " or ".join(conds)
    note = why.get("note")
    return f" Info for now: it becomes a {severity} {cond}." + (f" {note}" if note else "")


def _downgrade_text(why: dict[str, object]) -> str:
    """What a downgraded alert adds to its message."""
    text = (f" {str(why['to']).capitalize()}, not {why['from']}: {why['metric']} = "
            f"{_fmt(why['value'])}")
    if "loss_rise" in why:
        text += (f" and the loss is {_fmt(why['loss_rise'])} nats above its best (a "
                 f"{_fmt(why['loss_rise_limit'])}-nat rise makes it a {why['from']})")
    note = why.get("note")
    return text + (f". {note}" if note else ".")


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _json(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (list, tuple)):
        return [_json(i) for i in x]
    return x


def _fmt(x: object) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _message(run: Run | None, rule: RuleSpec, rank: int, layer: int | None,
             heads: list[int], t: Transition) -> str:
    """One line: where, what, since when, the evidence, what it means."""
    name = run.name if run else "?"
    where = f"rank {rank}"
    ev0 = t.verdict.evidence
    if layer is None and "at_layer" in ev0:
        where += f" (worst head: layer {ev0['at_layer']}, head {ev0['at_head']})"
    if layer is not None:
        hs = ", ".join(str(h) for h in heads)
        where += f", layer {layer}, head{'s' if len(heads) > 1 else ''} {hs}"
    v, ev = t.verdict, t.verdict.evidence
    what = f"{rule.metric} = {_fmt(v.value)}"
    if rule.kind == "departure" and "above_baseline" in ev:  # an additive margin
        what += (f" is {_fmt(ev['above_baseline'])} above its baseline {v.baseline:.3g}"
                 if math.isfinite(v.value) else " (non-finite)")
    elif rule.kind in ("departure", "baseline") and v.baseline:
        what += (f" is {v.value / v.baseline:.1f}x its baseline {v.baseline:.3g}"
                 if math.isfinite(v.value) else " (non-finite)")
    elif rule.kind == "forecast" and ev.get("eta_steps") is not None:
        what += (f", on course to cross {_fmt(ev.get('critical'))} in ~{ev['eta_steps']} steps "
                 f"(around step {ev.get('crosses_at_step')})")
    elif rule.kind == "trend":
        what += (f", x{_fmt(ev.get('growth_over_window'))} since step "
                 f"{ev.get('window_from_step')} (Kendall tau {_fmt(ev.get('kendall_tau'))})")
    elif rule.kind in ("spike", "loss_jump") and "median" in ev:
        what += f" vs a recent median of {_fmt(ev['median'])}"
        if ev.get("robust_z") is not None:
            what += f" (robust z {_fmt(ev['robust_z'])})"
    elif rule.kind == "level_rise" and ev.get("lowest_level"):
        what = (f"{rule.metric} level (median of {ev.get('window')} steps) = "
                f"{_fmt(ev.get('level'))}, {_fmt(ev.get('level') / ev['lowest_level'])}x "
                f"the lowest it settled to ({_fmt(ev['lowest_level'])})")
    elif rule.kind == "above_peak" and ev.get("settled_peak"):
        what += (f", {_fmt(ev.get('ratio'))}x the peak of {_fmt(ev['settled_peak'])} it had "
                 f"settled at (step {ev.get('settled_at_step')})")
    elif rule.kind == "lr_jump":
        what += f", was {_fmt(ev.get('previous'))} at step {ev.get('previous_step')}"
    causes = ev.get("causes")
    if causes:
        what += "; " + "; ".join(str(c) for c in causes)  # type: ignore[union-attr]
    meaning = rule.summary or rule.name
    return (f"{name}: {where}: {meaning}: {what}; left its range at step {t.started_step}, "
            f"fired at step {t.step}.")
