"""A run's lifecycle: ``running``, ``finished``, ``stopped``, ``diverged``.

* ``finished``: the job said it ended, with an end frame (``"end": "finished"``, see
  ``logitwatch.wire``) that ``Monitor.close()``, ``Client.shutdown()`` and the client's exit
  hook send after the last step. A run follows **rank 0**: its end frame finishes the run
  (``ended_at``, ``end_step``, ``end_seq`` are that frame's time, step and seq); the other
  ranks' end frames are accepted and change nothing. ``logitwatch replay`` ends each run
  it replayed that its file left running the same way, with the end frame its job would
  have sent (:func:`end_frame`): a recorded file has no live job.
* back to ``running``: a frame of rank 0 numbered after the end frame (``seq > end_seq``:
  the job was resumed; seqs follow the clock, so a restarted job's frames come after its
  earlier end frame). An end frame numbered before a frame of rank 0 already stored (an old
  spool pushed late) changes nothing. (A job restarted under the same name on a host whose
  clock is behind the first life's end frame stays finished: its frames look like an old
  spool's.) While a run is finished, the alert engine judges none
  of its frames past the end step (another rank that outlived rank 0's end): a finished run
  gets no alert for what came after it said it ended.
* ``stopped``: the ``no_data`` alert fired (``AlertEngine.check_stale``: nothing received
  for the rule's seconds, by the collector's clock, ``runs.seen_at``); the run's next frame
  resolves it and the run is ``running`` again. A finished run never gets ``no_data``, and an
  open ``no_data`` alert resolves when the run finishes.
* ``diverged``: ``runs.diverged_step`` is set when a run-level divergence alert (a rule with
  ``inhibits``: ``loss_nonfinite``, ``loss_jump``) fires at its rule's severity, at once or
  once escalated (a loss bump held at ``info`` that recovers does not count); it wins over
  the other three when the status is read (:func:`run_status`).

:func:`ingest` is the write path's entry (the ingest route, replay): end frames are taken
out of the batch, the other frames stored by :func:`~.ingest.ingest_frames`, then the
lifecycle is applied in the same transaction. Each change is one conditional UPDATE, so
several collectors on one database agree, and a resent end frame is a duplicate.
"""

from __future__ import annotations

import time as _time
from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import case, exists, or_, select, update
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Run
from logitwatch.server.schemas import FrameIn
from logitwatch.server.store.ingest import IngestResult, _run_id, ingest_frames

__all__ = ["STATUSES", "end_frame", "ingest", "keep_newest", "run_status", "split_ends"]

#: What a run's ``status`` may be.
STATUSES = ("running", "finished", "stopped", "diverged")


def run_status(run: Run) -> str:
    """The status a run reports: ``diverged`` once it did, else its stored lifecycle."""
    return "diverged" if run.diverged_step is not None else run.status


def split_ends(frames: Sequence[FrameIn]) -> tuple[list[FrameIn], list[FrameIn]]:
    """(frames with data, end frames)."""
    data: list[FrameIn] = []
    ends: list[FrameIn] = []
    for f in frames:
        (ends if f.end is not None else data).append(f)
    return data, ends


def keep_newest(newest: dict[tuple[str, str], FrameIn], frames: Sequence[FrameIn]) -> None:
    """Keep in ``newest``, by (project, run), each run's newest data frame of ``frames``
    (rank 0's highest seq; another rank's only while the run has no frame of rank 0): the
    frame after which :func:`end_frame` ends the run."""
    for f in frames:
        if f.end is not None:
            continue
        key = (f.project, f.run)
        have = newest.get(key)
        if have is None or (f.rank == 0, f.seq) > (have.rank == 0, have.seq):
            newest[key] = f


