"""What the :class:`~logitwatch.hooks._monitor.Monitor` does around the optimizer step:
the clip's norm and flag (every step, on the device), the gradient norm on sampled steps, and,
once a step has ended, whether to sample the next one (the LR and spike watches, the cost
budget, the ranks' agreement)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ._cost import thread_clock
from ._shard import is_dtensor
from ._stats import global_grad_norm

#: ``_StepClips.max_norm`` when a step's clip calls gave different ``max_norm`` values.
_MIXED = object()
#: ``_StepClips.next``: the next call's own returned norm counts (its parameters are new).
_OWN = object()


class _StepClips:
    """One step's ``clip_grad_norm_`` calls, kept from the first so that a second one (a
    job clipping parameter groups apart) combines with it rather than replacing it.

    ``grad.norm`` is the norm of the union of the calls' parameters, each counted once by
    its gradient **before** its first clip: a call whose parameters are all new counts by
    the norm it returned; one whose parameters were all counted before adds nothing (it
    sees gradients an earlier call clipped); one in between (or with another
    ``norm_type``) counts by the norm of its new parameters' gradients, taken on the
    device just before it clips. The per-call norms combine as the calls' ``norm_type``
    does (sum of squares for 2). ``grad.clipped`` is 1 when **any** call clipped (its norm
    over its ``max_norm``): no single threshold applies to the combined norm, which two
    groups each under their ``max_norm`` can take past either; ``grad.max_norm`` is the
    calls' common ``max_norm`` (an infinite one, a call that only reads the norm, does not
    count), left out when they differ. All on the device, no sync; the
    first call costs what it did before (the parameter ids are read only at a second)."""

    __slots__ = ("step", "forwards", "params", "seen", "norm_type", "norms", "hits",
                 "max_norm", "added", "next", "dirty", "totals")

    def __init__(self, step: int, forwards: int, params: list[torch.Tensor], norm_type: Any,
                 total: torch.Tensor, hit: torch.Tensor | None, max_norm: Any) -> None:
        self.step = step
        self.forwards = forwards  # the monitor's forward count at the first call
        self.params: list[torch.Tensor] | None = params  # the first call's
        self.seen: set[int] | None = None  # ids of the parameters counted (from a second)
        self.norm_type = norm_type
        self.norms = [total.detach()]  # the counted norms, each over parameters not counted before
        self.hits = [] if hit is None else [hit]  # per call: norm > max_norm (int32)
        self.max_norm = max_norm
        self.added = hit  # the step's flag as added to the clip-rate count
        self.next: Any = _OWN  # the coming call's share, decided just before it clips
        self.dirty = False  # calls not combined yet
        #: the norm tensors the calls reported: ``clip_grads_with_norm_`` calls handed one
        #: shared ``total_norm`` (accelerate clips each device mesh's parameters apart
        #: with the global norm) count it once
        self.totals = [total]


def _same(a: Any, b: Any) -> bool:
    """Whether two ``max_norm`` arguments are the same threshold."""
    if a is b:
        return True
    num = (int, float)
    return (isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool)
            and not isinstance(b, bool) and a == b)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two norms are one tensor (or views of one: a replicated DTensor's local
    value). Both are kept alive, so their memory cannot have been reused; no sync."""
    return a is b or (a.device == b.device and a.shape == b.shape and a.dtype == b.dtype
                      and a.data_ptr() == b.data_ptr())


def _unbounded(max_norm: Any) -> bool:
    """Whether ``max_norm`` clips nothing (``inf``: a job reading the norm only)."""
    return isinstance(max_norm, float) and max_norm == math.inf


