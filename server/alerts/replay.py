"""Replay recorded frames through the real ingest path and alert engine.

Used by ``logitwatch replay FILE`` and ``bench/bench_alerts.py``. The frames go through the
same validation (:class:`~logitwatch.server.schemas.IngestIn`), storage
(:func:`~logitwatch.server.store.ingest.ingest_frames`) and engine
(:meth:`AlertEngine.process`) as ``POST /api/v1/ingest``, batch by batch, on a migrated
database (a temporary SQLite file unless a URL is given), under the rules ``logitwatch
serve`` would apply: the defaults with the ``alert_*`` settings, the YAML rules file
(``rules_file``, else ``$LOGITWATCH_ALERT_RULES``) and the rules stored through the API in
that database (:func:`replay_rules`).

A recorded file has no live job: once replayed, each run it left running is ended as its job
would have ended it (an end frame after its newest frame, :func:`~.lifecycle.end_frame`),
so that a collector on that store later does not report it stopped (``no_data``: "may have
hung or crashed"). A run the file itself ended is left as it is.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.config import api_rules, configured_rules, rules_file
from logitwatch.server.alerts.defaults import merge_rules
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.db.models import Run
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.limits import check_batch
from logitwatch.server.schemas import AlertOut, FrameIn, IngestIn
from logitwatch.server.store import lifecycle
from logitwatch.server.store.alerts import alert_out, list_alerts

__all__ = ["ReplayError", "ReplayResult", "read_frame_lines", "read_frames", "replay",
           "replay_rules"]


@dataclass
class ReplayResult:
    """Every alert stored (including suppressed ones), the frames replayed, which rule
    set judged them (``rules``: e.g. ``"defaults + my-rules.yaml: 19 rules"``), the runs
    replayed (``runs``) and those of them the replay ended (``ended``; ``"project/run"``
    each: the file left them running)."""

    alerts: list[AlertOut] = field(default_factory=list)
    frames: int = 0
    notified: list[AlertOut] = field(default_factory=list)
    rules: str = ""
    runs: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)


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


def read_frames(path: str | Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Read a JSON-lines file (gzip'd if its name ends in ``.gz``): an optional header object
    (no ``seq``), then one frame a line.

    Raises ``ValueError`` naming the file and line that cannot be read (not JSON, nested too
    deeply, not UTF-8, a truncated or corrupt gzip file, a read error).
    """
    header, frames, _ = read_frame_lines(path)
    return header, frames


def read_frame_lines(
    path: str | Path,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[int]]:
    """:func:`read_frames`, with the line number of each frame (for :func:`replay`'s
    ``lines``)."""
    header: dict[str, Any] | None = None
    frames: list[dict[str, Any]] = []
    lines: list[int] = []
    i = 0
    try:
        with gzip.open(path) if str(path).endswith(".gz") else open(path, "rb") as fh:
            for i, raw in enumerate(fh, 1):
                line = raw.decode("utf-8")  # per line: an error names its line
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
                except RecursionError:
                    raise ValueError(f"{path}:{i}: JSON nested too deeply (a frame is at "
                                     "most 4 levels deep)") from None
                except ValueError as e:  # an integer past Python's 4,300 digits
                    raise ValueError(f"{path}:{i}: a number has too many digits ({e})"
                                     ) from None
                if i == 1 and isinstance(obj, dict) and "seq" not in obj:
                    header = obj
                    continue
                frames.append(obj)
                lines.append(i)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{i}: not UTF-8 text ({e.reason} at byte {e.start + 1} of "
                         "the line); a frames file is JSON lines") from None
    except EOFError:
        raise ValueError(f"{path}:{i + 1}: the gzip file ends early (truncated: was it "
                         f"still being written or cut off in a copy?); {len(frames)} frames "
                         "were read before it") from None
    except OSError as e:  # gzip.BadGzipFile, zlib errors are OSError / zlib.error
        where = f"{path}:{i + 1}" if i else str(path)
        raise ValueError(f"{where}: cannot be read ({e.strerror or e})") from None
    except zlib.error as e:
        raise ValueError(f"{path}:{i + 1}: corrupt gzip data ({e})") from None
    return header, frames, lines


class ReplayError(ValueError):
    """A frame the collector refuses (or fails on), with where it is in the input."""


def _where(lines: Sequence[int] | None, k: int) -> str:
    return f"line {lines[k]}" if lines is not None and k < len(lines) else f"frame {k + 1}"


def _refusal(e: ValidationError, start: int, lines: Sequence[int] | None) -> ReplayError:
    """The first error of a batch's validation, as ``line N: field: message``."""
    err = e.errors(include_url=False, include_input=False)[0]
    loc = list(err["loc"])
    if len(loc) >= 2 and loc[0] == "frames" and isinstance(loc[1], int):
        where, field = _where(lines, start + loc[1]), ".".join(str(p) for p in loc[2:])
    else:
        where, field = "batch", ".".join(str(p) for p in loc)
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" ({e.error_count()} errors in this batch)" if e.error_count() > 1 else ""
    return ReplayError(f"{where}: {field or 'frame'}: {msg}{more}")


