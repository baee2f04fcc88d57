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
* late frames: a frame numbered (``seq``) before one already judged on its (run, rank), at
  a step already judged (an old spool pushed after newer frames), is stored but not judged
  against the newer memory; the (run, rank) is rebuilt from the store, in step order, when
  it sends again;
* hold (``keep_firing_for``): a breach within the hold of a firing alert updates that alert
  (value, evidence, ``evidence.reopened``) instead of creating one, and is not notified;
* downgrade (:class:`~.rules.Downgrade`): an alert that fires while its rule's downgrade
  holds on the frame (a wide attention dtype, no loss-side harm) is stored with the lower
  severity and says why; a later frame of the same episode without it escalates the alert.

Suppressed alerts are not returned by :meth:`AlertEngine.process`, so they are neither
notified nor streamed as new.

:class:`AlertEngine` ties together the modules that do the work, each on its own concern
(a module imports only those listed below it):

* :mod:`.evaluate`: one frame through the rules, per cell or with the whole-matrix screens
  (:data:`~.rules.SCREENS`), into transitions grouped per rule and layer;
* :mod:`.no_data`: the ``no_data`` rule, judged by the clock;
* :mod:`.lifecycle`: what becomes of the transitions: alerts fired, grouped, held, resolved,
  suppressed, downgraded or held back from paging, and escalated;
* :mod:`.downgrade`: whether a frame lowers a rule's severity (its ``Downgrade``);
* :mod:`.recovery` and :mod:`.page_policy`: whether a held-back alert's level is back, and
  whether its page policy lets it page;
* :mod:`.state`: the per-(run, rank) state, its bounds, and its rebuild from the store;
* :mod:`.messages`: the text of alerts and the values they show.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.evaluate import EvaluationMixin
from logitwatch.server.alerts.lifecycle import (  # noqa: F401  (re-exported)
    MAX_BREACHES,
    PAGING,
    log,
)
from logitwatch.server.alerts.no_data import NoDataMixin
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.alerts.state import (  # noqa: F401  (re-exported)
    HEAD_EVERY,
    IDLE_SECONDS,
    LOSS_MIN_SAMPLES,
    MAX_RANKS,
    RESTORE_FRAMES,
    STICKY,
    Cell,
    Key,
)
from logitwatch.server.db.models import Alert, Run
from logitwatch.server.store.ingest import NewFrame

__all__ = ["AlertEngine"]


class AlertEngine(EvaluationMixin, NoDataMixin):
    """Evaluates the rules for every new frame, inside the ingest transaction.

    Args:
        rules: The rule set (default :data:`~.defaults.DEFAULT_RULES`).
        screen: Judge per-head rules with the whole-matrix screens (default); False runs
            every cell through its detector (the reference the screens must equal).
    """

    def __init__(self, rules: Iterable[RuleSpec] | None = None, *, screen: bool = True,
                 head_every: int = HEAD_EVERY, max_ranks: int = MAX_RANKS,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        super().__init__(max_ranks=max_ranks, idle_seconds=idle_seconds)
        self._rules: list[RuleSpec] = list(DEFAULT_RULES if rules is None else rules)
        self._screen = screen
        self._head_every = max(1, int(head_every))
        self._lock = threading.RLock()

    @property
    def rules(self) -> list[RuleSpec]:
        """The rules in force (a copy)."""
        return list(self._rules)

    def set_rules(self, rules: Iterable[RuleSpec]) -> None:
        """Replace the rule set; memory of changed rules starts over (rebuilt from the store)."""
        with self._lock:
            self._rules = list(rules)
            self._clear_state()

    # -- ingest ------------------------------------------------------------------------------

    def process(self, session: Session, frames: Sequence[NewFrame]) -> list[Alert]:
        """Advance the rules over ``frames`` (in step order); return alerts created or
        changed that people should hear about (suppressed ones are stored, not returned)."""
        changed: list[Alert] = []
        runs = session.execute(select(Run.id, Run.status, Run.end_step, Run.created_at).where(
            Run.id.in_({f.run_id for f in frames}))).all() if frames else []
        ended = {r.id: r.end_step for r in runs
                 if r.status == "finished" and r.end_step is not None}
        with self._lock:
            # a run deleted and its id given to a new one (SQLite reuses the highest id):
            # what the engine remembers of the old run is not the new one's
            for r in runs:
                if self._created.setdefault(r.id, r.created_at) != r.created_at:
                    self._created[r.id] = r.created_at
                    self._forget({k for k in self._seen if k[0] == r.id}
                                 | {k for k in self._loaded if k[0] == r.id})
                    self._newest_seq = {k: v for k, v in self._newest_seq.items()
                                        if k[0] != r.id}
            seen_runs: set[int] = set()
            late: set[tuple[int, int]] = set()
            for f in sorted(frames, key=lambda f: (f.run_id, f.rank, f.step)):
                if f.run_id in ended and f.step > ended[f.run_id]:
                    continue  # after the run said it ended (another rank outlived rank 0)
                newest = self._newest_seq.get((f.run_id, f.rank))
                if newest is not None and f.seq < newest[0] and f.step <= newest[1]:
                    # sent before what was judged, at a step already judged (an old spool
                    # pushed after newer frames): stored, not judged against newer memory;
                    # the (run, rank) is rebuilt from the store, in step order, when it
                    # sends again. (A job resumed on a host whose clock is behind numbers
                    # its frames below its first life's too: its steps past the newest
                    # judged one are judged.)
                    late.add((f.run_id, f.rank))
                    continue
                self._newest_seq[(f.run_id, f.rank)] = (
                    max(f.seq, newest[0]) if newest else f.seq,
                    max(f.step, newest[1]) if newest else f.step)
                if (f.run_id, f.rank) not in self._loaded:
                    self._restore(session, f.run_id, f.rank, before_step=f.step)
                if f.run_id not in seen_runs:  # the run's first frame resolves no_data
                    seen_runs.add(f.run_id)
                    changed.extend(self._resolve_no_data(session, f))
                pending = self._advance(f.run_id, f.rank, f.step, f.scalars, f.heads)
                changed.extend(self._persist(session, f, pending))
                if self._down.get((f.run_id, f.rank)):
                    changed.extend(self._escalate(session, f))
            touched = {(f.run_id, f.rank) for f in frames} - late
            self._save_long_state(session, touched)
            self._forget(late, late=True)
            self._evict(touched)
        return changed

    def _restore(self, session: Session, run_id: int, rank: int, before_step: int) -> None:
        """Replay stored history (silently) to rebuild rule state for one (run, rank)."""
        self._loaded.add((run_id, rank))
        history = self._stored_frames(session, run_id, rank, before_step)
        if not history:
            return
        for step, scalars, heads in history:
            self._advance(run_id, rank, step, scalars, heads)  # transitions dropped: replay
        self._load_long_state(session, run_id, rank)
        self._resume(session, run_id, rank)
