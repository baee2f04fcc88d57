"""The :class:`Monitor`: step accounting, capture on sampled steps, one frame per sample.

Its state and public methods live here; its behaviour is split into mixins, one concern
each: forward capture (``_capture``), frames (``_frames``), the optimizer step
(``_optimizer_step``), the sampling schedule (``_schedule``), the end of a step
(``_step_end``) and failure handling (``_failures``)."""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any

import torch

from logitwatch.client import Client

from . import _clip, _eager, _logits
from ._buffer import StepBuffer, logged_value, warn_skipped
from ._capture import STALL_FORWARDS, CaptureMixin, attention_dtype_max
from ._cost import MAX_INTERVAL, CostMeter, thread_clock
from ._failures import PARTS as PARTS
from ._failures import FailuresMixin
from ._final import find_output_head, vocab_size
from ._frames import FramesMixin
from ._history import LR, StepHistory
from ._history_flush import DEFAULT_EVERY as DEFAULT_FLUSH
from ._history_flush import HistoryFlush
from ._logits import DEFAULT_BUDGET
from ._lrwatch import LrWatch
from ._optim_kind import adaptive
from ._optimizer_step import OptimizerStepMixin
from ._padding import PaddingMask
from ._qk_find import QKDiscovery, QKLayout, no_shape
from ._reduce import RankReduce, Reduced, find_reduce
from ._schedule import ScheduleMixin
from ._sdpa import SdpaCapture
from ._shard import find_sharding
from ._step_end import StepEndMixin
from ._stepwatch import StepWatch
from ._tp import find_tp
from .fuses import FusesArg, FuseSet
from .fuses._base import parse as parse_fuses

__all__ = ["Monitor", "attention_dtype_max"]

log = logging.getLogger("logitwatch.hooks")

#: Sampled frames over which ``grad.clip_rate`` is taken when the job never clips itself.
CLIP_WINDOW = 20


