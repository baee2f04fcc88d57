"""Every unsampled step's loss, grad norm, clip flag and lr, kept until the next frame.

Sampled steps send a whole frame; the steps between them send these four scalars in the
next frame's ``history`` (see ``logitwatch.wire``). :class:`StepHistory` keeps them without
reading a tensor value: device values (the loss, the norm a clip call returned, the clip
flag) are written with ``copy_`` into one preallocated ``(capacity, 4)`` float32 tensor
on their device, Python numbers (the lr, a loss given as a float) into a host array, and
the host remembers which cell was written where. :meth:`StepHistory.take` hands the
written rows over as tensor views, so the sampled step reads them back in its one
transfer.

The rows form a ring of ``capacity`` steps (4096 by default: 64 KiB of device memory):
when more unsampled steps pass between two frames, the newest are kept and the dropped
ones counted. A value on another accelerator than the buffer's is left out (reading or
moving it would cost a sync or a copy per step); this is counted too.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import torch

from logitwatch.wire import MAX_HISTORY_STEPS

__all__ = ["COLUMNS", "CLIPPED", "LOSS", "LR", "NORM", "HistoryBlock", "StepHistory"]

#: The series of a history, in column order.
COLUMNS = ("loss", "grad.norm", "grad.clipped", "lr")
LOSS, NORM, CLIPPED, LR = range(len(COLUMNS))
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
    dropped: int

    def values(self, flat: list[float]) -> dict[str, Any]:
        """``{"steps", "scalars"}`` from the read-back rows (``flat``: row-major floats);
        a series no step measured is left out."""
        series: list[list[float | None]] = [[] for _ in COLUMNS]
        for i, (mask, host) in enumerate(zip(self.device_masks, self.host_values,
                                             strict=True)):
            row = flat[_WIDTH * i:_WIDTH * (i + 1)]
            for c in range(_WIDTH):
                if mask >> c & 1:
                    series[c].append(row[c])
                else:
                    series[c].append(host.get(c))
        return {"steps": self.steps,
                "scalars": {name: values for name, values in zip(COLUMNS, series, strict=True)
                            if any(v is not None for v in values)}}


class StepHistory:
    """The ring of unsampled steps' scalars (module docstring). Training thread only."""

    def __init__(self, capacity: int = MAX_HISTORY_STEPS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._buf: torch.Tensor | None = None  # (capacity, 4) float32, made at first use
        self._steps = array("q", bytes(8 * capacity))
        self._masks = array("B", bytes(capacity))
        self._host: list[dict[int, float]] = [{} for _ in range(capacity)]
        self._count = 0  # steps kept since the last take (at most capacity)
        self._next = 0  # the ring row of the current step
        self._dropped = 0
        self.skipped = 0  # values left out: on another device than the buffer
        # the current (not yet ended) step
        self._mask = 0
        self._values: dict[int, float] = {}
        self._losses = 0  # automatic losses added on the device this step
        self._loss_logged = False

    # -- the current step ------------------------------------------------------------------

    def _cell(self, value: torch.Tensor, column: int) -> torch.Tensor | None:
        """The current step's device cell of ``column``, or None (value on another
        accelerator than the buffer: left out)."""
        buf = self._buf
        if buf is None:
            buf = self._buf = torch.empty(self.capacity, _WIDTH, dtype=torch.float32,
                                          device=value.device)
        elif buf.device != value.device:
            return None
        return buf[self._next, column]

    def put(self, column: int, value: torch.Tensor | float) -> None:
        """Record ``value`` as the current step's ``column`` (the last call wins)."""
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.numel() != 1:
                value = value.float().mean()
            cell = self._cell(value, column)
            if cell is None:
                if value.device.type != "cpu":
                    self.skipped += 1
                    return
                value = float(value)  # a CPU tensor beside an accelerator buffer: no sync
            else:
                cell.copy_(value.reshape(()))
                self._mask |= 1 << column
                self._values.pop(column, None)
                return
        self._values[column] = float(value)
        self._mask &= ~(1 << column)

    def add_loss(self, loss: torch.Tensor) -> None:
        """An automatically captured loss (the forward's ``.loss``): the step's value is the
        mean over its forwards, unless :meth:`log_loss` gives one."""
        if self._loss_logged:
            return
        loss = loss.detach()
        if loss.numel() != 1:
            loss = loss.float().mean()
        if self._losses and self._mask >> LOSS & 1:
            cell = self._cell(loss, LOSS)
            if cell is not None:
                cell.add_(loss.reshape(()))
                self._losses += 1
            return
        self.put(LOSS, loss)
        self._losses = 1

    def log_loss(self, value: torch.Tensor | float) -> None:
        """A loss given by the job (``Monitor.log(loss=...)``): replaces the automatic one."""
        self._loss_logged = True
        self._losses = 0
        self.put(LOSS, value)

    def end_step(self, step: int) -> None:
        """Close the current step as ``step``: kept if anything was recorded."""
        mask, values, losses = self._mask, self._values, self._losses
        self._mask, self._values, self._losses, self._loss_logged = 0, {}, 0, False
        if not mask and not values:
            return
        if losses > 1 and self._buf is not None:
            self._buf[self._next, LOSS].div_(losses)
        row = self._next
        self._steps[row] = step
        self._masks[row] = mask
        self._host[row] = values
        self._next = (row + 1) % self.capacity
        if self._count == self.capacity:
            self._dropped += 1  # the oldest row was just overwritten
        else:
            self._count += 1

    # -- the sampled step ------------------------------------------------------------------

    def discard_step(self) -> None:
        """Forget what the current step recorded (it is sampled: its frame has it all)."""
        self._mask, self._values, self._losses, self._loss_logged = 0, {}, 0, False

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
            host_values=[self._host[r] for r in rows], dropped=dropped)
        self._next = 0
        return block
