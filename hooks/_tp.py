"""Tensor parallelism: where this rank's attention heads sit in the full layer x head matrix.

Under tensor parallelism each rank of a TP group of size ``tp`` computes ``H / tp`` heads
of every attention layer (the q/k/v projections split column-wise by head), so its own
per-head statistics are one slice of each layer's row. With reduction on (``_reduce``),
each rank writes its slice at ``tp_rank * H / tp`` of a ``tp`` times wider row, the
other TP ranks leave theirs "missing", and the group's reduction (max, sums) assembles the
full matrix while it reduces over the data-parallel replicas of each slice: the leader's
frame holds all ``H`` heads of every layer, in order.

Where it comes from (:func:`find_tp`):

* explicitly: ``attach(tp_group=<the TP process group>)``, the rank's place in head order
  being its rank in that group (``tp_rank=`` when it is another);
* or from DTensor placements: a q/k projection weight (``q_proj``/``k_proj``, ``query``/
  ``key``, ``wq``/``wk``, fused ``qkv``/``c_attn``...) sharded on its output dimension
  (``Shard(0)``: whole heads per rank) along a mesh dimension of more than one rank named
  like a TP one (``tp``, ``tensor``, ``model``), or along an unnamed one-dimensional mesh
  when no FSDP2 module shards the same weights (FSDP2 also shards on dim 0, but its ranks
  compute every head).

Heads must split evenly (``H`` a multiple of ``tp``) and in rank order, as column-wise
sharding does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ._qk_find import FUSED, SEPARATE
from ._shard import is_dtensor

__all__ = ["TensorParallel", "find_tp"]

_QK = {n for pair in SEPARATE for n in pair} | set(FUSED)
_TP_NAMES = ("tp", "tensor", "tensor_parallel", "model")


@dataclass(frozen=True)
class TensorParallel:
    """This rank's heads are ``[rank * h, (rank + 1) * h)`` of each layer's ``size * h``."""

    size: int
    rank: int
    #: The global ranks of this rank's TP group, when known (``find_reduce`` checks that
    #: the reduce group holds them all).
    members: tuple[int, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor parallel: rank {self.rank} of {self.size}")


def find_tp(model: nn.Module, tp_group: Any = None, tp_rank: int | None = None
            ) -> TensorParallel | None:
    """The tensor-parallel placement of this rank's heads, or None (every rank computes
    every head). ``tp_group``/``tp_rank``: see ``attach``."""
    if tp_group is not None:
        import torch.distributed as dist

        size = int(dist.get_world_size(tp_group))
        rank = int(dist.get_rank(tp_group)) if tp_rank is None else int(tp_rank)
        return TensorParallel(size, rank, _members(tp_group)) if size > 1 else None
    if tp_rank is not None:
        raise ValueError("attach: tp_rank needs tp_group")
    fsdp2 = any(type(m).__name__.startswith("FSDP") for m in model.modules())
    for name, param in model.named_parameters():
        parts = name.split(".")
        if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in _QK:
            continue
        if not is_dtensor(param):
            continue
        found = _from_placements(param, fsdp2)
        if found is not None:
            return found
    return None


def _from_placements(param: Any, fsdp2: bool) -> TensorParallel | None:
    mesh = param.device_mesh
    names = getattr(mesh, "mesh_dim_names", None)
    for dim, placement in enumerate(param.placements):
        if type(placement).__name__ != "Shard" or getattr(placement, "dim", None) != 0:
            continue
        if mesh.size(dim) < 2:
            continue
        named = names[dim].lower() if names else ""
        if named.startswith(_TP_NAMES) or (not names and mesh.ndim == 1 and not fsdp2):
            try:
                members = _members(mesh.get_group(dim))
            except Exception:
                members = None
            return TensorParallel(int(mesh.size(dim)), int(mesh.get_local_rank(dim)), members)
    return None


def _members(group: Any) -> tuple[int, ...] | None:
    """The global ranks of ``group``, or None where they cannot be read."""
    try:
        import torch.distributed as dist

        return tuple(int(r) for r in dist.get_process_group_ranks(group))
    except Exception:
        return None
