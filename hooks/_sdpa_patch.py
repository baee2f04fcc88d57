"""A cheaper capture of SDPA/MHA calls: ``torch.nn.functional``'s two attributes replaced
for one forward, on one thread.

:class:`~logitwatch.hooks._sdpa.SdpaCapture`, a ``TorchFunctionMode``, sees every attention
call of the forward however it was reached, but it also routes every other top-level torch
call of that forward through Python: on the bench's GPT-2 (276 calls a forward) an empty
mode costs about 1.2 ms of a 72 ms forward, more than the capture of its four attention
calls (``bench/README.md``, *Hooks*). :class:`SdpaPatch` replaces
``F.scaled_dot_product_attention`` and ``F.multi_head_attention_forward`` instead, which
costs nothing outside the attention calls. It sees the calls that look the function up when
they call it (``F.scaled_dot_product_attention(...)``, ``torch.nn.functional.…``, HF's SDPA
path, nanoGPT, ``nn.MultiheadAttention``), not code that bound the function at import
(``from torch.nn.functional import scaled_dot_product_attention``). So the monitor checks
first: a forward captured by both (:class:`~logitwatch.hooks._sdpa.SdpaCapture` with
``patch=``) shows whether any call escapes the patch, and the patch alone is used only where
none did (``docs/HOOKS.md``).

Other threads pass through (the patch is module-wide, a capture belongs to the thread that
started it), and so does the SDPA call inside a recorded MHA call (seen once, as the mode
sees it).
"""

from __future__ import annotations

import threading
from typing import Any

import torch.nn.functional as F

from ._sdpa import _MHA, _SDPA, Recorder

__all__ = ["SdpaPatch"]


class SdpaPatch:
    """While entered, calls ``record(func, args, kwargs)`` for each SDPA / MHA call this
    thread makes through ``torch.nn.functional``, then runs it (or the call ``record``
    returned). The same protocol as :class:`~logitwatch.hooks._sdpa.SdpaCapture`:
    :meth:`retire` makes it a pure pass-through, :meth:`is_top` says whether it can be
    removed (no one replaced the attributes after it)."""

    def __init__(self, record: Recorder) -> None:
        self._record: Recorder | None = record
        self._thread = threading.get_ident()
        self.inside = False  # a recorded call is running (its inner calls pass through)
        self.seen = 0  # calls recorded
        self._sdpa = self._wrap(_SDPA)
        self._mha = self._wrap(_MHA)
        self._saved: tuple[Any, Any] | None = None

    def _wrap(self, func: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if (self._record is None or self.inside
                    or threading.get_ident() != self._thread):
                return func(*args, **kwargs)
            self.inside = True
            try:
                self.seen += 1
                run, a, k = func, args, kwargs
                got = self._record(func, args, kwargs)
                if got is not None:  # a fuse rewrote the call (hooks/fuses/_rewrite.py)
                    run, a, k = got.func, got.args, got.kwargs
                return run(*a, **k)
            finally:
                self.inside = False
        wrapper.__wrapped__ = func  # type: ignore[attr-defined]
        wrapper.__name__ = func.__name__
        wrapper.__doc__ = func.__doc__
        return wrapper

    def __enter__(self) -> SdpaPatch:
        self._saved = (F.scaled_dot_product_attention, F.multi_head_attention_forward)
        F.scaled_dot_product_attention = self._sdpa
        F.multi_head_attention_forward = self._mha
        return self

    def is_top(self) -> bool:
        return (F.scaled_dot_product_attention is self._sdpa
                and F.multi_head_attention_forward is self._mha)

    def retire(self) -> None:
        self._record = None

    def __exit__(self, *exc: object) -> None:
        """Put back what was there; when someone replaced the attributes after us, leave
        theirs and become a pass-through (their wrapper calls ours)."""
        if self._saved is not None and self.is_top():
            F.scaled_dot_product_attention, F.multi_head_attention_forward = self._saved
        else:
            self.retire()
        self._saved = None
