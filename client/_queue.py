"""Everything not yet delivered, in order: the disk spool, the batch in flight, memory.

Frames wait in a bounded in-memory deque between :meth:`Client.send` (training thread)
and the sender thread. The *spooler* thread moves the oldest of them to the disk spool
(``_spool.py``) when memory is half full or the collector is unreachable; the sender
sends the spool first, then memory, so the collector gets frames in ``seq`` order. A
batch that fails (connection error, timeout, 5xx, ...) is written to the spool too, so
after a failure nothing waits only in memory for longer than ``spool_interval``.

Drops, each counted by reason (``COUNTERS``), happen only when a bound is hit: memory full
while the spool is off or failing (``dropped_queue_full``, oldest first), the spool's disk
budget (``dropped_spool_full``, oldest segment first), a damaged segment
(``dropped_spool_corrupt``), or a frame the collector refused as invalid (``rejected``)
or kept failing on while the rest of its batch went through (``quarantined``): the sender
finds such frames by sending the batch in halves, and only they are set aside, within
their share of the spool's budget (``dropped_aside`` past it).

``seq`` is assigned here, under the lock, as ``max(previous + 1, now in µs)``: strictly
increasing, in queue order whatever thread calls ``send``, and, because it follows the
clock, a restarted job (or a forked child) numbers its frames after the ones sent
before: the collector's (run, rank, seq) deduplication then never mistakes new frames for
old ones.

The disk side of the backlog (spilling memory to the spool within its budget, reading
spooled batches back, persisting a batch that waits too long in flight) is the mixin
``SpoolSide`` in ``_backlog_spool.py``; this module holds the memory queue, the
numbering, delivery accounting and the waiters, and ``Backlog`` itself, which creates all
the state both halves share and the one lock (``_cond``) that guards it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from ._backlog_spool import MAX_BATCH_BYTES, SpoolSide, head_count
from ._codec import Packed, Queued, freeze
from ._spool import Segment, WriterDir, write_segment

__all__ = ["COUNTERS", "Backlog", "Batch"]

log = logging.getLogger("logitwatch.client")

#: Counter names exposed by ``Client.stats`` (all frame counts except ``batches`` and
#: ``retries``).
COUNTERS = (
    "queued",  # frames accepted by send()
    "sent",  # frames delivered (a 2xx answer)
    "batches",  # batches delivered
    "retries",  # failed attempts that were retried (connection error, timeout, 5xx, ...)
    "duplicates",  # delivered frames the collector already had (resends it ignored)
    "spilled",  # frames written to the disk spool
    "replayed",  # frames delivered from the disk spool
    "invalid",  # frames send() could not use (e.g. a negative step); see the log
    "dropped_queue_full",  # oldest frames dropped because memory was full
    "dropped_spool_full",  # oldest spooled frames dropped to stay within spool_max_bytes
    "dropped_spool_corrupt",  # frames of spool segments found damaged
    "rejected",  # frames the collector refused as invalid (400, 413, 422, ...), found by
    # sending the batch in halves; kept aside in the spool (``.rejected``)
    "quarantined",  # frames the collector kept failing on (500) while the rest of their
    # batch went through; kept aside in the spool (``.quarantine``)
    "dropped_aside",  # rejected or quarantined frames not kept aside: past their share of
    # spool_max_bytes (ASIDE_SHARE), or the disk refused
    "dropped_after_shutdown",  # frames sent after shutdown()
    "undelivered_at_shutdown",  # frames neither delivered nor spooled at shutdown
    "discarded",  # frames given to a client without a URL
)


#: The share of ``spool_max_bytes`` that the frames set aside (``.rejected``,
#: ``.quarantine``) may take: never deleted by the client, they must not grow for a whole
#: run, nor crowd out the frames still to deliver.
ASIDE_SHARE = 0.1

#: The most distinct causes a client warns of once each (its memory of them is bounded:
#: a cause may carry a collector's error code); later causes are logged at debug level.
WARN_KEYS = 256


def warn_once(warned: set[str], key: str, msg: str, *args: object,
              exc_info: bool = False) -> None:
    """Log ``msg`` at warning level the first time ``key`` is seen in ``warned``, at debug
    level after that, and for every key past :data:`WARN_KEYS` (a key may carry a
    collector's error code: the set stays bounded)."""
    first = key not in warned and len(warned) < WARN_KEYS
    if first:
        warned.add(key)
    log.log(logging.WARNING if first else logging.DEBUG, msg, *args, exc_info=exc_info)


_SEQ = re.compile(rb'"seq":(\d+)')


def _seq(line: bytes) -> int:
    """The ``seq`` of an encoded frame (-1 if unreadable). The client writes ``run``,
    ``project`` and ``rank`` before it, and names hold no quote, so the first ``"seq":`` is
    the key."""
    m = _SEQ.search(line, 0, 600)
    return int(m.group(1)) if m else -1


class Batch:
    """Frames on their way to the collector: from memory (``frames``) or from the spool."""

    __slots__ = ("first", "frames", "lines", "segments", "settled")

    def __init__(self, first: int, frames: list[Queued] | None = None,
                 segments: list[Segment] | None = None) -> None:
        self.first = first
        self.frames = frames or []
        self.segments = segments or []
        self.lines: list[bytes] = []
        self.settled: str | None = None


class _Waiter:
    __slots__ = ("ok", "target")

    def __init__(self, target: int) -> None:
        self.target = target
        self.ok = True


class Backlog(SpoolSide):
    """The thread-safe state of undelivered frames (memory, spool index, in flight)."""

    def __init__(self, *, max_frames: int, max_bytes: int, max_batch: int,
                 encode: Callable[[Queued], bytes], spool: WriterDir | None,
                 spool_max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._max_batch = max_batch
        self._encode = encode
        self.spool = spool if spool_max_bytes > 0 else None
        self._budget = spool_max_bytes
        self._cond = threading.Condition(threading.Lock())
        self._mem: deque[Queued] = deque()  # (seq, nbytes, frozen frame): see Queued
        self.mem_bytes = 0
        self._segments: list[Segment] = []  # sorted by first seq
        self._spool_bytes = 0
        self._spool_frames = 0
        self._aside_bytes = 0  # .rejected and .quarantine files written (see keep_aside)
        self._reserved = 0
        self._inflight: Batch | None = None
        self._spilling: int | None = None  # first seq of frames being written by spill()
        self._spilling_n = 0  # how many frames that spill() is writing
        self._last_seq = -1
        self._waiters: list[_Waiter] = []
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._warned: set[str] = set()
        #: True after a failed attempt, False after a delivery (read without the lock).
        self.link_down = False

    # -- training thread: O(1), never blocks beyond a short lock --------------------------

    def put(self, frame: Packed, now_us: int) -> int:
        """Number and append a frame (frozen: one bytes object, see :data:`Queued`); drop
        the oldest if memory is full. Returns how many frames are now waiting in memory."""
        blob = freeze(frame)
        with self._cond:
            seq = self._last_seq + 1
            frame.seq = seq if seq > now_us else now_us
            self._last_seq = frame.seq
            self._mem.append((frame.seq, frame.nbytes, blob))
            self.mem_bytes += frame.nbytes
            self._counts["queued"] += 1
            mem = self._mem
            while len(mem) > self.max_frames or (self.mem_bytes > self.max_bytes
                                                 and len(mem) > 1):
                old = mem.popleft()
                self.mem_bytes -= old[1]
                self._counts["dropped_queue_full"] += 1
                self._lost(old[0])
            return len(mem)

    # -- spooler thread (and shutdown): spill(), persist_inflight(): see SpoolSide --------

    # -- sender thread -------------------------------------------------------------------

    def take(self, max_frames: int) -> Batch | None:
        """The next batch to send, oldest first (spool, then memory), encoded; None if
        nothing waits. A batch kept after a failed attempt comes back first."""
        while True:
            with self._cond:
                while self._spilling is not None:  # those frames are older than memory's
                    self._cond.wait(1.0)
                if self._inflight is not None:
                    return self._inflight
                if self._segments:
                    segs: list[Segment] = []
                    n = size = 0
                    for s in self._segments:
                        if segs and (n + s.frames > max_frames
                                     or size + s.size > MAX_BATCH_BYTES):
                            break
                        s.busy = True
                        segs.append(s)
                        n += s.frames
                        size += s.size
                    batch = Batch(segs[0].first, segments=segs)
                elif self._mem:
                    mem = self._mem
                    frames = [mem.popleft() for _ in range(head_count(mem, max_frames))]
                    self.mem_bytes -= sum(f[1] for f in frames)
                    batch = Batch(frames[0][0], frames=frames)
                else:
                    return None
                self._inflight = batch
            if batch.frames:
                batch.lines = self._encode_all(batch.frames)
                return batch
            if self._read(batch):
                return batch

    def settle(self, batch: Batch, kind: Literal["delivered", "rejected", "failed"],
               duplicates: int = 0) -> None:
        """Record the outcome of one attempt to send ``batch``.

        A failed batch from memory is written to the spool (or, if that is impossible,
        kept in flight and sent again first); one from the spool stays there.
        """
        unlink: list[Segment] = []
        if kind == "failed" and not batch.segments:
            result, seg = self._store([f[0] for f in batch.frames], batch.lines)
            with self._cond:
                if seg is not None and batch.segments:
                    # the spooler persisted it meanwhile (a slow collector): that copy is
                    # the batch's; this one goes, and the batch fails as a spooled one
                    if self._drop_copy(seg):
                        unlink.append(seg)
                else:
                    self.link_down = True
                    if result == "stored":
                        self._counts["spilled"] += len(batch.lines)
                    if result != "failed" and self._inflight is batch:
                        self._inflight = None
                    self._cond.notify_all()
                    return
        with self._cond:
            batch.settled = kind
            n = len(batch.lines)
            if self._inflight is batch:
                self._inflight = None
            if kind == "delivered":
                self.link_down = False
                self._counts["sent"] += n
                self._counts["batches"] += 1
                self._counts["duplicates"] += duplicates
                if batch.segments:
                    self._counts["replayed"] += n
            elif kind == "rejected":
                self._counts["rejected"] += n
                self._lost(batch.first)
            else:
                self.link_down = True
            for s in batch.segments:
                if kind == "failed":
                    s.busy = False
                else:
                    self._unindex(s)
                    unlink.append(s)
            self._cond.notify_all()
        for s in unlink:
            with contextlib.suppress(OSError):
                s.path.unlink()

    def keep_aside(self, rejected: list[bytes], quarantined: list[bytes]) -> list[str]:
        """Write frames (encoded lines) that will never be delivered to the spool
        directory, where nothing replays them (``.rejected``, ``.quarantine``), for a
        person to look at; returns the files written.

        Nothing deletes these files, so they get their own share of the disk budget
        (:data:`ASIDE_SHARE` of ``spool_max_bytes``, counted in it): the oldest frames
        that fit are kept, the others dropped (``dropped_aside``, logged once). A collector
        refusing every frame (a wrong URL, a client and collector of different versions)
        used to fill the disk with them for the whole run.
        """
        paths: list[str] = []
        for lines, suffix in ((rejected, ".rejected"), (quarantined, ".quarantine")):
            if not lines or self.spool is None:
                continue
            order = sorted(lines, key=_seq)
            with self._cond:  # the oldest frames that fit the share and the whole budget
                room = min(self._budget * ASIDE_SHARE - self._aside_bytes,
                           self._budget - self._spool_bytes - self._reserved - self._aside_bytes)
                size, n = 160, 0  # 160: an upper bound of the header
                while n < len(order) and size + len(order[n]) + 1 <= room:
                    size += len(order[n]) + 1
                    n += 1
                if n:
                    self._aside_bytes += size
                self._counts["dropped_aside"] += len(order) - n
            if n < len(order):
                self._warn_once(
                    "aside-full", "logitwatch: frames the collector refused are no longer kept "
                    "aside under %s: they would pass their share of the spool's disk budget "
                    "(%d bytes of spool_max_bytes=%d); they are dropped, counted in "
                    "stats['dropped_aside']. A collector that refuses many frames is usually "
                    "the wrong URL, or runs another version than this client: check the URL "
                    "and compare `logitwatch --version` on both sides",
                    self.spool.base, int(self._budget * ASIDE_SHARE), self._budget)
            if not n:
                continue
            try:
                seg = write_segment(self.spool.ensure(), [_seq(line) for line in order[:n]],
                                    order[:n], suffix=suffix)
            except OSError as e:
                with self._cond:
                    self._aside_bytes -= size
                    self._counts["dropped_aside"] += n
                self._warn_once("aside", "logitwatch: cannot keep refused frames aside "
                                "under %s (%s); they are dropped", self.spool.base, e)
                continue
            with self._cond:
                self._aside_bytes += seg.size - size
            paths.append(str(seg.path))
        return paths

    def settle_parts(self, batch: Batch, *, delivered: int, duplicates: int,
                     rejected: list[bytes], quarantined: list[bytes]) -> None:
        """Record a batch that was sent in parts: ``delivered`` of its frames were stored,
        the ``rejected`` and ``quarantined`` ones (encoded lines) never will be (counted;
        see :meth:`keep_aside`)."""
        unlink: list[Segment] = []
        with self._cond:
            batch.settled = "delivered"
            if self._inflight is batch:
                self._inflight = None
            self.link_down = False
            self._counts["sent"] += delivered
            self._counts["batches"] += 1
            self._counts["duplicates"] += duplicates
            self._counts["rejected"] += len(rejected)
            self._counts["quarantined"] += len(quarantined)
            if batch.segments:
                self._counts["replayed"] += delivered
            for line in (*rejected, *quarantined):
                self._lost(_seq(line))
            for s in batch.segments:
                self._unindex(s)
                unlink.append(s)
            self._cond.notify_all()
        for s in unlink:
            with contextlib.suppress(OSError):
                s.path.unlink()

    def count(self, counter: str, n: int = 1) -> None:
        with self._cond:
            self._counts[counter] += n

    # -- shutdown ------------------------------------------------------------------------

    def close(self, deadline: float | None = None) -> tuple[int, int]:
        """Write what is left in memory, and a batch still stuck in flight, to the spool.

        A spill of the spooler thread still under way (its frames are out of memory, not
        yet on disk) is waited for until ``deadline`` (``time.monotonic()``; default: 5 s
        from now); frames still in its hands then are counted lost: shutdown used to spill
        nothing while the spooler was writing, and its frames were counted nowhere, lost
        when the process exited under it.

        Returns ``(frames now in the spool, frames lost)``; lost frames (no spool, or the
        disk refused) are counted in ``undelivered_at_shutdown``.
        """
        if deadline is None:
            deadline = time.monotonic() + 5.0
        self.spill(0, 0, wait_until=deadline)
        with self._cond:
            batch = self._inflight
        if batch is not None and batch.frames and not batch.segments:
            lines = batch.lines or self._encode_all(batch.frames)
            result, seg = self._store([f[0] for f in batch.frames], lines)
            with self._cond:
                if seg is not None:
                    if (self._inflight is batch and batch.settled is None
                            and not batch.segments):
                        seg.busy = True
                        batch.segments = [seg]
                        self._counts["spilled"] += seg.frames
                    # the sender got there first: delivered, or spooled by its failure
                    elif self._drop_copy(seg):
                        with contextlib.suppress(OSError):
                            seg.path.unlink()
                if result != "failed" and self._inflight is batch and not batch.segments:
                    self._inflight = None
        with self._cond:
            lost = len(self._mem)
            if self._spilling is not None:  # the spooler thread's, past the deadline
                lost += self._spilling_n
                self._lost(self._spilling)
            if self._inflight is not None and not self._inflight.segments:
                lost += len(self._inflight.lines or self._inflight.frames)
                self._lost(self._inflight.first)
                self._inflight = None
            for f in self._mem:
                self._lost(f[0])
            self._mem.clear()
            self.mem_bytes = 0
            self._counts["undelivered_at_shutdown"] += lost
            self._cond.notify_all()
            return self._spool_frames, lost

    # -- observers -----------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def waiting(self) -> int:
        """Frames waiting in memory."""
        return len(self._mem)

    def pending(self) -> int:
        """Frames not yet delivered or dropped: in memory, in flight, or in the spool."""
        with self._cond:
            inflight = self._inflight
            n = len(self._mem) + self._spool_frames
            if inflight is not None and not inflight.segments:
                n += len(inflight.frames)
            return n

    def spooled(self) -> tuple[int, int]:
        """``(frames, bytes)`` in the spool."""
        with self._cond:
            return self._spool_frames, self._spool_bytes

    def counts(self) -> dict[str, int]:
        with self._cond:
            return dict(self._counts)

    def wait_handled(self, target: int, timeout: float) -> bool:
        """Wait until every frame with ``seq <= target`` is delivered or dropped.

        Returns True iff that happened within ``timeout`` and none of the frames that
        were pending when the call started was lost (dropped or rejected).
        """
        deadline = time.monotonic() + max(0.0, timeout)
        waiter = _Waiter(target)
        with self._cond:
            self._waiters.append(waiter)
            try:
                while self._lowest_pending() <= target:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return waiter.ok
            finally:
                self._waiters.remove(waiter)

    def _lowest_pending(self) -> int:
        low = self._last_seq + 1
        if self._inflight is not None:
            low = min(low, self._inflight.first)
        if self._spilling is not None:
            low = min(low, self._spilling)
        if self._segments:
            low = min(low, self._segments[0].first)
        if self._mem:
            low = min(low, self._mem[0][0])
        return low

    def _lost(self, seq: int) -> None:
        for waiter in self._waiters:
            if seq <= waiter.target:
                waiter.ok = False

    def _warn_once(self, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        warn_once(self._warned, key, msg, *args, exc_info=exc_info)
