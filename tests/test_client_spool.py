"""logitwatch.client without a collector: the in-memory backlog (its bound, the seq it
stamps) and the disk spool (segment files, the spool's budget, damage, two threads and
two writers racing for one batch). The client against a scripted collector:
``test_client.py``; against a real collector process: ``test_transport.py``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from logitwatch.client._codec import encode, pack
from logitwatch.client._queue import Backlog
from logitwatch.client._spool import SpoolCorrupt, WriterDir, read_segment, write_segment


def memory_backlog(max_frames: int, spool: WriterDir | None = None,
                   spool_max_bytes: int = 0) -> Backlog:
    return Backlog(max_frames=max_frames, max_bytes=1 << 30, max_batch=2,
                   encode=lambda f: encode(f, "r1", "default", 0), spool=spool,
                   spool_max_bytes=spool_max_bytes)


def frame(step: int):
    return pack(step, {"loss": float(step)}, {}, 1.0)[0]


def test_full_memory_without_spool_drops_the_oldest() -> None:
    backlog = memory_backlog(3)
    for step in range(5):
        backlog.put(frame(step), 0)
    assert backlog.counts()["dropped_queue_full"] == 2
    batch = backlog.take(10)
    assert batch is not None
    assert [json.loads(line)["step"] for line in batch.lines] == [2, 3, 4]


def test_seq_follows_the_clock_and_never_repeats() -> None:
    backlog = memory_backlog(100)
    seqs = []
    for now in (1000, 1000, 999, 5000):
        f = frame(0)
        backlog.put(f, now)
        seqs.append(f.seq)
    assert seqs == [1000, 1001, 1002, 5000]


def test_segment_files_are_checked(tmp_path) -> None:
    lines = [b'{"a":1}', b'{"a":2}']
    seg = write_segment(tmp_path, [5, 9], lines)
    assert seg.path.name == "00000000000000000005-00000000000000000009.seg"
    assert read_segment(seg.path) == lines and seg.frames == 2
    assert not list(tmp_path.glob(".tmp-*"))
    data = bytearray(seg.path.read_bytes())
    data[-3] ^= 1  # one bit flipped on disk
    seg.path.write_bytes(bytes(data))
    with pytest.raises(SpoolCorrupt, match="checksum"):
        read_segment(seg.path)
    (tmp_path / "x.seg").write_bytes(b"hello\n")
    with pytest.raises(SpoolCorrupt, match="not a logitwatch spool segment"):
        read_segment(tmp_path / "x.seg")


def test_spool_budget_drops_the_oldest_and_counts(tmp_path) -> None:
    spool = WriterDir(tmp_path, project="p", run="r1", rank=0, url="http://x")
    backlog = memory_backlog(1000, spool=spool, spool_max_bytes=2000)
    for step in range(40):
        backlog.put(frame(step), 0)
    backlog.spill(0, 0)
    counts = backlog.counts()
    frames, size = backlog.spooled()
    assert size <= 2000 and frames + counts["dropped_spool_full"] == 40
    assert counts["dropped_spool_full"] > 0 and counts["spilled"] == 40
    batch = backlog.take(1000)
    assert batch is not None
    steps = [json.loads(line)["step"] for line in batch.lines]
    assert steps == list(range(40 - frames, 40))  # the newest are kept
    assert len(list(spool.path.glob("*.seg"))) == len(batch.segments)
    spool.release()


def test_damaged_segment_is_dropped_and_counted(tmp_path, caplog) -> None:
    spool = WriterDir(tmp_path, project="p", run="r1", rank=0, url="http://x")
    backlog = memory_backlog(1000, spool=spool, spool_max_bytes=1 << 20)
    for step in range(6):
        backlog.put(frame(step), 0)
    backlog.spill(0, 0)  # 3 segments of 2 frames (max_batch=2)
    first = sorted(spool.path.glob("*.seg"))[0]
    first.write_bytes(first.read_bytes()[:-5])
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        batch = backlog.take(4)
    assert batch is not None
    assert [json.loads(line)["step"] for line in batch.lines] == [2, 3]
    assert backlog.counts()["dropped_spool_corrupt"] == 2
    assert "dropping spool segment" in caplog.text and first.with_suffix(".corrupt").exists()
    backlog.settle(batch, "delivered")
    assert backlog.counts()["replayed"] == 2
    spool.release()


def test_spool_directory_is_made_once_when_two_threads_write_first(tmp_path, monkeypatch) -> None:
    """The spooler thread and the sender (frames set aside) may both write first: one
    directory, or the files of the other are invisible to ``spool_path`` (a CI flake)."""
    from pathlib import Path

    spool = WriterDir(tmp_path, project="p", run="r1", rank=0, url="http://x")
    real_mkdir = Path.mkdir

    def slow_mkdir(self, *a, **k):  # widen the window between the check and the set
        real_mkdir(self, *a, **k)
        time.sleep(0.05)

    monkeypatch.setattr(Path, "mkdir", slow_mkdir)
    start = threading.Barrier(4)
    got: list[Path] = []

    def first_write() -> None:
        start.wait()
        got.append(spool.ensure())

    threads = [threading.Thread(target=first_write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.undo()
    assert len(set(got)) == 1 and got[0] == spool.path
    assert [p.name for p in spool.base.iterdir()] == [spool.path.name]
    spool.release()


def _interleave_before_store(backlog: Backlog, meanwhile: Callable[[], None]) -> None:
    """Run ``meanwhile`` once, on the next ``_store`` call, before it writes: the other
    thread (the spooler, or shutdown) acting between a caller's check and its write."""
    real = backlog._store
    pending = [meanwhile]

    def store(seqs, lines):
        if pending:
            pending.pop()()
        return real(seqs, lines)

    backlog._store = store  # type: ignore[method-assign]


