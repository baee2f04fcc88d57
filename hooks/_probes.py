"""Instruments for checking the hooks' own promises (tests and ``bench/``, not training).

:class:`CountSyncs` counts calls that read tensor values back to the host (the syncs the
monitor must not add on non-sampled steps); :class:`LiveBytes` tracks the peak bytes of
tensors allocated while it is active (the memory budget of a sampled step).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNCS", "CountSyncs", "LiveBytes"]

#: Tensor methods that read values back to the host.
SYNCS = frozenset({"item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__",
                   "__index__"})


class CountSyncs(TorchFunctionMode):
    """Names of the host read-backs (:data:`SYNCS`) called while active, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in SYNCS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


class LiveBytes(TorchDispatchMode):
    """Peak bytes of tensors created while active and still alive. Views of other tensors
    and in-place/``out=`` results allocate nothing and are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                n = t.numel() * t.element_size()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out
