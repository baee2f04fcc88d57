"""``attach()``: the two-line entry point that builds a :class:`Monitor`."""

from __future__ import annotations

import math
import os

import torch

from logitwatch.client import Client, ClientConfig

from ._monitor import Monitor

__all__ = ["attach", "resolve_rank"]


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


def attach(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    run: str,
    url: str | None = None,
    project: str = "default",
    rank: int | None = None,
    sample_every: int = 10,
    max_grad_norm: float | None = None,
    client: Client | None = None,
    token: str | None = None,
) -> Monitor:
    """Start monitoring ``model`` (and ``optimizer``); returns the :class:`Monitor`.

    Example::

        mon = logitwatch.attach(model, opt, run="my-run", url="http://127.0.0.1:8000")
        ...  # train as usual: forward, backward, opt.step()
        mon.close()

    Attach before ``torch.compile``. Signals per sampled step: ``attn.logit_max`` and
    ``attn.logit_p99`` (layer x head), ``loss`` (HF outputs' ``.loss``, or
    ``Monitor.log(loss=...)``), ``grad.norm`` (global L2 before clipping),
    ``grad.clipped`` (when a ``max_norm`` is known), ``lr``.

    Args:
        model: The module whose forward is one training forward.
        optimizer: Its optimizer; its ``step()`` ends a monitored step. Without one,
            call ``Monitor.step()`` at the end of each step.
        run: Run name (1-128 characters of ``[A-Za-z0-9._:-]``).
        url: Collector base URL; None discards frames (a dry run).
        project: Project name.
        rank: Data-parallel rank; default from ``torch.distributed``, ``RANK`` or 0.
        sample_every: Measure one step in this many (step 0 is always measured).
        max_grad_norm: Threshold for ``grad.clipped`` when the job does not call
            ``torch.nn.utils.clip_grad_norm_`` (whose ``max_norm`` wins when it does).
        client: A :class:`~logitwatch.client.Client` to send with, instead of one built
            from ``url``/``project``/``rank``; its run must equal ``run``. It is flushed,
            not shut down, by ``Monitor.close()``.
        token: Ingest token for ``project`` when the collector requires one
            (default: the ``LOGITWATCH_TOKEN`` environment variable).

    Raises:
        TypeError, ValueError: An argument is invalid (checked here, never later).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"attach: model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"attach: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if isinstance(sample_every, bool) or not isinstance(sample_every, int) or sample_every < 1:
        raise ValueError(f"attach: sample_every must be an int >= 1, got {sample_every!r}")
    if max_grad_norm is not None and not (
        isinstance(max_grad_norm, (int, float))
        and not isinstance(max_grad_norm, bool)
        and max_grad_norm > 0
        and not math.isnan(max_grad_norm)
    ):
        raise ValueError(f"attach: max_grad_norm must be a number > 0, got {max_grad_norm!r}")
    owns_client = client is None
    if client is None:
        config = ClientConfig.from_env(**({"token": token} if token else {}))
        client = Client(url, run=run, project=project, rank=resolve_rank(rank), config=config)
    elif client.run != run:
        raise ValueError(f"attach: run={run!r} but the given client sends as {client.run!r}")
    return Monitor(
        model,
        optimizer,
        client=client,
        owns_client=owns_client,
        sample_every=sample_every,
        max_grad_norm=None if max_grad_norm is None else float(max_grad_norm),
    )
