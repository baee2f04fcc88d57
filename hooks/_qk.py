"""Per-head norms of the query/key projections (weights and biases).

Found at attach time (``_qk_find``: the layouts understood), computed on sampled steps at
the end of the step (after the optimizer update). A source is a q and a k slice of
parameters along the head axis: rows of an ``nn.Linear`` weight (or of MHA's
``in_proj_weight``), columns of a ``Conv1D`` weight (GPT-2), entries of a bias.

The norm of head ``h`` is the Frobenius norm of its slice (weight) or the L2 norm of its
slice of the bias. Keys have ``H_kv`` heads under GQA, so the ``k`` matrices are
``layers x H_kv``.

Sharded parameters (FSDP2 DTensors, FSDP1 flat shards) are measured from each rank's
local piece and summed across ranks by the monitor's end-of-step exchange (see
``_shard.Sharding``); the layout is then read from the unsharded shapes FSDP1 records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Part", "QKSource", "qk_items", "qk_norms"]


@dataclass
class Part:
    """A parameter and the ``[start, stop)`` range of its dim ``axis`` that one of q/k
    occupies (sliced only under ``no_grad`` when measured: no autograd node is kept)."""

    param: torch.Tensor
    axis: int = 0
    start: int = 0
    stop: int | None = None
    owner: nn.Module | None = None  # the module holding it as attribute ``name``
    name: str | None = None

    def get(self) -> torch.Tensor:
        t = self.param.detach()
        stop = t.shape[self.axis] if self.stop is None else self.stop
        return t.narrow(self.axis, self.start, stop - self.start)


@dataclass
class QKSource:
    """Where one layer's q/k parameters live and how heads are laid out."""

    kind: str  # "rows" (Linear/in_proj: heads along dim 0) or "cols" (Conv1D: dim 1)
    q_weight: Part
    k_weight: Part
    q_bias: Part | None
    k_bias: Part | None
    head_dim: int


ShapeOf = Callable[[nn.Module, str], "torch.Size | None"]


def qk_norms(
    sources: list[QKSource], sums: list[torch.Tensor] | None = None
) -> dict[str, list[torch.Tensor]]:
    """``{"qk.q_weight_norm": [per layer (H,)], ...}``; biases only where present.

    ``sums`` (sharded parameters): the reduced per-index squared sums of
    :func:`qk_items`, in order (``Sharding.qk_sums`` after the step's exchange); no
    collective here. Without it, the norms of the parameters as this process holds them.
    """
    if sums is not None:
        out = _sharded_norms(sources, sums)
    else:
        out = {}
        with torch.no_grad():
            for src in sources:
                for name, part in _named_parts(src):
                    out.setdefault(name, []).append(_norm(part, src.kind, src.head_dim))
    for name in ("qk.q_bias_norm", "qk.k_bias_norm"):
        if name in out and len(out[name]) != len(sources):
            del out[name]  # biases on some layers only: rows would not line up with layers
    return out


def _named_parts(src: QKSource) -> list[tuple[str, Part]]:
    parts = [("qk.q_weight_norm", src.q_weight), ("qk.k_weight_norm", src.k_weight)]
    parts += [(n, b) for n, b in (("qk.q_bias_norm", src.q_bias), ("qk.k_bias_norm",
                                                                    src.k_bias)) if b is not None]
    return parts


def _norm(part: Part, kind: str, hd: int) -> torch.Tensor:
    t = part.get()
    if t.dim() == 1:
        return torch.linalg.vector_norm(t.reshape(-1, hd), dim=1, dtype=torch.float32)
    if kind == "rows":
        per = t.reshape(-1, hd, t.shape[-1])
        return torch.linalg.vector_norm(per, dim=(1, 2), dtype=torch.float32)
    per = t.reshape(t.shape[0], -1, hd)
    return torch.linalg.vector_norm(per, dim=(0, 2), dtype=torch.float32)


def qk_items(sources: list[QKSource]) -> list[tuple[torch.Tensor, nn.Module | None, str | None,
                                                      int]]:
    """``(param, owner, name, axis)`` of every q/k part, in the order :func:`qk_norms`
    expects their reduced sums (``Sharding.plan`` lays the exchange out from it)."""
    return [(p.param, p.owner, p.name, p.axis) for src in sources for _, p in _named_parts(src)]


def _sharded_norms(sources: list[QKSource], sums: list[torch.Tensor]
                   ) -> dict[str, list[torch.Tensor]]:
    """Per-head norms from per-index squared sums along the head axis (rows of a Linear,
    columns of a Conv1D, entries of a bias), summed over ranks by the step's exchange."""
    named = [(name, part, src.head_dim) for src in sources for name, part in _named_parts(src)]
    out: dict[str, list[torch.Tensor]] = {}
    for (name, part, hd), per_index in zip(named, sums, strict=True):
        stop = per_index.shape[0] if part.stop is None else part.stop
        heads = per_index[part.start : stop].reshape(-1, hd).sum(dim=1).sqrt()
        out.setdefault(name, []).append(heads)
    return out
