"""LR backoff: on a trigger, the optimizer's learning rate is multiplied by ``factor`` and
brought back to the schedule's value over ``steps`` steps (cosine or linear).

The multiplier is applied around each ``optimizer.step()`` only: a step pre-hook sets
``lr = scheduled * m`` in every param group and the post-hook puts the scheduled value
back, so a scheduler (or a loop assigning ``group["lr"]``) never sees the multiplier and
nothing compounds; undo is immediate. ``m`` goes from ``factor`` at the trigger to 1 after
``steps`` optimizer steps: ``factor + (1 - factor) * r(k / steps)`` with ``r(x) = x``
(linear) or ``(1 - cos(pi x)) / 2`` (cosine). A new trigger while backing off starts the
window again (from ``factor``, never below it). An alert whose step (its ``fired_step``,
``paged_step``, escalation step) is at or before the step of the last backoff's start is
about what that backoff already answers (a rollback's, say): it does not start it again.

Triggers: QK-clip acting (or, in suggest mode, its suggestion), a collector alert on the
learning rate, the gradient norm or the loss (``rules``), and people (``apply``). Host
floats only: no tensor is read. The monitor's ``lr`` (frames and the history) is the
effective, backed-off value; ``fuse.lr_backoff.multiplier`` says by how much.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

import torch

from logitwatch.wire import FUSE_RULES

from ._base import Fuse, alert_step, multi_rank

__all__ = ["LRBackoff"]

#: Alert rules that trigger (auto) or suggest a backoff.
DEFAULT_RULES = FUSE_RULES["lr_backoff"]
SHAPES = ("cosine", "linear")


class LRBackoff(Fuse):
    """Scale the optimizer's lr by ``factor`` on a trigger, restore it over ``steps``.

    Args:
        factor: The multiplier right after a trigger, in (0, 1) (default 0.5).
        steps: Optimizer steps to come back to the schedule (default 200).
        shape: ``"cosine"`` (default) or ``"linear"``.
        mode: ``"off"``, ``"suggest"`` (default) or ``"auto"``.
        rules: Alert rules (warning or critical) that trigger it; ``()``: none.
        on_qk_clip: Whether QK-clip acting triggers it (default True).
    """

    name = "lr_backoff"

    def __init__(self, factor: float = 0.5, steps: int = 200, *, shape: str = "cosine",
                 mode: str = "suggest", rules: Collection[str] = DEFAULT_RULES,
                 on_qk_clip: bool = True) -> None:
        super().__init__(mode)
        if not (isinstance(factor, (int, float)) and 0 < factor < 1):
            raise ValueError(f"LRBackoff: factor must be in (0, 1), got {factor!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"LRBackoff: steps must be an int >= 1, got {steps!r}")
        if shape not in SHAPES:
            raise ValueError(f"LRBackoff: shape must be one of {SHAPES}, got {shape!r}")
        self.factor = float(factor)
        self.steps = steps
        self.shape = shape
        self.rules = frozenset(rules)
        self.on_qk_clip = on_qk_clip
        self.optimizer: torch.optim.Optimizer | None = None
        self.multiplier = 1.0
        self._k: int | None = None  # optimizer steps since the trigger; None: not backing off
        self._saved: list[tuple[dict[str, Any], float]] | None = None
        self._handles: list[Any] = []
        # alerts (sender thread): (reason, the step the alert speaks of)
        self._requests: deque[tuple[str, int | None]] = deque(maxlen=16)
        self._last_suggest: int | None = None
        self._last_start = -(10**9)
        self._started_at: int | None = None  # the step the last backoff started for
        self._applied = False  # the pre-hook scaled this step's lr
        self._step = 0

    def describe(self) -> str:
        return (f"LR backoff: lr x{self.factor:g}, back to the schedule over {self.steps} "
                f"steps ({self.shape})")

    def matches(self, alert: Mapping[str, Any]) -> bool:
        return str(alert.get("rule", "")) in self.rules

    def at(self, k: int) -> float:
        """The multiplier ``k`` optimizer steps after a trigger."""
        if k >= self.steps:
            return 1.0
        x = k / self.steps
        r = x if self.shape == "linear" else (1 - math.cos(math.pi * x)) / 2
        return self.factor + (1 - self.factor) * r

    # -- binding ---------------------------------------------------------------------------

    def bind(self, fuses: Any) -> None:
        super().bind(fuses)
        if multi_rank():
            self.cannot(0, "several ranks: triggers reach the ranks at different steps and "
                        "their learning rates would differ")
            return
        if fuses.optimizer is not None:
            self.bind_optimizer(fuses.optimizer)

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if self.optimizer is optimizer:
            return
        self.close()
        self.optimizer = optimizer
        self._handles = [optimizer.register_step_pre_hook(self._pre),
                         optimizer.register_step_post_hook(self._post)]

    def close(self) -> None:
        self._restore()
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- triggers --------------------------------------------------------------------------

    def on_alert(self, alert: Mapping[str, Any]) -> None:
        if str(alert.get("severity", "")) in ("warning", "critical"):
            self._requests.append((f"alert {alert.get('rule')}", alert_step(alert)))

    def trigger(self, step: int, reason: str) -> None:
        """Back off now (acting), or suggest it (at most once per 100 steps)."""
        if reason == "qk_clip" and not self.on_qk_clip:
            return
        if self.engaged:
            self._start(step, reason)
        elif self._last_suggest is None or step - self._last_suggest >= 100:
            self._last_suggest = step
            self.record(step, "suggest", reason=reason, does=self.describe())

    def apply(self, step: int, by: str) -> None:
        """A person applies it: back off now (one window)."""
        self._start(step, f"applied by {by}")

    def undo(self, step: int, by: str) -> None:
        """Back to the scheduled lr at once."""
        self._restore()
        self._k = None
        self.multiplier = 1.0
        super().undo(step, by)

    def _start(self, step: int, reason: str) -> None:
        if self.optimizer is None:
            self.cannot(step, "no optimizer (attach(model, optimizer), or the Lightning "
                        "callback, gives it one)")
            return
        restart = self._k is not None
        self._started_at = step
        self._k = 0  # the next optimizer step runs at ``factor``
        if not restart or self._step - self._last_start >= 10:
            self.record(step, "backoff", factor=self.factor, steps=self.steps,
                        shape=self.shape, reason=reason, restart=restart)
        self._last_start = self._step

    # -- around the optimizer's step -------------------------------------------------------

    def step_end(self, step: int, sampled: bool) -> None:
        self._step = step + 1
        while self._requests:
            reason, about = self._requests.popleft()
            if about is not None and self._started_at is not None \
                    and about <= self._started_at:
                continue  # the backoff started at that step (or after) answers it
            self.trigger(step, reason)

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._restore()  # a step that raised last time never reached the post-hook
            self._applied = False
            if self._k is None or not self.live:
                return
            m = self.at(self._k)
            self.multiplier = m
            saved = []
            for group in optimizer.param_groups:
                lr = group.get("lr")
                if isinstance(lr, torch.Tensor) or not isinstance(lr, (int, float)):
                    self.cannot(self._step, "the lr is a tensor (capturable optimizer)")
                    self._saved = saved or None
                    self._restore()
                    return
                saved.append((group, float(lr)))
            self._saved = saved
            for group, lr in saved:
                group["lr"] = lr * m
            self._applied = True
        except Exception:
            self._fail_hook()

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._restore()
            if self._k is None or not self._applied:
                return
            self._applied = False
            self._k += 1
            if self._k >= self.steps:
                self._k = None
                self.multiplier = 1.0
                self.record(self._step, "restored", steps=self.steps)
        except Exception:
            self._fail_hook()

    def _restore(self) -> None:
        saved, self._saved = self._saved, None
        for group, lr in saved or ():
            group["lr"] = lr

    def _fail_hook(self) -> None:
        """An optimizer hook failed: the lr is the schedule's again, the fuse is off."""
        try:
            self._restore()
        finally:
            self._k = None
            self.multiplier = 1.0
            self.fail(self._step, "; the lr is the schedule's")

    def after_frame(self, step: int, scalars: dict[str, float],
                    heads: dict[str, list[list[float]]]) -> None:
        scalars["fuse.lr_backoff.multiplier"] = self.multiplier
