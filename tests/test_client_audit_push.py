"""``logitwatch push`` (``client/_push.py``) against a collector that refuses requests as a
whole: it keeps its requests within the collector's limits (bytes, history steps), sends a
refused request in halves so that only the frames refused on their own are set aside, and
two pushes of one spool do not trip over each other (the directory's lock)."""

from __future__ import annotations

import fcntl
import gzip
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from logitwatch.client import _push
from logitwatch.client._backlog_spool import MAX_BATCH_BYTES
from logitwatch.client._codec import encode, pack
from logitwatch.client._push import push_spool
from logitwatch.client._spool import read_segment, write_segment
from logitwatch.server.schemas import MAX_REQUEST_HISTORY_STEPS


def frame_line(run: str, seq: int, step: int, *, history: int = 0, pad: int = 0,
               bad: bool = False) -> bytes:
    """One encoded frame as the client spools it: ``history`` steps of history, ``pad``
    64 x 64 matrices (~80 KB each: a big frame), ``bad``: a frame the collector refuses."""
    hist = None
    if history:
        hist = {"steps": list(range(step - history, step)),
                "scalars": {"loss": [1.0] * history}}
    rng = random.Random(seq)
    heads = {f"attn.m{k}": [[rng.random() for _ in range(64)] for _ in range(64)]
             for k in range(pad)}
    f, problems = pack(step, {"loss": 1.0}, heads, 1000.0 + step, history=hist)
    assert not problems
    f.seq = seq
    line = encode(f, run, "default", 0)
    if bad:
        line = line.replace(b'"scalars":{', b'"scalars":{"bad":1,', 1)
    return line


def writer_dir(root: Path, run: str, url: str = "http://collector") -> Path:
    d = root / "default" / run / "rank-0" / "1-1"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"url": url, "run": run}))
    return d


def segment(d: Path, lines: list[bytes]) -> Path:
    seqs = [json.loads(line)["seq"] for line in lines]
    return write_segment(d, seqs, lines).path


class Collector:
    """A MockTransport handler with the collector's request-level refusals: past
    MAX_REQUEST_HISTORY_STEPS history steps (422), past ``max_bytes`` (413), or holding a
    frame it cannot take (422, the whole request, as a validation error is)."""

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        self.max_bytes = max_bytes
        self.requests: list[tuple[int, int, int]] = []  # (frames, bytes, history steps)
        self.stored: dict[int, dict[str, Any]] = {}
        self.during: Any = None  # called once, inside the first request

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = request.content
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        frames = json.loads(body)["frames"]
        steps = sum(len(f.get("history", {}).get("steps", [])) for f in frames)
        self.requests.append((len(frames), len(body), steps))
        if self.during is not None:
            during, self.during = self.during, None
            during()
        if len(body) > self.max_bytes:
            return httpx.Response(413, json={"code": "too-large", "message": "body"})
        if steps > MAX_REQUEST_HISTORY_STEPS:
            return httpx.Response(422, json={"code": "invalid-request",
                                             "message": f"{steps} history steps"})
        if any("bad" in f.get("scalars", {}) for f in frames):
            return httpx.Response(422, json={"code": "invalid-request", "message": "bad"})
        dup = sum(1 for f in frames if f["seq"] in self.stored)
        self.stored.update((f["seq"], f) for f in frames)
        return httpx.Response(200, json={"accepted": len(frames) - dup, "duplicates": dup})


def push(root: Path, collector: Collector, **kw: Any) -> _push.PushResult:
    http = httpx.Client(transport=httpx.MockTransport(collector))
    try:
        return push_spool(root, http=http, attempts=1, **kw)
    finally:
        http.close()


def test_push_knows_the_collectors_history_limit() -> None:
    assert _push.MAX_REQUEST_HISTORY_STEPS == MAX_REQUEST_HISTORY_STEPS


# --- 1. requests within the collector's limits; a refused request in halves ---------------


def test_push_keeps_history_steps_per_request_within_the_collectors_limit(
        tmp_path: Path) -> None:
    """A job's segment of 256 frames with 99 history steps each (25,344 steps) went in one
    request: refused as a whole (422), and all 256 frames were set aside as rejected."""
    d = writer_dir(tmp_path, "hist")
    lines = [frame_line("hist", 10 + i, (i + 1) * 100, history=99) for i in range(300)]
    segment(d, lines[:256])
    segment(d, lines[256:])
    col = Collector()
    result = push(tmp_path, col)
    assert (result.sent, result.rejected, result.damaged) == (300, 0, [])
    assert sorted(col.stored) == list(range(10, 310))
    assert all(steps <= MAX_REQUEST_HISTORY_STEPS for _, _, steps in col.requests)
    assert not d.exists()  # all delivered: the directory is gone


def test_push_keeps_bytes_per_request_within_the_senders_cap(tmp_path: Path) -> None:
    """Big frames (a large model's heads): a segment past MAX_BATCH_BYTES is sent in more
    than one request, each within it."""
    d = writer_dir(tmp_path, "big")
    lines = [frame_line("big", 10 + i, i, pad=4) for i in range(64)]
    assert sum(len(line) + 1 for line in lines) > 1.4 * MAX_BATCH_BYTES  # 64 x ~200 KB
    segment(d, lines)
    col = Collector(max_bytes=MAX_BATCH_BYTES + 4096)  # the cap, and the wrapping
    result = push(tmp_path, col)
    assert (result.sent, result.rejected) == (64, 0)
    assert len(col.requests) > 1
    assert all(size <= MAX_BATCH_BYTES + 4096 for _, size, _ in col.requests)
    assert sorted(col.stored) == list(range(10, 74))


