"""Block-sized scratch tensors for the attention statistics, reused across blocks and, on
CPU, across calls (one set per thread, freed by :func:`release_workspace`)."""

from __future__ import annotations

import math
import threading

import torch

__all__ = ["_Workspace", "release_workspace", "workspace"]


class _Workspace:
    """Block-sized scratch tensors reused across blocks and, on CPU, across calls.

    A fresh multi-MB CPU tensor is often served by a new ``mmap`` whose pages fault in on
    first touch; in the first profile of the bench model that cost as much as the arithmetic
    itself (a layer's statistics 2.4 ms with reused memory, 5-6 ms without). So every
    full-size temporary is written with ``out=`` into one of a few named buffers. On CPU
    they are kept per thread between calls (a few blocks of
    :data:`~logitwatch.hooks._logits.CPU_BLOCK_ELEMENTS`
    float32 values, 5.9 MiB on the bench model) and freed by :func:`release_workspace`;
    elsewhere the device's caching allocator already reuses memory, and the buffers live
    for one call.
    """

    def __init__(self) -> None:
        self._flat: dict[str, torch.Tensor] = {}
        self._masks: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._triangles: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, name: str, shape: torch.Size | tuple[int, ...], dtype: torch.dtype,
            device: torch.device, limit: int = 0) -> torch.Tensor:
        """A ``shape`` tensor of uninitialised values from buffer ``name``; an existing
        buffer is reused if it has between ``n`` and ``max(n, limit)`` values, so no more
        than one planned block per buffer stays allocated (the memory budget holds)."""
        n = math.prod(shape)
        buf = self._flat.get(name)
        if (buf is None or not n <= buf.numel() <= max(n, limit) or buf.dtype != dtype
                or buf.device != device):
            self._flat.pop(name, None)
            buf = torch.empty(n, dtype=dtype, device=device)
            self._flat[name] = buf
        return (buf if buf.numel() == n else buf[:n]).view(shape)

    def mask_parts(self, v: torch.Tensor, shapes_only: bool,
                   key: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(0/1 float mask, additive 0/-inf bias)`` of a bool "attend" block ``v``;
        kept for the next call when ``v`` depends on shapes only (a causal mask)."""
        if shapes_only:
            hit = self._masks.get(key)
            if hit is not None and hit[0].device == v.device:
                return hit
        vf = v.to(torch.float32)
        bias = torch.zeros((), dtype=torch.float32, device=v.device).expand(
            v.shape).masked_fill(~v, -math.inf)
        if shapes_only:
            if len(self._masks) >= 2:  # bounded: a model has one or two such shapes
                self._masks.clear()
            self._masks[key] = (vf, bias)
        return vf, bias


    def triangle(self, n: int, device: torch.device, rows: int | None = None,
                 cols: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keep, bias)`` of an ``n x n`` causal square, float32: ``keep`` is 1.0 where
        key ``c <= i`` (query ``i``) else 0.0, ``bias`` 0.0 there and ``-inf`` where
        ``c > i``. Kept between calls (one size at a time); slice ``[:rows, :cols]`` for a
        smaller square (``rows x cols``, the slices kept too)."""
        key = (n, n if rows is None else rows, n if cols is None else cols)
        hit = self._triangles.get(key)
        if hit is not None and hit[0].device == device:
            return hit
        full = self._triangles.get((n, n, n))
        if full is None or full[0].device != device:
            drop = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
            full = ((~drop).to(torch.float32),
                    torch.zeros(n, n, device=device).masked_fill_(drop, -math.inf))
            self._triangles = {(n, n, n): full}
        pair = (full[0][: key[1], : key[2]], full[1][: key[1], : key[2]])
        if len(self._triangles) < 64:  # bounded: one entry per block shape
            self._triangles[key] = pair
        return pair


_local = threading.local()


def workspace(device: torch.device) -> _Workspace:
    """This thread's scratch buffers on CPU; fresh ones (for one call) elsewhere."""
    if device.type != "cpu":
        return _Workspace()
    ws = getattr(_local, "workspace", None)
    if ws is None:
        ws = _local.workspace = _Workspace()
    return ws


def release_workspace() -> None:
    """Free this thread's cached CPU scratch buffers (the monitor calls it on close)."""
    _local.workspace = None
