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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Part", "QKSource", "find_qk", "qk_norms"]


@dataclass
class Part:
    """A parameter and the ``[start, stop)`` range of its dim ``axis`` that one of q/k
    occupies (sliced only under ``no_grad`` when measured: no autograd node is kept)."""

    param: torch.Tensor
    axis: int = 0
    start: int = 0
    stop: int | None = None

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


def _opt(t: object, start: int = 0, stop: int | None = None) -> Part | None:
    return Part(t, 0, start, stop) if isinstance(t, torch.Tensor) else None


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


def _source(module: nn.Module) -> QKSource | None:
    if isinstance(module, nn.MultiheadAttention):
        e, hd = module.embed_dim, module.head_dim
        bias = module.in_proj_bias
        qb, kb = _opt(bias, 0, e), _opt(bias, e, 2 * e)
        if module.in_proj_weight is not None:
            w = module.in_proj_weight
            return QKSource("rows", Part(w, 0, 0, e), Part(w, 0, e, 2 * e), qb, kb, hd)
        return QKSource("rows", Part(module.q_proj_weight), Part(module.k_proj_weight),
                        qb, kb, hd)
    c_attn = getattr(module, "c_attn", None)
    if c_attn is not None and not getattr(module, "is_cross_attention", False):
        w = getattr(c_attn, "weight", None)
        e = _int(getattr(module, "embed_dim", None))
        hd = _int(getattr(module, "head_dim", None))
        if isinstance(w, torch.Tensor) and w.dim() == 2 and e and hd and w.shape[1] == 3 * e:
            b = getattr(c_attn, "bias", None)
            return QKSource("cols", Part(w, 1, 0, e), Part(w, 1, e, 2 * e),
                            _opt(b, 0, e), _opt(b, e, 2 * e), hd)
    for q_name, k_name in (("q_proj", "k_proj"), ("query", "key")):
        q, k = getattr(module, q_name, None), getattr(module, k_name, None)
        if isinstance(q, nn.Linear) and isinstance(k, nn.Linear):
            hd = _head_dim(module, q.out_features)
            if hd and q.out_features % hd == 0 and k.out_features % hd == 0:
                return QKSource("rows", Part(q.weight), Part(k.weight), _opt(q.bias),
                                _opt(k.bias), hd)
    return None


def find_qk(model: nn.Module) -> list[QKSource]:
    """One :class:`QKSource` per attention module of ``model``, in module order.

    Parameters are referenced, not copied, and sliced at measurement time, so every
    in-place optimizer update is seen (a parameter *replaced* later is not followed).
    """
    return [src for module in model.modules() if (src := _source(module)) is not None]


def qk_norms(sources: list[QKSource]) -> dict[str, list[torch.Tensor]]:
    """``{"qk.q_weight_norm": [per layer (H,)], ...}``; biases only where present."""
    out: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for src in sources:
            hd = src.head_dim
            for name, w in (("qk.q_weight_norm", src.q_weight), ("qk.k_weight_norm",
                                                                  src.k_weight)):
                w = w.get()
                if src.kind == "rows":
                    per = w.reshape(-1, hd, w.shape[-1])
                    norm = torch.linalg.vector_norm(per, dim=(1, 2), dtype=torch.float32)
                else:
                    per = w.reshape(w.shape[0], -1, hd)
                    norm = torch.linalg.vector_norm(per, dim=(0, 2), dtype=torch.float32)
                out.setdefault(name, []).append(norm)
            for name, b in (("qk.q_bias_norm", src.q_bias), ("qk.k_bias_norm", src.k_bias)):
                if b is not None:
                    norm = torch.linalg.vector_norm(b.get().reshape(-1, hd), dim=1,
                                                    dtype=torch.float32)
                    out.setdefault(name, []).append(norm)
    for name in ("qk.q_bias_norm", "qk.k_bias_norm"):
        if name in out and len(out[name]) != len(sources):
            del out[name]  # biases on some layers only: rows would not line up with layers
    return out
