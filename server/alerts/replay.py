"""Replay recorded frames through the real ingest path and alert engine.

Used by ``logitwatch replay FILE`` and ``bench/bench_alerts.py``. The frames go through the
same validation (:class:`~logitwatch.server.schemas.IngestIn`), storage
(:func:`~logitwatch.server.store.ingest.ingest_frames`) and engine
(:meth:`AlertEngine.process`) as ``POST /api/v1/ingest``, batch by batch, on a migrated
database (a temporary SQLite file unless a URL is given), under the rules ``logitwatch
serve`` would apply: the defaults with the ``alert_*`` settings, the YAML rules file
(``rules_file``, else ``$LOGITWATCH_ALERT_RULES``) and the rules stored through the API in
that database (:func:`replay_rules`).

A file is read a line at a time (:class:`FrameFile`) and stored a batch at a time, so a
replay holds one batch in memory whatever the file's size; a batch keeps to what one ingest
request may carry (frames, history steps, runs, ranks; :meth:`.replay_batch.Batch.takes`).

**The batch size changes nothing stored or judged**: both are those of a replay one frame at
a time, in the file's order. The engine sorts what one call gives it by (run, rank, step)
and reads the runs' status once per call, so a batch judged in one call would change the
verdicts where a file is not in that order (a job restarted from an earlier checkpoint:
which of its frames the engine takes as late depended on what shared their batch) or where
a run ends or resumes within a batch (another rank's frames past rank 0's end step are not
judged once the run is finished: whether they shared the end frame's batch decided it). So
a batch is stored in one transaction, then judged frame by frame in file order, frames
merged into one engine call only where that order is the engine's and none can be late
(:meth:`_Replay.judged`); an end frame, a frame resent within the batch and a rank 0 frame
that may resume a finished run start a batch. By design, as for a client's batches, one
thing is judged a batch at a time: the step at which a ``no_data`` alert already open in
the store resolves (the newest of the first batch of its run).

A recorded file has no live job: once replayed, each run it left running is ended as its job
would have ended it (an end frame after its newest frame, :func:`~.lifecycle.end_frame`),
so that a collector on that store later does not report it stopped (``no_data``: "may have
hung or crashed"). A run the file itself ended is left as it is.

A file written by ``logitwatch runs export`` starts with a header line
(``{"logitwatch_export": 1, "project", "run", "config", "tags", ...}``): given it
(``header``), the replayed run gets its configuration (as ``PUT /runs/{run}/config`` sets
one) and its tags (added, as ``logitwatch runs tag`` adds them), in the transaction of the
run's first batch; every frame must be of that run (:func:`export_header`).
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.config import api_rules, configured_rules, rules_file
from logitwatch.server.alerts.defaults import merge_rules
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.replay_batch import (
    BATCH_BYTES,
    JUDGE_FRAMES,
    REPLAY_BATCH,
    Batch,
    run_key,
)
from logitwatch.server.alerts.replay_file import (
    FrameFile,
    FrameFileError,
    Numbered,
    export_header,
    read_frame_lines,
    read_frames,
)
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.db.models import Run
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.errors import ApiError
from logitwatch.server.limits import check_batch
from logitwatch.server.schemas import AlertOut, FrameIn, IngestIn
from logitwatch.server.store import lifecycle
from logitwatch.server.store.alerts import alert_out, list_alerts
from logitwatch.server.store.ingest import NewFrame

__all__ = ["BATCH_BYTES", "JUDGE_FRAMES", "REPLAY_BATCH", "FrameFile", "FrameFileError",
           "ReplayError", "ReplayResult", "export_header", "read_frame_lines", "read_frames",
           "replay", "replay_rules"]

@dataclass
class ReplayResult:
    """Every alert stored (including suppressed ones), the frames replayed, which rule
    set judged them (``rules``: e.g. ``"defaults + my-rules.yaml: 19 rules"``), the runs
    replayed (``runs``) and those of them the replay ended (``ended``; ``"project/run"``
    each: the file left them running), and whether an export header was applied."""

    alerts: list[AlertOut] = field(default_factory=list)
    frames: int = 0
    notified: list[AlertOut] = field(default_factory=list)
    rules: str = ""
    runs: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    #: batches stored (transactions)
    batches: int = 0
    #: the export header's config and tags were applied to its run
    header_applied: bool = False
    #: steps between two frames of a (run, rank) that neither carried (no ``history``):
    #: their loss, gradient norm, clip flag and LR were never judged
    unsent_steps: int = 0


def replay_rules(settings: Any = None, *, path: str | None = None,
                 session: Session | None = None) -> tuple[list[RuleSpec], str]:
    """The rules ``logitwatch serve`` would apply, and where they come from.

    :func:`~.config.configured_rules` of ``settings`` (default: ``Settings()``, i.e. the
    ``LOGITWATCH_*`` environment) and the YAML file ``path`` (else
    ``$LOGITWATCH_ALERT_RULES``), then the API rules stored in ``session``'s database.

    Raises:
        RuleError, OSError, ValueError: the rules file cannot be used.
    """
    if settings is None:
        from logitwatch.server.settings import Settings

        settings = Settings()
    rules = configured_rules(settings, path)
    source = "defaults"
    tuned = sorted(k for k in getattr(settings, "model_fields_set", ())
                   if k.startswith("alert_") and k != "alert_sample_every")
    if tuned:
        source += f" with {', '.join(tuned)}"
    f = rules_file(path)
    if f:
        source += f" + {f}"
    extra = api_rules(session) if session is not None else []
    if extra:
        rules = merge_rules(rules, extra)
        source += f" + {len(extra)} API rule{'s' if len(extra) > 1 else ''} from the database"
    n = sum(1 for r in rules if r.enabled)
    return rules, f"{source}: {n} rule{'s' if n != 1 else ''}"


# --- the replay ---------------------------------------------------------------------------


class ReplayError(ValueError):
    """A frame the collector refuses (or fails on), with where it is in the input."""


def _refusal(e: ValidationError, where: Sequence[str]) -> ReplayError:
    """The first error of a batch's validation, as ``line N: field: message``."""
    err = e.errors(include_url=False, include_input=False)[0]
    loc = list(err["loc"])
    if len(loc) >= 2 and loc[0] == "frames" and isinstance(loc[1], int):
        at, fld = where[loc[1]], ".".join(str(p) for p in loc[2:])
    else:
        at, fld = "batch", ".".join(str(p) for p in loc)
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" ({e.error_count()} errors in this batch)" if e.error_count() > 1 else ""
    return ReplayError(f"{at}: {fld or 'frame'}: {msg}{more}")


