"""Sharded parameters (FSDP2/DTensor, FSDP1 flat shards): global norms and lock-step sampling.

Under sharding a rank holds a piece of each parameter (and of its gradient), so a global
norm needs a collective. :func:`find_sharding` recognises, once at attach time:

* **DTensor** parameters (FSDP2 ``fully_shard``, tensor parallel): a gradient's local
  piece (``to_local()``; a replica counted once, at mesh coordinate 0);
* **FSDP1** (``FullyShardedDataParallel``, sharded strategies): each rank's flat-parameter
  shard. The global norm is ``sqrt(all_reduce(sum of local squares) + replicated)``,
  exactly as ``FullyShardedDataParallel.clip_grad_norm_`` computes it.

Per-head q/k norms come from each rank's local piece: squared sums per row (or column),
placed at the piece's global offset, summed over ranks instead of all-gathering weights.

**The exchange.** A part of the monitor may fail on one rank only (an OOM, a bug); if
that made the rank skip a collective, the other ranks would wait forever, or the skipped
``all_reduce`` would pair with the job's own next collective. So every collective here
runs at one place, the end of a sampled step, in a fixed order, whatever failed:

1. :meth:`Sharding.reduce`: one ``all_reduce(SUM)`` of a float32 vector whose layout
   :meth:`Sharding.plan` fixes at attach (and :meth:`Sharding.agree_layout` checks across
   ranks): ``[sharded grad squared sum, ranks missing grad, ranks missing q/k, q/k
   per-index squared sums...]``. A rank whose part is off or fails writes zeros and
   counts itself missing; values some rank did not contribute are then left out on every
   rank (a NaN *value*, e.g. a diverged gradient, still propagates as a real signal);
2. :meth:`Sharding.agree_schedule`: one ``all_reduce(MAX)``, the next sampling interval
   and whether some rank asks to sample the next step, so all ranks schedule the same
   next sampled step (under reduction over a group that is the sharding group or holds
   it, the reduce group's agreement takes its place, ``_reduce``).

Everything else here is local (no collective) and nothing here runs on a non-sampled step.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Sharding", "find_sharding", "is_dtensor", "plain"]

#: Exchange vector slots: the sharded grad squared sum, how many ranks did not contribute
#: it, how many did not contribute the q/k sums; the q/k per-index sums follow.
GRAD_SQ, GRAD_MISSING, QK_MISSING, QK_START = 0, 1, 2, 3


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
        self._qk_items: list[tuple[torch.Tensor, nn.Module | None, str | None, int]] = []
        self._qk_keys: list[tuple[int, int]] = []
        self._qk_offsets: dict[tuple[int, int], tuple[int, int]] = {}
        self.size = QK_START

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

    # -- the exchange: the monitor's only collectives ------------------------------------

    def plan(self, items: Sequence[tuple[torch.Tensor, nn.Module | None, str | None, int]]
             ) -> None:
        """Fix the exchange vector's layout at attach: the grad slots, then, for each unique
        ``(param, axis)`` of the q/k ``items``, the parameter's unsharded length along
        ``axis``. Raises (nothing planned for q/k) where a layout cannot be measured
        locally (DTensor placements other than ``Shard``/``Replicate``)."""
        self._qk_keys = []
        self._qk_offsets = {}
        size = QK_START
        keys: list[tuple[int, int]] = []
        offsets: dict[tuple[int, int], tuple[int, int]] = {}
        unique: list[tuple[torch.Tensor, nn.Module | None, str | None, int]] = []
        for param, owner, name, axis in items:
            key = (id(param), axis)
            keys.append(key)
            if key in offsets:
                continue
            slot = self._slots.get((id(owner), name)) if owner is not None and name else None
            if slot is not None:
                length = int(slot.handle.flat_param._shapes[slot.index][axis])
            else:
                if is_dtensor(param):
                    _check_placements(param.placements)  # type: ignore[attr-defined]
                length = int(param.shape[axis])
            offsets[key] = (size, length)
            unique.append((param, owner, name, axis))
            size += length
        self._qk_items = unique
        self._qk_keys, self._qk_offsets = keys, offsets
        self.size = size

    def agree_layout(self) -> bool:
        """At attach, on every rank: whether all ranks planned the same vector size (one
        ``all_reduce(MAX)`` of two integers). If not, the q/k slots are dropped on every
        rank, so the per-step exchange always has one size."""
        t = torch.tensor([self.size, -self.size], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        same = int(t[0]) == -int(t[1])
        if not same:
            self.plan([])
        return same

    @property
    def has_qk(self) -> bool:
        """Whether the exchange carries q/k sums."""
        return bool(self._qk_offsets)

    def new_vector(self) -> torch.Tensor:
        """A zeroed exchange vector (float32, :attr:`size`) on the exchange device."""
        return torch.zeros(self.size, dtype=torch.float32, device=self.device)

    def put_grad(self, vec: torch.Tensor, sharded_sq: torch.Tensor | None) -> None:
        """Write this rank's sharded grad squared sum, or mark it missing (``None``)."""
        if sharded_sq is None:
            vec[GRAD_MISSING] = 1.0
        else:
            vec[GRAD_SQ : GRAD_SQ + 1].copy_(sharded_sq.detach().float().reshape(1))

    def put_qk(self, vec: torch.Tensor) -> None:
        """Write this rank's per-index q/k squared sums at their planned offsets (each
        parameter once, e.g. GPT-2's fused ``c_attn`` holds both q and k)."""
        with torch.no_grad():
            for param, owner, name, axis in self._qk_items:
                start, length = self._qk_offsets[(id(param), axis)]
                sums = self._local_sums(param, owner, name, axis)
                if sums.shape != (length,):
                    raise RuntimeError(f"q/k sums of shape {tuple(sums.shape)}, planned "
                                       f"({length},) at attach: the layout changed")
                vec[start : start + length].copy_(sums)

    def mark_qk_missing(self, vec: torch.Tensor) -> None:
        """Zero the q/k slots and count this rank as not contributing them."""
        vec[QK_START:].zero_()
        vec[QK_MISSING] = 1.0

    def reduce(self, vec: torch.Tensor) -> None:
        """Sum ``vec`` over the group, in place: the step's one ``all_reduce(SUM)``."""
        self._dist.all_reduce(vec, group=self.group)

    def qk_sums(self, vec: torch.Tensor) -> list[torch.Tensor]:
        """The reduced per-index squared sums, one per planned q/k item (in order)."""
        out = []
        for key in self._qk_keys:
            start, length = self._qk_offsets[key]
            out.append(vec[start : start + length])
        return out

    def agree_schedule(self, proposal: int, force: bool) -> tuple[int, bool]:
        """The widest of every rank's proposed interval, and whether some rank asks to
        sample the next step (a collective, sampled steps only, one ``all_reduce(MAX)`` of
        two int64s).

        Each rank proposes what its overhead budget and its collector's ``sample_every``
        ask for; all ranks then schedule the same next sampled step. Under reduction over a
        group narrower than this one (``_reduce``), the reduce group's agreed values are
        agreed here again, so that every rank of the sharding group samples alike.
        """
        t = torch.tensor([int(proposal), int(bool(force))], dtype=torch.int64,
                         device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        interval, forced = t.tolist()
        return max(1, int(interval)), bool(forced)

    # -- gradient: local pieces only ----------------------------------------------------

    def local_grad_sums(self, parameters: Iterable[torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sharded, replicated)`` float32 squared sums of this rank's gradients; no
        collective. The global squared norm is ``all_reduce(sharded) + replicated``.

        FSDP1: flat-parameter shards (sharded strategies) vs ``NO_SHARD`` handles and
        parameters FSDP does not manage. Otherwise ``parameters``: DTensor gradients by
        their local piece (a replica counted once, at mesh coordinate 0), plain ones as
        replicated. Raises for DTensor placements that have no local square sum.
        """
        sharded: list[torch.Tensor] = []
        other: list[torch.Tensor] = []
        seen: set[int] = set()
        if self._handles:
            for h in self._handles:
                target = sharded if h.uses_sharded_strategy else other
                params = h.flat_param._params if h._use_orig_params else [h.flat_param]
                for p in params or ():
                    if id(p) not in seen:
                        seen.add(id(p))
                        if p.grad is not None:
                            target.append(p.grad)
            parameters = self.model.parameters()  # not managed by FSDP: replicated
        for p in parameters:
            if id(p) in seen or p.grad is None:
                continue
            seen.add(id(p))
            g = p.grad
            if is_dtensor(g):
                local = _dtensor_local(g)
                if local is not None:
                    sharded.append(local)
            else:
                other.append(g)
        with torch.no_grad():
            return _square_sum(sharded, self.device), _square_sum(other, self.device)

    # -- q/k per-axis squared sums (local) ---------------------------------------------

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
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        mesh, placements = param.device_mesh, param.placements
        _check_placements(placements)
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


def _check_placements(placements: Sequence[Any]) -> None:
    names = [type(p).__name__ for p in placements]
    if any(n not in ("Shard", "Replicate") for n in names):
        raise ValueError(f"DTensor placements {names}: only Shard/Replicate pieces have a "
                         "local square sum; this part is not measured under this layout")


def _dtensor_local(g: Any) -> torch.Tensor | None:
    """A DTensor's local piece for a global square sum, or None where a replica on
    another mesh coordinate counts it (no collective)."""
    _check_placements(g.placements)
    coord = g.device_mesh.get_coordinate()
    if coord is None or any(type(p).__name__ == "Replicate" and c != 0
                            for p, c in zip(g.placements, coord, strict=True)):
        return None
    return g.to_local()


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
