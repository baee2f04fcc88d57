"""Pure tensor helpers for the hooks: masks, exact percentiles, gradient norms.

Everything here runs under ``torch.no_grad()`` on detached inputs, computes in float32,
returns tensors on the input's device and never reads a value back to the host (no
``.item()``, no ``bool(tensor)``): control flow depends on shapes only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ._shard import plain

__all__ = [
    "MASKED_BELOW",
    "global_grad_norm",
    "quantile_from_top",
    "top_quantile",
    "valid_pairs",
]

#: A float (additive) mask entry at or below this value marks a pair as not attended
#: (HF uses the dtype's minimum, others -inf or -1e4..-1e9).
MASKED_BELOW = -1e4

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


def quantile_from_top(top: torch.Tensor, n_valid: torch.Tensor, percent: int = 99) -> torch.Tensor:
    """Exact per-row percentile from each row's largest values, sorted descending.

    ``top`` must hold at least the ``ceil((100 - percent) / 100 * (n - 1)) + 2`` largest of
    the ``n = n_valid[r]`` valid values of row ``r`` (``-inf`` padding sorts last). NumPy's
    default 'linear' method; the interpolation indices are computed on the device from
    ``n_valid`` in exact integer arithmetic.

    Returns:
        ``(R,)`` tensor; ``-inf`` for a row without valid entries.
    """
    k = top.shape[1]
    if k == 0:
        return top.new_full((top.shape[0],), -math.inf)
    last = (n_valid.to(torch.int64) - 1).clamp(min=0)  # ascending index of the largest
    num = percent * last
    lo = num // 100  # ascending index below the quantile
    frac = (num % 100).to(top.dtype) / 100
    hi = torch.minimum(lo + 1, last)
    below = top.gather(1, (last - lo).clamp(0, k - 1).unsqueeze(1)).squeeze(1)
    above = top.gather(1, (last - hi).clamp(0, k - 1).unsqueeze(1)).squeeze(1)
    out = torch.lerp(below, above, frac)  # the same two-sided formula as NumPy's _lerp
    return torch.where(n_valid > 0, out, torch.full_like(out, -math.inf))


def top_quantile(values: torch.Tensor, n_valid: torch.Tensor, percent: int = 99) -> torch.Tensor:
    """Exact per-row percentile of the valid entries, NumPy's default 'linear' method.

    Invalid entries must hold ``-inf`` so that they sort last. Only the top
    ``ceil((100 - percent) / 100 * M) + 2`` values of each row are selected (``topk``),
    which is where the percentile of any number of valid entries lies.

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
    return quantile_from_top(top, n_valid, percent)


def global_grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """Global L2 norm of the ``.grad`` of ``parameters`` (float32, on the device), or None.

    Same value as ``torch.nn.utils.clip_grad_norm_`` returns (grouped ``_foreach_norm``),
    without clipping and without a host sync. DTensor gradients (FSDP2, tensor parallel)
    are reduced across their mesh by ``get_total_norm`` (a collective: every rank must
    call this at the same point); the replicated result is returned as a plain tensor.
    Under sharding the monitor uses ``Sharding.local_grad_sums`` and its end-of-step
    exchange instead (FSDP1's flat shards are not recognisable here).
    """
    with torch.no_grad():
        grads = [p.grad.detach() for p in parameters if p.grad is not None]
        if not grads:
            return None
        get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
        if get_total_norm is not None:  # torch >= 2.6
            return plain(get_total_norm(grads, 2.0, False, None)).float()
        device = grads[0].device
        norms = [n.to(device) for n in torch._foreach_norm(grads, 2.0)]
        return torch.linalg.vector_norm(torch.stack(norms).float(), 2.0)