class _Replay:
    """One replay's store, engine and what it tracks between batches."""

    def __init__(self, sessions: sessionmaker[Session], alerts: AlertEngine, settings: Any,
                 result: ReplayResult, header: dict[str, Any] | None,
                 progress: Callable[[int], None] | None) -> None:
        self.sessions, self.alerts, self.settings = sessions, alerts, settings
        self.result, self.header, self.progress = result, header, progress
        self.reported = 0  # frames said to ``progress``
        self.run_ids: set[int] = set()
        self.newest: dict[tuple[str, str], FrameIn] = {}  # each run's, to end it after
        self.status: dict[tuple[str, str], bool] = {}  # (project, run) -> finished
        # (run_id, rank) -> the highest seq and step given to the engine: a frame below
        # both may be late (what AlertEngine.process skips and rebuilds after)
        self.high: dict[tuple[int, int], tuple[int, int]] = {}
        # (project, run, rank) -> the newest step a frame or its history carried
        self.reached: dict[tuple[str, str, int], int] = {}

    def finished(self, run: tuple[str, str]) -> bool:
        """Whether ``run`` is finished in the store (as of the last batch stored)."""
        if run not in self.status:
            with session_scope(self.sessions) as s:
                self.status[run] = s.scalar(select(Run.status).where(
                    Run.project == run[0], Run.name == run[1])) == "finished"
        return self.status[run]

    def count_unsent(self, frames: Sequence[FrameIn]) -> None:
        """Add to ``result.unsent_steps`` the steps no frame carried: for each frame of
        ``frames`` with scalars or a ``history``, those between its (run, rank)'s newest
        step so far and its own that its ``history`` leaves out. A frame at or before that
        newest step (a late frame, or a job resumed from an earlier checkpoint) counts
        nothing, and the count goes on from the newest step."""
        for f in frames:
            if f.end is not None or not (f.scalars or f.history):
                continue  # an end frame, or per-head statistics alone
            key = (f.project, f.run, f.rank)
            prev = self.reached.get(key)
            if prev is not None and f.step > prev + 1:
                carried = sum(1 for st in f.history.steps if prev < st < f.step) if (
                    f.history is not None) else 0
                self.result.unsent_steps += f.step - prev - 1 - carried
            self.reached[key] = f.step if prev is None else max(prev, f.step)

    def store(self, batch: Batch) -> None:
        """Validate, store and judge one batch, in one transaction."""
        where = [w for w, _ in batch.items]
        try:
            body = IngestIn.model_validate({"frames": [raw for _, raw in batch.items]})
        except ValidationError as e:
            raise _refusal(e, where) from None
        result = self.result
        self.count_unsent(body.frames)
        try:
            check_batch(body, self.settings)  # the limits `serve` holds a batch to
            with session_scope(self.sessions) as s:
                stored, finished = lifecycle.ingest(
                    s, body.frames, max_metrics_per_run=self.settings.max_metrics_per_run)
                self.run_ids |= stored.run_ids
                lifecycle.keep_newest(self.newest, body.frames)
                ids = {(p, n): i for i, p, n in s.execute(
                    select(Run.id, Run.project, Run.name).where(Run.id.in_(stored.run_ids)))}
                if self.header is not None and not result.header_applied:
                    self.apply_header(s, ids)
                fired = []
                for frames, done in self.judged(body.frames, stored.new_frames, ids):
                    fired += self.alerts.process(s, frames)
                    self.told(result.frames + done)  # judged; stored at the commit below
                if finished:
                    fired += self.alerts.check_stale(s, runs=finished)
                for a in fired:
                    run = s.get(Run, a.run_id)
                    assert run is not None
                    result.notified.append(alert_out(a, run))
                self.status.update({(p, n): st == "finished" for p, n, st in s.execute(
                    select(Run.project, Run.name, Run.status)
                    .where(Run.id.in_(stored.run_ids)))})
        except ReplayError:
            raise
        except Exception as e:  # refused by the store (or failing): name the batch
            span = where[0] + (f" to {where[-1]}" if len(where) > 1 else "")
            raise ReplayError(f"{span}: {getattr(e, 'message', e)}") from e
        result.frames += len(batch)
        result.batches += 1
        self.told(result.frames)

    def told(self, n: int) -> None:
        """Report ``n`` frames replayed, unless reported already."""
        if self.progress is not None and n > self.reported:
            self.reported = n
            self.progress(n)

    def judged(self, frames: Sequence[FrameIn], new: Sequence[NewFrame],
               ids: Mapping[tuple[str, str], int]) -> Iterator[tuple[list[NewFrame], int]]:
        """The engine calls that judge ``new`` (the rows a batch stored) as a replay of one
        frame at a time would, each with how many of ``frames`` it has judged so far: each
        frame's rows (its history steps and itself, as ingest made them), in file order;
        consecutive frames together (at most :data:`JUDGE_FRAMES`) while that is also the
        engine's own order, (run, rank, step), and none of them may be late (a seq below
        and a step at or below what the engine was given of its rank: it skips such a frame
        and rebuilds the rank after the call, so it is judged in a call of its own)."""
        rows: dict[tuple[int, int, int], list[NewFrame]] = defaultdict(list)
        for r in new:  # a history step carries the seq of the frame that carried it
            rows[(r.run_id, r.rank, r.seq)].append(r)
        call: list[NewFrame] = []
        n, alone = 0, False  # frames in the call; whether its last frame must be alone
        for k, f in enumerate(frames):
            mine = rows.pop((ids[(f.project, f.run)], f.rank, f.seq), None)
            if not mine:
                continue  # a frame stored already, or an end frame
            rank = (mine[0].run_id, mine[0].rank)
            high = self.high.get(rank)
            late = high is not None and any(r.seq < high[0] and r.step <= high[1]
                                            for r in mine)
            if call and (alone or late or n >= JUDGE_FRAMES
                         or (call[-1].run_id, call[-1].rank, call[-1].step)
                         > (mine[0].run_id, mine[0].rank, mine[0].step)):
                yield call, k
                call, n = [], 0
            call += mine  # ingest made them in step order
            n += 1
            alone = late
            self.high[rank] = (max(f.seq, high[0]) if high else f.seq,
                               max(mine[-1].step, high[1]) if high else mine[-1].step)
        if call:
            yield call, len(frames)
        for left in rows.values():  # none: every row is of a frame of the batch (a guard)
            yield left, len(frames)

    def apply_header(self, s: Session, ids: Mapping[tuple[str, str], int]) -> None:
        """Give the export header's run its configuration and tags (in the transaction of
        the run's first batch: refused, nothing of the file is stored)."""
        from logitwatch.server.store.run_edits import set_config, set_tags

        header = self.header
        assert header is not None
        rid = ids.get((header["project"], header["run"]))
        if rid is None:
            return  # (every frame is of the header's run, _check_run: its first batch has it)
        try:
            if header.get("config"):
                set_config(s, rid, header["config"])
            if header.get("tags"):
                set_tags(s, rid, add=header["tags"])
        except ApiError as e:
            raise ReplayError(f"line 1: the export header's {e.message}; nothing was stored"
                              ) from None
        except ValueError:  # json.dumps of a NaN the header's JSON held
            raise ReplayError("line 1: the export header's config: numbers must be finite; "
                              "nothing was stored") from None
        self.result.header_applied = True

    def end_runs(self, s: Session) -> None:
        """End the replayed runs left running (not those the file ended) through the ingest
        path, as their jobs' end frames would have."""
        keys = sorted(self.newest)
        if not keys:
            return
        running = {(p, n) for p, n in s.execute(
            select(Run.project, Run.name).where(Run.name.in_({n for _, n in keys}),
                                                Run.status != "finished")).all()}
        ends = [lifecycle.end_frame(self.newest[k]) for k in keys if k in running]
        if not ends:
            return
        _, finished = lifecycle.ingest(s, ends)
        if finished:
            for a in self.alerts.check_stale(s, runs=finished):  # resolves an open no_data
                run = s.get(Run, a.run_id)
                assert run is not None
                self.result.notified.append(alert_out(a, run))
            self.result.ended = [f"{p}/{n}" for p, n in s.execute(
                select(Run.project, Run.name).where(Run.id.in_(sorted(finished)))
                .order_by(Run.project, Run.name)).all()]


