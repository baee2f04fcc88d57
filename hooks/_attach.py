"""``attach()``: the two-line entry point that builds a :class:`Monitor`."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import torch

from logitwatch.client import Client, ClientConfig

from ._cost import MAX_INTERVAL
from ._history_flush import DEFAULT_EVERY as DEFAULT_FLUSH
from ._logits import DEFAULT_BUDGET
from ._monitor import Monitor
from ._qk_find import QKLayout
from .fuses import FusesArg, parse_fuses

__all__ = ["attach", "config_option", "resolve_rank"]


class _Default:
    """Marker for "not given" where None has a meaning of its own."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()


def resolve_rank(rank: int | None) -> int:
    """``rank`` if given, else ``torch.distributed.get_rank()`` if initialised, else
    the ``RANK`` environment variable, else 0."""
    if rank is not None:
        return rank
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    env = os.environ.get("RANK", "").strip()
    if env.isdigit():
        return int(env)
    return 0


def config_option(options: dict[str, object], found: Mapping[str, object]) -> None:
    """Set ``options["config"]`` for :func:`attach` from what a trainer integration
    ``found`` (its arguments, hyperparameters), under the keys the caller gave in
    ``config=``; ``config=None`` sends none."""
    given = options.get("config", DEFAULT)
    if given is DEFAULT:
        options["config"] = dict(found) or None
    elif isinstance(given, Mapping):
        options["config"] = {**found, **given}


