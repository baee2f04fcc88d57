"""``logitwatch push SPOOL``: send what a job left in its disk spool, then delete it.

Segments are sent in sequence order, one writer directory at a time, in requests of up to
``max_batch`` frames, :data:`MAX_BATCH_BYTES` bytes and :data:`MAX_REQUEST_HISTORY_STEPS`
history steps (the collector's limit), a segment split over requests where it must be;
each segment is deleted only after the collector answered 2xx for all its frames, so an
interrupted push can simply be run again (the collector ignores frames it already has). A
request the collector refuses as a whole (400, 413, 422, ...) is sent in halves, and
halves of the halves that are refused, as the live client does: only the frames refused
on their own are set aside (``*.rejected``). Directories still locked by a live process (a
running job replays its own spool) or by another push are skipped: a push holds the
directory's lock while it sends it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from logitwatch.wire import MAX_REQUEST_HISTORY_STEPS

from ._backlog_spool import MAX_BATCH_BYTES
from ._http import IngestTransport, Outcome, backoff_delay, failure_hint
from ._queue import _seq
from ._spool import (
    SUFFIX,
    SpoolCorrupt,
    find_writer_dirs,
    is_locked,
    read_header,
    read_meta,
    read_segment,
    remove_writer_dir,
    try_lock,
    write_segment,
)
from ._url import normalize_url

__all__ = ["PushError", "PushResult", "push_spool", "spool_frames"]

log = logging.getLogger("logitwatch.client")



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
        attempts: Tries per request on connection errors, 5xx, ...; then :class:`PushError`.
        progress: Called with the number of frames handled after each request.

    Raises:
        PushError: nothing to push to (no URL), or the collector kept failing.
    """
    root = Path(path)
    if not root.exists():
        raise PushError(f"{root}: no such spool directory")
    _, ready, locked = spool_frames(root)
    result = PushResult(skipped=[str(d) for d in locked])
    for directory in ready:
        try:
            fd = try_lock(directory, create=True)
        except FileNotFoundError:  # pushed and removed meanwhile, by another push
            continue
        if fd is None:  # taken since spool_frames looked: another push, or a job
            log.warning("logitwatch push: skipped %s: another process (a push, or the job "
                        "that writes it) is using it", directory)
            result.skipped.append(str(directory))
            continue
        try:
            _push_dir(directory, url=url, token=token, max_batch=max_batch, timeout=timeout,
                      attempts=attempts, gzip_level=gzip_level, progress=progress, http=http,
                      result=result)
        finally:
            if fd >= 0:
                os.close(fd)  # drops the lock
    return result


def _push_dir(directory: Path, *, url: str | None, token: str | None, max_batch: int,
              timeout: float, attempts: int, gzip_level: int,
              progress: Callable[[int], None] | None, http: httpx.Client | None,
              result: PushResult) -> None:
    """Push one writer directory, its lock held; remove it once emptied."""
    segments = _segments(directory)
    if not segments:  # sent meanwhile, by a push that has finished since
        remove_writer_dir(directory)
        return
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
        _DirPush(directory, transport, max_batch, attempts, result, progress).run(segments)
    finally:
        transport.close()
    if not _segments(directory):
        remove_writer_dir(directory)


def _steps(line: bytes) -> int:
    """The history steps of an encoded frame (0 if it has none or cannot be read)."""
    if b'"history"' not in line:
        return 0
    try:
        steps = json.loads(line)["history"]["steps"]
    except (ValueError, KeyError, TypeError):
        return 0
    return len(steps) if isinstance(steps, list) else 0