def _check_run(raw: Any, header: Mapping[str, Any], where: str) -> None:
    """A frame of another run than the export header's: refused, naming both."""
    run = run_key(raw)
    if isinstance(raw, dict) and run != (header["project"], header["run"]):
        raise ReplayError(
            f"{where}: a frame of run {run[0]}/{run[1]}, but the file's header (line 1) is "
            f"of run {header['project']}/{header['run']}: an export holds one run (--no-header"
            " stores the frames without the header's config and tags)")


def replay(
    frames: Iterable[dict[str, Any]] | FrameFile,
    *,
    db_url: str | None = None,
    rules: Iterable[RuleSpec] | None = None,
    settings: Any = None,
    rules_file: str | None = None,
    batch: int = 16,
    progress: Callable[[int], None] | None = None,
    lines: Sequence[int] | None = None,
    end_runs: bool = True,
    header: Mapping[str, Any] | None = None,
) -> ReplayResult:
    """Feed ``frames`` (wire-format dicts, in order) through ingest and the engine.

    Args:
        frames: Frames as sent on the wire, or a :class:`FrameFile` (read as it goes: a
            batch in memory at a time, a batch's lines at most :data:`BATCH_BYTES`). An
            iterable is consumed as it goes too.
        db_url: Database to write to (migrated first); default a temporary SQLite file.
        rules: Rule set, used as given. Default: :func:`replay_rules` (what ``logitwatch
            serve`` on that database would apply).
        settings: ``Settings`` for the default rules and the ingest limits (frames per
            batch, values per matrix, metrics per run) that ``serve`` holds a batch to
            (default: from the environment).
        rules_file: YAML rules file for the default rules (default:
            ``$LOGITWATCH_ALERT_RULES``).
        batch: Frames per ingest transaction, at most ``max_frames_per_request`` (the
            client sends up to 256; ``logitwatch replay`` stores :data:`REPLAY_BATCH`). What
            is stored and judged does not depend on it (module docstring).
        progress: Called with the number of frames replayed so far, as they are judged
            (every :data:`JUDGE_FRAMES` frames or fewer; stored at their batch's commit).
        lines: The line number of each frame in its file (:func:`read_frame_lines`), to
            name in errors (a :class:`FrameFile` names its own).
        end_runs: End each run the frames leave running, after its newest frame, as its
            job's end frame would (``result.ended``): a replayed run has no live job.
        header: An export header (:func:`export_header`): its run gets its config and
            tags, and every frame must be of that run.

    Raises:
        ReplayError: a frame the collector refuses (``line N: field: message``), one the
            store or the engine fails on (the lines of its batch named), or one of another
            run than ``header``'s.
        FrameFileError: a line of a :class:`FrameFile` that cannot be read; the batches
            before it are stored (``replayed`` says how many frames), the runs not ended.
    """
    if isinstance(frames, FrameFile):
        numbered: Iterable[Numbered] = frames
    else:
        numbered = ((lines[k] if lines is not None and k < len(lines) else None, 0, f)
                    for k, f in enumerate(frames))
    with tempfile.TemporaryDirectory(prefix="logitwatch-replay-") as tmp:
        url = db_url or f"sqlite:///{Path(tmp) / 'replay.db'}"
        engine = make_engine(url)
        try:
            migrate(engine)
            sessions = sessionmaker(engine, expire_on_commit=False)
            result = ReplayResult()
            if settings is None:
                from logitwatch.server.settings import Settings

                settings = Settings()
            if rules is None:
                with session_scope(sessions) as s:
                    rules, result.rules = replay_rules(settings, path=rules_file, session=s)
            else:
                rules = list(rules)
                result.rules = f"as given: {sum(1 for r in rules if r.enabled)} rules"
            run = _Replay(sessions, AlertEngine(rules), settings, result,
                          dict(header) if header is not None else None, progress)
            most = max(1, min(batch, settings.max_frames_per_request))  # as a client must
            _feed(run, numbered, most)
            with session_scope(sessions) as s:
                if end_runs:
                    run.end_runs(s)
                for rid in sorted(run.run_ids):
                    result.alerts.extend(list_alerts(s, rid))
                result.runs = [f"{p}/{n}" for p, n in s.execute(
                    select(Run.project, Run.name).where(Run.id.in_(sorted(run.run_ids)))
                    .order_by(Run.project, Run.name)).all()]
            return result
        finally:
            engine.dispose()


def _feed(run: _Replay, numbered: Iterable[Numbered], most: int) -> None:
    """Read ``numbered`` into batches and store each (:meth:`_Replay.store`)."""
    most_bytes = min(BATCH_BYTES, run.settings.max_request_bytes)
    pending = Batch(most, most_bytes)
    k = 0  # frames read
    items = iter(numbered)

    def flush() -> None:
        nonlocal pending
        if pending:
            run.store(pending)
        pending = Batch(most, most_bytes)

    while True:
        try:
            item = next(items, None)
        except FrameFileError as e:  # what came before the line is stored, as said
            flush()
            e.replayed = run.result.frames
            raise
        if item is None:
            break
        line, size, raw = item
        where = f"line {line}" if line is not None else f"frame {k + 1}"
        if run.header is not None:
            _check_run(raw, run.header, where)
        if not pending.takes(raw, size, run.finished):
            flush()
        pending.add(where, raw, size)
        k += 1
    flush()