def test_push_sets_aside_only_the_frames_refused_on_their_own(tmp_path: Path) -> None:
    """One frame the collector refuses used to take its whole batch (every segment of it)
    to *.rejected; now the batch is sent in halves and only that frame is set aside."""
    d = writer_dir(tmp_path, "one-bad")
    lines = [frame_line("one-bad", 10 + i, i, bad=i in (5, 17)) for i in range(24)]
    for k in range(0, 24, 4):
        segment(d, lines[k:k + 4])
    col = Collector()
    handled: list[int] = []
    result = push(tmp_path, col, progress=handled.append)
    assert (result.sent, result.rejected) == (22, 2)
    assert sum(handled) == 24
    assert sorted(col.stored) == [10 + i for i in range(24) if i not in (5, 17)]
    aside = sorted(d.glob("*.rejected"))
    assert not list(d.glob("*.seg"))
    assert len(aside) == 1
    kept = [json.loads(line) for line in read_segment(aside[0])]
    assert [f["seq"] for f in kept] == [15, 27]


# --- 2. two pushes of one spool -------------------------------------------------------------


def test_a_push_started_during_another_leaves_the_directory_to_it(tmp_path: Path) -> None:
    """A second push while the first is sending: it used to send the same segments and
    delete them, and the first then crashed with FileNotFoundError on unlinking them."""
    d = writer_dir(tmp_path, "twice")
    for k in range(3):
        segment(d, [frame_line("twice", 10 + 4 * k + i, 4 * k + i) for i in range(4)])
    col = Collector()
    inner: list[_push.PushResult] = []
    col.during = lambda: inner.append(push(tmp_path, col))
    result = push(tmp_path, col, max_batch=4)
    assert (result.sent, result.rejected, result.damaged) == (12, 0, [])
    assert inner and inner[0].sent == 0 and inner[0].skipped == [str(d)]
    assert sorted(col.stored) == list(range(10, 22))
    assert not d.exists()


def test_a_push_skips_a_directory_locked_after_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The directory is free when the spool is listed, taken (by another push) before it
    is sent: skipped, with a message, and left whole."""
    d = writer_dir(tmp_path, "taken")
    seg = segment(d, [frame_line("taken", 10, 0)])
    monkeypatch.setattr(_push, "is_locked", lambda path: False)  # the listing saw it free
    fd = os.open(d / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        col = Collector()
        with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
            result = push(tmp_path, col)
    finally:
        os.close(fd)
    assert result.skipped == [str(d)] and result.sent == 0 and not col.requests
    assert seg.exists()
    assert f"skipped {d}" in caplog.text
    result = push(tmp_path, col)  # once free, it is pushed
    assert result.sent == 1 and not d.exists()


def test_a_segment_gone_during_a_push_is_neither_damaged_nor_fatal(tmp_path: Path) -> None:
    """Segments deleted by someone else while the push runs (one of the batch being sent,
    one still to read): no crash on unlink, and nothing reported as damaged."""
    d = writer_dir(tmp_path, "gone")
    segs = [segment(d, [frame_line("gone", 10 + 2 * k + i, 2 * k + i) for i in range(2)])
            for k in range(3)]
    col = Collector()
    col.during = lambda: (segs[0].unlink(), segs[2].unlink())  # in flight, and to come
    result = push(tmp_path, col, max_batch=2)
    assert result.damaged == [] and result.corrupt == 0
    assert result.sent == 4 and sorted(col.stored) == [10, 11, 12, 13]
    assert not d.exists()


def test_push_of_long_histories_to_a_real_collector(serve, tmp_path: Path) -> None:
    """The audit's case end to end: 300 frames of 99 history steps each, spooled in
    segments of 256, pushed to `logitwatch serve`: every frame stored, none set aside."""
    col = serve()
    d = writer_dir(tmp_path / "spool", "hist-real", url=col.url)
    lines = [frame_line("hist-real", 10 + i, (i + 1) * 100, history=99) for i in range(300)]
    segment(d, lines[:256])
    segment(d, lines[256:])
    result = push_spool(tmp_path / "spool", attempts=2)
    assert (result.sent, result.accepted, result.rejected) == (300, 300, 0)
    assert col.steps("hist-real") == list(range(1, 30_001))  # every frame, every history
    assert not d.exists()


def test_the_cli_names_a_directory_another_push_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`logitwatch push` says which directory it left to another push: one taken after
    the listing was only in a log record, and one seen taken was said to be a running
    job's."""
    from click.testing import CliRunner

    from logitwatch.cli import main

    d = writer_dir(tmp_path, "taken")
    segment(d, [frame_line("taken", 10, 0)])
    fd = os.open(d / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = CliRunner().invoke(main, ["push", str(tmp_path), "--url", "http://127.0.0.1:9"])
        assert r.exit_code == 0 and f"skipped {d}: in use by its job" in r.output, r.output
        assert "or by another push" in r.output
        monkeypatch.setattr(_push, "is_locked", lambda path: False)  # free when listed
        r = CliRunner().invoke(main, ["push", str(tmp_path), "--url", "http://127.0.0.1:9"])
    finally:
        os.close(fd)
    assert r.exit_code == 0 and "sent 0 frame(s)" in r.output, r.output
    assert f"skipped {d}: another push (or its job) took it meanwhile" in r.output
