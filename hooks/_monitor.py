"""The :class:`Monitor`: step accounting, capture on sampled steps, one frame per sample."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from logitwatch.client import Client

from . import _clip, _eager
from ._buffer import StepBuffer
from ._sdpa import SdpaCall, SdpaCapture
from ._stats import attention_logit_stats, global_grad_norm

__all__ = ["Monitor"]

log = logging.getLogger("logitwatch.hooks")

#: The parts of a monitor that a failure disables independently.
PARTS = ("attention", "loss", "grad", "step")


class Monitor:
    """Watches one model (and optimizer) while training; built by :func:`attach`.

    A *step* ends with the optimizer's ``step()`` (or :meth:`step` without optimizer).
    Step 0 is sampled, then one step every ``sample_every`` (the collector may change
    the interval through ``client.control["sample_every"]``). Statistics are computed on
    sampled steps only, kept on the device, and read back once at the end of the step,
    where one frame is handed to the client. Non-sampled steps cost a few Python
    comparisons and never touch tensor values.

    Capture rule: a forward is measured only when the step is sampled, the model is in
    training mode (``model.training``) and autograd is enabled; evaluation forwards
    (``model.eval()`` or ``torch.no_grad()``) never mix into the training statistics.

    Several forwards per step (gradient accumulation): attention max and p99 are the
    maximum over the forwards (the max is exact; the p99 is the largest per-forward exact
    p99, an upper bound of the pooled one), the automatic loss is their mean. Layers are
    numbered by ``module.layer_idx`` (HF eager) or by SDPA call order in the forward.

    Memory: a sampled forward materialises each layer's float32 logits ``B x H x T x S``
    in chunks of heads (at least one head at a time) to compute the exact p99.

    Any exception inside the monitor is logged once with its traceback, disables that
    part (``attention``, ``loss``, ``grad`` or ``step``), and training goes on unchanged.

    Use as a context manager or call :meth:`close`; closing removes every hook and patch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        client: Client,
        owns_client: bool,
        sample_every: int,
        max_grad_norm: float | None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.client = client
        self._owns_client = owns_client
        self._sample_every = sample_every
        self._max_grad_norm = max_grad_norm
        self._step = 0
        self._last_sampled: int | None = None
        self._sampled = True
        self._buffer = StepBuffer()
        self._depth = 0
        self._mode: SdpaCapture | None = None
        self._calls = 0
        self._clip_seen = False
        self.capturing = False  # read by the eager wrapper
        self.eager_depth = 0  # > 0 while inside a wrapped eager attention call
        self.disabled: set[str] = set()
        self._closed = False
        self._warned_step = False
        self._param_ids = {id(p) for p in model.parameters()}
        self._handles = [
            model.register_forward_pre_hook(self._pre_forward),
            model.register_forward_hook(self._post_forward, always_call=True),
        ]
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._pre_optimizer_step))
            self._handles.append(optimizer.register_step_post_hook(self._post_optimizer_step))
        self._eager_token = _eager.install(model, self)
        _clip.add_listener(self._on_clip)

    # -- public --------------------------------------------------------------------------

    @property
    def step_index(self) -> int:
        """The index of the current (not yet ended) step."""
        return self._step

    @property
    def sampled(self) -> bool:
        """Whether the current step is sampled."""
        return self._sampled and "step" not in self.disabled

    def log(self, **scalars: torch.Tensor | float) -> None:
        """Add scalars to the current step's frame (call before ``optimizer.step()``).

        ``loss=`` replaces the automatically captured loss. Tensors stay on the device
        until the step's single transfer; on non-sampled steps this does nothing.
        """
        if not self.sampled or self._closed:
            return
        try:
            for name, value in scalars.items():
                self._buffer.log(name, value)
        except Exception:
            self._fail("step")

    def step(self) -> None:
        """End the current step; only for monitors attached without an optimizer."""
        if self._closed:
            return
        if self.optimizer is not None:
            if not self._warned_step:
                self._warned_step = True
                log.warning("logitwatch: Monitor.step() ignored: the optimizer ends steps")
            return
        if self.sampled and "grad" not in self.disabled and not self._clip_seen:
            try:
                self._buffer.grad_norm = global_grad_norm(self.model.parameters())
            except Exception:
                self._fail("grad")
        self._end_step()

    def close(self, timeout: float = 10.0) -> None:
        """Remove every hook and patch, then shut down (or flush, if injected) the client.

        Idempotent and bounded by ``timeout`` seconds. A client passed to ``attach`` is
        flushed but left running: its owner shuts it down.
        """
        if self._closed:
            return
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stop_capture()
        _eager.uninstall(self._eager_token)
        _clip.remove_listener(self._on_clip)
        if self._owns_client:
            self.client.shutdown(timeout)
        else:
            self.client.flush(timeout)

    detach = close

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forward -------------------------------------------------------------------------

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        try:
            self._depth += 1
            if self._depth > 1 or not self.sampled:
                return
            if not (module.training and torch.is_grad_enabled()):
                return
            self.capturing = True
            self._calls = 0
            if "attention" not in self.disabled:
                self._mode = SdpaCapture(self._record_sdpa)
                self._mode.__enter__()
        except Exception:
            self._fail("attention")

    def _post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        try:
            self._depth = max(0, self._depth - 1)
            if self._depth or not self.capturing:
                return
            self._stop_capture()
            loss = getattr(output, "loss", None)
            if isinstance(loss, torch.Tensor) and "loss" not in self.disabled:
                self._buffer.add_auto_loss(loss)
        except Exception:
            self._fail("loss")

    def _stop_capture(self) -> None:
        self.capturing = False
        mode, self._mode = self._mode, None
        if mode is None:
            return
        if mode.is_top():
            mode.__exit__(None, None, None)
        else:  # someone left a mode of theirs on top: we cannot pop ours safely
            mode.retire()
            self._fail("attention", RuntimeError("the SDPA capture mode is not innermost"))

    def _record_sdpa(self, call: SdpaCall) -> None:
        if self.eager_depth or "attention" in self.disabled:
            return
        self._record(None, call.query, call.key, call.attn_mask, call.is_causal, call.scale)

    def record_eager(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None,
    ) -> None:
        """Called by the eager-attention wrapper while :attr:`capturing`."""
        if "attention" in self.disabled:
            return
        layer = getattr(module, "layer_idx", None)
        layer = layer if isinstance(layer, int) and not isinstance(layer, bool) else None
        self._record(layer, query, key, attention_mask, False, scaling)

    def _record(
        self,
        layer: int | None,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None,
    ) -> None:
        try:
            index = self._calls if layer is None else layer
            self._calls += 1
            if getattr(query, "is_nested", False):
                return
            maximum, p99 = attention_logit_stats(
                query, key, attn_mask=mask, is_causal=is_causal, scale=scale
            )
            self._buffer.add_attention(index, maximum, p99)
        except Exception:
            self._fail("attention")

    # -- optimizer -----------------------------------------------------------------------

    def _on_clip(self, total: torch.Tensor, params: list[torch.Tensor], max_norm: Any) -> None:
        try:
            if not self.sampled or "grad" in self.disabled or not params:
                return
            if id(params[0]) not in self._param_ids:
                return  # another model's clip call
            self._clip_seen = True
            self._buffer.grad_norm = total.detach().float()
            self._buffer.max_norm = max_norm
        except Exception:
            self._fail("grad")

    def _pre_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if not self.sampled or "grad" in self.disabled or self._clip_seen:
                return
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._buffer.grad_norm = global_grad_norm(params)
        except Exception:
            self._fail("grad")

    def _post_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._end_step()

    # -- step end ------------------------------------------------------------------------

    def _end_step(self) -> None:
        step, sampled = self._step, self.sampled
        try:
            if sampled:
                self._stop_capture()
                self._last_sampled = step
                self._emit(step)
        except Exception:
            self._fail("step")
        finally:
            if sampled:
                self._buffer = StepBuffer()
            self._clip_seen = False
            self._step = step + 1
        try:
            every = self._current_every()
            self._sampled = self._last_sampled is None or self._step >= self._last_sampled + every
        except Exception:
            self._fail("step")

    def _current_every(self) -> int:
        value = self.client.control.get("sample_every")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        return self._sample_every

    def _emit(self, step: int) -> None:
        lr = None
        if self.optimizer is not None and self.optimizer.param_groups:
            lr = self.optimizer.param_groups[0].get("lr")
        scalars, heads = self._buffer.collect(lr=lr, default_max_norm=self._max_grad_norm)
        self.client.send(step, scalars, heads, time=time.time())

    # -- failures ------------------------------------------------------------------------

    def _fail(self, part: str, exc: BaseException | None = None) -> None:
        """Disable ``part`` after its first failure; log once with the traceback."""
        if part in self.disabled:
            return
        self.disabled.add(part)
        log.warning(
            "logitwatch: the %r part of the monitor failed and is disabled for the rest of "
            "the run; training continues unaffected",
            part,
            exc_info=exc if exc is not None else True,
        )
