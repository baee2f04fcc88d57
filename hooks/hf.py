"""Hugging Face ``transformers.Trainer`` integration: :class:`LogitwatchCallback`.

Example::

    from logitwatch.hooks.hf import LogitwatchCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[LogitwatchCallback(run="my-run", url="http://127.0.0.1:8000")])
    trainer.train()

The callback attaches at ``on_train_begin`` (the Trainer has built its optimizer then;
accelerate's wrapper is looked through), ends steps on the optimizer's ``step()`` like a
plain loop (and at ``on_step_end`` a step whose ``step()`` a loss scaler skipped), reads
``args.max_grad_norm`` as the clip threshold, the rank from
``args.process_index``, and closes at ``on_train_end``, which says the job ended (the run
becomes ``finished`` on the collector). The loss comes from the model outputs' ``.loss``:
where the Trainer passes ``num_items_in_batch`` (a model taking loss kwargs, as HF's
causal LMs do) each micro-batch's loss is already divided by the whole step's token
count, so under gradient accumulation the step's loss is their sum (the loss the Trainer
logs), not their mean. A run resumed from a checkpoint numbers its steps on from the
checkpoint's ``state.global_step`` (``attach(start_step=)``), so that its frames do not
collide with those already sent. The gradient norm is the one accelerate clips with
(``clip_grads_with_norm_``'s ``total_norm``: before clipping), the clip flag that norm
over ``args.max_grad_norm``.
The run's last step (``state.max_steps``) is sampled whatever the interval
(:meth:`Monitor.request_sample_at`), so the last frame is a full one at the last step.
The run's config (``GET /runs``) is the ``TrainingArguments`` (``to_dict()``, its numbers,
strings and booleans), under what ``config=`` gives.

Fuses (``fuses=``, docs/FUSES.md): the rollback fuse snapshots the Trainer's LR scheduler
too and restores inside the optimizer's ``step()`` (before the scheduler's step and
``on_step_end``); the Trainer cannot skip a batch from a callback, so the batches to skip
are trained forward and backward but their update is dropped (the optimizer's step leaves
the weights and its state alone; the scheduler and ``state.global_step`` still advance;
under gradient accumulation one skipped batch is one optimizer step's micro-batches).
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

from ._attach import attach, config_option
from ._monitor import Monitor

__all__ = ["LogitwatchCallback"]


def training_config(args: Any) -> dict[str, Any]:
    """``TrainingArguments.to_dict()`` filtered to JSON scalars (no None, no empty text)."""
    try:
        values = args.to_dict()
    except Exception:  # not TrainingArguments after all
        return {}
    return {k: v for k, v in values.items()
            if (isinstance(v, (bool, int, str)) and v != "")
            or (isinstance(v, float) and math.isfinite(v))}


def _loss_scale(args: Any, model: Any) -> float:
    """What the Trainer multiplies a forward's loss by where it averages tokens across
    devices (``Trainer.compute_loss``): the processes over the tensor-parallel size (TP
    ranks see one batch; the model's ``_tp_size``, 1 where it has none: a DeepSpeed or
    accelerate TP configuration is not seen here), or the GPUs under DataParallel; 1
    otherwise."""
    if not getattr(args, "average_tokens_across_devices", False):
        return 1.0
    n_gpu = int(getattr(args, "n_gpu", 1) or 1)
    if n_gpu > 1:
        return float(n_gpu)
    world = max(1, int(getattr(args, "world_size", 1) or 1))
    tp = getattr(getattr(model, "module", model), "_tp_size", None) or 1
    return float(max(1, world // max(1, int(tp))))


class LogitwatchCallback(TrainerCallback):  # type: ignore[misc]
    """Attach a :class:`~logitwatch.hooks.Monitor` for the length of ``trainer.train()``.

    Args:
        run: Run name.
        url: Collector URL (None: a dry run).
        **attach_kwargs: Anything else :func:`~logitwatch.hooks.attach` takes
            (``sample_every``, ``project``, ``client``, ``overhead_budget``, ...).
    """

    def __init__(self, *, run: str, url: str | None = None, **attach_kwargs: Any) -> None:
        self.run = run
        self.url = url
        self.attach_kwargs = attach_kwargs
        self.monitor: Monitor | None = None
        self._begun: int | None = None  # the monitor's step index at on_step_begin

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            return
        if self.monitor is not None:
            # an earlier train() ended without on_train_end (an exception, Ctrl-C: the
            # Trainer has no exception hook): its monitor is closed as a job that did not
            # say it ended, and this train() gets its own (it reused the old one, its
            # hooks and step count)
            old, self.monitor = self.monitor, None
            old.close(finished=False)
        options = dict(self.attach_kwargs)
        max_norm = getattr(args, "max_grad_norm", None)
        if max_norm and max_norm > 0:
            options.setdefault("max_grad_norm", float(max_norm))
        if "client" not in options:
            options.setdefault("rank", int(getattr(args, "process_index", 0)))
        config_option(options, training_config(args))
        done = int(getattr(state, "global_step", 0) or 0)  # resumed: the checkpoint's steps
        options.setdefault("start_step", done)
        self.monitor = attach(model, optimizer, run=self.run, url=self.url, **options)
        # the Trainer hands a model that takes loss kwargs ``num_items_in_batch``, the whole
        # step's token count (summed across ranks where it averages tokens across devices,
        # then scaling the loss by their number): each micro-batch's ``.loss`` is its share
        # of the step's loss, which is their sum, not their mean
        self.monitor.loss_items_scale = _loss_scale(args, model)
        ga = getattr(args, "gradient_accumulation_steps", 1)
        if isinstance(ga, int) and ga > 0:  # a step's micro-batches are no stalled optimizer
            self.monitor.stall_forwards = max(self.monitor.stall_forwards, 2 * ga + 1)
        if self.monitor.fuses:  # the rollback's snapshots carry the schedule
            self.monitor.fuses.bind_scheduler(kwargs.get("lr_scheduler"))
        max_steps = getattr(state, "max_steps", 0)
        if isinstance(max_steps, int) and max_steps > 0:
            self.monitor.request_sample_at(self.monitor.step_index + max_steps - done - 1)
            self.monitor.planned_steps = max_steps - done

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None and self._begun is None:
            self._begun = self.monitor.step_index

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A step whose optimizer ``step()`` never ran (fp16: the loss scaler skipped it on
        non-finite gradients) is ended here, so that it is not pooled into the next one."""
        begun, self._begun = self._begun, None
        if self.monitor is not None and begun is not None \
                and self.monitor.step_index == begun:
            self.monitor.step(skipped=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
