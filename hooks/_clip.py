"""Observe ``torch.nn.utils.clip_grad_norm_`` to get the norm *before* clipping.

While at least one monitor listens, ``torch.nn.utils.clip_grad_norm_`` is replaced by a
wrapper that calls the original unchanged and then tells every listener the returned
total norm (a device tensor) and ``max_norm``. Code that bound the function earlier
(``from torch.nn.utils import clip_grad_norm_`` at import time) is not seen; the monitor
then falls back to computing the norm itself in the optimizer's step pre-hook.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["ClipListener", "add_listener", "remove_listener"]

log = logging.getLogger("logitwatch.hooks")

#: ``listener(total_norm, parameters, max_norm)``; must not raise.
ClipListener = Callable[[torch.Tensor, list[torch.Tensor], Any], None]

_lock = threading.Lock()
_listeners: list[ClipListener] = []
_original: Callable[..., torch.Tensor] | None = None
_wrapper: Callable[..., torch.Tensor] | None = None


def _make_wrapper(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def clip_grad_norm_(
        parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: Any, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        if not _listeners:
            return original(parameters, max_norm, *args, **kwargs)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total = original(params, max_norm, *args, **kwargs)
        for listener in list(_listeners):
            listener(total, params, max_norm)
        return total

    return clip_grad_norm_


def add_listener(listener: ClipListener) -> None:
    """Start observing; patches ``torch.nn.utils.clip_grad_norm_`` for the first listener."""
    global _original, _wrapper
    with _lock:
        if not _listeners:
            _original = torch.nn.utils.clip_grad_norm_
            _wrapper = _make_wrapper(_original)
            torch.nn.utils.clip_grad_norm_ = _wrapper
        _listeners.append(listener)


def remove_listener(listener: ClipListener) -> None:
    """Stop observing; the last listener restores the original function."""
    global _original, _wrapper
    with _lock:
        if listener not in _listeners:
            return
        _listeners.remove(listener)
        if _listeners:
            return
        if torch.nn.utils.clip_grad_norm_ is _wrapper:
            torch.nn.utils.clip_grad_norm_ = _original
        else:  # someone patched over us: keep theirs; ours passes through when unused
            log.warning("logitwatch: torch.nn.utils.clip_grad_norm_ was replaced; left as is")
        _original = _wrapper = None