def _two_frames_in_flight(tmp_path) -> tuple[WriterDir, Backlog, Any]:
    """A backlog with a spool whose sender has taken a batch of two frames from memory."""
    spool = WriterDir(tmp_path, project="p", run="r1", rank=0, url="http://x")
    backlog = memory_backlog(1000, spool=spool, spool_max_bytes=1 << 20)
    for step in range(2):
        backlog.put(frame(step), 0)
    batch = backlog.take(2)
    assert batch is not None
    return spool, backlog, batch


def test_a_failure_spooled_meanwhile_by_the_spooler_is_not_written_twice(tmp_path) -> None:
    """The sender's batch fails while the spooler persists it (a slow collector): one
    segment, counted once, sent once (the failure used to check for a segment unlocked)."""
    spool, backlog, batch = _two_frames_in_flight(tmp_path)
    assert not batch.segments
    _interleave_before_store(backlog, lambda: backlog.persist_inflight(1 << 62))
    backlog.settle(batch, "failed")
    assert len(list(spool.path.glob("*.seg"))) == 1
    assert backlog.counts()["spilled"] == 2 and backlog.spooled()[0] == 2
    again = backlog.take(10)
    assert again is not None and [json.loads(x)["step"] for x in again.lines] == [0, 1]
    backlog.settle(again, "delivered")
    assert backlog.take(10) is None and list(spool.path.glob("*.seg")) == []
    assert backlog.counts()["replayed"] == 2 and backlog.spooled() == (0, 0)
    spool.release()


def test_shutdown_does_not_leave_a_second_copy_of_a_batch_its_failure_spooled(tmp_path) -> None:
    """``close()`` persists the batch in flight while the sender's failure spools it: the
    spool ends with the frames once (a copy indexed by nobody would be pushed twice)."""
    spool, backlog, batch = _two_frames_in_flight(tmp_path)
    _interleave_before_store(backlog, lambda: backlog.settle(batch, "failed"))
    spooled, lost = backlog.close()
    assert lost == 0 and spooled == 2
    segs = list(spool.path.glob("*.seg"))
    assert len(segs) == 1
    assert backlog.counts()["spilled"] == 2
    spool.release()


def test_the_spooler_does_not_unlink_the_copy_a_failure_spooled_meanwhile(tmp_path) -> None:
    """The spooler persists the batch in flight while the sender's failure spools it: the
    spooler's copy is written over the failure's (same name) and must not take its file
    with it when it sees the batch already settled (the frames were lost then)."""
    spool, backlog, batch = _two_frames_in_flight(tmp_path)
    _interleave_before_store(backlog, lambda: backlog.settle(batch, "failed"))
    assert backlog.persist_inflight(1 << 62) is False
    assert len(list(spool.path.glob("*.seg"))) == 1 and backlog.spooled()[0] == 2
    again = backlog.take(10)
    assert again is not None and [json.loads(x)["step"] for x in again.lines] == [0, 1]
    assert backlog.counts()["dropped_spool_corrupt"] == 0
    backlog.settle(again, "delivered")
    assert list(spool.path.glob("*.seg")) == [] and backlog.spooled() == (0, 0)
    spool.release()
