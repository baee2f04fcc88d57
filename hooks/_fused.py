"""One fused pass of the attention statistics when the valid pairs follow from shapes.

The common training case, SDPA with ``is_causal=True`` (or no mask at all) and no padding,
needs no mask tensor: which (query, key) pairs count is known from ``T`` and ``S``. Here
:func:`fused_stats` computes every statistic of
:func:`~logitwatch.hooks._logits.attention_head_stats` in one pass over blocks of query
rows:

* **Only the keys a block can see.** With a causal mask, rows ``t0..t1-1`` see keys
  ``0..t1-1`` (top-left aligned, as SDPA): the block's logits are ``q[t0:t1]·k[:t1]ᵀ``, so
  the masked upper triangle is neither computed nor reduced, except for the causal
  square on the block's diagonal. With about four row blocks, 62.5 % of the ``T x S``
  logits are computed instead of all of them (the causal pairs themselves are 50 %).
* **One set of passes per block, per-row results kept.** Each block is laid out head-major,
  ``(heads, B, rows, keys)``, so that a head's values are one flat row. Per block: the sum
  over valid pairs (the diagonal square's masked pairs zeroed first), the centred values
  ``x - mean_block`` (zeroed again there), their square sum, the row max, the softmax
  and ``Σ p·(x - mean_block)`` per row. The entropy of a row is
  ``log Z - Σ p z = (max - mean_block) - log(max p) - Σ p·(x - mean_block)`` (``Σ p = 1``),
  read off at the end from per-row arrays in one set of operations per call. Block means
  and M2 are pooled in float64 at the end (Chan et al.).
* **The top 1 % selected once per call**, not once per block: each block's logits (masked
  pairs at ``-inf``) are copied into a per-head selection buffer of two blocks (or the
  whole call's values when they fill it at most twice: one selection, no merge; on the
  bench's batch 8, 9.0 -> 8.1 ms a call), and :func:`~logitwatch.hooks._stats.top_values`
  runs when it is full and at the end.
  p99 comes from two ``kthvalue`` calls on the kept values (the valid count is the same for
  every head), not from a sort.

Memory stays bounded as in the general path: the block buffers, the selection buffer
(two blocks, or a head's values over the whole call when that is at most four) and its
group maxima (a third of it), the contiguous ``q``/``k`` copies
``(heads, B, L, D)`` and four ``(heads, B, T)`` per-row arrays; all from the workspace.
Nothing is read back to the host; every shape and loop bound comes from shapes only.
"""

from __future__ import annotations

import math

import torch

from ._stats import GROUP, TOPK_ROW, causal_pairs, top_values
from ._workspace import _Workspace, workspace

__all__ = ["fused_stats", "plan_rows"]

#: Query-row blocks a causal call is split into at least (when the block budget allows
#: more rows): more blocks skip more of the masked triangle, each costs a few operations.
CAUSAL_BLOCKS = 4
#: Row counts are rounded to a multiple of this (a causal block's square stays aligned).
ROW_ALIGN = 8
PERCENT = 99