class OptimizerStepMixin:
    """The optimizer-step half of :class:`~logitwatch.hooks._monitor.Monitor` (its state
    lives there)."""

    _clips: _StepClips | None = None  # the current step's clip calls
    _pre_step_at = -1  # the step whose optimizer pre-step hook ran last

    def _on_clip(self, total: torch.Tensor | None, params: list[torch.Tensor], max_norm: Any,
                 norm_type: Any = 2.0) -> None:
        try:
            if "grad" in self.disabled or not params or id(params[0]) not in self._param_ids:
                return
            rec = self._clips
            if rec is not None and rec.step != self._step:
                rec = self._clips = None  # an earlier step's
            elif rec is not None and rec.forwards != self._forwards:
                # a forward since the step's first call: these are new gradients (a clip
                # after each micro-batch, an iteration a loss scaler skipped, a clip before
                # the first step), so the step starts over from this call, as it did before
                # calls were combined; the earlier call's flag leaves the clip rate
                self._restart_clips(rec)
                rec = None
            if total is None:  # just before a call clips: only a second call needs this
                if rec is not None:
                    self._before_next_clip(rec, params, norm_type)
                return
            if rec is not None:
                self._next_clip(rec, total, max_norm)
                return
            hit = None
            if isinstance(max_norm, (int, float, torch.Tensor)):
                # every step, sampled or not: one on-device comparison, never read here
                hit = (total.detach() > max_norm).to(torch.int32)
                self._clip_hits = hit if self._clip_hits is None else self._clip_hits + hit
                self._clip_steps += 1
            self._clips = _StepClips(self._step, self._forwards, params,
                                     norm_type, total, hit, max_norm)
            if not self._scheduled:
                if self._keeps_history():
                    try:  # the norm and flag of this step, for the next frame's history
                        self._history.put_norm(total, max_norm, hit)
                    except Exception:
                        self._fail("history")
                return
            self._clip_seen = True
            self._buffer.grad_norm = total.detach().float()
            self._buffer.max_norm = max_norm
            self._buffer.norm_after_clip = False
        except Exception:
            self._fail("grad")

    def _restart_clips(self, rec: _StepClips) -> None:
        """Forget this step's clip calls so far (their norm and their clip-rate count)."""
        if rec.added is not None and self._clip_hits is not None:
            self._clip_hits = self._clip_hits - rec.added.to(self._clip_hits.device)
            self._clip_steps -= 1
        self._clips = None

    def _before_next_clip(self, rec: _StepClips, params: list[torch.Tensor],
                          norm_type: Any) -> None:
        """Decide, before a step's second (or later) clip call changes its gradients,
        what it adds to the step's norm (see :class:`_StepClips`)."""
        if rec.seen is None:
            rec.seen = {id(p) for p in rec.params or ()}
            rec.params = None
        ids = {id(p) for p in params}
        new = ids - rec.seen
        if not new:
            rec.next = None  # all counted before, by their norm before the first clip
        elif len(new) == len(ids) and norm_type == rec.norm_type:
            rec.next = _OWN  # a group of its own: the norm it returns
        elif self._shard is not None or self._ranks is not None or any(
                is_dtensor(p.grad) for p in params if id(p) in new):
            # the norm of the new parameters would be a collective (DTensor), entered only by
            # the ranks whose monitor got here (a rank-local failure must never make a rank
            # skip or add one): not counted, an underestimate of a rare case
            rec.next = None
        else:  # partly counted, or another norm type: its new parameters, before clipping
            # (FSDP1's flat shards would give this rank's share: no job clips them in parts)
            fresh = list({id(p): p for p in params if id(p) in new}.values())
            rec.next = global_grad_norm(fresh, rec.norm_type)
        rec.seen |= new

    def _next_clip(self, rec: _StepClips, total: torch.Tensor, max_norm: Any) -> None:
        """A step's second (or later) clip call has returned ``total``."""
        share, rec.next = rec.next, _OWN
        if any(_same_tensor(total, t) for t in rec.totals):
            share = None  # a norm already counted, handed to another call (never read)
        else:
            rec.totals.append(total)
        if share is _OWN:
            rec.norms.append(total.detach())
        elif share is not None:
            rec.norms.append(share)
        if isinstance(max_norm, (int, float, torch.Tensor)):
            rec.hits.append((total.detach() > max_norm).to(torch.int32))
        if rec.max_norm is not _MIXED and not _unbounded(max_norm):
            if _unbounded(rec.max_norm):  # ``clip_grad_norm_(params, inf)``: a norm read
                rec.max_norm = max_norm
            elif not _same(rec.max_norm, max_norm):
                rec.max_norm = _MIXED
        rec.dirty = True
        # combined once per step (a job clipping each parameter apart makes many calls:
        # combining at each call cost the square of their number): at the optimizer's
        # pre-step hook, or without an optimizer in Monitor.step(); at once only for a call
        # after the pre-step hook
        if self._step_optimizer is not None and self._pre_step_at == self._step:
            self._combine_clips(rec)

    def _combine_clips(self, rec: _StepClips) -> None:
        """The step's norm, clip flag and threshold from all its clip calls, where one call
        alone put them (the history's row on an unsampled step, else the frame's buffer)."""
        rec.dirty = False
        device = rec.norms[0].device
        if len(rec.norms) == 1:
            norm = rec.norms[0].float()  # later calls added nothing: the first call's value
        else:
            norm = torch.linalg.vector_norm(
                torch.stack([n.float().reshape(()).to(device) for n in rec.norms]),
                rec.norm_type)
        hit = None
        if rec.hits:
            hit = rec.hits[0] if len(rec.hits) == 1 else torch.stack(
                [h.reshape(()).to(device) for h in rec.hits]).amax()
            if rec.added is None or self._clip_hits is None:
                self._clip_hits = hit if self._clip_hits is None else self._clip_hits + hit
                self._clip_steps += 1
            elif hit is not rec.added:  # the step counts once: as clipped if any call was
                self._clip_hits = self._clip_hits + (hit - rec.added.to(hit.device))
            rec.added = hit
        max_norm = None if rec.max_norm is _MIXED else rec.max_norm
        if not self._scheduled:
            if self._keeps_history():
                try:  # the flag as on a sampled step: any call clipped (written on the device)
                    self._history.put_norm(norm, None, hit)
                except Exception:
                    self._fail("history")
            return
        self._clip_seen = True
        self._buffer.grad_norm = norm
        self._buffer.max_norm = max_norm
        self._buffer.norm_after_clip = False
        self._buffer.clipped = hit

    def _combine_pending_clips(self) -> None:
        """Combine this step's clip calls not combined yet (at the optimizer's pre-step hook,
        or in ``Monitor.step()`` without one); a failure disables the gradient statistics."""
        rec = self._clips
        if rec is not None and rec.dirty and rec.step == self._step:
            try:
                self._combine_clips(rec)
            except Exception:
                self._fail("grad")

    def _pre_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._pre_step_at = self._step
        self._combine_pending_clips()
        try:
            if not self._scheduled or "grad" in self.disabled or self._clip_seen:
                return
            t0 = thread_clock()
            # the attached optimizer's parameters: not every model parameter with a
            # gradient (a fine-tune optimizing the head only, its backbone not frozen,
            # never zeroes the backbone's gradients: they add up, step after step)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._measure_grad(params)
            self._cost.add_host(thread_clock() - t0)
        except Exception:
            self._fail("grad")

    def _measure_grad(self, params: Any) -> None:
        """The gradient norm (unsharded), or this rank's local squared sums (sharded: the
        end-of-step exchange reduces them; no collective here). Measured where no clip call
        was seen: after any clip the monitor could not see, so the frame's clip flag counts
        a norm at the threshold as clipped (:meth:`StepBuffer.scalars`)."""
        self._buffer.norm_after_clip = True
        if self._shard is not None:
            self._grad_local = self._shard.local_grad_sums(params)
        else:
            self._buffer.grad_norm = global_grad_norm(params)

    # -- the next step ---------------------------------------------------------------------

    def _lr(self) -> Any:
        """The optimizer's learning rate: a float (a CPU tensor read as one: no sync), a
        tensor on an accelerator as it is, or None (no optimizer, not a number)."""
        if self.optimizer is None or not self.optimizer.param_groups:
            return None
        lr = self.optimizer.param_groups[0].get("lr")
        if isinstance(lr, torch.Tensor) and lr.device.type == "cpu":
            return float(lr)
        if isinstance(lr, (int, float, torch.Tensor)) and not isinstance(lr, bool):
            return lr
        return None

    def _watch_lr(self, step: int) -> bool:
        """Sample the next step when the learning rate jumps or climbs far past where it
        settled (:mod:`~logitwatch.hooks._lrwatch`; a host number: no sync; an lr living on
        an accelerator is not read). Every rank runs the same schedule, so ranks request
        the same steps. True when ``step`` (just ended) triggered it."""
        try:
            lr = self._lr()
            if isinstance(lr, (int, float)) and self._lr_watch.step(step, lr):
                self._force_next = True
                return True
        except Exception:
            self._fail("step")
        return False

    def _watch_spikes(self, step: int) -> bool:
        """Sample the next step when a finished step's loss or gradient norm spiked or went
        non-finite (:mod:`~logitwatch.hooks._stepwatch`), read where that costs no sync
        (:meth:`StepHistory.peek`). Not on a job whose ranks sample together (sharded, or
        reducing before they send): each rank would see its own loss, or the same norm at
        a different step, and the ranks must sample alike. True when ``step``, the step
        just ended (read at once: host memory; an accelerator's is read a step later), was
        anomalous, whether or not the watch's burst allows sampling the next one: its
        history is flushed at once either way."""
        if self._shard is not None or self._ranks is not None:
            return False
        try:
            got = self._history.peek()
            if got is not None and self.fuses:
                self.fuses.observe(got[0], got[1])  # the rollback's non-finite loss
            if got is not None:
                if self._spike_watch.step(*got):
                    self._force_next = True
                return got[0] == step and self._spike_watch.flagged
        except Exception:
            self._fail("history")
        return False
