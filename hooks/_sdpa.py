"""Capture of ``F.scaled_dot_product_attention`` calls with a ``TorchFunctionMode``.

The mode is entered by the model's forward pre-hook on sampled steps only and exited by
its forward post-hook, so non-sampled steps pay nothing. While active it sees every torch
call of the forward on this thread; for SDPA calls it hands ``(q, k, mask, is_causal,
scale)`` to a recorder, then calls SDPA unchanged. This covers HF ``sdpa`` models and
any model that calls SDPA itself, but not ``nn.MultiheadAttention`` (which dispatches as
``F.multi_head_attention_forward``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["SdpaCall", "SdpaCapture"]

_SDPA = torch.nn.functional.scaled_dot_product_attention
_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class SdpaCall:
    """The arguments of one SDPA call that the statistics need."""

    __slots__ = ("attn_mask", "is_causal", "key", "query", "scale")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        bound = dict(zip(_PARAMS, args, strict=False))
        bound.update(kwargs)
        self.query: torch.Tensor = bound["query"]
        self.key: torch.Tensor = bound["key"]
        self.attn_mask: torch.Tensor | None = bound.get("attn_mask")
        self.is_causal = bool(bound.get("is_causal", False))
        self.scale: float | None = bound.get("scale")


class SdpaCapture(TorchFunctionMode):
    """Calls ``record(call)`` for each SDPA call while active, then runs SDPA as is.

    ``record`` must not raise (the monitor guards it). After :meth:`retire` the mode is a
    pure pass-through, for the rare case it cannot be popped from the mode stack.
    """

    def __init__(self, record: Callable[[SdpaCall], None]) -> None:
        super().__init__()
        self._record: Callable[[SdpaCall], None] | None = record

    def retire(self) -> None:
        self._record = None

    def is_top(self) -> bool:
        """Whether this mode is the innermost torch function mode of this thread."""
        n = torch._C._len_torch_function_stack()
        return n > 0 and torch._C._get_function_stack_at(n - 1) is self

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is _SDPA and self._record is not None:
            self._record(SdpaCall(args, kwargs))
        return func(*args, **kwargs)
