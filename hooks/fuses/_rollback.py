"""Rollback and skip: a bounded ring of snapshots of the job's state, and on a critical
warning the state of about ``back`` steps ago restored and the next ``skip`` batches skipped.

Every ``every`` steps (after steps 0, ``every``, ``2·every``, ... ) the fuse copies the
model's ``state_dict``, the optimizer's, the LR scheduler's (when it has one: ``scheduler=``,
or the HF/Lightning callbacks hand theirs) and the torch/CUDA/numpy/Python RNG states to
CPU memory (copies, ``hooks/fuses/_snapshots.py``), or to files under ``path``. At most
``keep`` snapshots are held, fewer if ``budget`` (bytes) says so; ``fuse.rollback.bytes``
reports what is held in memory. A copy is taken only of a state whose weights and
optimizer state are finite and whose losses since the previous snapshot were finite (checked
on the live tensors before an older copy is dropped to make room: a bad state never costs
the ring a good snapshot).

Triggers: a non-finite loss seen by the monitor (the loss of a step it samples, or the one
it keeps for the history of the others, read where that costs no device sync), a loss past
``loss_limit``, a critical collector alert in ``rules`` (``on_alert``), a person
(``apply``). In ``auto`` mode the trigger rolls back; in ``suggest`` mode the snapshots are
kept and the fuse says what it would do until a person applies it. An alert whose step (its
``fired_step``, ``paged_step``, escalation step) is at or before the step of the last
rollback is about what that rollback already handled: ignored.

A rollback, at the end of the step that triggered it (inside ``optimizer.step()``, after
the update): the newest snapshot at least ``back`` steps old (else the oldest) is restored
in place (parameters keep their identity), the newer snapshots are dropped, and the next
``skip`` batches are skipped: a loop that asks (``if mon.fuses.skip_batch(): continue``)
skips them before their forward; for a loop that does not (the HF ``Trainer``), the fuse
drops their update (gradients set to None before ``optimizer.step()``: parameters and
optimizer state untouched; the scheduler and the loop's counters still advance). The data
is not rewound: ``mon.fuses.rollback_pending()`` says once where the job went back to, for
a loop that wants to. The monitor's step index is not rewound either (the steps a run ran).

The RNG states are restored with the rest (``restore_rng=True``, the default). A loop that
draws its batches from the global RNG (nanoGPT's ``torch.randint`` ``get_batch``) then
draws, after the rollback, the very batches it drew after the snapshot, in the same order:
the bad batch comes again about ``from_step - to_step`` steps later, and ``skip_batch()``
(asked before drawing) skips iterations, not it. ``restore_rng=False`` leaves the RNG where
it is (fresh batches, fresh dropout masks; the run no longer replays the snapshot's draws).

A restore at a step's end makes that step's measurements stale (``FuseSet.stale``): QK-clip
and QK-norm's rescale skip them, whatever the fuses' order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

import torch

from logitwatch.wire import FUSE_RULES

from ._base import Fuse, alert_step, log, multi_rank
from ._snapshots import Ring, Snapshot, capture, restore, tensor_bytes

__all__ = ["Rollback"]

#: Alert rules that trigger a rollback (at severity critical) or carry its suggestion.
DEFAULT_RULES = FUSE_RULES["rollback"]


class Rollback(Fuse):
    """Restore the state of ~``back`` steps ago on a critical warning, skip ``skip`` batches.

    Args:
        every: Steps between snapshots (default 100).
        keep: Snapshots held at most (default 2).
        back: Steps back to go at least: the newest snapshot that old, else the oldest
            (default 100: with ``every=100, keep=2`` a rollback goes 100-199 steps back).
        skip: Batches skipped after a rollback (default 50).
        budget: Bytes the snapshots may hold (None: ``keep`` of them); fewer are kept if
            ``keep`` would not fit, and the fuse says it cannot apply if one does not.
        path: A directory to write the snapshots (and the undo copy) to instead of memory
            (None: memory).
        scheduler: The LR scheduler to snapshot and restore with the optimizer.
        mode: ``"off"``, ``"suggest"`` (default) or ``"auto"``.
        rules: Collector alert rules that trigger it at severity critical.
        loss_limit: A loss above this triggers it too (None: non-finite losses only).
        limit: Rollbacks at most in a run (default 5); then it says it cannot help.
        undo_state: Keep the state before a rollback, so that undo returns to it (one more
            snapshot's memory, within ``budget``, counted in ``fuse.rollback.bytes``; with
            ``path``, a file there; default True).
        backoff: Trigger the LR backoff fuse, when present, after a rollback (default True).
        restore_rng: Restore the torch/CUDA/numpy/Python RNG states with the snapshot
            (default True). A loop drawing its batches from the global RNG then replays the
            batches drawn after the snapshot, the bad one included (``skip`` skips the first
            ones of the replay); False: the RNG goes on (new batches).
    """

    name = "rollback"

    def __init__(self, every: int = 100, keep: int = 2, back: int = 100, skip: int = 50, *,
                 budget: int | None = None, path: str | None = None, scheduler: Any = None,
                 mode: str = "suggest", rules: Collection[str] = DEFAULT_RULES,
                 loss_limit: float | None = None, limit: int = 5, undo_state: bool = True,
                 backoff: bool = True, restore_rng: bool = True) -> None:
        super().__init__(mode)
        for what, value, low in (("every", every, 1), ("keep", keep, 1), ("back", back, 0),
                                 ("skip", skip, 0), ("limit", limit, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Rollback: {what} must be an int >= {low}, got {value!r}")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or budget < 1):
            raise ValueError(f"Rollback: budget must be a positive int of bytes, got {budget!r}")
        self.every, self.keep, self.back, self.skip = every, keep, back, skip
        self.budget, self.path, self.scheduler = budget, path, scheduler
        self.rules = frozenset(rules)
        self.loss_limit = None if loss_limit is None else float(loss_limit)
        self.limit, self.undo_state, self.backoff = limit, undo_state, backoff
        self.restore_rng = bool(restore_rng)
        self.ring = Ring(keep)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.rollbacks = 0
        self.snapshot_bytes = 0  # one snapshot's size, measured at the first copy
        self.peak_bytes = 0  # the most the fuse held in memory at once
        self.skipping = 0  # batches still to skip
        self.skipped = 0  # batches skipped so far
        self.steps_lost = 0  # steps undone by rollbacks so far
        self._undo: Snapshot | None = None
        self._pending: dict[str, Any] | None = None
        self._bad: str | None = None  # a bad loss seen since the last snapshot
        # critical alerts (sender thread): (reason, the step the alert speaks of)
        self._requests: deque[tuple[str, int | None]] = deque(maxlen=16)
        self._first: int | None = None  # the first step it saw: snapshots every `every`
        self._handle: Any = None
        self._last_suggest: int | None = None
        self._frame_lost = 0
        self._limited = False
        self._rolled_at = -1  # the step of the last rollback: older losses are history
        self._step = 0

    def describe(self) -> str:
        return (f"Rollback: restore the snapshot at least {self.back} steps back (one every "
                f"{self.every}, {self.keep} kept) and skip the next {self.skip} batches")

    def matches(self, alert: Mapping[str, Any]) -> bool:
        return str(alert.get("rule", "")) in self.rules

    # -- binding ---------------------------------------------------------------------------

    def bind(self, fuses: Any) -> None:
        super().bind(fuses)
        mon = fuses.monitor
        if mon is None:
            return
        if multi_rank() or getattr(mon, "_shard", None) is not None:
            self.cannot(0, "several ranks: they would have to roll back together (a "
                        "trigger agreed at one step); not built")
            return
        self.model = mon.model
        if fuses.optimizer is not None:
            self.bind_optimizer(fuses.optimizer)

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if self.optimizer is optimizer:
            return
        self.close()
        self.optimizer = optimizer
        self._handle = optimizer.register_step_pre_hook(self._pre)

    def bind_scheduler(self, scheduler: Any) -> None:
        """The LR scheduler to snapshot with the optimizer (the callbacks call this)."""
        if scheduler is not None and callable(getattr(scheduler, "state_dict", None)):
            self.scheduler = scheduler

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # -- the loop's side ---------------------------------------------------------------------

    def skip_batch(self) -> bool:
        """Whether the loop should skip its next batch (each True consumes one)."""
        if self.skipping <= 0:
            return False
        self._consume()
        return True

    def rollback_pending(self) -> dict[str, Any] | None:
        """Once per rollback: ``{"from_step", "to_step", "skip"}`` (steps as the monitor
        counts them: ``to_step`` is the step whose end state was restored)."""
        pending, self._pending = self._pending, None
        return pending

    def _consume(self) -> None:
        self.skipping -= 1
        self.skipped += 1
        if self.skipping == 0:
            self.record(self._step, "skipped", batches=self.skip)

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Drop the update of a batch to skip that the loop did not skip itself."""
        try:
            if self.skipping <= 0 or not self.live:
                return
            closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
            if closure is not None:  # (args[0] is the optimizer)
                return  # a closure computes the gradients after this hook (Lightning's
                # callback drops them itself)
            self.drop_update(optimizer)
        except Exception:
            self.fail(self._step)

    def drop_update(self, optimizer: Any = None) -> bool:
        """If a batch is to be skipped: set every gradient of ``optimizer``'s parameters to
        None, so its ``step()`` leaves them and its state alone; consumes one batch."""
        if self.skipping <= 0:
            return False
        opt = optimizer if optimizer is not None else self.optimizer
        for group in getattr(opt, "param_groups", ()):
            for p in group["params"]:
                p.grad = None
        self._consume()
        return True

    # -- triggers --------------------------------------------------------------------------

    def on_alert(self, alert: Mapping[str, Any]) -> None:
        if str(alert.get("severity", "")) == "critical":
            self._requests.append((f"alert {alert.get('rule')}", alert_step(alert)))

    def observe(self, step: int, loss: float | None) -> None:
        """A step's loss, read by the monitor without a device sync."""
        if loss is None or step <= self._rolled_at or self.skipping > 0:
            return  # before the last rollback, or a batch being skipped: not the state's
        if not math.isfinite(loss):
            self._bad_loss(step, f"non-finite loss {loss} at step {step}")
        elif self.loss_limit is not None and loss > self.loss_limit:
            self._bad_loss(step, f"loss {loss:.4g} past {self.loss_limit:g} at step {step}")

    def _bad_loss(self, step: int, reason: str) -> None:
        self._bad = reason
        self.trigger(step, reason)

    def trigger(self, step: int, reason: str) -> None:
        """Roll back now (acting), or suggest it (at most once per 100 steps). Ignored
        while skipping the batches of the previous rollback."""
        if self.skipping > 0:
            return
        if self.engaged:
            self.rollback(step, reason)
        elif self._last_suggest is None or step - self._last_suggest >= 100:
            if self._last_suggest is None:
                log.warning("logitwatch: fuse rollback (suggest) would roll back at step %d "
                            "(%s); apply: mon.fuses.apply('rollback') or the collector's "
                            "control {'fuses': {'rollback': 'apply'}}", step, reason)
            self._last_suggest = step
            self.record(step, "suggest", reason=reason, does=self.describe())

    def apply(self, step: int, by: str) -> None:
        """A person applies it: roll back now (once)."""
        self.rollback(step, f"applied by {by}")

    # -- snapshots ---------------------------------------------------------------------------

    def step_end(self, step: int, sampled: bool) -> None:
        self._step = step + 1
        while self._requests:
            reason, about = self._requests.popleft()
            if about is not None and about <= self._rolled_at:
                log.info("logitwatch: fuse rollback: %s about step %d: the rollback at step "
                         "%d handled it; ignored", reason, about, self._rolled_at)
                continue
            self.trigger(step, reason)
        if self._first is None:
            self._first = step  # a resumed job's first step (attach(start_step=)): not 0
        if (step - self._first) % self.every == 0 and self.model is not None:
            self._snapshot(step)

    def _lrs(self) -> list[float] | None:
        """The scheduled lr of each group while the LR backoff scales them (else None)."""
        if self.fuses is None:
            return None
        for fuse in self.fuses:
            saved = getattr(fuse, "_saved", None)
            if fuse.name == "lr_backoff" and saved:
                return [lr for _, lr in saved]
        return None

    def _snapshot(self, step: int) -> None:
        if self._bad is not None:
            self._bad = None  # a loss went bad since the last copy: this state is not kept
            return
        assert self.model is not None
        weights_ok, state_ok = self._live_finite()
        if not weights_ok:
            self.trigger(step, f"non-finite weights at step {step}")
            return
        if not state_ok:  # (Adam's exp_avg_sq overflowed, the weights still finite)
            self.trigger(step, f"non-finite optimizer state at step {step}")
            return
        first = self.snapshot_bytes == 0
        self.snapshot_bytes = max(self.snapshot_bytes, self._live_bytes())
        held = self._room()
        if held is None:
            return
        # the live state is finite (above): make room first, never more than `held` copies
        while len(self.ring) >= held:
            self.ring.items.pop(0).drop()
        snap = capture(step, self.model, self.optimizer, self.scheduler, lrs=self._lrs(),
                       path=self.path, fuses=self._fuse_states())
        self.snapshot_bytes = max(self.snapshot_bytes, snap.bytes)
        self.ring.add(snap)
        self._note_memory()
        if first:
            self.record(step, "armed", bytes=snap.bytes, keep=self._room() or 0,
                        budget=self.budget, on_disk=self.path is not None)
            log.info("logitwatch: fuse rollback (%s): a snapshot every %d steps takes %.1f "
                     "MiB, %d kept", self.mode, self.every, snap.bytes / 2**20,
                     self._room() or 0)

    def _live_finite(self) -> tuple[bool, bool]:
        """Whether the live weights, and the optimizer's live state, are finite (one device
        sync for both, before anything is copied or dropped)."""
        assert self.model is not None
        weights = [p for p in self.model.parameters() if p.is_floating_point()]
        state = [t for per in (self.optimizer.state.values() if self.optimizer is not None
                               else ())
                 for t in (per.values() if isinstance(per, Mapping) else ())
                 if isinstance(t, torch.Tensor) and t.is_floating_point()]
        with torch.no_grad():
            flags = [torch.stack([torch.isfinite(t).all() for t in group]).all()
                     if group else torch.ones((), dtype=torch.bool) for group in (weights, state)]
            device = flags[0].device
            ok = torch.stack([f.to(device) for f in flags]).tolist()
        return bool(ok[0]), bool(ok[1])

    def _live_bytes(self) -> int:
        """What a copy of the state takes, from the live tensors (nothing copied)."""
        assert self.model is not None
        size = tensor_bytes(self.model.state_dict())
        if self.optimizer is not None:
            size += tensor_bytes(self.optimizer.state_dict()["state"])
        if self.scheduler is not None:
            size += tensor_bytes(self.scheduler.state_dict())
        return size

    def _room(self) -> int | None:
        """Snapshots the budget lets the ring hold (None: none; the fuse says why)."""
        if self.budget is None or self.path is not None:
            return self.keep
        n = min(self.keep, self.budget // self.snapshot_bytes)
        if n < 1:
            self.cannot(self._step, f"one snapshot takes {self.snapshot_bytes} bytes, over "
                        f"the budget of {self.budget}")
            self.ring.clear()
            return None
        return n

    @property
    def held_bytes(self) -> int:
        """Bytes the fuse holds in memory now: the ring's and the undo copy's (on disk: 0)."""
        return self.ring.bytes + (self._undo.bytes if self._undo is not None
                                  and self._undo.state is not None else 0)

    def _note_memory(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    # -- the rollback ------------------------------------------------------------------------

    def rollback(self, step: int, reason: str) -> None:
        """Restore the snapshot of at least ``back`` steps ago and start skipping."""
        if self.model is None:
            return
        snap = self.ring.pick(step, self.back)
        if snap is None:
            self.record(step, "no_snapshot", reason=reason)
            log.warning("logitwatch: fuse rollback: no snapshot to go back to at step %d "
                        "(%s)", step, reason)
            return
        if self.rollbacks >= self.limit:
            if not self._limited:
                self._limited = True
                self.record(step, "limit", rollbacks=self.rollbacks, reason=reason)
                log.warning("logitwatch: fuse rollback: rolled back %d times already (its "
                            "limit); no more rollbacks (%s)", self.rollbacks, reason)
            return
        self._drop_undo()
        room = self._room() or 0
        if self.undo_state and (self.budget is None or self.path is not None
                                or (room + 1) * self.snapshot_bytes <= self.budget):
            # with `path`, on disk like the ring (memory: nothing), under its own name
            self._undo = capture(step, self.model, self.optimizer, self.scheduler,
                                 lrs=self._lrs(), fuses=self._fuse_states(), path=self.path,
                                 tag="rollback-undo")
        self._load_fuse_states(restore(snap, self.model, self.optimizer, self.scheduler,
                                       rng=self.restore_rng))
        self.ring.drop_after(snap.step)
        self._note_memory()
        self.rollbacks += 1
        lost = step - snap.step
        self.steps_lost += lost
        self._frame_lost += lost
        self.skipping = self.skip
        self._bad = None
        self._rolled_at = step
        self._pending = {"from_step": step, "to_step": snap.step, "skip": self.skip}
        self.record(step, "rollback", to_step=snap.step, steps_lost=lost, skip=self.skip,
                    reason=reason, undo=self._undo is not None)
        log.warning("logitwatch: fuse rollback: %s; restored the state after step %d (%d "
                    "steps back), skipping the next %d batches", reason, snap.step, lost,
                    self.skip)
        if self.backoff and self.fuses is not None:
            self.fuses.trigger("lr_backoff", step, "rollback")

    def _fuse_states(self) -> dict[str, Any] | None:
        """What the other fuses know about what they did to the weights (QK-clip's factors),
        kept with a snapshot: restoring the weights restores that too, so an undo after a
        rollback divides by the factors the restored weights carry."""
        return self.fuses.weight_states() if self.fuses is not None else None

    def _drop_undo(self) -> None:
        if self._undo is not None:
            self._undo.drop()
            self._undo = None

    def _load_fuse_states(self, states: dict[str, Any] | None) -> None:
        if self.fuses is not None:
            self.fuses.load_weight_states(states)

    def undo(self, step: int, by: str) -> None:
        """Stop skipping and, when kept, return to the state before the last rollback."""
        self.skipping = 0
        restored = False
        if self._undo is not None and self.model is not None:
            self._load_fuse_states(restore(self._undo, self.model, self.optimizer,
                                           self.scheduler, rng=self.restore_rng))
            self._drop_undo()
            restored = True
        self.engaged = False
        self.record(step, "undo", by=by, restored=restored)

    def after_frame(self, step: int, scalars: dict[str, float],
                    heads: dict[str, list[list[float]]]) -> None:
        loss = scalars.get("loss")
        if isinstance(loss, float):
            self.observe(step, loss)
        scalars["fuse.rollback.snapshots"] = float(len(self.ring))
        scalars["fuse.rollback.bytes"] = float(self.held_bytes)
        scalars["fuse.rollback.skipping"] = float(self.skipping)
        scalars["fuse.rollback.steps_lost"] = float(self._frame_lost)
        self._frame_lost = 0
