"""Sending the history between samples: every ``every`` unsampled steps, without a sync.

At a wide sampling interval the steps between two frames reach the collector only with the
next frame (:mod:`~logitwatch.hooks._history`): a page the collector judges on step ``s``
(a warm-up ramping too far, a loss level leaving its range) is heard of up to ``k`` steps
after ``s``. A flush sends the history kept so far as a frame of its own (a scalars-only
frame at the last kept step, the steps before it as its history, ``hooks.history_flush`` =
1), so a page reaches the collector within ``every`` steps of the step it was judged on.

Reading the rows must not stall the job: on the CPU they are host memory and are read at
once; on CUDA the rows are copied, non-blocking, to pinned host memory with an event
recorded after the copy, and the frame is sent from a later step's end once the event has
completed (:meth:`HistoryFlush.ready` polls it, typically a step later). One flush is in
flight at a time; the device buffer's rows can be reused at once, because the copy was
queued on the stream before any later write. Another accelerator (no event to poll) is
left without flushes: its history travels with the sampled frames, as before.
"""

from __future__ import annotations

from typing import Any

import torch

from ._history import HistoryBlock

__all__ = ["DEFAULT_EVERY", "HistoryFlush"]

#: Default steps between flushes: a page judged on an unsampled step reaches the collector
#: within this many steps (one more on an accelerator, whose copy is read once done).
DEFAULT_EVERY = 10


class HistoryFlush:
    """Starts a flush of a :class:`HistoryBlock` and says when its values are ready.
    Training thread only."""

    def __init__(self, every: int | None = DEFAULT_EVERY, *, cuda: bool = False) -> None:
        self.every = every
        self.enabled = bool(every)
        #: make the pinned buffer at the next sampled step, whose read-back syncs anyway
        #: (allocating pinned memory is not a step to take between samples)
        self.wants_prepare = self.enabled and cuda
        self._pending: tuple[HistoryBlock, Any, int] | None = None  # block, event, values
        self._pinned: torch.Tensor | None = None
        self._pinned_view: Any = None
        self._event: Any = None
        self._ready: tuple[HistoryBlock, list[float]] | None = None
        #: The last step a flush sent (the closing frame is not needed for it).
        self.sent_to: int | None = None

    @property
    def busy(self) -> bool:
        """Whether a flush was started and its values not yet taken."""
        return self._pending is not None or self._ready is not None

    def prepare(self, capacity: int) -> bool:
        """Make the pinned buffer for ``capacity`` history rows and the event (once, before
        the first CUDA flush takes any rows); False where that is not possible."""
        self.wants_prepare = False
        if self._pinned is not None:
            return True
        try:
            self._pinned = torch.empty(6 * capacity, dtype=torch.float32, pin_memory=True)
            self._pinned_view = self._pinned.numpy()
            self._event = torch.cuda.Event()
        except Exception:
            self._pinned = self._pinned_view = self._event = None
            self.enabled = False
            return False
        return True

    def start(self, block: HistoryBlock, host: list[float] | None) -> None:
        """Start reading ``block``'s rows: ``host``, its rows already read from host
        memory (:meth:`StepHistory.read_host`), else a non-blocking copy of its CUDA rows
        into the buffer :meth:`prepare` made."""
        if host is not None:
            self._ready = (block, host)
            return
        tensors = block.tensors
        if self._pinned is None:
            raise RuntimeError("HistoryFlush.start before prepare")
        n = sum(t.numel() for t in tensors)
        at = 0
        for t in tensors:
            m = t.numel()
            self._pinned[at:at + m].copy_(t.reshape(-1), non_blocking=True)
            at += m
        self._event.record()
        self._pending = (block, self._event, n)

    def ready(self, *, wait: bool = False) -> tuple[HistoryBlock, list[float]] | None:
        """The started block and its values once they can be read without a sync, else
        None; ``wait``: read them now (only where the caller has just synchronised with
        the device anyway, e.g. after a sampled step's read-back)."""
        if self._ready is not None:
            out, self._ready = self._ready, None
            return out
        pending = self._pending
        if pending is None:
            return None
        block, event, n = pending
        if not wait and not event.query():
            return None
        if wait:
            event.synchronize()
        self._pending = None
        return block, self._pinned_view[:n].tolist()  # pinned host memory, as numpy

    def release(self) -> None:
        """Drop the pinned buffer (at close)."""
        self._pending = self._ready = None
        self._pinned = self._pinned_view = self._event = None
