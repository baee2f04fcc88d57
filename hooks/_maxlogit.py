"""Max-only measurement of the attention logits: the per-head max of ``q·kᵀ·scale`` over
the valid pairs, and nothing else, for the steps a fuse needs it outside the monitor's
sampled steps (QK-clip acting: ``docs/FUSES.md``, *Cost*).

The full statistics (:func:`~logitwatch.hooks._logits.attention_head_stats`) make several
passes over every block of logits (mean, M2, softmax, entropy, top values); here one
matmul per block and one ``amax``. When the valid pairs follow from shapes (no mask, or a
causal one and no padding: ``_shape_max``) each query-row tile is one batched matmul over
every head (GQA by broadcasting, no copy of the keys), the keys past the tile's last row
are skipped (T cut into 8 tiles of at least 16 rows: 9/16 of T x S computed) and the
causal mask is written in place on the tile's diagonal square only. Other masks: blocks
as in the full statistics, the mask built per block. Blocks bounded by the
memory budget, logits never held whole.

**Screen** (``below``): on a CPU tensor, whose values the host reads without a device
sync, a head whose Cauchy-Schwarz bound ``max‖q_i‖·max‖k_j‖·|scale|`` is at most ``below``
cannot have a logit past it, so its logits are not computed and its bound is returned in
place of its max (QK-clip passes its ``tau``: a head under tau is left alone either way,
so the clip decides exactly as with the exact max). On an accelerator reading the bound
would stall the stream: every head is computed, nothing is read.

Nothing else is read back; the result stays on the query's device.
"""

from __future__ import annotations

import math

import torch

from ._logits import CPU_BLOCK_ELEMENTS, DEFAULT_BUDGET, _Mask, prepare_attention

__all__ = ["head_max"]

#: Float32 temporaries per block element (the logits and their masked copy, with margin).
_TEMPS = 3
#: The causal fast path cuts T into this many query-row tiles (of at least _MIN_TILE rows):
#: about (1 + 1/n) / 2 of the T x S logits are computed (9/16 at 8).
_CAUSAL_TILES = 8
_MIN_TILE = 16
_TRIANGLES: dict[tuple[int, int, str], torch.Tensor] = {}


