"""The backlog's disk side: spilling frames to the spool, its budget, reading it back.

``SpoolSide`` is a mixin of ``Backlog`` (``_queue.py``) and has no state of its own: it
works on the Backlog's fields, created in ``Backlog.__init__`` and declared below, under
the same lock (``_cond``), and it never holds that lock while it encodes, writes or reads
a segment. The spooler thread calls :meth:`~SpoolSide.spill` and
:meth:`~SpoolSide.persist_inflight`; the sender thread reaches ``_read`` and ``_store``
through ``Backlog.take`` and ``Backlog.settle``, and shutdown through ``Backlog.close``.
The segment files themselves are ``_spool.py``'s.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from ._codec import Queued
from ._spool import Segment, SpoolCorrupt, WriterDir, read_segment, write_segment

if TYPE_CHECKING:
    from ._queue import Batch

__all__ = ["SpoolSide", "StoreResult"]

StoreResult = Literal["stored", "dropped", "failed"]

#: The most bytes one batch carries (frames' estimated size in memory, segments' size on
#: disk): after an outage the spool replays segments of many frames each, and frames of a
#: large model's heads are big; a batch of ``max_batch`` of them could be hundreds of MB in
#: the training process and past the collector's request limit (32 MiB by default), refused
#: and halved over and over. At least one frame or segment goes, whatever its size.
MAX_BATCH_BYTES = 8 * 1024 * 1024


def head_count(mem: deque[Queued], max_frames: int) -> int:
    """How many of ``mem``'s oldest frames make one batch: at most ``max_frames`` and
    :data:`MAX_BATCH_BYTES` (at least one)."""
    n = size = 0
    for f in mem:
        if n and (n >= max_frames or size + f[1] > MAX_BATCH_BYTES):
            break
        n += 1
        size += f[1]
    return n


class SpoolSide:
    """Backlog's spool half: memory to disk (within the budget), disk back to a batch."""

    # Backlog's state and helpers (see Backlog.__init__); what changes is only read or
    # written with ``_cond`` held.
    spool: WriterDir | None
    _budget: int
    _max_batch: int
    _encode: Callable[[Queued], bytes]
    _cond: threading.Condition
    _mem: deque[Queued]
    mem_bytes: int
    _segments: list[Segment]
    _spool_bytes: int
    _spool_frames: int
    _aside_bytes: int
    _reserved: int
    _inflight: Batch | None
    _spilling: int | None
    _spilling_n: int
    _counts: dict[str, int]
    _lost: Callable[[int], None]
    _warn_once: Callable[..., None]

    # -- spooler thread (and shutdown) ---------------------------------------------------

    def spill(self, keep_frames: int, keep_bytes: int, through: int | None = None,
              wait_until: float | None = None) -> int:
        """Write the oldest frames in memory to the spool until at most ``keep_frames``
        frames and ``keep_bytes`` bytes remain there, or, with ``through``, every frame
        numbered up to it. Returns the frames written.

        While another thread spills, it returns at once; with ``wait_until`` (a
        ``time.monotonic()`` deadline: shutdown) it waits for that thread until then, and
        goes on with what is left."""
        if self.spool is None:
            return 0
        written = 0
        while True:
            with self._cond:
                mem = self._mem
                while (self._spilling is not None and wait_until is not None
                       and (left := wait_until - time.monotonic()) > 0):
                    self._cond.wait(left)
                if self._spilling is not None or not mem:
                    return written
                if through is not None:
                    n = bisect.bisect_right(mem, through, key=lambda f: f[0])
                    if n == 0:
                        return written
                elif len(mem) <= keep_frames and self.mem_bytes <= keep_bytes:
                    return written
                else:
                    n = len(mem)
                frames = [mem.popleft() for _ in range(head_count(mem, min(n, self._max_batch)))]
                self.mem_bytes -= sum(f[1] for f in frames)
                self._spilling = frames[0][0]
                self._spilling_n = len(frames)
            result: StoreResult = "failed"
            try:
                lines = self._encode_all(frames)
                result, _ = self._store([f[0] for f in frames], lines)
            except Exception:  # a bug: keep the frames, say so once
                self._warn_once("spill-bug", "logitwatch: writing to the spool failed",
                                exc_info=True)
            with self._cond:
                self._spilling = None
                self._spilling_n = 0
                if result == "failed":  # back to the front of memory, in order
                    mem.extendleft(reversed(frames))
                    self.mem_bytes += sum(f[1] for f in frames)
                elif result == "stored":
                    self._counts["spilled"] += len(frames)
                self._cond.notify_all()
            if result == "failed":
                return written
            if result == "stored":  # not the frames the disk budget dropped
                written += len(frames)

    def _encode_all(self, frames: list[Queued]) -> list[bytes]:
        """Encode frames, letting the training thread have the GIL between two: encoding
        holds it, and without this a send() could wait out a whole switch interval."""
        lines = []
        for f in frames:
            lines.append(self._encode(f))
            time.sleep(0)
        return lines

    def _store(self, seqs: list[int], lines: list[bytes]) -> tuple[StoreResult, Segment | None]:
        """Write one segment within the disk budget, evicting the oldest segments first.

        ``"dropped"``: the frames could not fit the budget (counted); ``"failed"``: the
        disk refused (no spool, full disk, permissions): the caller keeps the frames.
        """
        if self.spool is None:
            return "failed", None
        # the frames set aside (.rejected, .quarantine) are on the same disk budget
        size = sum(len(line) + 1 for line in lines) + 160
        evicted: list[Segment] = []
        with self._cond:
            while self._spool_bytes + self._reserved + self._aside_bytes + size > self._budget:
                victim = next((s for s in self._segments if not s.busy), None)
                if victim is None:
                    break
                self._unindex(victim)
                self._counts["dropped_spool_full"] += victim.frames
                self._lost(victim.first)
                evicted.append(victim)
            if self._spool_bytes + self._reserved + self._aside_bytes + size > self._budget:
                self._counts["dropped_spool_full"] += len(lines)
                self._lost(seqs[0])
                dropped = True
            else:
                self._reserved += size
                dropped = False
        for victim in evicted:
            with contextlib.suppress(OSError):
                victim.path.unlink()
        if evicted or dropped:
            self._warn_once(
                "budget", "logitwatch: the spool reached its disk budget (spool_max_bytes=%d); "
                "the oldest spooled frames are dropped (counted in dropped_spool_full)",
                self._budget)
        if dropped:
            return "dropped", None
        try:
            seg = write_segment(self.spool.ensure(), seqs, lines)
        except OSError as e:
            with self._cond:
                self._reserved -= size
            self._warn_once("disk", "logitwatch: cannot write the spool under %s (%s); frames "
                            "stay in memory while it fails", self.spool.base, e)
            return "failed", None
        with self._cond:
            self._reserved -= size
            bisect.insort(self._segments, seg, key=lambda s: s.first)
            self._spool_bytes += seg.size
            self._spool_frames += seg.frames
        return "stored", seg

    def _unindex(self, seg: Segment) -> None:
        """Forget a segment (lock held). By identity: two copies of the same frames are
        equal segments (same name, same counts) and only this one is to go."""
        for i, s in enumerate(self._segments):
            if s is seg:
                del self._segments[i]
                self._spool_bytes -= seg.size
                self._spool_frames -= seg.frames
                return

    def _drop_copy(self, seg: Segment) -> bool:
        """Forget ``seg``, a second copy of frames the spool already holds or that were
        delivered (lock held). True when its file may be unlinked: a copy of the same
        frames has the same name and was written over the first, so the file stays while
        an indexed segment names it."""
        self._unindex(seg)
        return all(s.path != seg.path for s in self._segments)

    # -- sender thread -------------------------------------------------------------------

    def _read(self, batch: Batch) -> bool:
        """Load a spool batch's frames; damaged segments are dropped (counted)."""
        good: list[Segment] = []
        for s in batch.segments:
            try:
                batch.lines.extend(read_segment(s.path))
                good.append(s)
            except (SpoolCorrupt, OSError) as e:
                self._warn_once("corrupt", "logitwatch: dropping spool segment: %s", e)
                with self._cond:
                    self._unindex(s)
                    self._counts["dropped_spool_corrupt"] += s.frames
                    self._lost(s.first)
                with contextlib.suppress(OSError):
                    s.path.rename(s.path.with_suffix(".corrupt"))
        with self._cond:
            batch.segments = good
            if good:
                batch.first = good[0].first
                return True
            self._inflight = None
            self._cond.notify_all()
            return False

    # -- shutdown ------------------------------------------------------------------------

    def persist_inflight(self, through: int) -> bool:
        """Write the batch in flight to the spool if it came from memory and holds frames
        numbered up to ``through`` (it has been waiting that long: a slow collector), so a
        crash cannot lose it; it stays in flight, and is unlinked once delivered. Returns
        True if it was written."""
        with self._cond:
            batch = self._inflight
            if (self.spool is None or batch is None or not batch.frames or batch.segments
                    or batch.settled is not None or batch.first > through):
                return False
        lines = batch.lines or self._encode_all(batch.frames)
        result, seg = self._store([f[0] for f in batch.frames], lines)
        if seg is None:
            return False
        with self._cond:
            if self._inflight is batch and not batch.segments and batch.settled is None:
                seg.busy = True
                batch.segments = [seg]
                self._counts["spilled"] += seg.frames
                return True
            # settled meanwhile: delivered, or spooled by its failure (that copy stays)
            if not self._drop_copy(seg):
                return False
        with contextlib.suppress(OSError):
            seg.path.unlink()
        return False
