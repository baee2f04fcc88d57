"""What the :class:`~logitwatch.hooks._monitor.Monitor` does around the optimizer step:
the clip's norm and flag (every step, on the device), the gradient norm on sampled steps, and,
once a step has ended, whether to sample the next one (the LR and spike watches, the cost
budget, the ranks' agreement)."""

from __future__ import annotations

from typing import Any

import torch

from ._cost import thread_clock
from ._stats import global_grad_norm


class OptimizerStepMixin:
    """The optimizer-step half of :class:`~logitwatch.hooks._monitor.Monitor` (its state
    lives there)."""

    def _on_clip(self, total: torch.Tensor, params: list[torch.Tensor], max_norm: Any) -> None:
        try:
            if "grad" in self.disabled or not params or id(params[0]) not in self._param_ids:
                return
            hit = None
            if isinstance(max_norm, (int, float, torch.Tensor)) and not self._clip_seen:
                # every step, sampled or not: one on-device comparison, never read here
                hit = (total.detach() > max_norm).to(torch.int32)
                self._clip_hits = hit if self._clip_hits is None else self._clip_hits + hit
                self._clip_steps += 1
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
        except Exception:
            self._fail("grad")

    def _pre_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if not self._scheduled or "grad" in self.disabled or self._clip_seen:
                return
            t0 = thread_clock()
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._measure_grad(params)
            self._cost.add_host(thread_clock() - t0)
        except Exception:
            self._fail("grad")

    def _measure_grad(self, params: Any) -> None:
        """The gradient norm (unsharded), or this rank's local squared sums (sharded: the
        end-of-step exchange reduces them; no collective here)."""
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

    def _watch_lr(self, step: int) -> None:
        """Sample the next step when the learning rate jumps or climbs far past where it
        settled (:mod:`~logitwatch.hooks._lrwatch`; a host number: no sync; an lr living on
        an accelerator is not read). Every rank runs the same schedule, so ranks request
        the same steps."""
        try:
            lr = self._lr()
            if isinstance(lr, (int, float)) and self._lr_watch.step(step, lr):
                self._force_next = True
        except Exception:
            self._fail("step")

    def _watch_spikes(self) -> None:
        """Sample the next step when a finished step's loss or gradient norm spiked or went
        non-finite (:mod:`~logitwatch.hooks._stepwatch`), read where that costs no sync
        (:meth:`StepHistory.peek`). Not on a job whose ranks sample together (sharded, or
        reducing before they send): each rank would see its own loss, or the same norm at
        a different step, and the ranks must sample alike."""
        if self._shard is not None or self._ranks is not None:
            return
        try:
            got = self._history.peek()
            if got is not None and self.fuses:
                self.fuses.observe(got[0], got[1])  # the rollback's non-finite loss
            if got is not None and self._spike_watch.step(*got):
                self._force_next = True
        except Exception:
            self._fail("history")

    def _reschedule(self, agree: bool = False) -> None:
        try:
            proposal = self._cost.interval(self.sample_every)
        except Exception:
            proposal = self._effective_every
            self._fail("step")
        ranks = self._ranks
        if self._shard is None and ranks is None:
            self._effective_every = proposal
        elif agree:  # the end of a sampled step, on every rank alike
            try:
                if ranks is not None:  # requests to sample are agreed too (``_reduce``)
                    self._effective_every, self._force_next = ranks.agree(
                        proposal, self._force_next, self.client.control)
                else:
                    self._effective_every = self._shard.agree_interval(proposal)
            except Exception:
                self._force_next = self._force_next and ranks is None
                self._warn_once("interval", "the ranks' interval agreement failed")
        if ranks is not None and not agree:
            force = False  # waits for the next agreement: every rank samples alike
        else:
            force, self._force_next = self._force_next, False
        if self._sample_at:
            force = force or self._step in self._sample_at
            self._sample_at = {s for s in self._sample_at if s > self._step}
        self._sampled = (
            force
            or self._last_sampled is None
            or self._step >= self._last_sampled + self._effective_every
        )
