"""Max-only measurement of the attention logits: the per-head max of ``q·kᵀ·scale`` over
the valid pairs, and nothing else, for the steps a fuse needs it outside the monitor's
sampled steps (QK-clip acting: ``docs/FUSES.md``, *Cost*).

The full statistics (:func:`~logitwatch.hooks._logits.attention_head_stats`) make several
passes over every block of logits (mean, M2, softmax, entropy, top values); here one
matmul per block and one ``amax``. A causal mask that follows from shapes alone skips the
key columns past the block's last query row (about half the matmul). Blocks as in the full
statistics: bounded by the memory budget, logits never held whole.

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