def attach(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    run: str,
    url: str | None = None,
    project: str = "default",
    rank: int | None = None,
    sample_every: int | None = None,
    max_grad_norm: float | None = None,
    client: Client | None = None,
    token: str | None = None,
    memory_budget: int = DEFAULT_BUDGET,
    overhead_budget: float | None | _Default = DEFAULT,
    lm_head: torch.nn.Module | bool | None = None,
    qk_layout: QKLayout | None = None,
    max_sample_every: int = MAX_INTERVAL,
    fuses: FusesArg | None = None,
    reduce_ranks: bool | None | object = None,
    tp_group: object | None = None,
    tp_rank: int | None = None,
    config: Mapping[str, object] | None = None,
    history_every: int | None = DEFAULT_FLUSH,
    start_step: int = 0,
) -> Monitor:
    """Start monitoring ``model`` (and ``optimizer``); returns the :class:`Monitor`.

    Example::

        mon = logitwatch.attach(model, opt, run="my-run", url="http://127.0.0.1:8000")
        ...  # train as usual: forward, backward, opt.step()
        mon.close()

    Attach before ``torch.compile``. Signals per sampled step (``docs/HOOKS.md`` defines
    each): per layer x head ``attn.logit_max/p99/mean/std``, ``attn.entropy_mean/min``
    (``attn.capped_logit_max/p99`` with a soft-cap), ``qk.q_weight_norm``,
    ``qk.k_weight_norm`` (and ``qk.*_bias_norm``); scalars ``final.hidden_rms``,
    ``final.logz``, ``final.logit_max``, ``loss`` (HF outputs' ``.loss``, or
    ``Monitor.log(loss=...)``), ``loss.first_over_ln_vocab`` (first frame), ``grad.norm``
    (global L2 before clipping), ``grad.clipped`` and ``grad.clip_rate`` (when a
    ``max_norm`` is known), ``lr``, and the monitor's own cost ``hooks.*``.

    Args:
        model: The module whose forward is one training forward.
        optimizer: Its optimizer; its ``step()`` ends a monitored step. Without one,
            call ``Monitor.step()`` at the end of each step.
        run: Run name (1-128 characters of ``[A-Za-z0-9._:-]``).
        url: Collector base URL; None discards frames (a dry run).
        project: Project name.
        rank: Data-parallel rank; default from ``torch.distributed``, ``RANK`` or 0.
        sample_every: Measure one step in this many (step 0 is always measured); default
            10, widened as the overhead budget needs. An explicit value is kept fixed
            unless ``overhead_budget`` is given too.
        max_grad_norm: Threshold for ``grad.clipped`` when the job does not call
            ``torch.nn.utils.clip_grad_norm_`` (whose ``max_norm`` wins when it does).
        client: A :class:`~logitwatch.client.Client` to send with, instead of one built
            from ``url``/``project``/``rank``; its run must equal ``run``. It is flushed,
            not shut down, by ``Monitor.close()``.
        token: Ingest token for ``project`` when the collector requires one
            (default: the ``LOGITWATCH_TOKEN`` environment variable).
        memory_budget: Bytes one sampled attention call (or LM-head call) may use for its
            statistics; logits are computed in blocks within it (default 256 MiB).
        overhead_budget: Fraction of training time the monitor may cost; the sampling
            interval is widened to stay under it, up to ``max_sample_every``. Cost is the
            thread CPU time of the hooks (on an accelerator: the sampled step's extra
            duration). Default: 0.01 with the default ``sample_every``, None (never widen)
            when ``sample_every`` is given.
        max_sample_every: Ceiling on the interval the overhead budget may widen to
            (default 50): a frame at least every this many steps, even where that costs
            more than the budget (``hooks.overhead`` says how much).
        lm_head: The module producing vocabulary logits (for ``final.*``); None finds it
            (``get_output_embeddings()``, then a ``Linear`` named like a head); False: off.
        qk_layout: Geometry of fused q/k/v projections that cannot be inferred, by the
            projection's module name (full, or its last part for every module of that
            name): ``{"blocks.0.attn.qkv": {"heads": 8, "kv_heads": 2, "head_dim": 64}}``
            (``kv_heads`` defaults to ``heads``, ``head_dim`` to what the output size
            implies; weights laid out ``[q | k | v]``); ``{name: None}``: no q/k norms for
            it. Usually not needed: ``docs/HOOKS.md`` lists what is recognised, and
            ``attach`` logs one line saying which attention modules have q/k norms.
        fuses: Actions the job takes on a warning, off unless named here (docs/FUSES.md):
            ``[QKClip(tau=50, mode="auto"), LRBackoff()]`` (``logitwatch.hooks.fuses``)
            or ``{"qk_clip": {"tau": 50, "mode": "auto"}, "lr_backoff": "suggest"}``;
            ``mon.fuses`` applies and undoes them.
        reduce_ranks: Reduce before sending (docs/HOOKS.md "Ranks, DDP, FSDP"): per-head
            statistics reduced across the data-parallel ranks on sampled steps and sent
            once, by the group's rank 0, with the rank that held each head's max and every
            rank's loss; the other ranks send their own frames only when the collector
            asks. None (default): on when ``torch.distributed`` runs more than one rank
            (off for DTensors on a multi-dimensional mesh); False: every rank sends its
            own frames; True: over the whole job; a process group: over that group (the
            data-parallel one under pipeline parallelism). The same on every rank.
        tp_group: Under tensor parallelism, the process group whose ranks each compute
            ``H / tp`` heads of every attention layer: the reduced frame then holds the
            full layer x head matrix, each rank's heads at their place (rank r of the group
            holds heads ``[r * H / tp, (r + 1) * H / tp)``; ``tp_rank`` when the order is
            another). Found from DTensor placements when not given (q/k projection weights
            sharded by head on a mesh dimension named like ``tp``). Needs reduction on.
        config: The run's configuration, a dict of JSON values (hyperparameters, model,
            data), shown in the collector's runs list; sent once by rank 0 in the
            background (``Client.set_config``). Values JSON cannot carry are left out.
        history_every: Send the steps between samples (loss, grad norm, clip flag, lr, log
            Z, hidden RMS) every this many unsampled steps, ahead of the next frame
            (default 10), so that an alert judged on them reaches the collector within
            that many steps whatever the sampling interval; read where that costs no
            sync (host memory, or a non-blocking copy on CUDA sent once done, typically
            a step later); on a CPU job also at once after a step whose loss or gradient
            norm spiked or whose lr jumped. None or 0: they travel with the next sampled
            frame only.
        start_step: The index of the first monitored step (default 0): a job resumed
            from a checkpoint passes the number of optimizer steps already taken (the
            checkpoint's global step), so that its frames continue that run's step
            numbers instead of starting again at 0 and colliding with the frames already
            on the collector. :attr:`Monitor.step_index` and
            :meth:`Monitor.request_sample_at` count from it. The Hugging Face callback
            sets it from ``state.global_step``.

    Raises:
        TypeError, ValueError: An argument is invalid (checked here, never later).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"attach: model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"attach: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if overhead_budget is DEFAULT:
        overhead_budget = 0.01 if sample_every is None else None
    if sample_every is None:
        sample_every = 10
    if isinstance(sample_every, bool) or not isinstance(sample_every, int) or sample_every < 1:
        raise ValueError(f"attach: sample_every must be an int >= 1, got {sample_every!r}")
    if max_grad_norm is not None and not (
        isinstance(max_grad_norm, (int, float))
        and not isinstance(max_grad_norm, bool)
        and max_grad_norm > 0
        and not math.isnan(max_grad_norm)
    ):
        raise ValueError(f"attach: max_grad_norm must be a number > 0, got {max_grad_norm!r}")
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or (
        memory_budget < 1 << 20
    ):
        raise ValueError(f"attach: memory_budget must be an int >= 1 MiB, got {memory_budget!r}")
    if overhead_budget is not None and not (
        isinstance(overhead_budget, (int, float)) and not isinstance(overhead_budget, bool)
        and 0 < overhead_budget <= 1
    ):
        raise ValueError(
            f"attach: overhead_budget must be in (0, 1] or None, got {overhead_budget!r}")
    if isinstance(max_sample_every, bool) or not isinstance(max_sample_every, int) or (
        max_sample_every < 1
    ):
        raise ValueError(
            f"attach: max_sample_every must be an int >= 1, got {max_sample_every!r}")
    if qk_layout is not None and not (
        isinstance(qk_layout, Mapping)
        and all(isinstance(k, str) and (v is None or isinstance(v, Mapping))
                for k, v in qk_layout.items())
    ):
        raise TypeError(f"attach: qk_layout must map names to dicts or None, got {qk_layout!r}")
    if lm_head is not None and not isinstance(lm_head, (bool, torch.nn.Module)):
        raise TypeError(f"attach: lm_head must be a Module, a bool or None, got {lm_head!r}")
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"attach: config must be a dict, got {type(config).__name__}")
    fuses = parse_fuses(fuses) or None  # checked before anything is hooked
    if history_every is not None and (isinstance(history_every, bool) or not isinstance(
            history_every, int) or history_every < 0):
        raise ValueError(
            f"attach: history_every must be an int >= 0 or None, got {history_every!r}")
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(f"attach: start_step must be an int >= 0, got {start_step!r}")
    if tp_rank is not None and tp_group is None:
        raise ValueError("attach: tp_rank needs tp_group")
    owns_client = client is None
    if client is None:
        client = Client(url, run=run, project=project, rank=resolve_rank(rank),
                        config=ClientConfig.from_env(**({"token": token} if token else {})))
    elif client.run != run:
        raise ValueError(f"attach: run={run!r} but the given client sends as {client.run!r}")
    if config is not None and client.rank == 0:
        client.set_config(config)
    return Monitor(
        model,
        optimizer,
        client=client,
        owns_client=owns_client,
        sample_every=sample_every,
        max_grad_norm=None if max_grad_norm is None else float(max_grad_norm),
        memory_budget=memory_budget,
        overhead_budget=None if overhead_budget is None else float(overhead_budget),
        lm_head=lm_head,
        qk_layout=qk_layout,
        max_sample_every=max_sample_every,
        fuses=fuses,
        reduce_ranks=reduce_ranks,
        tp_group=tp_group,
        tp_rank=tp_rank,
        history_every=history_every,
        start_step=start_step,
    )
