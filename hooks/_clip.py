"""Observe ``clip_grad_norm_`` calls to get the gradient norm *before* clipping.

While at least one monitor listens, ``torch.nn.utils.clip_grad_norm_`` is replaced by a
wrapper that calls the original unchanged and then tells every listener the returned
total norm (a device tensor) and ``max_norm``. ``torch.nn.utils.clip_grads_with_norm_
(parameters, max_norm, total_norm)`` (torch >= 2.6; accelerate >= 1.x clips with it, after
``get_total_norm``, in ``Accelerator.clip_grad_norm_``, so the Hugging Face Trainer never
calls ``clip_grad_norm_``) is wrapped the same way: its ``total_norm`` argument is the
norm before clipping (the device tensor as given, never read), reported with a
``norm_type`` of 2 (the call does not say which norm it was given). FSDP1's own method,
``FullyShardedDataParallel.clip_grad_norm_`` (the right call for sharded FSDP1 gradients:
its norm is reduced across ranks), is wrapped the same way when ``torch.distributed.fsdp``
has been imported by the time a monitor attaches. A clip call made inside another
observed one (FSDP1 delegates to ``torch.nn.utils`` under ``NO_SHARD``) is reported once,
by the outer call. A DTensor norm (FSDP2) is handed over as a plain tensor.

Code that bound the function earlier (``from torch.nn.utils import clip_grad_norm_`` at
import time) is not seen; the monitor then falls back to computing the norm itself in the
optimizer's step pre-hook, after that clip: a norm at the threshold then counts as clipped
(``StepBuffer.norm_after_clip``), never as an unclipped step.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ._shard import plain

__all__ = ["ClipListener", "add_listener", "remove_listener"]

log = logging.getLogger("logitwatch.hooks")

#: ``listener(total_norm, parameters, max_norm, norm_type)``, called twice per observed
#: clip call: first with ``total_norm=None`` just **before** the call clips (the gradients
#: are still the job's; a second call of a step may need the norm of parameters it has
#: not counted yet, ``_optimizer_step``), then with the norm the call returned (for
#: ``clip_grads_with_norm_``: the ``total_norm`` it was given, the same tensor object for
#: each call that shares it). Must not raise.
ClipListener = Callable[[torch.Tensor | None, list[torch.Tensor], Any, Any], None]

_FSDP1_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"

_lock = threading.Lock()
_listeners: list[ClipListener] = []
_inside = threading.local()  # depth of observed clip calls on this thread
_failed: list[bool] = []  # a listener raised (logged once)
#: ``(owner, attribute, original, wrapper)`` for every patch in place.
_patches: list[tuple[Any, str, Any, Any]] = []


def _notify(total: torch.Tensor | None, params: list[torch.Tensor], max_norm: Any,
            norm_type: Any) -> None:
    if total is not None:
        total = plain(total)
    for listener in list(_listeners):
        try:  # a listener must not raise; should one, the job's clip call still runs
            listener(total, params, max_norm, norm_type)
        except Exception:
            if not _failed:
                _failed.append(True)
                log.warning("logitwatch: a clip_grad_norm_ listener failed",
                            exc_info=True)


def _enter() -> bool:
    depth = getattr(_inside, "depth", 0)
    _inside.depth = depth + 1
    return depth == 0


def _leave() -> None:
    _inside.depth -= 1


def _observed(call: Callable[[], Any], params: Callable[[], list[torch.Tensor]],
              max_norm: Any, norm_type: Any, given: torch.Tensor | None = None) -> Any:
    """Run one clip call; the outermost observed one notifies the listeners, before and
    after it clips, with the norm it returned (or ``given``: the norm the call was handed,
    ``clip_grads_with_norm_``)."""
    outer = _enter()
    plist: list[torch.Tensor] = []
    try:
        if outer:
            plist = params()
            _notify(None, plist, max_norm, norm_type)
        total = call()
    finally:
        _leave()
    if outer:
        _notify(total if given is None else given, plist, max_norm, norm_type)
    return total


def _norm_type(args: tuple, kwargs: dict) -> Any:
    """The call's ``norm_type`` (the argument after ``max_norm``, in both signatures), as
    a float where it is a number or a string such as ``"inf"`` (a tensor is left as it
    is: reading it could be a sync)."""
    value = args[0] if args else kwargs.get("norm_type", 2.0)
    if isinstance(value, (int, float, str)):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _make_wrapper(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def clip_grad_norm_(
        parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: Any, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        if not _listeners:
            return original(parameters, max_norm, *args, **kwargs)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        return _observed(lambda: original(params, max_norm, *args, **kwargs),
                         lambda: params, max_norm, _norm_type(args, kwargs))

    return clip_grad_norm_


def _make_with_norm_wrapper(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def clip_grads_with_norm_(
        parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: Any, total_norm: Any,
        *args: Any, **kwargs: Any
    ) -> None:
        if not _listeners or not isinstance(total_norm, torch.Tensor):
            return original(parameters, max_norm, total_norm, *args, **kwargs)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        return _observed(lambda: original(params, max_norm, total_norm, *args, **kwargs),
                         lambda: params, max_norm, 2.0, given=total_norm)

    return clip_grads_with_norm_


def _make_method_wrapper(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def clip_grad_norm_(self: torch.nn.Module, max_norm: Any, *args: Any,
                        **kwargs: Any) -> torch.Tensor:
        if not _listeners:
            return original(self, max_norm, *args, **kwargs)
        return _observed(lambda: original(self, max_norm, *args, **kwargs),
                         lambda: list(self.parameters()), max_norm, _norm_type(args, kwargs))

    return clip_grad_norm_


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = getattr(owner, name)
    wrapper = make(original)
    setattr(owner, name, wrapper)
    _patches.append((owner, name, original, wrapper))


def add_listener(listener: ClipListener) -> None:
    """Start observing; the first listener patches ``torch.nn.utils.clip_grad_norm_`` (and
    ``clip_grads_with_norm_`` where torch has it), and
    ``FullyShardedDataParallel.clip_grad_norm_`` is patched once FSDP1 is imported."""
    with _lock:
        if not _listeners:
            _patch(torch.nn.utils, "clip_grad_norm_", _make_wrapper)
            if callable(getattr(torch.nn.utils, "clip_grads_with_norm_", None)):
                _patch(torch.nn.utils, "clip_grads_with_norm_", _make_with_norm_wrapper)
        fsdp1 = getattr(sys.modules.get(_FSDP1_MODULE), "FullyShardedDataParallel", None)
        if (fsdp1 is not None and callable(getattr(fsdp1, "clip_grad_norm_", None))
                and not any(owner is fsdp1 for owner, *_ in _patches)):
            _patch(fsdp1, "clip_grad_norm_", _make_method_wrapper)  # imported since
        _listeners.append(listener)


def remove_listener(listener: ClipListener) -> None:
    """Stop observing; the last listener restores the original functions."""
    with _lock:
        if listener not in _listeners:
            return
        _listeners.remove(listener)
        if _listeners:
            return
        for owner, name, original, wrapper in reversed(_patches):
            if getattr(owner, name) is wrapper:
                setattr(owner, name, original)
            else:  # someone patched over us: keep theirs; ours passes through when unused
                log.warning("logitwatch: %s.%s was replaced; left as is",
                            getattr(owner, "__name__", owner), name)
        _patches.clear()
