"""The monitor's capture of training forwards: the model's forward hooks, the SDPA/MHA
mode, HF eager attention and ``record_attention`` calls, the LM head (see
:class:`~logitwatch.hooks._monitor.Monitor` and ``docs/HOOKS.md``)."""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

import torch

from . import _adapter
from ._cost import thread_clock
from ._final import final_stats, step_final
from ._logits import attention_head_stats
from ._maxlogit import head_max
from ._sdpa import SdpaCapture, parse_call

log = logging.getLogger("logitwatch.hooks")

__all__ = ["CaptureMixin", "attention_dtype_max"]

#: Training forwards with no step of the attached optimizer after which the monitor warns
#: once (an optimizer replaced mid-run: ``Monitor.bind_optimizer``); far above a gradient
#: accumulation's micro-batches per step (a loop accumulating 64 must not be told its
#: optimizer was replaced).
STALL_FORWARDS = 1000


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _handled_exception() -> int | None:
    """The id of the exception being handled on this thread (None: none). Only its id is
    kept: a reference would keep a failed forward's frames, and their tensors, alive."""
    exc = sys.exc_info()[1]
    return None if exc is None else id(exc)


class _ForwardState:
    """What one sampled (or max-only) forward adds to the step's statistics, as it was
    before that forward: restored when the forward raises, so that a forward the job
    catches and retries (a CUDA OOM on a smaller batch) leaves nothing in the frame, nor
    in what a fuse acts on (QK-clip scales W_q/W_k on the step's max logits)."""

    __slots__ = ("attn", "auto_loss", "buffer", "dtype_max", "final", "maxima")

    def __init__(self, owner: Any) -> None:
        b = self.buffer = owner._buffer
        self.attn = dict(b.attn)  # entries are replaced on merge, never changed in place
        self.final = copy.copy(b.final)  # FinalStats.merge rebinds its fields: a shallow copy
        self.auto_loss = (b.auto_loss, b.auto_loss_count, b.auto_loss_summed)
        self.dtype_max = b.dtype_max
        self.maxima = dict(owner.maxima)

    def restore(self, owner: Any) -> None:
        b = self.buffer
        if owner._buffer is not b:  # the step ended inside the forward: nothing to undo
            return
        b.attn.clear()
        b.attn.update(self.attn)
        b.final = self.final
        b.auto_loss, b.auto_loss_count, b.auto_loss_summed = self.auto_loss
        b.dtype_max = self.dtype_max
        owner.maxima = self.maxima


def _autocast_dtype(device: str) -> torch.dtype | None:
    """The autocast dtype in force for ``device`` (None: off, or no autocast there)."""
    try:
        return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    except RuntimeError:  # a device type autocast does not know (meta, ...)
        return None


def attention_dtype_max(query: torch.Tensor, key: torch.Tensor) -> float | None:
    """``torch.finfo(dtype).max`` of the dtype the attention scores are computed in.

    The smaller of ``query``'s and ``key``'s floating dtypes; under ``torch.autocast`` for
    their device type, the autocast dtype (attention matmuls and SDPA run in it). Read from
    dtypes and the autocast state only: no tensor value, no sync. None for non-float inputs.
    """
    best: float | None = None
    for t in (query, key):
        dtype = t.dtype
        if not dtype.is_floating_point:
            continue
        if dtype in (torch.float32, torch.float64):
            dtype = _autocast_dtype(t.device.type) or dtype
        value = float(torch.finfo(dtype).max)
        best = value if best is None or value < best else best
    return best


