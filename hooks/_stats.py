"""Pure tensor statistics for the hooks: attention logits and gradient norms.

Everything here runs under ``torch.no_grad()`` on detached inputs, computes in float32,
returns tensors on the input's device and never reads a value back to the host (no
``.item()``, no ``bool(tensor)``): control flow depends on shapes only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = [
    "MASKED_BELOW",
    "attention_logit_stats",
    "global_grad_norm",
    "top_quantile",
    "valid_pairs",
]

#: A float (additive) mask entry at or below this value marks a pair as not attended
#: (HF uses the dtype's minimum, others -inf or -1e4..-1e9).
MASKED_BELOW = -1e4

#: Logit elements materialised at once (float32: 512 MiB); heads are processed in chunks.
_CHUNK_ELEMENTS = 1 << 27


def valid_pairs(
    attn_mask: torch.Tensor | None, *, is_causal: bool, t: int, s: int, device: torch.device
) -> torch.Tensor | None:
    """Boolean "query may attend key" mask broadcastable to ``(..., T, S)``, or None (all).

    Args:
        attn_mask: As given to SDPA or HF eager attention: bool (True = attend) or float
            (additive; entries ``<= MASKED_BELOW``, ``-inf`` or NaN are not attended).
            A last dimension longer than ``s`` is cut to ``s`` (as HF eager does).
        is_causal: Add SDPA's causal mask (top-left aligned: query i sees keys ``<= i``).
    """
    valid: torch.Tensor | None = None
    if attn_mask is not None:
        mask = attn_mask.detach()
        if mask.shape[-1] > s:
            mask = mask[..., :s]
        valid = mask if mask.dtype == torch.bool else mask > MASKED_BELOW
    if is_causal:
        causal = torch.ones(t, s, dtype=torch.bool, device=device).tril()
        valid = causal if valid is None else valid & causal
    return valid


def top_quantile(values: torch.Tensor, n_valid: torch.Tensor, percent: int = 99) -> torch.Tensor:
    """Exact per-row percentile of the valid entries, NumPy's default 'linear' method.

    Invalid entries must hold ``-inf`` so that they sort last. Only the top
    ``ceil((100 - percent) / 100 * M) + 2`` values of each row are selected (``topk``),
    which is where the percentile of any number of valid entries lies; the interpolation
    indices are computed on the device from ``n_valid`` in exact integer arithmetic.

    Args:
        values: ``(R, M)`` float tensor.
        n_valid: ``(R,)`` integer tensor, number of valid entries per row.
        percent: An integer percentile in ``[50, 100]``.

    Returns:
        ``(R,)`` tensor; ``-inf`` for a row without valid entries.
    """
    if not 50 <= percent <= 100:
        raise ValueError(f"percent must be in [50, 100], got {percent}")
    rows, m = values.shape
    if m == 0:
        return values.new_full((rows,), -math.inf)
    k = min(m, ((100 - percent) * m + 99) // 100 + 2)
    top = values.topk(k, dim=1, largest=True, sorted=True).values  # descending
    last = (n_valid.to(torch.int64) - 1).clamp(min=0)  # ascending index of the largest
    num = percent * last
    lo = num // 100  # ascending index below the quantile
    frac = (num % 100).to(values.dtype) / 100
    hi = torch.minimum(lo + 1, last)
    below = top.gather(1, (last - lo).clamp(0, k - 1).unsqueeze(1)).squeeze(1)
    above = top.gather(1, (last - hi).clamp(0, k - 1).unsqueeze(1)).squeeze(1)
    out = torch.lerp(below, above, frac)  # the same two-sided formula as NumPy's _lerp
    return torch.where(n_valid > 0, out, torch.full_like(out, -math.inf))


def _as_bhtd(x: torch.Tensor) -> torch.Tensor:
    """View SDPA's ``(..., L, E)`` layouts as ``(B, H, L, E)``.

    ``(N, L, E)`` is N sequences of one head; more than 4 dims fold into the batch.
    """
    if x.dim() == 4:
        return x
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() < 3:
        return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))
    return x.reshape(-1, *x.shape[-3:])


def attention_logit_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head max and p99 of the pre-softmax logits ``q·kᵀ·scale`` over valid pairs.

    Pairs are pooled per head over batch, queries and keys; masked pairs (causal,
    padding, any bool/float mask) are excluded. Keys with fewer heads than queries
    (GQA/MQA) are repeated as ``repeat_interleave`` (HF ``repeat_kv``, SDPA
    ``enable_gqa``).

    Args:
        query: ``(B, H, T, D)`` (SDPA's other layouts are accepted).
        key: ``(B, H_kv, S, D)`` with ``H % H_kv == 0``.
        attn_mask: Bool or additive float mask broadcastable to ``(B, H, T, S)``.
        is_causal: SDPA's causal flag.
        scale: Logit scale; default ``D ** -0.5``.

    Returns:
        ``(max, p99)``, two float32 ``(H,)`` tensors on the query's device (``-inf``
        for a head without valid pairs).
    """
    with torch.no_grad():
        full_shape = tuple(query.shape[:-1]) + (key.shape[-2],)
        q = _as_bhtd(query.detach())
        k = _as_bhtd(key.detach())
        b, h, t, d = q.shape
        s = k.shape[2]
        if k.shape[1] != h:
            if k.shape[1] == 0 or h % k.shape[1]:
                raise ValueError(f"{h} query heads cannot share {k.shape[1]} key heads")
            k = k.repeat_interleave(h // k.shape[1], dim=1)
        scale = d**-0.5 if scale is None else float(scale)
        valid = valid_pairs(attn_mask, is_causal=is_causal, t=t, s=s, device=q.device)
        if valid is not None and query.dim() != 4:
            valid = torch.broadcast_to(valid, full_shape)
            valid = _as_bhtd(valid)
        if valid is not None:
            valid = valid.reshape((1,) * (4 - valid.dim()) + tuple(valid.shape))
        per_head = max(1, b * t * s)
        chunk = max(1, _CHUNK_ELEMENTS // per_head)
        maxima, quantiles = [], []
        for h0 in range(0, h, chunk):
            h1 = min(h, h0 + chunk)
            logits = torch.matmul(q[:, h0:h1].float(), k[:, h0:h1].float().transpose(-1, -2))
            logits = logits * scale
            if valid is None:
                n = torch.full((h1 - h0,), b * t * s, dtype=torch.int64, device=q.device)
            else:
                v = valid if valid.shape[1] == 1 else valid[:, h0:h1]
                v = v.expand(b, h1 - h0, t, s)
                logits = logits.masked_fill(~v, -math.inf)
                n = v.sum(dim=(0, 2, 3))
            flat = logits.transpose(0, 1).reshape(h1 - h0, -1)
            maxima.append(flat.amax(dim=1) if flat.shape[1] else n.float() - math.inf)
            quantiles.append(top_quantile(flat, n, 99))
        return torch.cat(maxima), torch.cat(quantiles)


def global_grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """Global L2 norm of the ``.grad`` of ``parameters`` (float32, on the device), or None.

    Same value as ``torch.nn.utils.clip_grad_norm_`` returns (grouped ``_foreach_norm``),
    without clipping and without a host sync.
    """
    with torch.no_grad():
        grads = [p.grad.detach() for p in parameters if p.grad is not None]
        if not grads:
            return None
        get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
        if get_total_norm is not None:  # torch >= 2.6
            return get_total_norm(grads, 2.0, False, None).float()
        device = grads[0].device
        norms = [n.to(device) for n in torch._foreach_norm(grads, 2.0)]
        return torch.linalg.vector_norm(torch.stack(norms).float(), 2.0)
