"""logitwatch.client without a collector: the in-memory backlog (its bound, the seq it
stamps) and the disk spool (segment files, the spool's budget, damage, two threads and
two writers racing for one batch). The client against a scripted collector:
``test_client.py``; against a real collector process: ``test_transport.py``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from logitwatch.client import _spool
from logitwatch.client._codec import encode, pack
from logitwatch.client._queue import ASIDE_SHARE, Backlog
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


# -- a spool directory that cannot be made; frames set aside -----------------------------


def _fds_under(path: Path) -> int:
    """This process's open descriptors on files under ``path`` (Linux's /proc/self/fd)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
    return n


def _break_spool_dir(monkeypatch, how: str) -> dict[str, Any]:
    """Make ``WriterDir._make`` fail after its ``mkdir`` (the LOCK file open by then), as a
    full disk does (writing meta.json: ENOSPC) or a filesystem without flock (ENOLCK).
    Returns a switch (``broken``) and the count of attempts."""
    state: dict[str, Any] = {"broken": True, "attempts": 0}

    def fail(code: int) -> None:
        if state["broken"]:
            state["attempts"] += 1
            raise OSError(code, os.strerror(code))

    if how == "disk full":
        real = Path.write_text

        def write_text(self: Path, *a: Any, **k: Any) -> int:
            if self.name == ".tmp-meta.json":
                fail(errno.ENOSPC)
            return real(self, *a, **k)

        monkeypatch.setattr(Path, "write_text", write_text)
    else:
        real_fcntl = _spool.fcntl

        def flock(fd: int, op: int) -> None:
            fail(errno.ENOLCK)
            real_fcntl.flock(fd, op)

        monkeypatch.setattr(_spool, "fcntl", SimpleNamespace(
            flock=flock, LOCK_EX=real_fcntl.LOCK_EX, LOCK_NB=real_fcntl.LOCK_NB))
    return state


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd") or _spool.fcntl is None,
                    reason="counts descriptors in /proc/self/fd; flock is POSIX")
@pytest.mark.parametrize("how", ["disk full", "no flock"])
def test_a_spool_directory_that_cannot_be_made_leaks_no_descriptor_nor_directory(
        tmp_path, monkeypatch, caplog, how) -> None:
    """The LOCK file was left open and the directory on disk at each failed attempt, one
    per spill: 235 descriptors in 6 s on a full disk, until the job's own ``torch.save``
    failed with EMFILE. Retried at every spill here (the worst case)."""
    monkeypatch.setattr(_spool, "RETRY_MAKE_AFTER", 0.0)
    state = _break_spool_dir(monkeypatch, how)
    root = tmp_path.resolve()
    spool = WriterDir(root, project="p", run="r1", rank=0, url="http://x")
    backlog = memory_backlog(1000, spool=spool, spool_max_bytes=1 << 20)
    backlog.put(frame(0), 0)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        for _ in range(30):
            assert backlog.spill(0, 0) == 0
    assert state["attempts"] == 30
    assert _fds_under(root) == 0
    assert list(root.rglob("*")) == []  # no half-made directory, nor its parents
    assert spool.path is None and backlog.waiting() == 1  # the frame waits in memory
    assert caplog.text.count("cannot write the spool") == 1  # said once
    state["broken"] = False  # the disk has room again: the frame gets to disk
    assert backlog.spill(0, 0) == 1 and spool.path is not None
    assert [p.name for p in spool.base.iterdir()] == [spool.path.name]
    assert _fds_under(root) == 1  # the LOCK, held while the process lives
    spool.release()
    assert _fds_under(root) == 0


def test_a_failed_spool_directory_is_tried_again_only_after_a_while(tmp_path,
                                                                   monkeypatch) -> None:
    """Not at every spill: a spool that cannot work costs no disk operation per frame."""
    now = [1000.0]
    monkeypatch.setattr(_spool, "time", SimpleNamespace(
        time=time.time, time_ns=time.time_ns, monotonic=lambda: now[0]))
    state = _break_spool_dir(monkeypatch, "disk full")
    spool = WriterDir(tmp_path, project="p", run="r1", rank=0, url="http://x")
    backlog = memory_backlog(1000, spool=spool, spool_max_bytes=1 << 20)
    backlog.put(frame(0), 0)
    for _ in range(20):
        assert backlog.spill(0, 0) == 0
    assert state["attempts"] == 1
    with pytest.raises(OSError, match="No space left on device.*retried at most every"):
        spool.ensure()
    now[0] += _spool.RETRY_MAKE_AFTER + 0.01
    assert backlog.spill(0, 0) == 0 and state["attempts"] == 2
    state["broken"] = False
    assert backlog.spill(0, 0) == 0 and state["attempts"] == 2  # not yet: still waiting
    now[0] += _spool.RETRY_MAKE_AFTER + 0.01
    assert backlog.spill(0, 0) == 1 and backlog.counts()["spilled"] == 1
    assert len(list(spool.path.glob("*.seg"))) == 1
    spool.release()


