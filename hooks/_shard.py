"""Sharded parameters (FSDP2/DTensor, FSDP1 flat shards): global norms and lock-step sampling.

Under sharding a rank holds a piece of each parameter (and of its gradient), so a global
norm needs one collective. :func:`find_sharding` recognises, once at attach time:

* **DTensor** parameters (FSDP2 ``fully_shard``, tensor parallel): gradient norms go
  through ``torch.nn.utils.get_total_norm``, which reduces across the mesh itself;
* **FSDP1** (``FullyShardedDataParallel``, sharded strategies): each rank's flat-parameter
  shard gives a rank-local norm; the global one is ``sqrt(all_reduce(sum of local
  squares))``, exactly as ``FullyShardedDataParallel.clip_grad_norm_`` computes it.

Per-head q/k norms are computed from each rank's local piece: squared sums per row (or
column), placed at the piece's global offset, summed over ranks by **one** ``all_reduce``
for all layers (a few floats per head) instead of all-gathering every q/k weight.

Every collective here must be entered by every rank at the same point, so the monitor
samples the same steps on every rank: :meth:`Sharding.agree_interval` makes the ranks
agree on the next interval at the end of each sampled step (one small ``all_reduce``).
Nothing here runs on a non-sampled step.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Sharding", "find_sharding", "is_dtensor", "plain"]


def _dtensor_type() -> type | None:
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor`` (no import if never used)."""
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value as a plain tensor; other tensors unchanged.

    Replicated DTensors (what ``get_total_norm``/``clip_grad_norm_`` return for DTensor
    gradients) are read locally; any other placement needs ``full_tensor()``, a
    collective, which callers only reach where every rank reaches it too.
    """
    if not is_dtensor(t):
        return t
    if all(type(p).__name__ == "Replicate" for p in t.placements):  # type: ignore[attr-defined]
        return t.to_local()  # type: ignore[attr-defined]
    return t.full_tensor()  # type: ignore[attr-defined]


def _fsdp1_modules(model: nn.Module) -> list[nn.Module]:
    mod = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    cls = getattr(mod, "FullyShardedDataParallel", None) if mod is not None else None
    if cls is None:
        return []
    return list(cls.fsdp_modules(model))


@dataclass(frozen=True)
class _FlatSlot:
    """Where an original parameter lives in an FSDP1 flat parameter."""

    handle: Any
    index: int


class Sharding:
    """How ``model``'s parameters are split across ranks; see the module docstring."""

    def __init__(self, model: nn.Module, fsdp1: list[nn.Module], dtensor: bool) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.model = model
        self.dtensor = dtensor
        self._fsdp1 = fsdp1
        self._handles: list[Any] = []
        seen: set[int] = set()
        for m in fsdp1:
            h = getattr(m, "_handle", None)
            if h is not None and id(h) not in seen:
                seen.add(id(h))
                self._handles.append(h)
        # FSDP1 reduces over the root's process group (the intra-node group under hybrid
        # sharding, where shards are complete within the group); DTensors over their mesh
        # when it is one 1-D mesh (FSDP2, also per pipeline stage), else the whole job
        self.group = getattr(fsdp1[0], "process_group", None) if fsdp1 else _mesh_group(model)
        self._slots: dict[tuple[int, str], _FlatSlot] = {}
        for h in self._handles:
            for i, info in enumerate(getattr(h.flat_param, "_param_infos", ())):
                self._slots[(id(info.module), info.param_name)] = _FlatSlot(h, i)
        self.device = self._device()

    @property
    def fsdp1(self) -> bool:
        """Whether FSDP1 shards some parameters (a sharded strategy)."""
        return any(h.uses_sharded_strategy for h in self._handles)

    def _device(self) -> torch.device:
        for m in self._fsdp1:  # where FSDP1 computes (not the CPU under CPU offload)
            device = getattr(m, "compute_device", None)
            if isinstance(device, torch.device):
                return device
        for h in self._handles:
            return h.flat_param.device
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    def _is_group_leader(self) -> bool:
        return self._dist.get_rank(self.group) == 0

    # -- shapes ----------------------------------------------------------------------

    def shape_of(self, owner: nn.Module, name: str) -> torch.Size | None:
        """The unsharded shape of ``owner.<name>`` when FSDP1 flattened it, else None."""
        slot = self._slots.get((id(owner), name))
        if slot is None:
            return None
        return torch.Size(slot.handle.flat_param._shapes[slot.index])

    # -- sampling --------------------------------------------------------------------

    def agree_interval(self, proposal: int) -> int:
        """The widest of every rank's proposed interval (a collective, sampled steps only).

        Each rank proposes what its overhead budget and its collector's ``sample_every``
        ask for; all ranks then schedule the same next sampled step.
        """
        t = torch.tensor([proposal], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    # -- gradient norm ---------------------------------------------------------------

    def grad_norm(self, parameters: Iterable[torch.Tensor]) -> torch.Tensor | None:
        """Global L2 norm of the gradients, reduced across ranks where they are sharded.

        FSDP1: every rank enters the ``all_reduce`` even with no local gradient.
        Otherwise (DTensor or unsharded): ``global_grad_norm`` of ``parameters``.
        """
        if not self.fsdp1:
            from ._stats import global_grad_norm

            return global_grad_norm(parameters)
        sharded: list[torch.Tensor] = []
        other: list[torch.Tensor] = []
        seen: set[int] = set()
        for h in self._handles:
            target = sharded if h.uses_sharded_strategy else other
            params = h.flat_param._params if h._use_orig_params else [h.flat_param]
            for p in params or ():
                if id(p) not in seen:
                    seen.add(id(p))
                    if p.grad is not None:
                        target.append(p.grad)
        for p in self.model.parameters():  # not managed by FSDP: replicated
            if id(p) not in seen and p.grad is not None:
                seen.add(id(p))
                other.append(p.grad)
        with torch.no_grad():
            sq = _square_sum(sharded, self.device)
            self._dist.all_reduce(sq, group=self.group)
            total = sq + _square_sum(other, self.device)
        return total.sqrt()

    # -- q/k per-axis squared sums -----------------------------------------------------

    def axis_square_sums(
        self, items: Sequence[tuple[torch.Tensor, nn.Module | None, str | None, int]]
    ) -> list[torch.Tensor]:
        """For each ``(param, owner, name, axis)``: the squared sum of the whole parameter
        per index along ``axis`` (float32, unsharded length), reduced across ranks with a
        single ``all_reduce``. Parameters listed twice are computed once."""
        cache: dict[tuple[int, int], torch.Tensor] = {}
        parts: list[torch.Tensor] = []
        keys: list[tuple[int, int]] = []
        with torch.no_grad():
            for param, owner, name, axis in items:
                key = (id(param), axis)
                keys.append(key)
                if key in cache:
                    continue
                cache[key] = self._local_sums(param, owner, name, axis)
                parts.append(cache[key])
            if not parts:
                return []
            flat = torch.cat([p.to(self.device) for p in parts])
            self._dist.all_reduce(flat, group=self.group)
            pos = 0
            reduced: dict[tuple[int, int], torch.Tensor] = {}
            for key, part in cache.items():
                reduced[key] = flat[pos : pos + part.numel()]
                pos += part.numel()
        return [reduced[k] for k in keys]

    def _local_sums(
        self, param: torch.Tensor, owner: nn.Module | None, name: str | None, axis: int
    ) -> torch.Tensor:
        slot = self._slots.get((id(owner), name)) if owner is not None and name else None
        if slot is not None:
            return self._flat_sums(slot, axis)
        if is_dtensor(param):
            return self._dtensor_sums(param, axis)
        # replicated: counted once, by the group's first rank
        sums = _sums_along(param.detach(), axis)
        return sums if self._is_group_leader() else torch.zeros_like(sums)

    def _flat_sums(self, slot: _FlatSlot, axis: int) -> torch.Tensor:
        flat_param = slot.handle.flat_param
        shape = torch.Size(flat_param._shapes[slot.index])
        out = torch.zeros(shape[axis], dtype=torch.float32, device=flat_param.device)
        if not slot.handle.uses_sharded_strategy and not self._is_group_leader():
            return out  # NO_SHARD: every rank holds it all; counted once
        info = flat_param._shard_param_infos[slot.index]
        if not info.in_shard or not info.numel_in_shard:
            return out
        shard = getattr(flat_param, "_local_shard", None)
        shard = flat_param if shard is None else shard
        local = shard.detach()[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard]
        idx = torch.arange(info.intra_param_start_idx, info.intra_param_end_idx + 1,
                           device=local.device)
        stride = 1
        for size in shape[axis + 1 :]:
            stride *= size
        out.index_add_(0, (idx // stride) % shape[axis], local.float().square())
        return out

    def _dtensor_sums(self, param: Any, axis: int) -> torch.Tensor:
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        mesh, placements = param.device_mesh, param.placements
        if not all(type(p) in (Shard, Replicate) for p in placements):
            # strided/partial layouts: gather the whole value (a collective on the mesh)
            sums = _sums_along(param.full_tensor().detach(), axis)
            return sums if self._is_group_leader() else torch.zeros_like(sums)
        local = param.to_local().detach()
        out = torch.zeros(param.shape[axis], dtype=torch.float32, device=local.device)
        coord = mesh.get_coordinate()
        if coord is None or any(type(p) is Replicate and c != 0
                                for p, c in zip(placements, coord, strict=True)):
            return out  # a replica: its twin on coordinate 0 counts
        _, offset = compute_local_shape_and_global_offset(param.shape, mesh, placements)
        if local.numel():
            start = offset[axis]
            out[start : start + local.shape[axis]] += _sums_along(local, axis)
        return out


def _mesh_group(model: nn.Module) -> Any:
    meshes: dict[int, Any] = {}
    for p in model.parameters():
        if is_dtensor(p):
            mesh = p.device_mesh  # type: ignore[attr-defined]
            meshes[id(mesh)] = mesh
    if len(meshes) == 1:
        (mesh,) = meshes.values()
        if mesh.ndim == 1:
            return mesh.get_group()
    return None


def _sums_along(t: torch.Tensor, axis: int) -> torch.Tensor:
    """Squared sum per index of dim ``axis`` (float32)."""
    sq = t.float().square()
    dims = [d for d in range(t.dim()) if d != axis]
    return sq.sum(dim=dims) if dims else sq


def _square_sum(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squares of all ``grads`` as a float32 scalar on ``device`` (0 if none)."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        if g.numel():
            norm = torch.linalg.vector_norm(g.detach(), 2.0, dtype=torch.float32)
            total += norm.square().to(device)
    return total


def find_sharding(model: nn.Module) -> Sharding | None:
    """A :class:`Sharding` when ``torch.distributed`` is initialised and ``model`` has
    DTensor parameters or FSDP1 modules; else None (plain, DDP: nothing to reduce)."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    fsdp1 = _fsdp1_modules(model)
    dtensor = any(is_dtensor(p) for p in model.parameters())
    if not fsdp1 and not dtensor:
        return None
    return Sharding(model, fsdp1, dtensor)