class _DirPush:
    """Pushes one writer directory's segments (its lock held by the caller)."""

    def __init__(self, directory: Path, transport: IngestTransport, max_batch: int,
                 attempts: int, result: PushResult,
                 progress: Callable[[int], None] | None) -> None:
        self.directory = directory
        self.transport = transport
        self.max_batch = max(1, max_batch)
        self.attempts = attempts
        self.result = result
        self.progress = progress

    def run(self, segments: list[Path]) -> None:
        todo = deque(segments)
        carried: tuple[Path, list[bytes], list[int]] | None = None  # read, not yet sent
        while todo or carried:
            group: list[Path] = []
            lines: list[bytes] = []
            steps: list[int] = []
            size = total = 0
            while carried or todo:
                if carried is not None:
                    seg, seg_lines, seg_steps = carried
                    carried = None
                else:
                    seg = todo.popleft()
                    try:
                        seg_lines = read_segment(seg)
                    except FileNotFoundError:  # gone: pushed meanwhile (nothing to set aside)
                        continue
                    except (SpoolCorrupt, OSError) as e:
                        self._damaged(seg, e)
                        continue
                    seg_steps = [_steps(line) for line in seg_lines]
                seg_size = sum(len(line) + 1 for line in seg_lines)
                seg_total = sum(seg_steps)
                if group and (len(lines) + len(seg_lines) > self.max_batch
                              or size + seg_size > MAX_BATCH_BYTES
                              or total + seg_total > MAX_REQUEST_HISTORY_STEPS):
                    carried = (seg, seg_lines, seg_steps)
                    break
                group.append(seg)
                lines.extend(seg_lines)
                steps.extend(seg_steps)
                size += seg_size
                total += seg_total
            if not group:
                continue
            rejected: list[bytes] = []
            for request in self._requests(lines, steps):
                rejected.extend(self._send(request, lines, [carried[0]] if carried else [],
                                           todo))
                if self.progress is not None:
                    self.progress(len(request))
            # refused frames are kept for a person to look at, never sent again; if they
            # cannot be written apart, the whole segments are (as they are)
            keep = bool(rejected) and not self._set_aside(rejected)
            for seg in group:
                with contextlib.suppress(FileNotFoundError):
                    if keep:
                        seg.rename(seg.with_suffix(".rejected"))
                    else:
                        seg.unlink()

    def _requests(self, lines: list[bytes], steps: list[int]) -> list[list[bytes]]:
        """``lines`` cut into requests within ``max_batch`` frames, MAX_BATCH_BYTES bytes
        and MAX_REQUEST_HISTORY_STEPS history steps (``steps``: each line's; at least one
        frame a request)."""
        requests: list[list[bytes]] = []
        part: list[bytes] = []
        size = total = 0
        for line, k in zip(lines, steps, strict=True):
            n = len(line) + 1
            if part and (len(part) >= self.max_batch or size + n > MAX_BATCH_BYTES
                         or total + k > MAX_REQUEST_HISTORY_STEPS):
                requests.append(part)
                part, size, total = [], 0, 0
            part.append(line)
            size += n
            total += k
        if part:
            requests.append(part)
        return requests

    def _send(self, request: list[bytes], group: list[bytes], carried: list[Path],
              rest: deque[Path]) -> list[bytes]:
        """Deliver ``request``; a refusal of the whole request sends it in halves, and
        halves of the refused halves, so only frames refused on their own are lost.
        Returns those frames."""
        refused: list[bytes] = []
        parts: deque[list[bytes]] = deque([request])
        while parts:
            part = parts.popleft()
            outcome = self._post(part, group, [*carried, *rest])
            if outcome.kind == "ok":
                self.result.sent += len(part)
                acc, dup = outcome.answer.get("accepted"), outcome.answer.get("duplicates")
                self.result.accepted += acc if isinstance(acc, int) else 0
                self.result.duplicates += dup if isinstance(dup, int) else 0
            elif len(part) > 1:  # refused as a whole: which of its frames?
                mid = len(part) // 2
                parts.extendleft([part[mid:], part[:mid]])
            else:
                refused.append(part[0])
        self.result.rejected += len(refused)
        return refused

    def _post(self, lines: list[bytes], group: list[bytes], rest: list[Path]) -> Outcome:
        """One request, tried up to ``attempts`` times while the collector fails; an
        answer (2xx, or a refusal) is returned, a failure raises :class:`PushError`."""
        for attempt in range(self.attempts):
            outcome = self.transport.post(lines)
            if outcome.kind != "retry" or outcome.status in STOP_AT_ONCE:
                break
            if attempt + 1 < self.attempts:
                time.sleep(backoff_delay(attempt, max_backoff=10.0,
                                         retry_after=outcome.retry_after))
        if outcome.kind == "retry":
            left = len(group)  # the group's segments are all still there
            for seg in rest:
                left += header_frames(seg) or 0
            raise PushError(_failed(outcome, self.transport.endpoint, attempt + 1, left,
                                    self.directory))
        return outcome

    def _set_aside(self, lines: list[bytes]) -> bool:
        """Write refused frames to a ``.rejected`` file; False if the disk refused."""
        order = sorted(lines, key=_seq)
        try:
            write_segment(self.directory, [_seq(line) for line in order], order,
                          suffix=".rejected")
        except OSError as e:
            log.warning("logitwatch push: cannot write %d refused frame(s) apart in %s (%s); "
                        "their segments are kept whole as *.rejected", len(order),
                        self.directory, e)
            return False
        return True

    def _damaged(self, seg: Path, e: Exception) -> None:
        frames = header_frames(seg) or 0
        why = str(e).removeprefix(f"{seg}: ") or type(e).__name__
        try:
            seg.rename(seg.with_suffix(".corrupt"))
        except FileNotFoundError:  # gone meanwhile: nothing left to set aside
            return
        except OSError:
            pass
        self.result.corrupt += frames
        self.result.damaged.append(f"{seg.with_suffix('.corrupt')}: {why}")


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
