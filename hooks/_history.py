"""Every unsampled step's loss, grad norm, clip flag, lr and output-side scalars (log Z, the
final hidden RMS), kept until the next frame.

Sampled steps send a whole frame; the steps between them send these scalars in the next
frame's ``history`` (see ``logitwatch.wire``). :class:`StepHistory` keeps them without
reading a tensor value: device values (the loss, the norm a clip call returned) are
written with ``copy_`` into one preallocated ``(capacity, 6)`` float32 tensor on their
device, Python numbers (the lr, a loss given as a float) into host memory, and the host
remembers which cell was written where. :meth:`StepHistory.take` hands the written rows
over as tensor views, so the sampled step reads them back in its one transfer.

The clip flag costs nothing on the device when ``max_norm`` is a number: the host keeps
``max_norm`` and compares the norm read back with it, in float32 as the device would
(``norm > max_norm`` on a float32 tensor rounds ``max_norm`` to float32); a tensor
``max_norm`` has its flag written on the device like the norm. Each device write is two
small ops (an element view, a copy), three for a loss that requires grad (a detach). On
the CPU bench model (``bench/bench_hooks.py``, a 230 ms step whose tensors have just swept
the caches) a non-sampled step spends about 0.2 ms here in all, under 0.1 %.

The rows form a ring of ``capacity`` steps (4096 by default: 96 KiB of device memory):
when more unsampled steps pass between two frames, the newest are kept and the dropped
ones counted. A value on another accelerator than the buffer's is left out (reading or
moving it would cost a sync or a copy per step); this is counted too.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from logitwatch.wire import MAX_HISTORY_STEPS

__all__ = ["COLUMNS", "CLIPPED", "HIDDEN_RMS", "LOGZ", "LOSS", "LR", "NORM", "HistoryBlock",
           "StepHistory"]

#: The series of a history, in column order.
COLUMNS = ("loss", "grad.norm", "grad.clipped", "lr", "final.logz", "final.hidden_rms")
LOSS, NORM, CLIPPED, LR, LOGZ, HIDDEN_RMS = range(len(COLUMNS))
_WIDTH = len(COLUMNS)


@dataclass(slots=True)
class HistoryBlock:
    """The steps since the last :meth:`StepHistory.take`, oldest first.

    ``tensors`` are views of the device buffer (``(rows, 4)`` each, in step order) to read
    back with the frame; :meth:`values` turns what was read into the wire's history.
    """

    steps: list[int]
    tensors: list[torch.Tensor]
    device_masks: list[int]  # per step: bit c set = column c was written on the device
    host_values: list[dict[int, float]]  # per step: column -> value written on the host
    limits: list[float | None]  # per step: the clip call's max_norm, for the host's flag
    dropped: int
    start: int = 0  # the ring row of the first step

    def values(self, flat: list[float]) -> dict[str, Any]:
        """``{"steps", "scalars"}`` from the read-back rows (``flat``: row-major floats);
        a series no step measured is left out."""
        series: list[list[float | None]] = [[] for _ in COLUMNS]
        for i, (mask, host, limit) in enumerate(zip(self.device_masks, self.host_values,
                                                    self.limits, strict=True)):
            row = flat[_WIDTH * i:_WIDTH * (i + 1)]
            values = [row[c] if mask >> c & 1 else host.get(c) for c in range(_WIDTH)]
            norm = values[NORM]
            if limit is not None and norm is not None:
                values[CLIPPED] = 1.0 if norm > limit else 0.0  # NaN: 0, as on the device
            for c in range(_WIDTH):
                series[c].append(values[c])
        return {"steps": self.steps,
                "scalars": {name: values for name, values in zip(COLUMNS, series, strict=True)
                            if any(v is not None for v in values)}}


class StepHistory:
    """The ring of unsampled steps' scalars (module docstring). Training thread only."""

    def __init__(self, capacity: int = MAX_HISTORY_STEPS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._buf: torch.Tensor | None = None  # (capacity, 6) float32, made at first use
        self._flat: torch.Tensor | None = None  # the same, flat: cheaper element views
        self._steps = array("q", bytes(8 * capacity))
        self._masks = array("B", bytes(capacity))
        self._host: list[dict[int, float]] = [{} for _ in range(capacity)]
        self._limits: list[float | None] = [None] * capacity
        self._count = 0  # steps kept since the last take (at most capacity)
        self._next = 0  # the ring row of the current step
        self._dropped = 0
        self.skipped = 0  # values left out: on another device than the buffer
        # the current (not yet ended) step
        self._mask = 0
        self._values: dict[int, float] = {}
        self._limit: float | None = None
        self._losses = 0  # automatic losses added on the device this step
        self._finals = 0  # LM-head calls whose log Z and RMS were added this step
        self._loss_logged = False
        self._loss_summed = False  # the step's automatic losses are shares: summed
        # peek(): the last ended row, and an accelerator row's copy in flight
        self.watch = True
        self._last_row: tuple[int, int] | None = None
        self._pinned: torch.Tensor | None = None
        self._event: Any = None
        self._pinned_view: Any = None
        self._pending: tuple[int, Any, Any] | None = None
        self._host_view: Any = None  # a CPU buffer's memory, as numpy
        self._staged_meta: tuple[int, dict[int, float]] = (0, {})

    @property
    def kept(self) -> int:
        """Steps kept since the last :meth:`take`."""
        return self._count

    @property
    def device(self) -> torch.device | None:
        """Where the buffer lives (None until a device value was first written)."""
        return None if self._buf is None else self._buf.device

    # -- the current step ------------------------------------------------------------------

    def _cell(self, value: torch.Tensor, column: int) -> torch.Tensor | None:
        """The current step's device cell of ``column``, or None (value on another
        accelerator than the buffer: left out)."""
        flat = self._flat
        if flat is None:
            if value.device.type == "cpu":  # host memory the watch reads directly (peek)
                self._host_view = np.zeros(self.capacity * _WIDTH, dtype=np.float32)
                self._buf = torch.from_numpy(self._host_view).view(self.capacity, _WIDTH)
            else:
                self._buf = torch.empty(self.capacity, _WIDTH, dtype=torch.float32,
                                        device=value.device)
            flat = self._flat = self._buf.view(-1)
        elif flat.device != value.device:
            return None
        return flat[_WIDTH * self._next + column]

    @staticmethod
    def _scalar(value: torch.Tensor) -> torch.Tensor:
        """``value`` as a 0-d tensor outside autograd (a copy from it must not make the
        buffer part of the graph)."""
        if value.requires_grad:
            value = value.detach()
        if value.dim():
            value = value.float().mean() if value.numel() != 1 else value.reshape(())
        return value

    def put(self, column: int, value: torch.Tensor | float) -> None:
        """Record ``value`` as the current step's ``column`` (the last call wins)."""
        if isinstance(value, torch.Tensor):
            value = self._scalar(value)
            cell = self._cell(value, column)
            if cell is None:
                if value.device.type != "cpu":
                    self.skipped += 1
                    return
                value = float(value)  # a CPU tensor beside an accelerator buffer: no sync
            else:
                cell.copy_(value)
                self._mask |= 1 << column
                self._values.pop(column, None)
                return
        self._values[column] = float(value)
        self._mask &= ~(1 << column)

    def put_norm(self, norm: torch.Tensor, max_norm: Any, hit: torch.Tensor | None) -> None:
        """The norm a clip call returned, and its clip flag: taken on the host from the
        norm when ``max_norm`` is a number, else ``hit`` (``norm > max_norm``, on the
        device)."""
        self.put(NORM, norm)
        if isinstance(max_norm, (int, float)) and not isinstance(max_norm, bool):
            self._limit = array("f", [max_norm])[0]  # float32, as the device compares
            self._mask &= ~(1 << CLIPPED)
            self._values.pop(CLIPPED, None)
        elif hit is not None:
            self._limit = None
            self.put(CLIPPED, hit)

    def add_loss(self, loss: torch.Tensor, summed: bool = False) -> None:
        """An automatically captured loss (the forward's ``.loss``): the step's value is the
        mean over its forwards (``summed``: their sum, each being its share of the step's),
        unless :meth:`log_loss` gives one."""
        if self._loss_logged:
            return
        self._loss_summed = self._loss_summed or summed
        loss = self._scalar(loss)
        if self._losses and self._mask >> LOSS & 1:
            cell = self._cell(loss, LOSS)
            if cell is not None:
                cell.add_(loss)
                self._losses += 1
            return
        self.put(LOSS, loss)
        self._losses = 1

    def add_final(self, logz: torch.Tensor, square: torch.Tensor) -> None:
        """One LM-head call's log Z and the mean square of its hidden input (0-d device
        tensors, :func:`~logitwatch.hooks._final.step_final`): the step's log Z is the mean
        over its calls (gradient accumulation runs the head once a micro-batch), its hidden
        RMS the root of the mean square, pooled as a sampled step pools them."""
        first = not self._finals
        for column, value in ((LOGZ, logz), (HIDDEN_RMS, square)):
            value = self._scalar(value)
            if first:
                self.put(column, value)
            elif self._mask >> column & 1:
                cell = self._cell(value, column)
                if cell is not None:
                    cell.add_(value)
            elif column in self._values and value.device.type == "cpu":
                self._values[column] += float(value)
        self._finals += 1

    def log_loss(self, value: torch.Tensor | float) -> None:
        """A loss given by the job (``Monitor.log(loss=...)``): replaces the automatic one."""
        self._loss_logged = True
        self._losses = 0
        self.put(LOSS, value)

    def end_step(self, step: int) -> None:
        """Close the current step as ``step``: kept if anything was recorded."""
        mask, values, losses, limit = self._mask, self._values, self._losses, self._limit
        if self._loss_summed:
            losses = 1  # the sum is the step's loss: not divided
        finals = self._finals
        self.discard_step()
        if not mask and not values:
            return
        if losses > 1 and self._flat is not None:
            self._flat[_WIDTH * self._next + LOSS].div_(losses)
        if finals:
            for column in (LOGZ, HIDDEN_RMS):
                root = column == HIDDEN_RMS
                if mask >> column & 1 and self._flat is not None:
                    cell = self._flat[_WIDTH * self._next + column]
                    if finals > 1:
                        cell.div_(finals)
                    if root:
                        cell.sqrt_()
                elif column in values:
                    values[column] /= finals
                    if root:
                        values[column] = math.sqrt(max(0.0, values[column]))
        row = self._next
        self._steps[row] = step
        self._masks[row] = mask
        self._host[row] = values
        self._limits[row] = limit
        self._stage(row, step)
        self._next = (row + 1) % self.capacity
        if self._count == self.capacity:
            self._dropped += 1  # the oldest row was just overwritten
        else:
            self._count += 1

    # -- the sampled step ------------------------------------------------------------------

    def discard_step(self) -> None:
        """Forget what the current step recorded (it is sampled: its frame has it all)."""
        self._mask, self._values, self._losses, self._loss_logged = 0, {}, 0, False
        self._loss_summed = False
        self._limit = None
        self._finals = 0

    # -- the finished steps' loss and norm, where reading them costs no sync --------------

    def peek(self) -> tuple[int, float | None, float | None] | None:
        """``(step, loss, norm)`` of a recently ended step, when they can be read without a
        host-device sync, else None. Host values and a CPU buffer are read at once (the step
        just ended). An accelerator buffer's two cells are copied, non-blocking, to pinned
        host memory at the step's end (:meth:`_stage`) and returned once the copy's event
        has completed (typically at the next step's end); one copy is in flight at a time."""
        pending = self._pending
        if pending is not None:
            step, event, host = pending  # host: numpy view of the pinned copy
            if not event.query():
                return None
            self._pending = None
            mask, values = self._staged_meta
            got = [float(x) for x in host]  # a numpy view of pinned host memory
            return (step, got[0] if mask >> LOSS & 1 else values.get(LOSS),
                    got[1] if mask >> NORM & 1 else values.get(NORM))
        last = self._last_row
        if last is None:
            return None
        self._last_row = None
        row, step = last
        mask, values = self._masks[row], self._host[row]
        if self._buf is not None and mask & 0b11 and self._buf.device.type != "cpu":
            return None  # staged: read when its copy is done
        read: list[float | None] = [None, None]
        if self._host_view is not None and mask & 0b11:  # the CPU buffer's memory
            at = _WIDTH * row
            read = [float(self._host_view[at]), float(self._host_view[at + 1])]
        return (step, read[0] if mask >> LOSS & 1 else values.get(LOSS),
                read[1] if mask >> NORM & 1 else values.get(NORM))

    def _stage(self, row: int, step: int) -> None:
        """Start the non-blocking copy of an accelerator row's loss and norm to pinned host
        memory (nothing when a copy is still in flight, or on the CPU)."""
        self._last_row = (row, step)
        buf = self._buf
        if (buf is None or buf.device.type == "cpu" or not self._masks[row] & 0b11
                or self._pending is not None or not self.watch):
            return
        if buf.device.type != "cuda":
            self.watch = False  # another accelerator: no event to poll, left unwatched
            return
        try:
            if self._pinned is None:  # made once: one pinned pair, one event, one view
                self._pinned = torch.empty(2, dtype=torch.float32, pin_memory=True)
                self._event = torch.cuda.Event()
                self._pinned_view = self._pinned.numpy()
            self._pinned.copy_(buf[row, :2], non_blocking=True)
            self._event.record()
            self._pending = (step, self._event, self._pinned_view)
            self._staged_meta = (self._masks[row], self._host[row])
        except Exception:
            self.watch = False  # no pinned memory or events here: the watch stays off

    def take(self) -> HistoryBlock | None:
        """The kept steps, oldest first (None if none), and start over. The tensors are
        views of the buffer: read them before the next step writes into it."""
        n, dropped = self._count, self._dropped
        self._count, self._dropped = 0, 0
        if not n:
            return None
        start = (self._next - n) % self.capacity
        rows = [(start + i) % self.capacity for i in range(n)]
        tensors: list[torch.Tensor] = []
        if self._buf is not None and any(self._masks[r] for r in rows):
            if start + n <= self.capacity:
                tensors = [self._buf[start:start + n]]
            else:
                tensors = [self._buf[start:], self._buf[:start + n - self.capacity]]
        block = HistoryBlock(
            steps=[self._steps[r] for r in rows], tensors=tensors,
            device_masks=[self._masks[r] for r in rows],
            host_values=[self._host[r] for r in rows],
            limits=[self._limits[r] for r in rows], dropped=dropped, start=start)
        self._next = 0
        return block

    def read_host(self, block: HistoryBlock) -> list[float] | None:
        """``block``'s rows as floats, row-major, where the buffer is host memory (read
        through its numpy view: no tensor call at all), else None. Call before the next
        step writes into the ring."""
        view = self._host_view
        if view is None or not block.tensors:
            return None if block.tensors else []
        n, start = len(block.steps), block.start
        end = start + n
        if end <= self.capacity:
            return view[_WIDTH * start:_WIDTH * end].tolist()
        return (view[_WIDTH * start:].tolist()
                + view[:_WIDTH * (end - self.capacity)].tolist())