class CaptureMixin:
    """Forward capture for :class:`~logitwatch.hooks._monitor.Monitor` (its state lives
    there)."""

    # -- forward -------------------------------------------------------------------------

    def _pre_forward(self, module: torch.nn.Module, args: Any,
                     kwargs: dict[str, Any] | None = None) -> None:
        if _compiling():
            return
        t0 = 0.0
        try:
            self._depth += 1
            if self._depth == 1:  # new gradients may follow (_optimizer_step: clip calls)
                self._forwards += 1
                if self.loss_items_scale is not None:  # set by the Hugging Face callback
                    self._items_loss = bool(kwargs) and kwargs.get(
                        "num_items_in_batch") is not None
                if self.optimizer is not None and module.training and torch.is_grad_enabled():
                    self._train_forwards += 1
                    if self._train_forwards == self.stall_forwards:
                        self._warn_stalled()
            if self._depth > 1 or not self.sampled:
                if self.capturing:  # a nested call of the model (Lightning's training_step)
                    self._padding.capture(args, kwargs)
                elif (self._depth == 1 and getattr(self, "_max_step", False)
                      and module.training and torch.is_grad_enabled()):
                    self._start_max(args, kwargs)
                elif self._depth == 1 and self._rewriting():
                    self._start_max(args, kwargs, measure=False)
                return
            if not (module.training and torch.is_grad_enabled()):
                if self._rewriting():  # a fuse's rewrite holds in evaluation forwards too
                    self._start_max(args, kwargs, measure=False)
                return
            t0 = thread_clock()
            self._begin_forward()
            self.capturing = True
            _adapter.push(self)
            self._calls = 0
            self._padding.capture(args, kwargs)  # a reference only: read when measured
            if "attention" not in self.disabled or self._rewriting():
                self._mode = SdpaCapture(self._record_call)
                self._mode.__enter__()
        except Exception:
            self._fail("attention")
        finally:
            if self.capturing and t0:
                self._cost.add_host(thread_clock() - t0)

    def _begin_forward(self) -> None:
        """At the start of a measured forward: what to restore if it raises."""
        self._forward_state = _ForwardState(self)
        self._forward_exc = _handled_exception()

    def _forward_failed(self) -> bool:
        """In the forward post-hook: whether the forward raised. torch calls an
        ``always_call`` hook from its ``except`` block, so an exception other than the one
        (if any) being handled when the forward started is the forward's own."""
        exc = _handled_exception()
        return exc is not None and exc != self._forward_exc

    def _post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _compiling():
            return
        try:
            self._depth = max(0, self._depth - 1)
            if self._depth:
                return
            if not self.capturing:
                if module.training and torch.is_grad_enabled() and self._keeps_history():
                    self._history_loss(output)
                return
            state, self._forward_state = self._forward_state, None
            if state is not None and self._forward_failed():
                # the forward raised: its partial statistics must not reach the frame (nor
                # a fuse), the job may retry the step (see _ForwardState)
                self._stop_capture()
                state.restore(self)
                return
            if self.max_only:  # a max-only forward: its loss goes to the history
                self._stop_capture()
                if module.training and torch.is_grad_enabled() and self._keeps_history():
                    self._history_loss(output)
                return
            t0 = thread_clock()
            self._stop_capture()
            if self._calls == 0:
                self._no_attention_seen(module)
            loss = getattr(output, "loss", None)
            if loss is None and isinstance(output, dict):
                loss = output.get("loss")
            if isinstance(loss, torch.Tensor) and "loss" not in self.disabled:
                loss, summed = self._step_share(loss)
                self._buffer.add_auto_loss(loss, summed)
            self._cost.add_host(thread_clock() - t0)
        except Exception:
            self._fail("loss")

    def _no_attention_seen(self, model: torch.nn.Module) -> None:
        """A measured forward recorded no attention call: say so once, when the model has
        attention modules the hooks know of (their rows or q/k projections). Its attention
        goes neither through torch's scaled_dot_product_attention nor HF's
        ``eager_attention_forward`` (GPT-2 with ``reorder_and_upcast_attn``, a hand-written
        softmax), so the per-head attention statistics are missing from every frame."""
        if "no-attention" in self._warned or "attention" in self.disabled:
            return
        token = getattr(self, "_eager_token", None)
        if not (token is not None and token.rows) and not getattr(self, "_qk", None):
            return
        self._warned.add("no-attention")
        log.warning(
            "logitwatch: a measured forward of %s made no attention call the hooks can see "
            "(neither torch's scaled_dot_product_attention nor transformers' "
            "eager_attention_forward), so per-head attention statistics (attn.*) are "
            "missing; use attn_implementation='sdpa', or call "
            "logitwatch.record_attention(q, k, ...) in the attention (docs/HOOKS.md)",
            type(model).__name__)

    def _keeps_history(self) -> bool:
        """Whether the current step's scalars go to the next frame's history: a step
        outside the schedule, while frames are sent."""
        return not (self._scheduled or "history" in self.disabled
                    or "step" in self.disabled)

    def _history_loss(self, output: Any) -> None:
        """The loss of a training forward on a non-sampled step (no sync)."""
        try:
            loss = getattr(output, "loss", None)
            if loss is None and isinstance(output, dict):
                loss = output.get("loss")
            if isinstance(loss, torch.Tensor) and "loss" not in self.disabled:
                loss, summed = self._step_share(loss)
                self._history.add_loss(loss, summed)
        except Exception:
            self._fail("history")

    def _step_share(self, loss: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """An outermost forward's loss, and whether it is its share of the step's loss (the
        step's loss is then the sum over its forwards, not the mean): the forward was called
        with ``num_items_in_batch`` where :attr:`loss_items_scale` is set (the Hugging Face
        Trainer divides each micro-batch's summed loss by the whole step's token count);
        scaled by it (the ranks' count where the Trainer averages tokens across devices)."""
        if self.loss_items_scale is None or not self._items_loss:
            return loss, False
        if self.loss_items_scale != 1.0:
            loss = loss.detach() * self.loss_items_scale  # on the device, no sync
        return loss, True

    def _warn_stalled(self) -> None:
        """Many training forwards and no step of the attached optimizer: the job most
        likely steps another optimizer now (replaced mid-run), which the monitor does not
        see, so no step ends; said once."""
        if "stalled" in self._warned:
            return
        self._warned.add("stalled")
        log.warning(
            "logitwatch: %d training forwards without a step() of the attached optimizer: "
            "the monitor's steps end with that optimizer's step(). If the job replaced its "
            "optimizer, call mon.bind_optimizer(new_optimizer) (docs/HOOKS.md)",
            self.stall_forwards)

    def _head_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if "final" in self.disabled or _compiling():
            return
        if not self.capturing or self.max_only:
            if module.training and torch.is_grad_enabled() and self._keeps_history():
                self._history_final(args, output)
            return
        t0 = thread_clock()
        try:
            if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
                self._buffer.add_final(final_stats(args[0], output, self.memory_budget))
        except Exception:
            self._fail("final")
        self._cost.add_host(thread_clock() - t0)

    def _history_final(self, args: Any, output: Any) -> None:
        """log Z and the hidden RMS of a training forward on a non-sampled step (no sync)."""
        try:
            if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
                self._history.add_final(*step_final(args[0], output))
        except Exception:
            self._fail("history")

    def _rewriting(self) -> bool:
        """Whether a fuse rewrites attention calls now (QK-norm, soft-cap: every forward is
        intercepted, ``hooks/fuses/_rewrite.py``)."""
        rewrite = self.attn_rewrite
        return rewrite is not None and rewrite.active

    def _start_max(self, args: Any, kwargs: dict[str, Any] | None,
                   measure: bool = True) -> None:
        """Start a max-only capture of this training forward (a step a fuse asked for with
        :meth:`request_max`, outside the monitor's samples): the attention calls give their
        per-head max logit only (:mod:`~logitwatch.hooks._maxlogit`), nothing else.
        ``measure=False``: the calls are only rewritten by a fuse (nothing measured)."""
        self._begin_forward()
        self.capturing = True
        self.max_only = True
        self._max_measure = measure
        _adapter.push(self)
        self._calls = 0
        self._padding.capture(args, kwargs)
        if "attention" not in self.disabled or self._rewriting():
            self._mode = SdpaCapture(self._record_call)
            self._mode.__enter__()

    def _stop_capture(self) -> None:
        self.capturing = False
        self.max_only = False
        self._padding.clear()
        _adapter.pop(self)
        mode, self._mode = self._mode, None
        if mode is None:
            return
        # Taken off the stack even under another mode (a second monitor's, or one someone
        # left there): a mode left behind would slow every later torch call of the process
        if not mode.remove():  # not on this thread's stack (closed from another thread)
            self._fail("attention", RuntimeError("the SDPA capture mode is not on this "
                                                 "thread's mode stack"))

    def _record_call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Measure one SDPA/MHA call; returns a fuse's rewrite of it (or None)."""
        if self.eager_depth or _compiling():  # compiled code is not measured (see SdpaCapture)
            return None
        got = None
        if self._rewriting():  # never raises: a failing rewrite leaves the call as is
            got = self.attn_rewrite.sdpa(self._calls, func, args, kwargs)
        if "attention" in self.disabled:
            self._calls += 1
            return got
        try:
            call = parse_call(func, args, kwargs)
        except Exception:
            self._fail("attention")
            return got
        if call is None:
            self._calls += 1  # a layer we cannot model keeps its row number
            return got
        if got is not None:  # measure what the softmax receives
            call.query, call.key = got.query, got.key
        self._record(None, call.query, call.key, call.attn_mask, call.is_causal, call.scale,
                     None if got is None else got.softcap, call.query_valid, call.key_valid)
        return got

    def rewrite_eager(self, original: Any, module: torch.nn.Module, query: torch.Tensor,
                      key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
        """A fuse's rewrite of one HF eager attention call (None: unchanged)."""
        if not self._rewriting():
            return None
        layer = self._eager_row(module)
        layer = self._calls if layer is None else layer
        return self.attn_rewrite.eager(layer, original, module, query, key, value,
                                       attention_mask, args, kwargs)

    def record_eager(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None,
        softcap: float | None = None,
    ) -> None:
        """Called by the eager-attention wrapper while :attr:`capturing`."""
        if "attention" in self.disabled:
            return
        self._record(self._eager_row(module), query, key, attention_mask, False, scaling,
                     softcap)

    def _eager_row(self, module: torch.nn.Module) -> int | None:
        """An eager attention module's row (``_eager.attention_rows``); its ``layer_idx``
        for a module found after attach; None (call order) without either."""
        token = getattr(self, "_eager_token", None)
        row = token.rows.get(id(module)) if token is not None else None
        if row is not None:
            return row
        layer = getattr(module, "layer_idx", None)
        return layer if isinstance(layer, int) and not isinstance(layer, bool) else None

    def _record(
        self,
        layer: int | None,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None,
        softcap: float | None,
        query_valid: torch.Tensor | None = None,
        key_valid: torch.Tensor | None = None,
    ) -> None:
        if self.max_only:
            if not getattr(self, "_max_measure", True):  # rewritten by a fuse only
                self._calls += 1
                return
            self._record_max(layer, query, key, mask, is_causal, scale, query_valid,
                             key_valid)
            return
        t0 = thread_clock()
        try:
            index = self._calls if layer is None else layer
            self._calls += 1
            if _unmeasurable(query, key):  # counted: the later calls keep their rows
                return
            dtype_max = attention_dtype_max(query, key)
            if dtype_max is not None:
                self._buffer.add_dtype_max(dtype_max)
            if getattr(query, "is_nested", False):
                return
            cap = float(softcap) if isinstance(softcap, (int, float)) and softcap else None
            if query.dim() in (3, 4) and (query_valid is None or key_valid is None):
                rows, cols = self._padding.for_call(query.shape[0], query.shape[-2],
                                                    key.shape[-2])
                query_valid = rows if query_valid is None else query_valid
                key_valid = cols if key_valid is None else key_valid
            if self._qk_find.pending:
                self._qk_find.on_attention(query, key)
            stats = attention_head_stats(query, key, attn_mask=mask, is_causal=is_causal,
                                         scale=scale, softcap=cap, budget=self.memory_budget,
                                         query_valid=query_valid, key_valid=key_valid)
            self._buffer.add_attention(index, stats)
        except Exception:
            self._fail("attention")
        self._cost.add_host(thread_clock() - t0)


    def _record_max(
        self,
        layer: int | None,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None,
        query_valid: torch.Tensor | None,
        key_valid: torch.Tensor | None,
    ) -> None:
        """One attention call of a max-only forward: its per-head max, pooled per layer
        over the step's forwards into :attr:`maxima` (on the device, nothing read)."""
        try:
            index = self._calls if layer is None else layer
            self._calls += 1
            if getattr(query, "is_nested", False) or _unmeasurable(query, key):
                return
            if query.dim() in (3, 4) and (query_valid is None or key_valid is None):
                rows, cols = self._padding.for_call(query.shape[0], query.shape[-2],
                                                    key.shape[-2])
                query_valid = rows if query_valid is None else query_valid
                key_valid = cols if key_valid is None else key_valid
            m = head_max(query, key, attn_mask=mask, is_causal=is_causal, scale=scale,
                         budget=self.memory_budget, query_valid=query_valid,
                         key_valid=key_valid, below=self._max_below)
            old = self.maxima.get(index)
            self.maxima[index] = m if old is None or old.shape != m.shape else (
                torch.maximum(old, m))
        except Exception:
            self._fail("attention")


def _unmeasurable(query: torch.Tensor, key: torch.Tensor) -> bool:
    """A call with no logits to measure: on the meta device (a shape probe inside the
    forward: its statistics would make the frame's one read-back fail, and the whole
    ``step`` part with it) or with no elements (an empty sequence: no valid pair)."""
    return query.is_meta or key.is_meta or query.numel() == 0 or key.numel() == 0
