"""The end of a :class:`~logitwatch.hooks._monitor.Monitor`'s step: capture stopped, the
ranks' collectives entered in their fixed order, the frame handed to the client, the step
state reset, and the next step's schedule decided (see ``docs/HOOKS.md``)."""

from __future__ import annotations

import logging
from typing import Any

from ._buffer import StepBuffer
from ._reduce import Reduced

__all__ = ["StepEndMixin"]

log = logging.getLogger("logitwatch.hooks")


class StepEndMixin:
    """The end of each step for :class:`~logitwatch.hooks._monitor.Monitor` (its state
    lives there)."""

    def _post_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._end_step()

    def _end_step(self) -> None:
        step, sampled, scheduled = self._step, self.sampled, self._scheduled
        vec = None
        self._end_history(step)
        if not scheduled:
            self._flush_between()
        try:
            if scheduled or self.max_only:
                self._stop_capture()
            if scheduled:
                self._last_sampled = step
                if self._forwards == self._step_forwards:
                    self._no_forward_seen()
            # a forward that never reached its post-hook (torch runs always_call hooks for
            # Exception only: a KeyboardInterrupt in a notebook) would leave the depth above
            # 0 and every later forward would look nested, never measured. Steps end outside
            # forwards, so the depth starts from 0 again here (any capture stopped above)
            if self._depth:
                self._stop_capture()
                self._depth = 0
                self._forward_state = None
        except Exception:
            self._fail("step")
        if scheduled and self._qk_find.pending:
            try:
                if self._qk_find.step_end():
                    self._qk = self._qk_find.sources
            except Exception:
                self._fail("qk")
        if self.fuses:  # after the update, before the frame (never raises)
            self.fuses.step_end(step, sampled)
        try:
            # the collectives, each entered by every rank whatever failed here: a failure
            # before one of them must never make this rank skip it (gloo would pair it with
            # the job's next collective, or the other ranks would wait until the timeout)
            if scheduled and self._shard is not None:
                try:
                    vec = self._exchange()
                except Exception:
                    vec = None
                    self._warn_once("exchange", "the end-of-step exchange failed")
            if scheduled and self._ranks is not None:  # every rank, whatever failed here
                self._reduced = self._reduce_step()
            if sampled and "step" not in self.disabled:
                self._emit(step, vec)
        except Exception:
            self._fail("step")
        finally:
            if scheduled:
                self._buffer = StepBuffer()
            self._clip_seen = False
            self._grad_local = None
            self.maxima = {}
            self._step = step + 1
            self._step_forwards = self._forwards
            self._train_forwards = 0
        try:
            self._cost.step_end(scheduled)
        except Exception:
            self._fail("step")
        watched = self._watch_lr(step)
        watched = self._watch_spikes(step) or watched
        if watched and not scheduled:  # a step a watch flagged: its history goes now
            self._flush_between(now=True)
        self._reschedule(agree=scheduled)
        self._max_step, self._max_next = self._max_next and not self._sampled, False

    def _reduce_step(self) -> Reduced | None:
        """The end-of-step reduction (``_reduce``), entered by every rank: this rank's
        scalars are read in their own ``try`` (a rank-local failure there, an OOM in a final
        statistic, gathers nothing from this rank) so that ``reduce()`` is always entered."""
        ranks = self._ranks
        if ranks is None:
            return None
        try:
            attn = self._buffer.attn
        except Exception:
            attn = {}
            self._warn_once("reduce-local", "this rank's attention statistics could not be "
                            "reduced")
        try:
            scalars = self._buffer.scalars()
        except Exception:
            scalars = {}
            self._warn_once("reduce-scalars", "this rank's scalars could not be gathered")
        try:
            return ranks.reduce(attn, scalars, self._warn_once)
        except Exception:  # reduce() enters its collectives whatever fails; never expected
            self._warn_once("reduce", "the end-of-step reduction across ranks failed")
            return None

    def _no_forward_seen(self) -> None:
        """A sampled step ended and no forward of the attached model was seen in it: say
        once why its frames carry no ``attn.*``, ``final.*`` or automatic ``loss``. Under
        ``torch.compile`` the forward hooks do nothing inside the compiled graph (and cannot
        warn there: a call would break the graph); otherwise the job trains another module
        than the one attached."""
        if "no-forward" in self._warned:
            return
        self._warned.add("no-forward")
        log.warning(
            "logitwatch: a step of %s ended and none of its forwards was measured: a "
            "torch.compile'd model (inside the compiled graph the monitor's hooks do nothing: "
            "attn.*, final.* and the automatic loss are not measured; grad.norm, clipping and "
            "lr are), or the job calls another module than the one attached. Attach to the "
            "module the job calls, and keep the measured blocks uncompiled (docs/HOOKS.md, "
            "torch.compile)", type(self.model).__name__)