def big_frame(step: int):
    """A frame of about 2.3 kB encoded: one 32 x 32 matrix."""
    return pack(step, {"loss": 1.0}, {"attn.logit_max": [[1.0] * 32] * 32}, 1.0)[0]


def test_frames_set_aside_stay_within_their_share_of_the_spool_budget(tmp_path,
                                                                      caplog) -> None:
    """A collector refusing every frame (a wrong URL, another version) made the client
    write ``.rejected`` files outside ``spool_max_bytes`` for the whole run: 1.4 MB
    against a 64 KiB budget in 3 s. They now take at most their share of the budget."""
    budget = 64 * 1024
    spool = WriterDir(tmp_path, project="p", run="r1", rank=0, url="http://x")
    backlog = memory_backlog(1000, spool=spool, spool_max_bytes=budget)
    lines = []
    for step in range(100):
        f = big_frame(step)
        f.seq = step + 1
        lines.append(encode(f, "r1", "default", 0))
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        for i in range(0, 100, 2):  # a frame refused and one quarantined, batch after batch
            backlog.keep_aside(lines[i:i + 1], lines[i + 1:i + 2])
    aside = [p for p in spool.path.iterdir() if p.suffix in (".rejected", ".quarantine")]
    kept = sum(len(read_segment(p)) for p in aside)
    assert 0 < sum(p.stat().st_size for p in aside) <= budget * ASIDE_SHARE
    assert kept + backlog.counts()["dropped_aside"] == 100 and kept > 0
    warned = [r.getMessage() for r in caplog.records if "no longer kept aside" in r.getMessage()]
    assert len(warned) == 1 and "check the URL" in warned[0]  # once, and what to do
    # the files set aside count in the budget: the frames to deliver take the rest
    for step in range(100, 160):
        backlog.put(big_frame(step), 0)
    backlog.spill(0, 0)
    on_disk = sum(p.stat().st_size for p in spool.path.iterdir() if p.suffix != ".json")
    assert on_disk <= budget and backlog.counts()["dropped_spool_full"] > 0
    spool.release()


def test_batches_are_bounded_in_bytes_too(tmp_path) -> None:
    """Frames of a large model's heads (64 matrices of 16 x 16: ~140 KB each) spooled
    during an outage: each batch sent from memory or replayed from the spool holds at most
    MAX_BATCH_BYTES (or one frame or segment), whatever ``max_batch`` allows. A replay once
    joined 256 frames' segments into one 40 MB body, in the training process and past the
    collector's 32 MiB request limit. Nothing is lost: every frame comes back, in order."""
    from logitwatch.client._backlog_spool import MAX_BATCH_BYTES

    heads = {f"h{i}": [[float(i + r + c) for c in range(16)] for r in range(16)]
             for i in range(64)}
    big = [pack(step, {"loss": 1.0}, heads, 1.0)[0] for step in range(200)]
    assert sum(f.nbytes for f in big) > 3 * MAX_BATCH_BYTES
    spool = WriterDir(tmp_path, project="p", run="r1", rank=0, url="http://x")
    backlog = Backlog(max_frames=1000, max_bytes=1 << 30, max_batch=256,
                      encode=lambda f: encode(f, "r1", "default", 0), spool=spool,
                      spool_max_bytes=1 << 30)
    for f in big[:100]:
        backlog.put(f, 0)
    backlog.spill(0, 0)  # the outage: to disk
    for f in big[100:]:
        backlog.put(f, 0)  # and as much again still in memory
    assert sum(f.nbytes for f in big[100:]) > MAX_BATCH_BYTES
    steps: list[int] = []
    batches = 0
    while (batch := backlog.take(256)) is not None:
        lines = [json.loads(line) for line in batch.lines]
        size = (sum(s.size for s in batch.segments) if batch.segments
                else sum(f[1] for f in batch.frames))
        assert size <= MAX_BATCH_BYTES or len(batch.segments or batch.frames) == 1, size
        assert size <= MAX_BATCH_BYTES or len(lines) == 1, (size, len(lines))
        steps += [f["step"] for f in lines]
        batches += 1
        backlog.settle(batch, "delivered")
    assert steps == list(range(200))
    assert batches >= 3  # one spool segment and one memory batch held it all before
    spool.release()