class Monitor(CaptureMixin, FramesMixin, OptimizerStepMixin, ScheduleMixin, StepEndMixin,
              FailuresMixin):
    """Watches one model (and optimizer) while training; built by :func:`attach`.

    A *step* ends with the optimizer's ``step()`` (or :meth:`step` without optimizer).
    Step 0 is sampled, then one step every :attr:`sample_every` (changeable at run time,
    by the collector through ``client.control["sample_every"]``, and widened by the
    overhead budget, see :class:`~logitwatch.hooks._cost.CostMeter`);
    :meth:`request_sample` samples the next step on demand. Statistics are computed on
    sampled steps only, kept on the device, and read back once at the end of the step,
    where one frame is handed to the client. Non-sampled steps cost a few Python
    comparisons, a ``perf_counter()``, (when the job clips) one on-device comparison for
    the clip rate, and a few on-device copies that keep the step's loss, grad norm and
    clip flag (and its lr, a host float) for the next frame's ``history`` (see
    :mod:`~logitwatch.hooks._history`); they never read a tensor value. Every
    ``history_every`` unsampled steps (and, on a CPU job, after a step the spike or LR
    watch flagged) that history is sent ahead of the next frame, read where that costs no
    sync (:mod:`~logitwatch.hooks._history_flush`).

    Capture rule: a forward is measured only when the step is sampled, the model is in
    training mode (``model.training``), autograd is enabled and it is not being traced
    by ``torch.compile``; evaluation forwards never mix into the training statistics.

    Several forwards per step (gradient accumulation) are pooled (see
    :class:`~logitwatch.hooks._buffer.StepBuffer`). Layers are numbered by
    ``module.layer_idx`` (HF eager), ``record_attention(layer=)``, or call order.

    Any exception inside the monitor is logged once with its traceback, disables that
    part (see :data:`~logitwatch.hooks._failures.PARTS`), and training goes on unchanged.

    Sharded parameters (FSDP2/DTensor, FSDP1): the grad and q/k norms need a collective,
    so every rank must sample the same steps. All of the monitor's collectives happen at
    the end of each sampled step, in a fixed order, whatever failed on this rank: one
    ``all_reduce(SUM)`` of a vector laid out at attach (local gradient and q/k squared
    sums, and how many ranks could not contribute them), then one ``all_reduce(MAX)``
    where the ranks agree on the next interval (the widest proposal wins). A part failing
    on one rank only makes its values absent from every rank's frames; it never makes a
    rank skip a collective (see docs/HOOKS.md "Ranks, DDP, FSDP"). :meth:`request_sample`
    must be called on every rank at the same step.

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
        memory_budget: int = DEFAULT_BUDGET,
        overhead_budget: float | None = 0.01,
        lm_head: torch.nn.Module | bool | None = None,
        qk_layout: QKLayout | None = None,
        max_sample_every: int = MAX_INTERVAL,
        fuses: FusesArg | None = None,
        reduce_ranks: Any = None,
        tp_group: Any = None,
        tp_rank: int | None = None,
        history_every: int | None = DEFAULT_FLUSH,
        start_step: int = 0,
    ) -> None:
        # checked before anything is installed: a bad ``fuses`` raises with the model untouched
        fuse_list = parse_fuses(fuses)
        self.model = model
        self._ranks: RankReduce | None = None  # reduce-before-send (``_reduce``)
        self._reduced: Reduced | None = None
        self.optimizer = optimizer
        self.client = client
        self._owns_client = owns_client
        self._sample_every = sample_every
        self._max_grad_norm = max_grad_norm
        self.memory_budget = memory_budget
        device_work = any(p.device.type != "cpu" for p in model.parameters())
        self._cost = CostMeter(overhead_budget, max_interval=max_sample_every,
                               device_work=device_work)
        self._sample_at: set[int] = set()  # steps to sample whatever the interval
        #: The run's planned optimizer steps from attach, when known (the Hugging Face and
        #: Lightning callbacks set it from the trainer): a fuse's window given as a fraction
        #: of the remaining steps uses it.
        self.planned_steps: int | None = None
        #: the first step's index (``attach(start_step=)``: a resumed job's next step)
        self._start_step = start_step
        self._step = start_step
        self._last_sampled: int | None = None
        self._sampled = True
        self._force_next = False
        self._effective_every = sample_every
        self._buffer = StepBuffer()
        self._depth = 0
        self._forwards = 0  # outermost forwards seen: new gradients may follow each
        self._step_forwards = 0  # ``_forwards`` when the current step began
        self._train_forwards = 0  # training forwards since the last step ended
        #: Training forwards with no step of the attached optimizer after which the monitor
        #: warns once (an optimizer replaced without :meth:`bind_optimizer`); the Hugging
        #: Face callback raises it past a long gradient accumulation
        self.stall_forwards = STALL_FORWARDS
        #: Where set (a number), a training forward called with ``num_items_in_batch``
        #: returns its share of the step's loss (summed over the step's forwards, times
        #: this number), not a mean: the Hugging Face callback sets it (``hooks/hf.py``)
        self.loss_items_scale: float | None = None
        self._items_loss = False  # the current forward was given ``num_items_in_batch``
        self._lr_logged: int | None = None  # the step whose lr= log() kept (unsampled)
        self._mode: SdpaCapture | None = None
        self._forward_state: Any = None  # restored if the measured forward raises
        self._forward_exc: int | None = None
        self._calls = 0
        self._clip_seen = False
        self._clip_hits: torch.Tensor | None = None
        self._clip_steps = 0
        self._clipped_window: deque[float] = deque(maxlen=CLIP_WINDOW)
        self._history = StepHistory()
        self._hflush = HistoryFlush(history_every, cuda=any(
            p.device.type == "cuda" for p in model.parameters()))
        self._lr_watch = LrWatch()
        self._lr_watch.high_step = start_step  # steps counted from the first one
        self._spike_watch = StepWatch()
        self._send_key: Any = None
        self._send_history = True
        self._frames = 0
        self.capturing = False  # read by the eager wrapper
        self.max_only = False  # capturing the per-head max logit only (``request_max``)
        self.maxima: dict[int, torch.Tensor] = {}  # per layer, this step's max-only capture
        self._max_next = self._max_step = False
        self._max_below: float | None = None
        self.eager_depth = 0  # > 0 while inside a wrapped eager attention call
        self.disabled: set[str] = set()
        self._closed = False
        self._warned_step = False
        self._param_ids = {id(p) for p in model.parameters()}
        self._padding = PaddingMask(model)
        if lm_head is None or lm_head is True:
            head = find_output_head(model)
        else:
            head = lm_head or None
        self.lm_head: torch.nn.Module | None = head
        vocab = vocab_size(head, model)
        self._ln_vocab = math.log(vocab) if vocab else None
        try:
            self._shard = find_sharding(model)
        except Exception:  # sharding internals we cannot read: no part may enter a collective
            self._shard = None
            self.disabled.add("qk")
            self._fail("grad")
        self._qk_find = QKDiscovery(
            model, self._shard.shape_of if self._shard is not None else no_shape, qk_layout,
            allow_pending=self._shard is None, capturing=lambda: self.capturing)
        self._qk = self._qk_find.sources
        self._grad_local: tuple[torch.Tensor, torch.Tensor] | None = None
        self._warned: set[str] = set()
        self._vec: torch.Tensor | None = None
        if self._shard is not None:
            self._plan_exchange(self._shard)
        try:
            device = self._shard.device if self._shard is not None else next(
                (p.device for p in model.parameters()), torch.device("cpu"))
            tp = find_tp(model, tp_group, tp_rank) if reduce_ranks is not False else None
            self._ranks = find_reduce(reduce_ranks, device, self._shard, tp)
        except Exception:  # every rank sends its own frames
            log.warning("logitwatch: ranks not reduced: the group could not be read",
                        exc_info=True)
        self._handles = [
            model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
            # prepend: post-hooks unwind in the reverse order of the pre-hooks, so that with
            # two monitors on one model each finds its own mode on top when it pops it
            model.register_forward_hook(self._post_forward, always_call=True, prepend=True),
        ]
        if head is not None:
            self._handles.append(head.register_forward_hook(self._head_forward))
        self._opt_handles: list[Any] = []
        self._hook_optimizer(optimizer)
        self._eager_token = _eager.install(model, self)
        _clip.add_listener(self._on_clip)
        #: Attention rewritten by the QK-norm / soft-cap fuses (``fuses/_rewrite.py``).
        self.attn_rewrite: Any = None
        #: The fuses (``attach(fuses=...)``, docs/FUSES.md); empty and free by default.
        self.fuses = FuseSet(fuse_list, self)

    def _hook_optimizer(self, optimizer: Any) -> None:
        """Make ``optimizer``'s ``step()`` end the monitor's steps (its hooks replace the
        previous optimizer's)."""
        for handle in self._opt_handles:
            handle.remove()
            if handle in self._handles:
                self._handles.remove(handle)
        self._opt_handles = []
        self.optimizer = optimizer
        inner = optimizer
        while inner is not None and isinstance(getattr(inner, "optimizer", None),
                                               torch.optim.Optimizer):
            inner = inner.optimizer  # accelerate's AcceleratedOptimizer and the like
        self._step_optimizer = inner
        #: ``optim.adaptive`` (1 Adam-like, 0 SGD, None unknown), a host float every frame
        self._optim_adaptive = adaptive(inner)
        if inner is not None:
            self._opt_handles = [inner.register_step_pre_hook(self._pre_optimizer_step),
                                 inner.register_step_post_hook(self._post_optimizer_step)]
            self._handles.extend(self._opt_handles)

    # -- public --------------------------------------------------------------------------

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer``'s ``step()`` end the monitor's steps from now on, in place of
        the optimizer given to :func:`attach` (or bound before): a job that replaces its
        optimizer mid-run (a new phase, a new optimizer class) calls this with the new one,
        between steps; otherwise the monitor never sees a step end again (it warns once
        after many training forwards with no step of its optimizer). The learning rate,
        ``optim.adaptive`` and the fuses follow the new optimizer; step numbering goes on."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("bind_optimizer: optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if self._closed:
            return
        self._hook_optimizer(optimizer)
        self._train_forwards = 0
        self._warned.discard("stalled")
        if self.fuses and self._step_optimizer is not None:
            self.fuses.bind_optimizer(self._step_optimizer)


    def log(self, **scalars: torch.Tensor | float) -> None:
        """Add scalars to the current step's frame (call before ``optimizer.step()``).

        ``loss=`` replaces the automatically captured loss. Tensors stay on the device
        until the step's single transfer. On non-sampled steps only ``loss=`` and ``lr=``
        are kept (on the device, for the next frame's history; ``lr=`` in place of the
        attached optimizer's, a job whose monitor has none: the Lightning callback); the
        rest is ignored. A value that is not one real number (None, a string, a tensor of
        several elements) is skipped, with one warning per name.
        """
        if self._closed:
            return
        if not self.sampled:
            if ("loss" in scalars or "lr" in scalars) and self._keeps_history():
                try:
                    for name in ("loss", "lr"):
                        if name not in scalars:
                            continue
                        value = logged_value(scalars[name])
                        if value is None:  # None before a first value, a string: skipped,
                            warn_skipped(name, scalars[name])  # as on a sampled step
                        elif name == "loss":
                            self._history.log_loss(value)
                        else:
                            self._history.put(LR, value)
                            self._lr_logged = self._step  # _end_history keeps it
                except Exception:
                    self._fail("history")
            return
        try:
            for name, value in scalars.items():
                self._buffer.log(name, value)
        except Exception:
            self._fail("step")

    def record(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
        softcap: float | None = None,
        layer: int | None = None,
        query_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Measure one attention call while capturing (see ``record_attention``); returns
        the ``(q, k)`` a QK-norm fuse asks the caller to use, or None."""
        if not self.capturing:
            return None
        got = None
        if self._rewriting():
            got = self.attn_rewrite.custom(self._calls if layer is None else layer, query,
                                           key, scale)
            if got is not None:
                query, key = got
        if "attention" not in self.disabled:
            self._record(layer, query, key, attn_mask, is_causal, scale, softcap, query_mask,
                         key_mask)
        return got

    def begin_capture(self) -> None:
        """Start measuring a training forward by hand (framework integrations whose
        training step does not go through ``model.forward``). Nested model forwards are
        then part of it. Pair with :meth:`end_capture`."""
        self._pre_forward(self.model, (), {})

    def end_capture(self, loss: torch.Tensor | None = None) -> None:
        """End what :meth:`begin_capture` started; ``loss`` is added like an HF loss."""
        self._post_forward(self.model, (), {"loss": loss} if loss is not None else None)

    def step(self, *, skipped: bool = False) -> None:
        """End the current step, for monitors attached without an optimizer.

        With an optimizer its ``step()`` ends steps, and this is ignored unless
        ``skipped=True``: the step's ``optimizer.step()`` did not run, as when a loss scaler
        (``torch.amp.GradScaler``) skips a step on non-finite gradients. Such a step would
        otherwise be pooled into the next one and the monitor's step index fall behind the
        job's. The Hugging Face callback does this by itself; in a plain loop::

            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() < scale:  # the step was skipped
                mon.step(skipped=True)
        """
        if self._closed:
            return
        if self.optimizer is not None:
            if skipped and self._step_optimizer is not None:
                # what the optimizer's step hooks would have done (their own guards)
                self._pre_optimizer_step(self._step_optimizer, (), {})
                self._end_step()
                return
            if not self._warned_step:
                self._warned_step = True
                log.warning("logitwatch: Monitor.step() ignored: the optimizer ends steps "
                            "(step(skipped=True) ends a step whose optimizer.step() did not run)")
            return
        self._combine_pending_clips()  # several clip calls this step: combined once, here
        if self._scheduled and "grad" not in self.disabled and not self._clip_seen:
            t0 = thread_clock()
            try:
                self._measure_grad(self.model.parameters())
            except Exception:
                self._fail("grad")
            self._cost.add_host(thread_clock() - t0)
        self._end_step()

    def close(self, timeout: float = 10.0, *, finished: bool = True) -> None:
        """Remove every hook and patch, then shut down (or flush, if injected) the client.

        Shutting down its own client says that the job ended (the run becomes
        ``finished``); ``finished=False`` (and leaving a ``with`` block on an exception)
        does not, so the collector reports the run ``stopped`` once no data comes.
        Idempotent and bounded by ``timeout`` seconds. A client passed to ``attach`` is
        flushed but left running: its owner shuts it down (and so says the job ended).
        """
        if self._closed:
            return
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stop_capture()
        _logits.release_workspace()  # this thread's CPU scratch buffers (a few MiB)
        _eager.uninstall(self._eager_token)
        _clip.remove_listener(self._on_clip)
        self._qk_find.close()
        self.fuses.close()
        if self._step > self._start_step:  # a step ran: nothing to close before the first
            self._flush_history()
        self._hflush.release()
        if self._owns_client:
            if finished and self._step > self._start_step:
                self.client.finish(step=self._step - 1)  # the last step, sampled or not
            self.client.shutdown(timeout, finished=finished)
        else:
            self.client.flush(timeout)

    detach = close

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(finished=exc_type is None)
