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

from ._workspace import workspace

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
        with torch.no_grad():
            out = _batched_norms(sources)
            if out is None:
                out = {}
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


def _batched_norms(sources: list[QKSource]) -> dict[str, list[torch.Tensor]] | None:
    """Every part's per-head norms in a few operations, or None (mixed devices or
    dtypes, subclassed tensors such as DTensors, a part the plain layout does not fit:
    the caller measures part by part).

    Per parameter, the squared sums along the non-head dimension over the index range
    its q/k parts cover (a fused ``c_attn`` is read once for both q and k, its v part
    not at all). Then, for all parts together, one concatenation of their ranges, summed
    per head and square-rooted. Per-part ``vector_norm`` calls on strided per-head views
    cost ~60-80 µs each in a training step on CPU (16 on the bench's 4-layer GPT-2,
    1.0-1.3 ms).
    """
    named = [(name, part, src) for src in sources for name, part in _named_parts(src)]
    if not named:
        return {}
    hd = sources[0].head_dim
    first = named[0][1].param
    spans: dict[tuple[int, int], list[int]] = {}  # (param id, axis) -> [start, stop]
    params: dict[tuple[int, int], torch.Tensor] = {}
    for _, part, src in named:
        t = part.param
        if (type(t) is not torch.Tensor and type(t) is not nn.Parameter) or \
                src.head_dim != hd or t.device != first.device or t.dtype != first.dtype \
                or not t.dtype.is_floating_point or t.dim() not in (1, 2) \
                or part.axis >= t.dim() or (t.dim() == 2 and part.axis != (
                    0 if src.kind == "rows" else 1)):
            return None
        stop = t.shape[part.axis] if part.stop is None else part.stop
        if (stop - part.start) % hd or stop <= part.start:
            return None
        key = (id(t), part.axis)
        span = spans.get(key)
        if span is None:
            spans[key] = [part.start, stop]
            params[key] = t
        else:
            span[0], span[1] = min(span[0], part.start), max(span[1], stop)
    per_index: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}  # squared sums
    for key, (start, stop) in spans.items():
        t = params[key].detach().narrow(key[1], start, stop - start)
        if t.dim() == 1:
            per_index[key] = (t.float().square(), start)
        elif key[1] == 0:  # heads along rows: a contiguous reduction per row
            per_index[key] = (torch.linalg.vector_norm(t, dim=1, dtype=torch.float32)
                              .square_(), start)
        else:  # along columns (Conv1D): squares summed over the outer dimension (a norm
            # over dim 0 is 3-5x slower on CPU)
            buf = workspace(t.device).get("qk", t.shape, torch.float32, t.device)
            sq = torch.mul(t, t, out=buf) if t.dtype == torch.float32 else (
                buf.copy_(t).square_())
            per_index[key] = (sq.sum(dim=0), start)
    pieces, sizes = [], []
    for _, part, _ in named:
        norms, start = per_index[(id(part.param), part.axis)]
        stop = part.param.shape[part.axis] if part.stop is None else part.stop
        pieces.append(norms[part.start - start : stop - start])
        sizes.append((stop - part.start) // hd)
    heads = torch.cat(pieces).view(-1, hd).sum(dim=1).sqrt_()
    out: dict[str, list[torch.Tensor]] = {}
    for (name, _, _), row in zip(named, heads.split(sizes), strict=True):
        out.setdefault(name, []).append(row)
    return out


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
