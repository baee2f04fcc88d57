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
from ._workspace import _Workspace

__all__ = [
    "GROUP",
    "MASKED_BELOW",
    "TOPK_ROW",
    "block_top",
    "causal_pairs",
    "global_grad_norm",
    "quantile_from_top",
    "top_quantile",
    "top_values",
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


def global_grad_norm(parameters: Iterable[torch.Tensor],
                     norm_type: float = 2.0) -> torch.Tensor | None:
    """Global ``norm_type`` (default L2) norm of the ``.grad`` of ``parameters`` (float32,
    on the device), or None.

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
            return plain(get_total_norm(grads, norm_type, False, None)).float()
        device = grads[0].device
        norms = [n.to(device) for n in torch._foreach_norm(grads, norm_type)]
        return torch.linalg.vector_norm(torch.stack(norms).float(), norm_type)


def causal_pairs(t0: int, t1: int, s: int) -> int:
    """Number of causal pairs of query rows ``t0..t1-1`` (top-left aligned, ``s`` keys):
    ``sum(min(i + 1, s))``."""
    lo, hi = t0 + 1, min(t1, s)  # rows whose count i + 1 is below the key count
    ramp = (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0
    return ramp + max(0, t1 - max(t0, s)) * s


#: Group size of :func:`block_top`'s levels.
GROUP = 4
#: Row length up to which ``topk`` is fast on CPU (measured, torch 2.x: ~1 ns per value up
#: to 4,096 values a row, 5-10 ns beyond); :func:`_block_top` groups until it gets there.
TOPK_ROW = 4096


def block_top(masked: torch.Tensor, k_top: int, ws: _Workspace | None = None) -> torch.Tensor:
    """``(hn, kk)``: the ``kk = min(k_top, B·T·S)`` largest values of each head of a
    ``(B, hn, T, S)`` block (``-inf`` for masked pairs), in any order. Exact.

    Each head's ``n = T·S`` values of a batch row are split into groups of ``g``
    (strided: member ``i`` of group ``j`` is value ``i·n/g + j``, so that the group maxima
    are one elementwise pass over a view, no copy), and the group maxima again, level by
    level, until a level is short enough for a fast ``topk`` (:data:`TOPK_ROW`). The
    ``kk`` largest values of a level all lie in the ``kk`` groups of the next level with
    the largest maxima (every value above the ``kk``-th group maximum ``tau`` is in a
    group with a larger maximum, and the chosen groups hold at least ``kk`` values
    ``>= tau``). So the selection walks back down: ``topk`` of the top level, then of the
    ``g·kk`` members of the chosen groups, level by level, down to the values. Fixed
    shapes, no host sync.
    """
    b, hn = masked.shape[:2]
    n = masked[0, 0].numel()
    kk = min(k_top, b * n)
    g = GROUP
    levels = [masked.reshape(b, hn, n)]  # a view of a contiguous block
    size = n
    while b * size > TOPK_ROW and size % g == 0 and b * (size // g) >= 2 * kk:
        size //= g
        out = None if ws is None else ws.get(f"level{len(levels)}", (b, hn, size),
                                             masked.dtype, masked.device)
        levels.append(torch.amax(levels[-1].view(b, hn, g, size), dim=2, out=out))
    top = levels.pop()
    flat = top.transpose(0, 1).reshape(hn, b * size)
    if not levels:
        return flat.topk(kk, dim=1, sorted=False).values
    chosen = flat.topk(kk, dim=1, sorted=False).indices  # (hn, kk) groups (batch, j)
    rows, cols = chosen // size, chosen % size
    heads = torch.arange(hn, device=masked.device).view(hn, 1, 1)
    members = torch.arange(g, device=masked.device) * size  # group j: j + i·size
    while levels:
        below = levels.pop()
        pos = cols.unsqueeze(-1) + members  # (hn, kk, g)
        cand = below[rows.unsqueeze(-1).expand_as(pos), heads, pos].reshape(hn, kk * g)
        if not levels:
            return cand.topk(kk, dim=1, sorted=False).values
        pick = cand.topk(kk, dim=1, sorted=False).indices
        rows = rows.gather(1, pick // g)
        cols = pos.reshape(hn, kk * g).gather(1, pick)
        members = torch.arange(g, device=masked.device) * below.shape[2]
    raise AssertionError("unreachable")


_MEMBERS: dict[tuple[int, int, str], torch.Tensor] = {}


def _members(g: int, size: int, device: torch.device) -> torch.Tensor:
    """``arange(g) * size`` (kept: a few small tensors, one per level size seen)."""
    key = (g, size, str(device))
    hit = _MEMBERS.get(key)
    if hit is None:
        if len(_MEMBERS) > 256:
            _MEMBERS.clear()
        hit = _MEMBERS[key] = torch.arange(0, g * size, size, device=device)
    return hit


def top_values(flat: torch.Tensor, k_top: int, ws: _Workspace | None = None,
               final: bool = True) -> torch.Tensor:
    """``(R, kk)``: the ``kk = min(k_top, n)`` largest values of each row of ``flat``
    (``(R, n)``, rows may be strided views), in any order. Exact. With ``final=False``
    the last ``topk`` after a grouping is left out: ``(R, m)`` values (a new tensor),
    ``m >= kk``, that hold the ``kk`` largest (for a caller that selects from them anyway).

    The same grouped selection as :func:`block_top` on one flat row per head, walked back
    down with ``gather`` (no advanced indexing): group maxima of :data:`GROUP` strided
    slabs, level by level while a row is longer than :data:`TOPK_ROW`, ``topk`` of the
    top level, then ``topk`` of the ``GROUP * kk`` members of the chosen groups at each
    level below. A row whose length is not a multiple of ``GROUP`` at some level stops
    the grouping there (pad with ``-inf`` to keep it going). Fixed shapes, no host sync.
    """
    r, n = flat.shape
    kk = min(k_top, n)
    g = GROUP
    levels = [flat]
    size = n
    while size > TOPK_ROW and size % g == 0 and size // g >= 2 * kk:
        size //= g
        out = None if ws is None else ws.get(f"sel{len(levels)}", (r, size), flat.dtype,
                                             flat.device)
        levels.append(torch.amax(levels[-1].view(r, g, size), dim=1, out=out))
    top = levels.pop()
    if not levels:
        return top.topk(kk, dim=1, sorted=False).values
    idx = top.topk(kk, dim=1, sorted=False).indices  # (R, kk) groups of the level below
    while levels:
        below = levels.pop()
        members = _members(g, size, flat.device)  # group j: j + i·size
        pos = (idx.unsqueeze(-1) + members).view(r, kk * g)
        cand = below.gather(1, pos)
        if not levels:
            return cand.topk(kk, dim=1, sorted=False).values if final else cand
        idx = pos.gather(1, cand.topk(kk, dim=1, sorted=False).indices)
        size *= g
    raise AssertionError("unreachable")