def _triangle(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """``(rows, cols)`` bool, True above the diagonal (the pairs a causal row cannot see)."""
    key = (rows, cols, str(device))
    m = _TRIANGLES.get(key)
    if m is None:
        if len(_TRIANGLES) > 64:
            _TRIANGLES.clear()
        m = _TRIANGLES[key] = torch.ones(rows, cols, dtype=torch.bool, device=device).triu(1)
    return m


def _shape_max(q: torch.Tensor, k: torch.Tensor, group: int, scale: float, causal: bool,
               budget: int) -> torch.Tensor:
    """Per-head max of ``q·kᵀ·scale`` over every pair (``causal``: top-left causal pairs),
    the valid pairs following from shapes: per query-row tile, one batched matmul over all
    heads (GQA: the key heads broadcast over their query heads, never copied), the keys past
    the tile's last row skipped, the causal mask written in place on the tile's diagonal
    square only."""
    b, h, t, d = q.shape
    hk, s = k.shape[1], k.shape[2]
    q = q.float() * scale  # as the full statistics do (the same rounding): one copy of q
    if k.dtype != torch.float32:
        k = k.float()
    qg = q.reshape(b, hk, group, t, d)
    kt = k.transpose(-1, -2).unsqueeze(2)  # (B, Hk, 1, D, S)
    elements = max(1, budget // (4 * _TEMPS))
    if q.device.type == "cpu":
        elements = min(elements, CPU_BLOCK_ELEMENTS)
    tile = t
    if causal and t >= 2 * _MIN_TILE:
        tile = max(_MIN_TILE, -(-t // _CAUSAL_TILES))
    per_head_row = b * group * s  # elements of one key head's query heads for one row
    tile = max(1, min(tile, elements // max(1, hk * per_head_row)))
    chunk = max(1, min(hk, elements // max(1, tile * per_head_row)))
    found = []
    for c0 in range(0, hk, chunk):
        c1 = min(hk, c0 + chunk)
        best: torch.Tensor | None = None
        for t0 in range(0, t, tile):
            t1 = min(t, t0 + tile)
            s1 = min(s, t1) if causal else s
            logits = torch.matmul(qg[:, c0:c1, :, t0:t1], kt[:, c0:c1, ..., :s1])
            if causal and s1 > t0 + 1:  # row t0 + r sees keys <= t0 + r
                logits[..., t0:s1].masked_fill_(_triangle(t1 - t0, s1 - t0, q.device),
                                                -math.inf)
            m = logits.amax(dim=(0, 3, 4))  # (chunk, group)
            best = m if best is None else torch.maximum(best, m)
        assert best is not None
        found.append(best)
    # float32, as documented, also where autocast ran the matmul in its dtype (as it runs the
    # full statistics' and the model's own)
    return (torch.cat(found) if len(found) > 1 else found[0]).reshape(h).float()


def head_max(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    budget: int = DEFAULT_BUDGET,
    query_valid: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
    below: float | None = None,
) -> torch.Tensor:
    """Per-head max logit ``(H,)`` (float32, on the query's device) over valid pairs.

    Same conventions as :func:`~logitwatch.hooks._logits.attention_head_stats` (layouts,
    masks, GQA by ``repeat_interleave``, ``scale`` default ``D ** -0.5``); heads with no
    valid pair get ``-inf``. With ``below`` on a CPU tensor, a head whose bound is at most
    ``below`` gets its bound (>= its max) instead (module docstring).
    """
    with torch.no_grad():
        q, k, group, scale, valid = prepare_attention(
            query, key, attn_mask, is_causal, scale, query_valid, key_valid)
        b, h, t, _ = q.shape
        s = k.shape[2]
        out = torch.full((h,), -math.inf, device=q.device)
        idx: torch.Tensor | None = None  # the heads computed (None: all)
        if below is not None and q.device.type == "cpu":
            qn = q.float().norm(dim=-1).amax(dim=(0, 2))
            kn = k.float().norm(dim=-1).amax(dim=(0, 2)).repeat_interleave(group)
            bound = qn * kn * abs(scale)
            under = bound <= below
            out = torch.where(under, bound, out)
            if bool(under.all()):  # a CPU tensor: no device sync
                return out
            if bool(under.any()):
                idx = (~under).nonzero().flatten()
        if valid is None or valid.causal_only:  # the valid pairs follow from shapes
            qs = q if idx is None else q.index_select(1, idx)
            ks = k if idx is None else k.index_select(1, idx.to(k.device) // group)
            got = _shape_max(qs, ks, 1 if idx is not None else group, scale,
                             valid is not None, budget)
            return got if idx is None else out.index_put((idx,), got)
        qh = q if idx is None else q.index_select(1, idx)
        kh = k if group == 1 and idx is None else k.index_select(
            1, (torch.arange(h, device=k.device) if idx is None else idx.to(k.device))
            // group)
        if valid is not None and idx is not None and valid.mask is not None \
                and valid.mask.shape[1] != 1:
            valid = _Mask(valid.mask.index_select(1, idx.to(valid.mask.device)),
                          valid.is_causal, valid.rows, valid.cols)
        hn = qh.shape[1]
        elements = max(1, budget // (4 * _TEMPS))
        if q.device.type == "cpu":
            elements = min(elements, CPU_BLOCK_ELEMENTS)
        per_head = b * t * s
        if per_head * hn <= elements:
            hc, tq = hn, t
        elif per_head <= elements:
            hc, tq = max(1, elements // per_head), t
        else:
            hc, tq = 1, max(1, elements // max(1, b * s))
        causal_only = valid is not None and valid.causal_only
        found = []
        for h0 in range(0, hn, hc):
            h1 = min(hn, h0 + hc)
            kt = kh[:, h0:h1].float().transpose(-1, -2)  # (B, hc, D, S)
            best = torch.full((h1 - h0,), -math.inf, device=q.device)
            for t0 in range(0, t, tq):
                t1 = min(t, t0 + tq)
                s1 = min(s, t1) if causal_only else s  # keys past the last row: masked
                qb = qh[:, h0:h1, t0:t1].float() * scale
                logits = torch.matmul(qb, kt[..., :s1])  # (B, hc, tq, s1)
                if valid is not None:
                    v = valid.block(b, h0, h1, t0, t1, s, q.device)[..., :s1]
                    logits = logits.masked_fill(~v, -math.inf)
                best = torch.maximum(best, logits.amax(dim=(0, 2, 3)))
            found.append(best)
        got = torch.cat(found) if len(found) > 1 else found[0]
        if idx is None:
            return got
        return out.index_put((idx,), got)