def _end_runs(s: Session, alerts: AlertEngine, newest: dict[tuple[str, str], FrameIn],
              result: ReplayResult) -> None:
    """End the replayed runs left running (not those the file ended) through the ingest
    path, as their jobs' end frames would have."""
    keys = sorted(newest)
    if not keys:
        return
    running = {(p, n) for p, n in s.execute(
        select(Run.project, Run.name).where(Run.name.in_({n for _, n in keys}),
                                            Run.status != "finished")).all()}
    ends = [lifecycle.end_frame(newest[k]) for k in keys if k in running]
    if not ends:
        return
    _, finished = lifecycle.ingest(s, ends)
    if finished:
        for a in alerts.check_stale(s, runs=finished):  # resolves an open no_data
            run = s.get(Run, a.run_id)
            assert run is not None
            result.notified.append(alert_out(a, run))
        result.ended = [f"{p}/{n}" for p, n in s.execute(
            select(Run.project, Run.name).where(Run.id.in_(sorted(finished)))
            .order_by(Run.project, Run.name)).all()]


def replay(
    frames: Iterable[dict[str, Any]],
    *,
    db_url: str | None = None,
    rules: Iterable[RuleSpec] | None = None,
    settings: Any = None,
    rules_file: str | None = None,
    batch: int = 16,
    progress: Callable[[int], None] | None = None,
    lines: Sequence[int] | None = None,
    end_runs: bool = True,
) -> ReplayResult:
    """Feed ``frames`` (wire-format dicts, in order) through ingest and the engine.

    Args:
        frames: Frames as sent on the wire.
        db_url: Database to write to (migrated first); default a temporary SQLite file.
        rules: Rule set, used as given. Default: :func:`replay_rules` (what ``logitwatch
            serve`` on that database would apply).
        settings: ``Settings`` for the default rules and the ingest limits (frames per
            batch, values per matrix, metrics per run) that ``serve`` holds a batch to
            (default: from the environment).
        rules_file: YAML rules file for the default rules (default:
            ``$LOGITWATCH_ALERT_RULES``).
        batch: Frames per ingest transaction (the client sends up to 256).
        progress: Called with the number of frames replayed so far, after each batch.
        lines: The line number of each frame in its file (:func:`read_frame_lines`), to
            name in errors.
        end_runs: End each run the frames leave running, after its newest frame, as its
            job's end frame would (``result.ended``): a replayed run has no live job.

    Raises:
        ReplayError: a frame the collector refuses (``line N: field: message``), or one
            the store or the engine fails on (the lines of its batch named).
    """
    items = list(frames)
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
            alerts = AlertEngine(rules)
            run_ids: set[int] = set()
            newest: dict[tuple[str, str], FrameIn] = {}  # each run's, to end it after
            batch = max(1, min(batch, settings.max_frames_per_request))  # as a client must
            for i in range(0, len(items), batch):
                try:
                    body = IngestIn.model_validate({"frames": items[i:i + batch]})
                except ValidationError as e:
                    raise _refusal(e, i, lines) from None
                try:
                    check_batch(body, settings)  # the limits `serve` holds a batch to
                    with session_scope(sessions) as s:
                        stored, finished = lifecycle.ingest(
                            s, body.frames, max_metrics_per_run=settings.max_metrics_per_run)
                        run_ids |= stored.run_ids
                        lifecycle.keep_newest(newest, body.frames)
                        fired = alerts.process(s, stored.new_frames)
                        if finished:
                            fired += alerts.check_stale(s, runs=finished)
                        for a in fired:
                            run = s.get(Run, a.run_id)
                            assert run is not None
                            result.notified.append(alert_out(a, run))
                except Exception as e:  # refused by the store (or failing): name the batch
                    last = min(len(items), i + batch) - 1
                    span = _where(lines, i) + (f" to {_where(lines, last)}" if last > i
                                               else "")
                    raise ReplayError(f"{span}: {getattr(e, 'message', e)}") from e
                result.frames = min(len(items), i + batch)
                if progress is not None:
                    progress(result.frames)
            with session_scope(sessions) as s:
                if end_runs:
                    _end_runs(s, alerts, newest, result)
                for rid in sorted(run_ids):
                    result.alerts.extend(list_alerts(s, rid))
                result.runs = [f"{p}/{n}" for p, n in s.execute(
                    select(Run.project, Run.name).where(Run.id.in_(sorted(run_ids)))
                    .order_by(Run.project, Run.name)).all()]
            return result
        finally:
            engine.dispose()
