"""Shutdown while the spooler thread is writing frames to disk: ``Backlog.close()`` used to
spill nothing then (``spill`` returns at once while another spill is under way) and to
count the spooler's frames nowhere: the process exits under the spooler's write, and they
were lost without a trace. Now it waits for that write (until its deadline), spills the
rest, and counts what is still in the spooler's hands in ``undelivered_at_shutdown``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from logitwatch.client._codec import Queued, encode, pack
from logitwatch.client._queue import Backlog
from logitwatch.client._spool import WriterDir, read_segment


def frame(step: int):
    return pack(step, {"loss": float(step)}, {}, 1.0)[0]


def backlog_blocked_at(tmp_path: Path, step: int) -> tuple[WriterDir, Backlog,
                                                               threading.Event,
                                                               threading.Event]:
    """A backlog (batches of 2) whose encoding of frame ``step`` waits for ``release``
    (``entered`` is set then): a spill holding that frame stays under way meanwhile."""
    entered, release = threading.Event(), threading.Event()

    def slow_encode(f: Queued) -> bytes:
        line = encode(f, "r1", "default", 0)
        if json.loads(line)["step"] == step and not release.is_set():
            entered.set()
            assert release.wait(30)
        return line

    spool = WriterDir(tmp_path, project="default", run="r1", rank=0, url="http://x")
    backlog = Backlog(max_frames=1000, max_bytes=1 << 30, max_batch=2, encode=slow_encode,
                      spool=spool, spool_max_bytes=1 << 30)
    for s in range(6):
        backlog.put(frame(s), 0)
    return spool, backlog, entered, release


def spooled_steps(spool: WriterDir) -> list[int]:
    assert spool.path is not None
    return sorted(json.loads(line)["step"] for seg in spool.path.glob("*.seg")
                  for line in read_segment(seg))


def test_close_waits_for_the_spoolers_write_then_spills_the_rest(tmp_path: Path) -> None:
    spool, backlog, entered, release = backlog_blocked_at(tmp_path, 0)
    spooler = threading.Thread(target=backlog.spill, args=(0, 0))  # the spooler thread
    spooler.start()
    assert entered.wait(30)  # frames 0 and 1 are in its hands, 2-5 in memory
    timer = threading.Timer(0.2, release.set)  # its write ends while shutdown is on
    timer.start()
    spooled, lost = backlog.close(time.monotonic() + 30)
    spooler.join(30)
    timer.join()
    assert (spooled, lost) == (6, 0)
    counts = backlog.counts()
    assert counts["spilled"] == 6 and counts["undelivered_at_shutdown"] == 0
    assert spooled_steps(spool) == [0, 1, 2, 3, 4, 5]
    spool.release()


def test_close_counts_the_frames_still_in_the_spoolers_hands(tmp_path: Path) -> None:
    """The spooler's write outlasts the shutdown's deadline: its frames are counted as not
    delivered (the process is about to exit under it), with those left in memory."""
    spool, backlog, entered, release = backlog_blocked_at(tmp_path, 2)
    spooler = threading.Thread(target=backlog.spill, args=(0, 0))
    spooler.start()
    assert entered.wait(30)  # 0 and 1 spooled, 2 and 3 in its hands, 4 and 5 in memory
    try:
        spooled, lost = backlog.close(time.monotonic() + 0.2)
        counts = backlog.counts()
    finally:
        release.set()
        spooler.join(30)
    assert (spooled, lost) == (2, 4)
    assert counts["undelivered_at_shutdown"] == 4
    assert counts["queued"] == counts["spilled"] + counts["undelivered_at_shutdown"]
    spool.release()
