"""Per-head attention-logit statistics, computed in memory-bounded chunks.

One call reduces ``q·kᵀ·scale`` over the valid (query, key) pairs of every head to:
max, p99, mean, std, and the entropy of the softmax rows (mean and min over query
rows); with a soft-cap also the post-cap max and p99. The logits are materialised one
block of ``(B, heads, query rows, S)`` at a time, sized so that a block and its
temporaries stay within ``budget`` bytes: a 32k-token sequence never holds a full
``T x T`` matrix per head. When the valid pairs follow from shapes (a causal mask or
none, no padding, no soft-cap) the work goes to the fused pass of
:mod:`~logitwatch.hooks._fused` (only the keys each query block sees, one set of passes
per block, the top 1 % selected once per call); everything else takes the general path
below.

p99 is **exact** (NumPy's 'linear' percentile) while the top 1 % of one head's pairs fits
in a quarter of the budget (selected per block by
:func:`~logitwatch.hooks._stats.block_top`, kept across query
blocks and merged with ``topk``); beyond
that it comes from a 4096-bin histogram over ``[min, max]`` in a second pass over the
blocks, with an absolute error of at most one bin width, ``(max - min) / 4096``.

Nothing here reads a value back to the host; all shapes and loop bounds depend on shapes
only. See ``docs/HOOKS.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from ._fused import fused_stats, plan_rows
from ._masks import _Mask, prepare_attention  # noqa: F401  (_Mask re-exported: _maxlogit)
from ._stats import TOPK_ROW as _TOPK_ROW  # noqa: F401  (re-exported: tests)
from ._stats import block_top as _block_top
from ._stats import causal_pairs as _causal_pairs
from ._stats import quantile_from_top
from ._workspace import (
    _local,  # noqa: F401  (re-exported: bench_hooks reads it)
    _Workspace,
    release_workspace,
    workspace,
)

__all__ = [
    "DEFAULT_BUDGET",
    "HIST_BINS",
    "HeadStats",
    "attention_head_stats",
    "merge_head_stats",
    "release_workspace",
]

#: Default bytes a sampled attention call may use for its statistics (256 MiB).
DEFAULT_BUDGET = 256 << 20
#: Float32-sized temporaries alive at once per block element (logits, masked and zeroed
#: copies, centred values, softmax, the soft-capped copies, the top-value candidates),
#: with margin; measured by the memory test.
_TEMPS = 9
#: Logits per block on CPU. Each statistic is a pass over the block and its few
#: temporaries; blocks that stay in the core's L2 cache make those passes about twice as
#: fast as one block per call (``bench/README.md``, *Hooks*). Devices with their own
#: memory (CUDA) take blocks as large as the budget allows: fewer kernel launches.
CPU_BLOCK_ELEMENTS = 1 << 18
#: Bins of the p99 histogram used when the exact top 1 % does not fit in the budget.
HIST_BINS = 4096
PERCENT = 99


@dataclass
class HeadStats:
    """Per-head accumulators, each an ``(H,)`` tensor on the device.

    ``count``/``mean``/``m2`` are float64 (Chan's parallel variance), ``rows`` and
    ``ent_sum`` float64; the rest float32. ``capped_*`` are None without a soft-cap.
    """

    count: torch.Tensor
    mean: torch.Tensor
    m2: torch.Tensor
    maximum: torch.Tensor
    p99: torch.Tensor
    rows: torch.Tensor
    ent_sum: torch.Tensor
    ent_min: torch.Tensor
    capped_max: torch.Tensor | None = None
    capped_p99: torch.Tensor | None = None

    def metrics(self) -> dict[str, torch.Tensor]:
        """Final per-head values by signal name (``attn.*``)."""
        # one masked select for the four pooled values (a few operations per layer, not
        # a dozen: each small op costs 5-30 µs in a training step on CPU)
        count, rows = self.count, self.rows
        vals = torch.stack([self.mean, self.m2 / count.clamp(min=1),
                            self.ent_sum / rows.clamp(min=1), self.ent_min.double()])
        vals[1].sqrt_()
        has = torch.stack([count, count, rows, rows]) > 0
        mean, std, ent_mean, ent_min = torch.where(has, vals, math.nan).float().unbind(0)
        out = {
            "attn.logit_max": self.maximum,
            "attn.logit_p99": self.p99,
            "attn.logit_mean": mean,
            "attn.logit_std": std,
            "attn.entropy_mean": ent_mean,
            "attn.entropy_min": ent_min,
        }
        if self.capped_max is not None and self.capped_p99 is not None:
            out["attn.capped_logit_max"] = self.capped_max
            out["attn.capped_logit_p99"] = self.capped_p99
        return out


def merge_head_stats(a: HeadStats, b: HeadStats) -> HeadStats:
    """Pool two forwards of the same layer (gradient accumulation).

    Max, mean, std and entropy are pooled exactly; p99 is the larger of the two exact
    p99s (an upper bound of the pooled p99, never under-reporting a heating head).
    """
    n = a.count + b.count
    delta = b.mean - a.mean
    safe_n = n.clamp(min=1)
    mean = a.mean + delta * b.count / safe_n
    m2 = a.m2 + b.m2 + delta * delta * a.count * b.count / safe_n
    mean = torch.where(a.count > 0, torch.where(b.count > 0, mean, a.mean), b.mean)
    m2 = torch.where(a.count > 0, torch.where(b.count > 0, m2, a.m2), b.m2)

    def both(x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None or y is None else torch.maximum(x, y)

    return HeadStats(
        count=n, mean=mean, m2=m2,
        maximum=torch.maximum(a.maximum, b.maximum), p99=torch.maximum(a.p99, b.p99),
        rows=a.rows + b.rows, ent_sum=a.ent_sum + b.ent_sum,
        ent_min=torch.minimum(a.ent_min, b.ent_min),
        capped_max=both(a.capped_max, b.capped_max),
        capped_p99=both(a.capped_p99, b.capped_p99),
    )


def _cap(x: torch.Tensor, softcap: float) -> torch.Tensor:
    return torch.tanh(x / softcap) * softcap


def _block_elements(budget: int, block_elements: int | None = None) -> int:
    """Logits per block: three quarters of ``budget`` over :data:`_TEMPS` float32 copies
    (a quarter is kept for the top 1 %), at most ``block_elements`` when given."""
    elements = max(1, (budget - budget // 4) // (4 * _TEMPS))
    return elements if block_elements is None else min(elements, block_elements)


def _top_bytes(b: int, t: int, s: int) -> int:
    """Bytes of one head's kept top 1 % (the values, a merge's concatenation, its topk)."""
    per_head = b * t * s
    return 4 * 3 * min(per_head, ((100 - PERCENT) * per_head + 99) // 100 + 2)


def _top_heads(b: int, t: int, s: int, budget: int) -> int:
    """Heads whose kept top values fit in a quarter of ``budget`` (at least one)."""
    return max(1, (budget // 4) // _top_bytes(b, t, s))


def _merge_bytes(b: int, t: int, s: int) -> int:
    """Bytes per head of the general path's merge of a block's top values into the kept
    ones (:func:`_head_chunk`): the concatenation (2 kept-sized float32 rows), then its
    ``topk``'s values (1) and int64 indices (2): 20 bytes a kept value where
    :func:`_top_bytes` counts 12."""
    per_head = b * t * s
    return 4 * 5 * min(per_head, ((100 - PERCENT) * per_head + 99) // 100 + 2)


def _rows(b: int, h: int, t: int, s: int, elements: int) -> tuple[int, int]:
    """(heads, query rows) of a block of at most ``elements`` logits."""
    per_head = b * t * s
    if per_head * h <= elements:
        return h, t
    if per_head <= elements:
        return max(1, elements // per_head), t
    return 1, max(1, elements // max(1, b * s))


def _plan(b: int, h: int, t: int, s: int, budget: int,
          block_elements: int | None = None) -> tuple[int, int, bool]:
    """(heads per block, query rows per block, exact p99?) of the general path for
    ``budget`` bytes, blocks of at most ``block_elements`` logits when given (see
    :data:`CPU_BLOCK_ELEMENTS`). ``exact`` also chooses the fused pass, which plans its
    own blocks (:func:`~logitwatch.hooks._fused.plan_rows`)."""
    elements = _block_elements(budget, block_elements)
    exact = _top_bytes(b, t, s) <= budget // 4
    hc, tq = _rows(b, h, t, s, elements)
    if exact:
        hc = max(1, min(hc, _top_heads(b, t, s, budget)))
        # The merge of the kept top values holds 20 bytes a value where the quarter kept
        # for them counts 12 (so up to 0.42 of the budget): with a mask's blocks beside it
        # the call went 1 % over the budget (measured: a 4-D additive mask, causal +
        # padding). The blocks get what the merge leaves. Shapes only; the fused pass
        # plans its own blocks, unchanged.
        merge = hc * _merge_bytes(b, t, s)
        if merge > budget // 4:
            fit = max(1, (budget - merge) // (4 * _TEMPS))
            elements = fit if block_elements is None else min(fit, block_elements)
            hc2, tq = _rows(b, h, t, s, elements)
            hc = min(hc, hc2)
    return hc, tq, exact


def attention_head_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    budget: int = DEFAULT_BUDGET,
    query_valid: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
) -> HeadStats:
    """Per-head statistics of the pre-softmax logits ``q·kᵀ·scale`` over valid pairs.

    Pairs are pooled per head over batch, queries and keys; pairs excluded by the mask
    (causal, padding, sliding window, any bool/float mask) do not count, nor do the rows of
    padded queries (``query_valid``) and the columns of padded keys (``key_valid``). Keys
    with fewer heads than queries (GQA/MQA) are shared as ``repeat_interleave`` (HF
    ``repeat_kv``).

    Args:
        query: ``(B, H, T, D)`` (SDPA's other layouts are accepted).
        key: ``(B, H_kv, S, D)`` with ``H % H_kv == 0``.
        attn_mask: Bool (True = attend) or additive float mask broadcastable to
            ``(B, H, T, S)``.
        is_causal: SDPA's causal flag (top-left aligned).
        scale: Logit scale; default ``D ** -0.5``.
        softcap: Gemma-2 style cap ``c·tanh(x/c)``: max/p99/mean/std stay pre-cap, the
            entropy uses the capped logits (what the softmax sees) and ``capped_max``/
            ``capped_p99`` are added.
        budget: Bytes the computation may use at once (see the module docstring).
        query_valid: ``(B, T)`` bool, True = a real query token: the rows of the others
            are left out of every statistic (a padded query still "sees" real keys).
        key_valid: ``(B, S)`` bool, True = a real key token.

    Returns:
        A :class:`HeadStats` on the query's device.
    """
    with torch.no_grad():
        q, k, group, scale, valid = prepare_attention(
            query, key, attn_mask, is_causal, scale, query_valid, key_valid)
        b, h, t, _ = q.shape
        s = k.shape[2]
        cap = CPU_BLOCK_ELEMENTS if q.device.type == "cpu" else None
        hc, tq, exact = _plan(b, h, t, s, budget, cap)
        parts: list[HeadStats] = []
        if exact and softcap is None and (valid is None or valid.causal_only) and b * t * s:
            # the valid pairs follow from shapes: one fused pass over the visible keys
            causal = valid is not None
            elements = _block_elements(budget, cap)
            hc, tq = plan_rows(b, h, t, s, causal, elements, _top_heads(b, t, s, budget))
            for h0 in range(0, h, hc):
                h1 = min(h, h0 + hc)
                parts.append(HeadStats(*fused_stats(q, k, group, h0, h1, tq, scale, causal,
                                                    2 * elements // (h1 - h0))))
        else:
            for h0 in range(0, h, hc):
                h1 = min(h, h0 + hc)
                parts.append(_head_chunk(q, k, valid, group, h0, h1, tq, scale, softcap,
                                         exact))
        if len(parts) == 1:
            return parts[0]
        return HeadStats(**{
            f.name: None if getattr(parts[0], f.name) is None
            else torch.cat([getattr(p, f.name) for p in parts])
            for f in fields(HeadStats)
        })


def _blocks(q, k, valid, group, h0, h1, tq, scale, ws: _Workspace | None = None):
    """Yield ``(logits, valid_block)`` for heads ``h0:h1`` in query blocks of ``tq``.

    With ``ws`` the logits are written into its ``raw`` buffer, overwritten by the next
    block: use each block before asking for the next.
    """
    b, _, t, _ = q.shape
    s = k.shape[2]
    # contiguous (B, H, L, D) copies: row copies are cheap, and ``kᵀ`` as a transposed
    # view is read by the batched matmul as is (models hand over strided views of a
    # fused projection, which the matmul would otherwise transpose-copy)
    kv = k[:, h0 // group : (h1 - 1) // group + 1].float()
    if group > 1:
        kv = kv.repeat_interleave(group, dim=1)[:, h0 % group : h0 % group + (h1 - h0)]
    if ws is None:
        kt = kv.contiguous().transpose(-1, -2)
    else:
        kt = ws.get("k", kv.shape, torch.float32, k.device).copy_(kv).transpose(-1, -2)
    for t0 in range(0, t, tq):
        t1 = min(t, t0 + tq)
        qb = q[:, h0:h1, t0:t1]
        # the scale is applied to q (T x D values, not T x S): same logits to rounding
        if ws is None:
            logits = torch.matmul(qb.float() * scale, kt)
        else:
            qs = ws.get("q", qb.shape, torch.float32, q.device,
                        b * (h1 - h0) * tq * q.shape[3]).copy_(qb).mul_(scale)
            out = ws.get("raw", (b, h1 - h0, t1 - t0, s), torch.float32, q.device,
                         b * (h1 - h0) * tq * s)
            logits = torch.matmul(qs, kt, out=out)
        v = None if valid is None else valid.block(b, h0, h1, t0, t1, s, q.device)
        yield logits, v


def _head_chunk(q, k, valid, group, h0, h1, tq, scale, softcap, exact) -> HeadStats:
    b, _, t, _ = q.shape
    s = k.shape[2]
    hn = h1 - h0
    dev = q.device
    ws = workspace(dev)
    lim = b * hn * tq * s  # one planned block
    f64 = dict(dtype=torch.float64, device=dev)
    count = torch.zeros(hn, **f64)
    mean = torch.zeros(hn, **f64)
    m2 = torch.zeros(hn, **f64)
    rows = torch.zeros(hn, **f64)
    ent_sum = torch.zeros(hn, **f64)
    maximum = torch.full((hn,), -math.inf, device=dev)
    minimum = torch.full((hn,), math.inf, device=dev)
    ent_min = torch.full((hn,), math.inf, device=dev)
    per_head = b * t * s
    causal_only = valid is not None and valid.causal_only
    # the top values needed for the p99 of n valid pairs: n is known from shapes when the
    # mask is causal only (about half the pairs), else bounded by all pairs
    n_max = b * _causal_pairs(0, t, s) if causal_only else per_head
    k_top = min(n_max, ((100 - PERCENT) * n_max + 99) // 100 + 2)
    top: torch.Tensor | None = None
    dims = (0, 2, 3)
    t0_next = 0
    for raw, v in _blocks(q, k, valid, group, h0, h1, tq, scale, ws):
        # Every statistic reads the raw logits, or the masked copy (additive 0/-inf bias:
        # max, softmax, top values); a 0/1 float mask zeroes what a sum must not count.
        # The masks stay broadcast (a causal one is T x S). Full-size temporaries go to
        # the workspace. Per-block reductions in float32 (pairwise summation), merged in
        # float64 across blocks.
        shape = raw.shape

        def scratch(name: str, shape: torch.Size = shape) -> torch.Tensor:
            return ws.get(name, shape, torch.float32, dev, lim)

        if v is None:
            n_b = torch.full((hn,), float(b * shape[2] * s), **f64)
            masked, vf, bias = raw, None, None
            sum_b = raw.sum(dim=dims)
        else:
            if causal_only:  # counts from shapes: row i sees min(i + 1, S) keys
                t0 = t0_next
                n_b = torch.full((hn,), float(b * _causal_pairs(t0, t0 + shape[2], s)),
                                 **f64)
            else:
                n_b = v.expand(shape).sum(dim=dims).double()
            # a causal mask of all query rows is the same at the next call: kept
            vf, bias = ws.mask_parts(v, causal_only and shape[2] == t, (t, s))
            masked = torch.add(raw, bias, out=scratch("masked"))
            sum_b = torch.mul(raw, vf, out=scratch("tmp")).sum(dim=dims)
        t0_next += shape[2]
        zrow = masked.amax(dim=-1)  # (B, hn, tq): the max and the softmax's log Z
        maximum = torch.maximum(maximum, zrow.amax(dim=(0, 2)))
        if not exact:
            low = torch.where(v, raw, math.inf) if v is not None else raw
            minimum = torch.minimum(minimum, low.amin(dim=dims))
            del low
        # mean and M2 of this block, merged (Chan et al.)
        mean_b = sum_b.double() / n_b.clamp(min=1)
        centred = torch.sub(raw, mean_b.float().view(1, hn, 1, 1), out=scratch("tmp"))
        if vf is not None:
            centred.mul_(vf)
        m2_b = centred.mul_(centred).sum(dim=dims).double()
        delta = mean_b - mean
        n = count + n_b
        mean = mean + delta * n_b / n.clamp(min=1)
        m2 = m2 + m2_b + delta * delta * count * n_b / n.clamp(min=1)
        count = n
        # entropy of each softmax row, -sum p log p = logsumexp(z) - sum p z, with
        # logsumexp(z) = max(z) - log(max p) read off the softmax (no log per element);
        # sum p z over the raw logits: p is 0 where the mask excludes a pair
        z, z0, zmax = masked, raw, zrow
        if softcap is not None:  # the mask after the cap: tanh(-inf) is -1
            z0 = torch.div(raw, softcap, out=scratch("capped")).tanh_().mul_(softcap)
            z = z0 if bias is None else torch.add(z0, bias, out=scratch("tmp"))
            zmax = z.amax(dim=-1)
        p = torch.softmax(z, dim=-1, out=scratch("p"))
        lse = zmax - p.amax(dim=-1).log()
        ent = (lse - p.mul_(z0).sum(dim=-1)).clamp_(min=0)  # (B, hn, tq)
        del p, z, z0
        if v is None or causal_only:  # every query row sees at least one key
            rows = rows + float(b * shape[2])
            ent_sum = ent_sum + ent.sum(dim=(0, 2)).double()
            ent_min = torch.minimum(ent_min, ent.amin(dim=(0, 2)))
        else:
            row_ok = v.any(dim=-1).expand(shape[:3])
            ent = torch.where(row_ok, ent, 0.0)  # rows without a key: NaN from the softmax
            rows = rows + row_ok.sum(dim=(0, 2)).double()
            ent_sum = ent_sum + ent.sum(dim=(0, 2)).double()
            ent_min = torch.minimum(ent_min,
                                    torch.where(row_ok, ent, math.inf).amin(dim=(0, 2)))
        if exact:
            block_top = _block_top(masked, k_top, ws)
            top = block_top if top is None else torch.cat([top, block_top], dim=1)
            del block_top  # before the topk: the merge holds the concatenation only
            if top.shape[1] > k_top:
                top = top.topk(k_top, dim=1, sorted=False).values
        del masked, raw, vf
    count_i = count.round().to(torch.int64)
    capped_max = capped_p99 = None
    if exact and top is not None:
        top = top.sort(dim=1, descending=True).values
        p99 = quantile_from_top(top, count_i, PERCENT)
        if softcap is not None:
            capped_p99 = quantile_from_top(_cap(top, softcap), count_i, PERCENT)
    else:
        p99 = _hist_p99(q, k, valid, group, h0, h1, tq, scale, minimum, maximum, count_i)
        if softcap is not None:
            capped_p99 = _cap(p99, softcap)
    if softcap is not None:
        capped_max = _cap(maximum, softcap)
    return HeadStats(count=count, mean=mean, m2=m2, maximum=maximum, p99=p99, rows=rows,
                     ent_sum=ent_sum, ent_min=ent_min, capped_max=capped_max,
                     capped_p99=capped_p99)


def _hist_p99(q, k, valid, group, h0, h1, tq, scale, minimum, maximum, count) -> torch.Tensor:
    """p99 from a :data:`HIST_BINS`-bin histogram over ``[min, max]`` (second pass).

    Each order statistic is located in its bin and replaced by the bin centre, so the
    interpolated result is within half a bin of the exact one; we state one bin width.
    """
    hn = h1 - h0
    nb = HIST_BINS
    width = (maximum - minimum) / nb
    safe_w = torch.where(width > 0, width, torch.ones_like(width))
    counts = torch.zeros(hn, nb + 1, dtype=torch.int64, device=q.device)
    offsets = torch.arange(hn, device=q.device).view(1, hn, 1, 1) * (nb + 1)
    one = torch.ones(1, dtype=torch.int64, device=q.device)
    for logits, v in _blocks(q, k, valid, group, h0, h1, tq, scale):
        idx = ((logits - minimum.view(1, hn, 1, 1)) / safe_w.view(1, hn, 1, 1)).floor_()
        idx = idx.nan_to_num_(nan=nb, posinf=nb - 1, neginf=0).clamp_(0, nb - 1).long()
        if v is not None:
            idx.masked_fill_(~v, nb)  # the overflow bin, ignored
        flat_idx = (idx + offsets).reshape(-1)
        del idx
        counts.view(-1).index_add_(0, flat_idx, one.expand(flat_idx.numel()))
        del flat_idx
    cum = counts[:, :nb].cumsum(dim=1)
    last = (count - 1).clamp(min=0)
    num = PERCENT * last
    lo = num // 100
    frac = (num % 100).float() / 100
    hi = torch.minimum(lo + 1, last)
    bin_lo = torch.searchsorted(cum, (lo + 1).unsqueeze(1)).squeeze(1).clamp(max=nb - 1)
    bin_hi = torch.searchsorted(cum, (hi + 1).unsqueeze(1)).squeeze(1).clamp(max=nb - 1)
    centre = lambda i: minimum + (i.float() + 0.5) * width  # noqa: E731
    out = torch.lerp(centre(bin_lo), centre(bin_hi), frac)
    out = torch.where(width > 0, out, maximum)
    return torch.where(count > 0, out, torch.full_like(out, -math.inf))
