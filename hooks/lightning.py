"""PyTorch Lightning integration: :class:`LogitwatchCallback`.

Example::

    from logitwatch.hooks.lightning import LogitwatchCallback

    trainer = lightning.Trainer(callbacks=[LogitwatchCallback(run="my-run", url=URL)])
    trainer.fit(module, loader)

Lightning runs ``training_step`` inside the optimizer's ``step(closure)`` and may never
call the module's ``forward``, so the callback drives the monitor itself: capture from
``on_train_batch_start`` to ``on_train_batch_end`` (the loss from the step's outputs,
which Lightning has divided by ``accumulate_grad_batches``: multiplied back, so a step's
loss is the mean of its micro-batches' losses), the gradient norm before clipping
(``gradient_clip_val`` with the norm algorithm goes through
``torch.nn.utils.clip_grad_norm_``, which the monitor observes; without clipping it is
computed at the step's end, where the gradients are still this step's), the LR the
optimizer step used (read in ``on_before_optimizer_step``: by ``on_train_batch_end`` a
``"step"``-interval scheduler has already moved it to the next step's), and one monitored
step per optimizer step (``accumulate_grad_batches`` respected). The rank is
``trainer.global_rank``.

Automatic optimization only (one optimizer, the only kind Lightning 2 allows there). Under
manual optimization (``automatic_optimization = False``) the optimizer steps inside
``training_step``, as often as it likes, so batches are not steps and the gradients at a
batch's end are not the step's: the callback warns once and does not attach (no run, no
frames) rather than send wrong step counts and norms.

The fit's last optimizer step (``trainer.estimated_stepping_batches``, when finite) is
sampled whatever the interval (:meth:`Monitor.request_sample_at`), so the last frame is a
full one at the last step. ``on_fit_end`` closes the monitor, which says the job ended
(the run becomes ``finished`` on the collector); a fit that raises closes it without
(``on_exception``), so the run is reported ``stopped`` once no data comes. The run's
config (``GET /runs``) is the module's ``hparams``, under what ``config=`` gives.

Fuses (``fuses=``, docs/FUSES.md): the callback hands the optimizer and the first LR
scheduler to them; a rollback restores at the step's end (``on_train_batch_end``), and a
batch to skip has its update dropped in ``on_before_optimizer_step`` (after its backward:
its forward and backward still run; Lightning's loop cannot skip a batch from a callback).
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from ._attach import attach, config_option
from ._monitor import Monitor

__all__ = ["LogitwatchCallback"]

MANUAL_OPTIMIZATION = (
    "logitwatch: LogitwatchCallback supports automatic optimization only (one optimizer; "
    "accumulate_grad_batches and gradient_clip_val are followed); this LightningModule sets "
    "automatic_optimization = False, so the callback does not attach and sends nothing for "
    "this fit (its step counts and gradient norms would be wrong)"
)


class LogitwatchCallback(pl.Callback):  # type: ignore[misc]
    """Attach a :class:`~logitwatch.hooks.Monitor` for the length of ``trainer.fit()``.

    Args:
        run: Run name.
        url: Collector URL (None: a dry run).
        **attach_kwargs: Anything else :func:`~logitwatch.hooks.attach` takes.
    """

    def __init__(self, *, run: str, url: str | None = None, **attach_kwargs: Any) -> None:
        super().__init__()
        self.run = run
        self.url = url
        self.attach_kwargs = attach_kwargs
        self.monitor: Monitor | None = None
        self._warned_manual = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Attach, once the trainer has restored a checkpoint's state (``ckpt_path``: its
        ``global_step`` is the first step's index, ``attach(start_step=)``; at
        ``on_fit_start`` it still reads 0, and a resumed fit numbered its steps from 0
        again, onto the frames already sent) and after the sanity check's validation."""
        if self.monitor is not None:
            return
        if not getattr(pl_module, "automatic_optimization", True):
            if not self._warned_manual:
                self._warned_manual = True
                rank_zero_warn(MANUAL_OPTIMIZATION, category=UserWarning)
            return
        options = dict(self.attach_kwargs)
        clip = trainer.gradient_clip_val
        if clip and trainer.gradient_clip_algorithm in (None, "norm"):
            options.setdefault("max_grad_norm", float(clip))
        if "client" not in options:
            options.setdefault("rank", int(trainer.global_rank))
        config_option(options, dict(getattr(pl_module, "hparams", None) or {}))
        done = int(trainer.global_step)  # a resumed fit: the checkpoint's optimizer steps
        options.setdefault("start_step", done)
        self.monitor = attach(pl_module, None, run=self.run, url=self.url, **options)
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        if optimizer is not None and self.monitor.fuses:
            self.monitor.fuses.bind_optimizer(optimizer)  # LR backoff, rollback act on it
            configs = getattr(trainer, "lr_scheduler_configs", None) or []
            if configs:
                self.monitor.fuses.bind_scheduler(getattr(configs[0], "scheduler", None))
        try:
            total = trainer.estimated_stepping_batches
        except Exception:  # no estimate (an iterable of unknown length...): close() still
            total = math.inf  # sends the last step's scalars
        if isinstance(total, (int, float)) and math.isfinite(total) and total > done:
            # the fit's last optimizer step (estimated_stepping_batches counts from 0)
            self.monitor.request_sample_at(self.monitor.step_index + int(total) - done - 1)
            self.monitor.planned_steps = int(total) - done

    def _log_lr(self, optimizer: Any) -> None:
        """Log ``optimizer``'s current LR, the one this step uses, to the step. As given: a
        tensor LR (capturable optimizers) stays on the device, where float() would read it
        back on every step, sampled or not; on a sampled step copied, since the frame reads
        it at the step's end and a scheduler updates it in place before (an unsampled
        step's history copies it at once)."""
        groups = getattr(optimizer, "param_groups", None)
        mon = self.monitor
        if not groups or mon is None:
            return
        lr = groups[0].get("lr")
        if isinstance(lr, torch.Tensor) and mon.sampled:
            lr = lr.detach().clone()
        mon.log(lr=lr)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.monitor is not None:
            self.monitor.begin_capture()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        mon = self.monitor
        if mon is None:
            return
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and accumulate > 1:
            # Lightning's automatic optimization divides every batch's loss by
            # accumulate_grad_batches (the last, shorter window's too) before backward and
            # hands that on: the batch's own loss (a device op, no sync)
            loss = loss * accumulate
        mon.end_capture(loss if isinstance(loss, torch.Tensor) else None)
        last = trainer.num_training_batches
        if (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == last:
            mon.step()  # (its LR was logged in on_before_optimizer_step)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        """Read the LR this step uses (after a module's ``optimizer_step`` override set a
        warm-up's); in a rollback's skip window, drop the batch's update (gradients set to
        None: the step leaves the weights and the optimizer's state alone)."""
        if self.monitor is None:
            return
        # the LR this optimizer step uses (by on_train_batch_end a "step" scheduler has
        # moved it to the next step's); logged on every step: on an unsampled one
        # Monitor.log() keeps it for the history (the monitor has no optimizer of its own)
        self._log_lr(optimizer)
        if self.monitor.fuses:
            self.monitor.fuses.drop_update(optimizer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if self.monitor is not None:
            self.monitor.close(finished=False)
            self.monitor = None
