"""What one transaction of a replay may hold (:class:`Batch`), and how many frames.

A replay (:mod:`.replay`) stores a file a batch at a time. A batch keeps to what one ingest
request may carry (frames, history steps, runs, ranks) and to :data:`BATCH_BYTES` of the
file's lines, and it never holds what would make the verdicts depend on the batch size: an
end frame keeps to a batch of end frames, and a frame resent within the batch or a rank 0
frame that may resume a finished run starts a batch of its own (:meth:`Batch.takes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logitwatch.server.schemas import (
    MAX_REQUEST_HISTORY_STEPS,
    MAX_REQUEST_RANKS,
    MAX_REQUEST_RUNS,
)

__all__ = ["BATCH_BYTES", "JUDGE_FRAMES", "REPLAY_BATCH", "Batch", "run_key"]

#: Frames ``logitwatch replay`` stores a batch (a transaction): a client's batch
#: (``max_batch``), far under ``max_frames_per_request``. A commit on PostgreSQL waits for
#: the disk: the storing alone is 5.7x faster there than in batches of 16 (on SQLite, WAL,
#: about the same); the alert engine's work does not change (bench_replay.py).
REPLAY_BATCH = 256
#: Frames judged by one engine call at most (of a batch already stored), with progress said
#: after each: the engine takes 0.7-1.4 ms a step (history steps included), so a batch of
#: 256 frames carrying 9 steps each is judged in seconds, 16 of them in a fifth of one.
JUDGE_FRAMES = 16
#: Most bytes of a file's lines one batch holds (a frame as JSON text; as Python objects,
#: several times that): 256 frames of up to 16 KiB each, fewer larger ones.
BATCH_BYTES = 4 << 20


def run_key(raw: Any) -> tuple[str, str]:
    """(project, run) of a frame as sent (not yet validated: anything hashable)."""
    if not isinstance(raw, dict):
        return ("", "")
    return (str(raw.get("project", "default")), str(raw.get("run")))


def _ident(raw: Any) -> tuple[tuple[str, str], str, str, bool]:
    """(project, run), rank, seq and whether it is an end frame, of a frame as sent (not yet
    validated: as text, whatever their types)."""
    if not isinstance(raw, dict):
        return run_key(raw), "", "", False
    return run_key(raw), str(raw.get("rank", 0)), str(raw.get("seq")), raw.get("end") is not None


def _history_steps(raw: Any) -> int:
    h = raw.get("history") if isinstance(raw, dict) else None
    steps = h.get("steps") if isinstance(h, dict) else None
    return len(steps) if isinstance(steps, list) else 0


class Batch:
    """The frames one transaction will store, and what :meth:`takes` checks of them."""

    def __init__(self, most: int, most_bytes: int | None) -> None:
        self.most, self.most_bytes = most, most_bytes
        self.items: list[tuple[str, Any]] = []  # (where, frame)
        self.bytes = self.steps = 0
        self.sent: set[tuple[str, str, str, str]] = set()
        self.ranks: set[tuple[str, str, str]] = set()
        self.runs: set[tuple[str, str]] = set()
        self.ends = False

    def __len__(self) -> int:
        return len(self.items)

    def takes(self, raw: Any, size: int, finished: Callable[[tuple[str, str]], bool]) -> bool:
        """Whether ``raw`` joins this batch, not the next: within the per-request limits
        (frames, history steps, runs, ranks) and the batch's bytes, and changing nothing
        that would make what is judged depend on the batch (module docstring): an end frame
        keeps to a batch of end frames, a frame resent within the batch (its history would
        be dropped in one batch, stored from two) and a rank 0 frame of a finished run that
        has frames in the batch (it may resume the run, and the run's other frames in the
        batch would be judged as of a running run) start a batch of their own."""
        if not self.items:
            return True
        run, rank, seq, end = _ident(raw)
        return not (
            len(self.items) >= self.most
            or end != self.ends
            or (self.most_bytes is not None and self.bytes + size > self.most_bytes)
            or self.steps + _history_steps(raw) > MAX_REQUEST_HISTORY_STEPS
            or (run not in self.runs and len(self.runs) >= MAX_REQUEST_RUNS)
            or ((*run, rank) not in self.ranks and len(self.ranks) >= MAX_REQUEST_RANKS)
            or (*run, rank, seq) in self.sent
            or (rank == "0" and not end and run in self.runs and finished(run))
        )

    def add(self, where: str, raw: Any, size: int) -> None:
        run, rank, seq, end = _ident(raw)
        self.items.append((where, raw))
        self.bytes += size
        self.steps += _history_steps(raw)
        self.runs.add(run)
        self.ranks.add((*run, rank))
        self.sent.add((*run, rank, seq))
        self.ends = end
