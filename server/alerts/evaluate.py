"""One frame through the rules: the transitions each rule's lifecycle makes on it.

:meth:`EvaluationMixin._advance` runs every enabled rule over a frame of one (run, rank)
and returns the transitions grouped per rule and layer (:class:`~.lifecycle._Pending`),
with the severity they would fire at. On the way it keeps the per-(run, rank) inputs the
rules read: the last clip threshold a rank said (``grad.max_norm``, held for the steps
after it), the loss-rise trackers of downgrades, and the per-head statistics folded in
between judgements (at most one every ``head_every`` steps).

A per-head rule whose kind has a whole-matrix screen (:data:`~.rules.SCREENS`) keeps its
cells' memory in arrays (:class:`~.rules.CellMemory`) and judges all layers x heads of a
sample with numpy; only the cells the screen cannot clear (near or past their limit, or
with a pending/firing lifecycle) go through the rule's own detector, so the decisions are
the per-cell ones. Other rules run per cell. A rule that raises is skipped from then on.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np

from logitwatch.server.alerts.departure import mirrored, unmirrored
from logitwatch.server.alerts.lifecycle import LifecycleMixin, _Pending
from logitwatch.server.alerts.rules import (
    KINDS,
    SCREENS,
    CellMemory,
    FrameView,
    Memory,
    RuleSpec,
    State,
    Track,
    Transition,
    Verdict,
)
from logitwatch.server.alerts.state import (
    STICKY,
    Cell,
    _Cells,
    _Level,
    _level_key,
    _loss_key,
    _LossRise,
    _Thin,
)

__all__ = ["EvaluationMixin"]

log = logging.getLogger("logitwatch.alerts")


class EvaluationMixin(LifecycleMixin):
    """Runs the rules of an :class:`~logitwatch.server.alerts.engine.AlertEngine` over
    frames (see the module's docstring).

    The engine sets ``_screen`` (judge screened per-head rules with their whole-matrix
    screen) and ``_head_every``; the state keeps ``_broken`` (the rules that raised).
    """

    _screen: bool
    _head_every: int

    def _track_loss(self, run_id: int, rank: int, step: int,
                    scalars: dict[str, float]) -> None:
        """Advance the loss-rise trackers the rules' downgrades read (every frame)."""
        loss = scalars.get("loss")
        lr_now = scalars.get("lr")
        seen: set[tuple[int, int, int, int]] = set()
        for r in self._rules:
            d = r.downgrade
            if d is None or (d.loss_rise is None and d.lr_climb is None) or not r.enabled:
                continue
            key = _loss_key(run_id, rank, d)
            if key in seen:
                continue
            seen.add(key)
            tr = self._loss.get(key)
            if tr is None:
                tr = self._loss[key] = _LossRise(d.loss_window, d.recover_span)
            tr.push(step, None if loss is None else float(loss),
                    None if lr_now is None else float(lr_now))

    def _track_levels(self, run_id: int, rank: int, step: int,
                      scalars: dict[str, float]) -> None:
        """Advance the level trackers the rules' ``Page.recover_within`` reads (every
        frame that carries the rule's scalar)."""
        for r in self._rules:
            if r.page is None or r.page.recover_within is None or not r.enabled:
                continue
            v = scalars.get(r.metric)
            if v is None:
                continue
            key = _level_key(run_id, rank, r)
            lv = self._levels.get(key)
            if lv is None:
                lv = self._levels[key] = _Level(r.page.recover_steps)
            lv.push(step, float(v))

    def _cells(self, rule: RuleSpec, scalars: dict[str, float],
               heads: dict[str, list[list[float]]],
               arrays: dict[str, np.ndarray], metric: str) -> list[tuple[Cell, float]]:
        """The values ``rule`` judges on this frame, per cell or over heads; ``metric``: the
        per-head series it reads (:func:`_judged_metric`)."""
        if rule.metric in scalars:
            return [((None, None), float(scalars[rule.metric]))]
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
        self._track_levels(run_id, rank, step, scalars)
        raw = heads  # this frame's own matrices: the kinds judged on every frame read them
        heads = self._thinned(run_id, rank, step, heads)
        arrays: dict[str, np.ndarray] = {}
        raw_arrays: dict[str, np.ndarray] = {}
        out: list[_Pending] = []
        for rule in self._rules:
            if (not rule.enabled or rule.kind == "no_data"
                    or (rule.name, run_id, rank) in self._broken):
                continue
            every = KINDS[rule.kind].every_frame  # over max/min only (RuleSpec says so)
            try:
                out.extend(self._advance_rule(rule, run_id, rank, step, scalars,
                                              raw if every else heads,
                                              raw_arrays if every else arrays, fv))
            except Exception:  # one rule must never stop ingest
                # skipped for this run and rank only: one run's values (a negative LR) must
                # not switch a rule off for every run of the collector
                self._broken.add((rule.name, run_id, rank))
                log.exception("alert rule %r failed on run %s rank %s step %s; it is skipped "
                              "for that run and rank from now on (if it fails on every run, "
                              "fix or replace it: PUT /api/v1/alerts/rules/%s)",
                              rule.name, run_id, rank, step, rule.name)
        for p in out:
            p.severity = p.rule.severity
            if p.transition.state is State.FIRING and not p.transition.reopened:
                p.downgraded = self._downgrade(p.rule, run_id, rank, fv,
                                               p.transition.started_step)
                if p.downgraded is None:
                    p.kept = self._lr_kept(p.rule, run_id, rank, fv)
                else:
                    assert p.rule.downgrade is not None
                    p.severity = p.rule.downgrade.to
                self._page_policy(p, run_id, rank)
                if p.unpaged is not None:
                    p.severity = "info"
        return out

    def _advance_rule(self, rule: RuleSpec, run_id: int, rank: int, step: int,
                      scalars: dict[str, float], heads: dict[str, list[list[float]]],
                      arrays: dict[str, np.ndarray], fv: FrameView) -> list[_Pending]:
        """One rule over one frame."""
        kind = KINDS[rule.kind]
        judged = _judged_metric(rule, heads)
        read = None if judged == rule.metric else judged  # another series than its metric
        flip = mirrored(rule)  # judged downwards: on -x, kept as -x in its memory
        if (self._screen and rule.over == "cell" and rule.kind in SCREENS and not flip
                and not rule.params.get("smooth") and not rule.params.get("step_weighted")
                and rule.metric not in scalars and rule.metric in heads):
            a = _matrix(arrays, heads, judged)
            if self._screened(rule, run_id, rank, a):
                assert a is not None
                return self._advance_screened(rule, run_id, rank, step, a, fv, read)
        groups: dict[tuple[State, bool, int | None], _Pending] = {}
        for cell, value in self._cells(rule, scalars, heads, arrays, judged):
            if flip:
                value = -value
            key = (rule.name, run_id, rank, *cell)
            mem = self._mem.get(key)
            if mem is None:
                mem = self._mem[key] = (Memory.keeping(kind.keep) if cell[0] is None
                                        else Memory.per_head())
            verdict = kind.detect(rule, mem, step, value, fv, cell)
            if flip and verdict is not None:
                verdict = unmirrored(verdict)
            if verdict is not None and verdict.breach:
                if rule.over in ("max", "min"):
                    verdict = _with_where(verdict, arrays.get(judged), rule.over)
                if read is not None:
                    verdict = _judged_on(verdict, read)
            if verdict is not None:
                track = self._tracks.get(key)
                if track is None:
                    track = self._tracks[key] = Track()
                t = track.advance(rule, step, verdict)
                if t is not None:
                    _group(groups, rule, cell, t)
            if not (kind.hold_breaches and verdict is not None and verdict.breach
                    and verdict.sample_breach is not False):
                mem.push(step, value, pair=fv.pair(step, value))
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
                          a: np.ndarray, fv: FrameView,
                          read: str | None = None) -> list[_Pending]:
        """One screened per-head rule over one sample: the screen clears the calm cells at
        rest, the rule's detector judges the others (in layer, head order). ``read``: the
        series read instead of the rule's metric (its ``capped_metric``), if any."""
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
            if read is not None and verdict.breach:
                verdict = _judged_on(verdict, read)
            c.judged[cell] = True
            t = c.track(cell).advance(rule, step, verdict)
            if t is not None:
                _group(groups, rule, cell, t)
            c.settle(cell)
            if kind.hold_breaches and verdict.breach:
                keep[cell] = False
        c.mem.push(step, a, keep)
        return list(groups.values())


def _judged_metric(rule: RuleSpec, heads: dict[str, list[list[float]]]) -> str:
    """The per-head series a rule reads on this frame: its metric, or for a forecast or a
    departure with a ``capped_metric`` the soft-capped scores where the frame has them:
    overflow and runaway logits are judged on what the softmax receives."""
    capped = rule.params.get("capped_metric", KINDS[rule.kind].defaults.get("capped_metric"))
    if capped and capped in heads:
        return str(capped)
    return rule.metric


def _judged_on(v: Verdict, metric: str) -> Verdict:
    """A breach read off another series than the rule's metric says which (the message
    names it)."""
    return dataclasses.replace(v, evidence={**v.evidence, "judged_metric": metric})


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