def end_frame(last: FrameIn) -> FrameIn:
    """The end frame that finishes ``last``'s run after it, as ``Monitor.close()``'s does:
    rank 0, at ``last``'s step and time, numbered as ``last`` (any frame of rank 0 numbered
    after it resumes the run). ``logitwatch replay`` ends the runs it replayed with it: a
    recorded file has no live job, and a run left running would be judged stopped (the
    ``no_data`` alert: hung or crashed) by the next collector on the store."""
    return FrameIn(run=last.run, project=last.project, rank=0, seq=last.seq, step=last.step,
                   time=last.time, end="finished")


def ingest(session: Session, frames: Sequence[FrameIn], *,
           max_metrics_per_run: int | None = None,
           now: float | None = None) -> tuple[IngestResult, set[int]]:
    """Store ``frames`` and apply their lifecycle; return the result (end frames counted
    in ``accepted``/``duplicates``, their runs in ``run_ids``) and the ids of the runs
    that finished with this batch. ``now``: the collector's clock (``time.time()`` unless
    given), stored as each run's ``seen_at``."""
    now = _time.time() if now is None else now
    data, ends = split_ends(frames)
    result = (ingest_frames(session, data, max_metrics_per_run=max_metrics_per_run, now=now)
              if data else IngestResult())
    _resume(session, data)
    return result, _finish(session, ends, result, now)


def _by_run(frames: Sequence[FrameIn]) -> dict[tuple[str, str], list[FrameIn]]:
    out: dict[tuple[str, str], list[FrameIn]] = defaultdict(list)
    for f in frames:
        out[(f.project, f.run)].append(f)
    return out


def _resume(session: Session, data: Sequence[FrameIn]) -> None:
    """A finished run that gets a frame of rank 0 numbered after its end frame: resumed."""
    for (project, name), group in sorted(_by_run(data).items()):
        rank0 = [f for f in group if f.rank == 0]
        if not rank0:
            continue
        # By seq only: a step past the end step is also what an old spool looks like when
        # the run's last life started from an earlier checkpoint (it must change nothing).
        t = max(f.time for f in group)
        session.execute(
            update(Run)
            .where(Run.project == project, Run.name == name, Run.status == "finished",
                   Run.end_seq < max(f.seq for f in rank0))
            .values(status="running", ended_at=None, end_step=None, end_seq=None,
                    # a job resumed from an earlier checkpoint sends steps below last_step,
                    # which do not move last_time: without this, the runs list would sort
                    # the resumed run by its first life's last frame
                    last_time=case((or_(Run.last_time.is_(None), Run.last_time < t), t),
                                   else_=Run.last_time))
            .execution_options(synchronize_session=False)
        )


def _finish(session: Session, ends: Sequence[FrameIn], result: IngestResult,
            now: float) -> set[int]:
    """Apply rank 0's newest end frame of each run; count the end frames."""
    finished: set[int] = set()
    for (project, name), group in sorted(_by_run(ends).items()):
        run_id = _run_id(session, project, name)
        result.run_ids.add(run_id)
        session.execute(update(Run).where(Run.id == run_id).values(seen_at=now))
        rank0 = [f for f in group if f.rank == 0]
        result.accepted += len(group) - len(rank0)  # other ranks: taken, no effect
        if not rank0:
            continue
        end = max(rank0, key=lambda f: f.seq)
        result.accepted += len(rank0) - 1
        later = exists().where(Frame.run_id == run_id, Frame.rank == 0, Frame.seq > end.seq)
        done = session.execute(
            update(Run)
            .where(Run.id == run_id, or_(Run.end_seq.is_(None), Run.end_seq < end.seq),
                   ~later)
            .values(status="finished", ended_at=end.time, end_step=end.step,
                    end_seq=end.seq)
            .execution_options(synchronize_session=False)
        ).rowcount
        if done:
            finished.add(run_id)
            result.accepted += 1
        elif session.scalar(select(Run.end_seq).where(Run.id == run_id)) == end.seq:
            result.duplicates += 1  # a resend
        else:
            result.accepted += 1  # older than what the run has: no effect
    return finished