def plan_rows(b: int, h: int, t: int, s: int, causal: bool, elements: int,
              max_heads: int) -> tuple[int, int]:
    """``(heads per chunk, query rows per block)`` for blocks of at most ``elements``
    logits (at most ``max_heads`` heads, what the kept top values allow)."""
    want = t
    if causal and t > 2 * ROW_ALIGN:
        want = -(-t // CAUSAL_BLOCKS)
        want = min(t, -(-want // ROW_ALIGN) * ROW_ALIGN)
    hc = max(1, min(h, max_heads, elements // max(1, b * want * s)))
    tq = max(1, min(want, elements // max(1, b * hc * s)))
    return hc, tq


def _padded(n: int) -> int:
    """``n`` rounded up so that :func:`top_values` can group it down to rows of at most
    :data:`TOPK_ROW` values."""
    unit = 1
    while n > TOPK_ROW * unit:
        unit *= GROUP
    return -(-n // unit) * unit


def _select(ws: _Workspace, sel: torch.Tensor, used: int, k_top: int) -> torch.Tensor:
    """The top ``k_top`` values (at least; a superset of them, unordered) of each row's first
    ``used`` columns of the selection buffer, padded with ``-inf`` to :func:`_padded`."""
    padded = _padded(used)
    if padded > used:
        sel[:, used:padded].fill_(-math.inf)
    return top_values(sel[:, :padded], k_top, ws, final=False)


def fused_stats(
    q: torch.Tensor, k: torch.Tensor, group: int, h0: int, h1: int, tq: int, scale: float,
    causal: bool, sel_elements: int,
) -> tuple[torch.Tensor, ...]:
    """Statistics of heads ``h0:h1`` over the valid pairs of a causal (or unmasked) call.

    Args:
        q: ``(B, H, T, D)`` queries (any strides). k: ``(B, H_kv, S, D)`` keys, ``H_kv``
            = ``H / group`` (shared as ``repeat_interleave``).
        tq: Query rows per block (:func:`plan_rows`).
        causal: Query ``i`` sees keys ``<= i`` (top-left); else every key.
        sel_elements: Capacity of the selection buffer per head (values).

    Returns:
        ``(count, mean, m2, maximum, p99, rows, ent_sum, ent_min)`` per head, as the
        fields of :class:`~logitwatch.hooks._logits.HeadStats`.
    """
    b, _, t, d = q.shape
    s = k.shape[2]
    hn = h1 - h0
    dev = q.device
    f32 = torch.float32
    ws = workspace(dev)
    blk = b * hn * tq * s  # the largest block
    # contiguous head-major copies; the scale goes into q (T x D values, not T x S)
    qs = ws.get("q", (hn, b, t, d), f32, dev)
    if q.dtype == f32:
        torch.mul(q[:, h0:h1].transpose(0, 1), scale, out=qs)
    else:  # to float32 first, then scaled (as the general path)
        qs.copy_(q[:, h0:h1].transpose(0, 1)).mul_(scale)
    kv = k[:, h0 // group : (h1 - 1) // group + 1]
    if group > 1:
        kv = kv.repeat_interleave(group, dim=1)[:, h0 % group : h0 % group + hn]
    ks = ws.get("k", (hn, b, s, d), f32, dev).copy_(kv.transpose(0, 1))
    kt = ks.transpose(-1, -2)
    n_total = b * (causal_pairs(0, t, s) if causal else t * s)
    # per-row results: max logit, max p, and with c = x - shift (over valid pairs):
    # Σ p·c, Σ c, Σ c²
    rows_buf = ws.get("rows", (5, hn, b, t), f32, dev)
    k_top = min(n_total, ((100 - PERCENT) * n_total + 99) // 100 + 2)
    sel_cap = max(sel_elements, b * tq * s)
    # a head's values over the whole call (only the keys each block sees): when they fill
    # the buffer at most twice, it takes them all, one selection instead of two and a merge
    visible = sum(b * (min(t, t0 + tq) - t0) * (min(t0 + tq, t, s) if causal else s)
                  for t0 in range(0, t, tq))
    if visible <= 2 * sel_cap:
        sel_cap = visible
    sel = ws.get("sel", (hn, _padded(sel_cap)), f32, dev)
    used = 0
    kept: list[torch.Tensor] = []
    shift = centre = None
    for t0 in range(0, t, tq):
        t1 = min(t, t0 + tq)
        r = t1 - t0
        s1 = min(t1, s) if causal else s
        raw = torch.matmul(qs[:, :, t0:t1], kt[..., :s1],
                           out=ws.get("raw", (hn, b, r, s1), f32, dev, blk))
        w = s1 - t0 if causal else 0  # the causal square on the diagonal: keys t0..s1-1
        keep = bias = None
        if w > 1:
            keep, bias = ws.triangle(tq, dev, r, w)
        if shift is None or centre is None:
            # every block is centred on the first block's mean (the exact mean and M2
            # follow from Σ c and Σ c², whatever the shift; near the mean, no cancellation)
            if keep is not None:
                raw[..., t0:s1].mul_(keep)
            shift = raw.sum(dim=(1, 2, 3)) / (b * (causal_pairs(t0, t1, s) if causal
                                                  else r * s))
            centre = shift.view(hn, 1, 1, 1)
        c = torch.sub(raw, centre, out=ws.get("c", raw.shape, f32, dev, blk))
        if keep is not None and bias is not None:
            c[..., t0:s1].mul_(keep)  # masked pairs add nothing to the sums
            raw[..., t0:s1].add_(bias)  # ... nor to the max, softmax, top values
        zmax, pmax, pd, sc, sq = rows_buf[..., t0:t1].unbind(0)
        torch.amax(raw, dim=-1, out=zmax)
        p = torch.softmax(raw, dim=-1, out=ws.get("p", raw.shape, f32, dev, blk))
        torch.amax(p, dim=-1, out=pmax)
        torch.sum(c, dim=-1, out=sc)
        torch.sum(p.mul_(c), dim=-1, out=pd)
        torch.sum(c.mul_(c), dim=-1, out=sq)
        # the top values: the block goes to the selection buffer, selected when it is full
        nb = b * r * s1
        if used + nb > sel_cap:
            kept.append(_select(ws, sel, used, k_top))
            if len(kept) > 1:  # bounded: what is kept is merged down to the top k_top
                both = torch.cat(kept, dim=1)
                kept = [both.topk(min(k_top, both.shape[1]), dim=1, sorted=False).values]
            used = 0
        sel[:, used : used + nb].view(hn, b, r, s1).copy_(raw)
        used += nb
    kept.append(_select(ws, sel, used, k_top))
    cand = kept[0] if len(kept) == 1 else torch.cat(kept, dim=1)
    assert shift is not None and centre is not None
    zmax, pmax, pd = rows_buf[:3].unbind(0)
    # mean and M2 from the sums about the shift a: Σ (x - a)² = M2 + n (mean - a)²
    offset, sum_sq = rows_buf[3:].sum(dim=(2, 3), dtype=torch.float64).unbind(0)
    offset /= n_total
    mean = torch.add(offset, shift)  # float64
    m2 = torch.addcmul(sum_sq, offset, offset, value=-n_total).clamp_(min=0)
    maximum = zmax.amax(dim=(1, 2))
    # entropy per row, log Z - Σ p z = (max - a) - log(max p) - Σ p·(z - a)
    ent = zmax.sub_(centre.view(hn, 1, 1)).sub_(pmax.log_()).sub_(pd).clamp_(min=0)
    ent_sum = ent.sum(dim=(1, 2), dtype=torch.float64)
    ent_min = ent.amin(dim=(1, 2))
    # p99 (NumPy 'linear'): two order statistics, at the same ranks for every head
    last = n_total - 1
    lo = PERCENT * last // 100
    hi = min(lo + 1, last)
    rank = last - lo + 1  # of the lower one, counted from the largest (1-based)
    two = cand.topk(rank, dim=1, sorted=False).values.topk(min(2, rank), dim=1,
                                                          largest=False).values
    below = two[:, 0]
    above = two[:, 1] if hi != lo else below  # rank - 1
    p99 = torch.lerp(below, above, (PERCENT * last % 100) / 100)
    count = torch.full((hn,), float(n_total), dtype=torch.float64, device=dev)
    rows = torch.full((hn,), float(b * t), dtype=torch.float64, device=dev)
    return count, mean, m2, maximum, p99, rows, ent_sum, ent_min
