"""Per-head norms of the query/key projections (weights and biases).

Found once at attach time, computed on sampled steps at the end of the step (after the
optimizer update). Layouts understood:

* separate projections: ``q_proj``/``k_proj`` (Llama, Qwen, Gemma, Mistral, ViT...) or
  ``query``/``key`` (BERT-style), ``nn.Linear`` with ``H·D`` output rows;
* GPT-2's fused ``c_attn`` (``Conv1D``, weight ``(in, 3E)``: q = columns ``[0, E)``,
  k = ``[E, 2E)``, head ``h`` = its ``D`` columns);
* ``nn.MultiheadAttention``: fused ``in_proj_weight`` ``(3E, E)`` (q = rows ``[0, E)``,
  k = ``[E, 2E)``) or separate ``q_proj_weight``/``k_proj_weight``.

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

__all__ = ["Part", "QKSource", "find_qk", "qk_items", "qk_norms"]


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


def _part(owner: nn.Module, name: str, axis: int = 0, start: int = 0,
          stop: int | None = None) -> Part | None:
    t = getattr(owner, name, None)
    return Part(t, axis, start, stop, owner, name) if isinstance(t, torch.Tensor) else None


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None


def _head_dim(module: nn.Module, q_out: int) -> int | None:
    hd = _int(getattr(module, "head_dim", None)) or _int(
        getattr(module, "attention_head_size", None))
    if hd:
        return hd
    config = getattr(module, "config", None)
    hd = _int(getattr(config, "head_dim", None))
    if hd:
        return hd
    heads = (_int(getattr(module, "num_heads", None))
             or _int(getattr(module, "num_attention_heads", None))
             or _int(getattr(config, "num_attention_heads", None)))
    return q_out // heads if heads and q_out % heads == 0 else None


def _source(module: nn.Module, shape_of: ShapeOf) -> QKSource | None:
    if isinstance(module, nn.MultiheadAttention):
        e, hd = module.embed_dim, module.head_dim
        qb = _part(module, "in_proj_bias", 0, 0, e)
        kb = _part(module, "in_proj_bias", 0, e, 2 * e)
        if module.in_proj_weight is not None:
            q, k = _part(module, "in_proj_weight", 0, 0, e), _part(module, "in_proj_weight", 0,
                                                                   e, 2 * e)
        else:
            q, k = _part(module, "q_proj_weight"), _part(module, "k_proj_weight")
        return QKSource("rows", q, k, qb, kb, hd) if q is not None and k is not None else None
    c_attn = getattr(module, "c_attn", None)
    if c_attn is not None and not getattr(module, "is_cross_attention", False):
        w = getattr(c_attn, "weight", None)
        e = _int(getattr(module, "embed_dim", None))
        hd = _int(getattr(module, "head_dim", None))
        shape = shape_of(c_attn, "weight") or (w.shape if isinstance(w, torch.Tensor) else None)
        if isinstance(w, torch.Tensor) and shape is not None and len(shape) == 2 and e and hd \
                and shape[1] == 3 * e:
            return QKSource("cols", Part(w, 1, 0, e, c_attn, "weight"),
                            Part(w, 1, e, 2 * e, c_attn, "weight"),
                            _part(c_attn, "bias", 0, 0, e), _part(c_attn, "bias", 0, e, 2 * e), hd)
    for q_name, k_name in (("q_proj", "k_proj"), ("query", "key")):
        q, k = getattr(module, q_name, None), getattr(module, k_name, None)
        if isinstance(q, nn.Linear) and isinstance(k, nn.Linear):
            hd = _head_dim(module, q.out_features)
            if hd and q.out_features % hd == 0 and k.out_features % hd == 0:
                return QKSource("rows", Part(q.weight, owner=q, name="weight"),
                                Part(k.weight, owner=k, name="weight"), _part(q, "bias"),
                                _part(k, "bias"), hd)
    return None


def _no_shape(owner: nn.Module, name: str) -> torch.Size | None:
    return None


def find_qk(model: nn.Module, shape_of: ShapeOf | None = None) -> list[QKSource]:
    """One :class:`QKSource` per attention module of ``model``, in module order.

    Parameters are referenced, not copied, and sliced at measurement time, so every
    in-place optimizer update is seen (a parameter *replaced* later is not followed).
    ``shape_of(owner, name)`` gives a parameter's unsharded shape where sharding
    flattened it (FSDP1, ``Sharding.shape_of``).
    """
    shape_of = shape_of or _no_shape
    return [src for module in model.modules() if (src := _source(module, shape_of)) is not None]


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
