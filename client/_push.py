"""``logitwatch push SPOOL``: send what a job left in its disk spool, then delete it.

Segments are sent in sequence order, one writer directory at a time, in batches of up to
``max_batch`` frames; each segment is deleted only after the collector answered 2xx, so an
interrupted push can simply be run again (the collector ignores frames it already has).
Directories still locked by a live process (a running job replays its own spool) are
skipped.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ._http import IngestTransport, Outcome, backoff_delay, failure_hint
from ._spool import (
    SUFFIX,
    SpoolCorrupt,
    find_writer_dirs,
    is_locked,
    read_header,
    read_meta,
    read_segment,
    remove_writer_dir,
)
from ._url import normalize_url

__all__ = ["PushError", "PushResult", "push_spool", "spool_frames"]


class PushError(Exception):
    """The push stopped (collector unreachable, no URL); the message says what to do."""


#: Answers a person must act on (a URL, a token, a host name to fix): the push stops at
#: once instead of retrying; the frames stay in the spool.
STOP_AT_ONCE = frozenset({401, 403, 404, 421})


@dataclass
class PushResult:
    """What a push did; counts are frames."""

    sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    corrupt: int = 0  # frames of damaged segments, as far as their header can be believed
    skipped: list[str] = field(default_factory=list)  # directories of live processes
    damaged: list[str] = field(default_factory=list)  # "<file>: <why>", set aside .corrupt


def header_frames(seg: Path) -> int | None:
    """The frames a segment's header claims, if the header agrees with the file (its
    size, at least two bytes a frame); None for a header that cannot be believed."""
    try:
        head = read_header(seg)
        size = seg.stat().st_size
        with open(seg, "rb") as f:
            header_len = len(f.readline(4096))
    except (OSError, SpoolCorrupt):
        return None
    frames, body = head["frames"], head["bytes"]
    if header_len + body != size or not 0 < frames <= body // 2 or head["first"] > head["last"]:
        return None
    return int(frames)


def _segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob(f"*{SUFFIX}") if not p.name.startswith("."))


def spool_frames(path: Path) -> tuple[int, list[Path], list[Path]]:
    """``(frames, writer dirs to push, dirs locked by a live process)`` under ``path``."""
    total = 0
    ready: list[Path] = []
    locked: list[Path] = []
    for d in find_writer_dirs(path):
        if is_locked(d):
            locked.append(d)
            continue
        ready.append(d)
        for seg in _segments(d):
            total += header_frames(seg) or 0
    return total, ready, locked


def push_spool(
    path: str | Path,
    *,
    url: str | None = None,
    token: str | None = None,
    max_batch: int = 256,
    timeout: float = 30.0,
    attempts: int = 5,
    gzip_level: int = 1,
    progress: Callable[[int], None] | None = None,
    http: httpx.Client | None = None,
) -> PushResult:
    """Send every spooled frame under ``path`` to the collector and delete what was sent.

    Args:
        path: A spool root or any directory below it.
        url: Collector base URL; default: the one recorded by the job that spooled.
        token: Ingest token (``LOGITWATCH_TOKEN`` is read by the CLI).
        attempts: Tries per batch on connection errors, 5xx, ...; then :class:`PushError`.
        progress: Called with the number of frames handled after each batch.

    Raises:
        PushError: nothing to push to (no URL), or the collector kept failing.
    """
    root = Path(path)
    if not root.exists():
        raise PushError(f"{root}: no such spool directory")
    _, ready, locked = spool_frames(root)
    result = PushResult(skipped=[str(d) for d in locked])
    for directory in ready:
        target = url or read_meta(directory).get("url")
        if not isinstance(target, str) or not target:
            raise PushError(f"{directory}: the job recorded no collector URL; pass --url")
        try:
            target = normalize_url(target)
        except ValueError as e:
            raise PushError(f"{e}; pass the collector's base URL with --url") from None
        transport = IngestTransport(target, timeout=timeout, http=http, token=token,
                                    gzip_level=gzip_level, user_agent="logitwatch-push")
        try:
            _push_dir(directory, transport, max_batch, attempts, result, progress)
        finally:
            transport.close()
        if not _segments(directory):
            remove_writer_dir(directory)
    return result


def _push_dir(directory: Path, transport: IngestTransport, max_batch: int, attempts: int,
              result: PushResult, progress: Callable[[int], None] | None) -> None:
    segments = _segments(directory)
    while segments:
        batch: list[Path] = []
        lines: list[bytes] = []
        while segments and (not batch or len(lines) < max_batch):
            seg = segments[0]
            try:
                seg_lines = read_segment(seg)
            except (SpoolCorrupt, OSError) as e:
                segments.pop(0)
                result.corrupt += header_frames(seg) or 0
                why = str(e).removeprefix(f"{seg}: ") or type(e).__name__
                with contextlib.suppress(OSError):
                    seg.rename(seg.with_suffix(".corrupt"))
                result.damaged.append(f"{seg.with_suffix('.corrupt')}: {why}")
                continue
            if batch and len(lines) + len(seg_lines) > max_batch:
                break
            segments.pop(0)
            batch.append(seg)
            lines.extend(seg_lines)
        if not batch:
            continue
        for attempt in range(attempts):
            outcome = transport.post(lines)
            if outcome.kind != "retry" or outcome.status in STOP_AT_ONCE:
                break
            if attempt + 1 < attempts:
                time.sleep(backoff_delay(attempt, max_backoff=10.0,
                                         retry_after=outcome.retry_after))
        if outcome.kind == "retry":
            left = len(lines)
            for seg in segments:
                with contextlib.suppress(OSError, SpoolCorrupt):
                    left += header_frames(seg) or 0
            raise PushError(_failed(outcome, transport.endpoint, attempt + 1, left, directory))
        if outcome.kind == "ok":
            result.sent += len(lines)
            acc, dup = outcome.answer.get("accepted"), outcome.answer.get("duplicates")
            result.accepted += acc if isinstance(acc, int) else 0
            result.duplicates += dup if isinstance(dup, int) else 0
            for seg in batch:
                seg.unlink()
        else:  # refused as invalid: kept aside for a person to look at, not sent again
            result.rejected += len(lines)
            for seg in batch:
                seg.rename(seg.with_suffix(".rejected"))
        if progress is not None:
            progress(len(lines))


def _failed(outcome: Outcome, endpoint: str, attempts: int, left: int, directory: Path) -> str:
    """Why the push stopped, told apart: nothing answers (the collector is down or the
    address is wrong), a wrong path or a token to fix (it answers: waiting will not help),
    or a collector that is up but failing."""
    kept = f"{left} frame(s) are still in {directory}"
    tries = f"after {attempts} attempt{'s' if attempts > 1 else ''}"
    hint = failure_hint(outcome)
    if outcome.status == 0:
        return (f"no collector answers at {endpoint} ({outcome.message}) {tries}: it is down "
                f"or the host or port is wrong (start it with `logitwatch serve`, check "
                f"--url); {kept}: run the command again when it is up")
    if hint:
        return (f"{endpoint} answered {outcome.message}: {hint}; {kept}: run the command "
                "again with the right --url (or token)")
    return (f"the collector at {endpoint} is up but did not take the frames "
            f"({outcome.message}) {tries}; {kept}: run the command again later")
