"""Rewriting attention calls for the temporary QK-norm and soft-cap fuses.

The monitor intercepts every attention call it measures (``hooks/_sdpa.py``: SDPA and
``F.multi_head_attention_forward``; ``hooks/_eager.py``: HF ``eager_attention_forward``;
``record_attention``). While a fuse rewrites a layer (:attr:`AttentionRewrite.active`), that
interception runs on **every** forward (training, evaluation, sampled or not), and each call
of a rewritten layer is changed here before it runs:

* **QK-norm** (per layer ``λ`` in (0, 1]): ``q ← λ·n(q) + (1-λ)·q`` and the same for ``k``,
  ``n(x) = g·x / sqrt(mean(x²) + eps)`` over ``head_dim``, per head and token, no learnable
  gain (nothing is added to the model or its optimizer). Gain: a plain RMS-norm gives
  ``|n(q)·n(k)|·scale <= d·scale = sqrt(d)`` (4 for ``d = 16``): the softmax goes almost
  flat and a head loses the contrast it learned. With ``g = sqrt(tau / (d·|scale|))`` the
  logit is exactly ``tau·cos(q, k)``: bounded by ``tau`` (Cauchy-Schwarz) and still ordered
  by the direction of ``q`` and ``k``, so a head keeps up to ``tau`` of contrast (the fuse's
  own bound; the demo's healthy run with a learned QK-norm stays under ~25). Differentiable:
  the gradient reaches ``W_q``/``W_k`` through both terms. Computed in float32 for half
  inputs, cast back.
* **Soft-cap** (per layer ``cap``): the scores ``s = q·kᵀ·scale`` become ``cap·tanh(s/cap)``
  (Gemma-2) before the mask and the softmax. SDPA does not expose its scores, so a capped
  SDPA (or MHA) call is computed explicitly here: float32 scores ``(B, H, T, S)`` held whole
  (SDPA's fused kernels never hold them), GQA by ``repeat_interleave``, SDPA's top-left
  causal mask, bool or additive masks, dropout as the call asks (``dropout_p``; an
  evaluation caller passes 0). HF eager attention is rebuilt the same way as
  ``eager_attention_forward`` (``repeat_kv``, additive mask, float32 softmax, dropout when
  ``module.training``), the model's own soft-cap (Gemma-2) first. ``record_attention``
  cannot be capped (the kernel is the caller's).

The monitor measures the calls with the rewritten ``q`` and ``k``: its statistics are those
of the logits the softmax receives (pre-cap: ``attn.logit_max``; after the cap
``attn.capped_logit_max``). Every entry here catches its own failures: the fuse that owns
the layer fails (``failed`` event, off for the run) and the call runs unchanged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .._maxlogit import head_max

if TYPE_CHECKING:
    from ._base import Fuse

__all__ = ["AttentionRewrite", "Rewritten", "capped_sdpa", "norm_qk", "rewrite_of"]

log = logging.getLogger("logitwatch.hooks")

_SDPA = F.scaled_dot_product_attention
#: eps of the norm's mean square (as RMSNorm).
EPS = 1e-6


class Rewritten:
    """One rewritten call: run ``func(*args, **kwargs)``; the monitor measures ``query``
    and ``key`` (what the softmax receives, per head) with ``softcap``."""

    __slots__ = ("args", "func", "key", "kwargs", "query", "softcap")

    def __init__(self, func: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], query: torch.Tensor, key: torch.Tensor,
                 softcap: float | None) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self.query, self.key, self.softcap = query, key, softcap


def gain(tau: float, head_dim: int, scale: float | None) -> float:
    """The norm's fixed gain: ``n(q)·n(k)·scale = tau·cos(q, k)`` (module docstring)."""
    s = abs(scale) if scale else 1.0 / math.sqrt(head_dim)
    return math.sqrt(tau / (head_dim * s))


def norm_qk(x: torch.Tensor, lam: float, g: float) -> torch.Tensor:
    """``λ·g·x/rms(x) + (1-λ)·x`` over the last dimension (at least float32 inside,
    ``x``'s dtype out)."""
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    n = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * g
    out = n if lam >= 1.0 else lam * n + (1.0 - lam) * xf
    return out.to(x.dtype)


def _cap(s: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(s / cap) * cap


def capped_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False, *, cap: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` computed explicitly with ``cap·tanh(s/cap)`` on
    the scores (float32 scores, output in ``value``'s dtype)."""
    hq, hk = query.shape[-3] if query.dim() >= 3 else 1, key.shape[-3] if key.dim() >= 3 else 1
    if query.dim() >= 3 and hq != hk:
        key = key.repeat_interleave(hq // hk, dim=-3)
        value = value.repeat_interleave(hq // hk, dim=-3)
    t, s = query.shape[-2], key.shape[-2]
    sc = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = _cap(torch.matmul(query.float(), key.float().transpose(-2, -1)) * sc, cap)
    masked = None
    if is_causal:
        masked = ~torch.ones(t, s, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            extra = ~attn_mask
            masked = extra if masked is None else masked | extra
        else:
            scores = scores + attn_mask.float()
    if masked is not None:
        scores = scores.masked_fill(masked, -math.inf)
    p = torch.softmax(scores, dim=-1)
    if masked is not None or (attn_mask is not None and attn_mask.dtype != torch.bool):
        p = p.masked_fill(torch.isneginf(scores).all(-1, keepdim=True), 0.0)  # SDPA: 0 rows
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    return torch.matmul(p.to(value.dtype), value)


def _mha_explicit(a: dict[str, Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  cap: float | None, batched: bool) -> tuple[torch.Tensor, Any]:
    """The rest of ``F.multi_head_attention_forward`` from per-head ``q, k, v``
    ``(B, H, T|S, hd)``: masks, (capped) softmax, dropout, weights, out projection."""
    bsz, heads, tgt, hd = q.shape
    src = k.shape[2]
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) / math.sqrt(hd)
    if cap is not None:
        scores = _cap(scores, cap)
    mask = a.get("attn_mask")
    if mask is None and a.get("is_causal"):
        mask = ~torch.ones(tgt, src, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        m = mask.view(1, 1, tgt, src) if mask.dim() == 2 else mask.view(bsz, heads, tgt, src)
        scores = (scores.masked_fill(m, -math.inf) if m.dtype == torch.bool
                  else scores + m.float())
    kpm = a.get("key_padding_mask")
    if kpm is not None:
        kpm = kpm.view(bsz, 1, 1, src)
        scores = (scores.masked_fill(kpm, -math.inf) if kpm.dtype == torch.bool
                  else scores + kpm.float())
    p = torch.softmax(scores, dim=-1).to(v.dtype)
    if a.get("training", True) and a.get("dropout_p", 0.0) > 0:
        p = F.dropout(p, a["dropout_p"])
    out = torch.matmul(p, v).permute(2, 0, 1, 3).reshape(tgt, bsz, heads * hd)
    out = F.linear(out, a["out_proj_weight"], a.get("out_proj_bias"))
    weights = None
    if a.get("need_weights", True):
        weights = p.mean(dim=1) if a.get("average_attn_weights", True) else p
        if not batched:
            weights = weights.squeeze(0)
    return (out if batched else out.squeeze(1)), weights


class AttentionRewrite:
    """The per-layer rewrite the QK-norm and soft-cap fuses share on one monitor
    (``monitor.attn_rewrite``; see the module docstring)."""

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor
        self.lam: dict[int, float] = {}  # QK-norm: λ per layer (absent: no norm)
        self.tau = 25.0  # QK-norm's logit bound (the QKNorm fuse sets it)
        self.caps: dict[int, float] = {}  # soft-cap per layer
        self.raw_max: dict[int, torch.Tensor] = {}  # per-head max of the un-normed logits
        self.measure_raw: set[int] = set()  # layers whose raw max the next sample takes
        self.owners: dict[str, Fuse] = {}  # "qk_norm" / "soft_cap" -> the fuse
        self.calls = 0  # rewritten calls so far

    @property
    def active(self) -> bool:
        """Whether some layer is rewritten now (the monitor then intercepts every forward)."""
        return bool(self.norms) or bool(self.capped)

    def _live(self, name: str) -> bool:
        owner = self.owners.get(name)
        return owner is not None and not owner.failed and owner.unavailable is None

    @property
    def norms(self) -> dict[int, float]:
        """λ per layer, while the QK-norm fuse lives (a failed fuse's layers go back to the
        model's own attention at once)."""
        return self.lam if self.lam and self._live("qk_norm") else {}

    @property
    def capped(self) -> dict[int, float]:
        """The cap per layer, while the soft-cap fuse lives."""
        return self.caps if self.caps and self._live("soft_cap") else {}

    def _fail(self, layer: int) -> None:
        """A rewrite raised: the fuses acting on ``layer`` fail (off for the run) and their
        layers go back to the model's own attention."""
        fuses = self.owners.get("qk_norm") if layer in self.lam else None, (
            self.owners.get("soft_cap") if layer in self.caps else None)
        for fuse in fuses:
            if fuse is None or fuse.failed:
                continue
            fuse.failed = True
            log.warning("logitwatch: fuse %s failed while rewriting attention and is off "
                        "for the rest of the run; training continues unaffected",
                        fuse.name, exc_info=True)
            if fuse.fuses is not None:
                from ._base import Event

                fuse.fuses.events.append(Event(fuse.fuses._step, fuse.name, "failed"))

    def _qk(self, layer: int, q: torch.Tensor, k: torch.Tensor, scale: float | None,
            mask: Any = None, causal: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor]:
        lam = self.norms.get(layer)
        if not lam:
            return q, k
        mon = self.monitor
        if (layer in self.measure_raw and getattr(mon, "capturing", False)
                and not getattr(mon, "max_only", False)):  # a sampled forward
            m = head_max(q.detach(), k.detach(), attn_mask=mask, is_causal=causal,
                         scale=scale)
            old = self.raw_max.get(layer)
            self.raw_max[layer] = m if old is None or old.shape != m.shape else (
                torch.maximum(old, m))
        g = gain(self.tau, q.shape[-1], scale)
        return norm_qk(q, lam, g), norm_qk(k, lam, g)

    def _guarded(self, layer: int, run: Callable[[], Any], fallback: Callable[[], Any]
                 ) -> Callable[[], Any]:
        """``run`` for the call; if it raises, the fuses fail and ``fallback`` (the call as
        the model made it) runs instead."""
        def call() -> Any:
            try:
                return run()
            except Exception:
                self._fail(layer)
                return fallback()

        return call

    # -- the paths ---------------------------------------------------------------------------

    def sdpa(self, layer: int, func: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Rewritten | None:
        """An SDPA or MHA call of layer ``layer`` (call order); None: run it unchanged."""
        if layer not in self.norms and layer not in self.capped:
            return None
        try:
            if func is _SDPA:
                return self._sdpa(layer, args, kwargs)
            return self._mha(layer, args, kwargs)
        except Exception:
            self._fail(layer)
            return None

    def _sdpa(self, layer: int, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> Rewritten:
        from .._sdpa import _SDPA_PARAMS

        a = dict(zip(_SDPA_PARAMS, args, strict=False))
        a.update(kwargs)
        q, k = self._qk(layer, a["query"], a["key"], a.get("scale"), a.get("attn_mask"),
                        bool(a.get("is_causal", False)))
        a["query"], a["key"] = q, k
        cap = self.capped.get(layer)
        self.calls += 1
        if cap is None:
            return Rewritten(_SDPA, (), a, q, k, None)
        run = self._guarded(layer, lambda: capped_sdpa(**a, cap=cap),
                            lambda: _SDPA(*args, **kwargs))
        return Rewritten(run, (), {}, q, k, cap)

    def _mha(self, layer: int, args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> Rewritten | None:
        from .._sdpa import _MHA, _MHA_PARAMS

        a = dict(zip(_MHA_PARAMS, args, strict=False))
        a.update(kwargs)
        if a.get("bias_k") is not None or a.get("add_zero_attn") or (
                a.get("static_k") is not None or a.get("static_v") is not None):
            self.cannot_path(layer, "nn.MultiheadAttention with bias_k, add_zero_attn or "
                             "static keys")
            return None
        query, key, value = a["query"], a["key"], a["value"]
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        tgt, bsz, embed = query.shape
        src = key.shape[0]
        heads = int(a["num_heads"])
        hd = embed // heads
        bias = a.get("in_proj_bias")
        if a.get("use_separate_proj_weight"):
            ws = a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"]
        else:
            ws = a["in_proj_weight"].chunk(3)
        bs = (None, None, None) if bias is None else bias.chunk(3)
        q = F.linear(query, ws[0], bs[0]).view(tgt, bsz, heads, hd).permute(1, 2, 0, 3)
        k = F.linear(key, ws[1], bs[1]).view(src, bsz, heads, hd).permute(1, 2, 0, 3)
        v = F.linear(value, ws[2], bs[2]).view(src, bsz, heads, hd).permute(1, 2, 0, 3)
        q, k = self._qk(layer, q, k, None)
        cap = self.capped.get(layer)
        self.calls += 1
        run = self._guarded(layer, lambda: _mha_explicit(a, q, k, v, cap, batched),
                            lambda: _MHA(*args, **kwargs))
        return Rewritten(run, (), {}, q, k, cap)

    def eager(self, layer: int, original: Callable[..., Any], module: torch.nn.Module,
              query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Rewritten | None:
        """An HF ``eager_attention_forward`` call; None: run it unchanged."""
        if layer not in self.norms and layer not in self.capped:
            return None
        try:
            scaling = kwargs["scaling"] if "scaling" in kwargs else (args[0] if args else None)
            q, k = self._qk(layer, query, key, scaling, attention_mask)
            cap = self.capped.get(layer)
            self.calls += 1
            if cap is None:
                return Rewritten(original, (module, q, k, value, attention_mask, *args),
                                 kwargs, q, k, None)
            dropout = kwargs.get("dropout", args[1] if len(args) > 1 else 0.0)
            own = kwargs.get("softcap")

            run = self._guarded(layer, lambda: _eager_explicit(
                module, q, k, value, attention_mask, scaling, float(dropout or 0.0), own, cap),
                lambda: original(module, query, key, value, attention_mask, *args, **kwargs))
            return Rewritten(run, (), {}, q, k, cap)
        except Exception:
            self._fail(layer)
            return None

    def custom(self, layer: int, query: torch.Tensor, key: torch.Tensor,
               scale: float | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A ``record_attention`` call: the normed ``(q, k)`` to use (QK-norm), or None."""
        if layer in self.capped:
            self.cannot_path(layer, "record_attention (the attention kernel is the caller's)",
                             fuse="soft_cap")
        if layer not in self.norms:
            return None
        try:
            self.calls += 1
            return self._qk(layer, query, key, scale)
        except Exception:
            self._fail(layer)
            return None

    def cannot_path(self, layer: int, what: str, fuse: str | None = None) -> None:
        """Say once per fuse and path that layer ``layer`` cannot be rewritten there."""
        for name in ((fuse,) if fuse else ("qk_norm", "soft_cap")):
            owner = self.owners.get(name)
            if owner is not None and hasattr(owner, "path_unavailable"):
                owner.path_unavailable(layer, what)


def _eager_explicit(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: torch.Tensor | None,
                    scaling: float | None, dropout: float, own_cap: float | None,
                    cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``eager_attention_forward`` with ``cap·tanh(s/cap)`` on the scores."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    sc = scaling if scaling is not None else query.shape[-1] ** -0.5
    w = torch.matmul(query, key.transpose(2, 3)) * sc
    if own_cap:
        w = _cap(w, float(own_cap))
    w = _cap(w, cap)
    if attention_mask is not None:
        w = w + attention_mask[:, :, :, : key.shape[-2]]
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    w = F.dropout(w, p=dropout, training=module.training)
    out = torch.matmul(w, value).transpose(1, 2).contiguous()
    return out, w


def rewrite_of(monitor: Any) -> AttentionRewrite:
    """The monitor's :class:`AttentionRewrite` (made on first use)."""
    rw = getattr(monitor, "attn_rewrite", None)
    if rw is None:
        rw = AttentionRewrite(monitor)
        monitor.attn_rewrite = rw
    return rw


class LayerFuse:
    """What the QK-norm and soft-cap fuses share (a mixin of :class:`~._base.Fuse`): the
    trigger on the monitor's sampled ``attn.logit_p99`` (per layer, the largest over its
    heads) past ``limit`` for ``patience`` consecutive sampled steps, suggestions, the
    alerts they address, and the paths they cannot rewrite."""

    name: str
    limit: float
    patience: int

    def _init_layers(self) -> None:
        self.rewrite: AttentionRewrite | None = None
        self._over: dict[int, int] = {}
        self._rows: list[int] = []  # the frame's rows: layer indices, in order
        self._suggested: set[int] = set()
        self._last_suggest: int | None = None
        self._paths: set[str] = set()

    def matches(self, alert: Any) -> bool:
        from logitwatch.wire import FUSE_RULES

        rule = str(alert.get("rule", ""))
        return rule.startswith(tuple(r.rstrip("*") for r in FUSE_RULES[self.name]))

    def _bind_rewrite(self, fuses: Any) -> None:
        from ._base import multi_rank

        mon = fuses.monitor
        if mon is None or self.mode == "off":  # type: ignore[attr-defined]
            return
        if multi_rank() or getattr(mon, "_shard", None) is not None:
            self.cannot(0, "several ranks (DDP/FSDP): each rank measures its own batch, and "  # type: ignore[attr-defined]
                        "rewriting replicas' attention at different steps would "
                        "desynchronise them")
            return
        self.rewrite = rewrite_of(mon)
        self.rewrite.owners[self.name] = self  # type: ignore[assignment]

    def _frame_rows(self) -> None:
        mon = self.fuses.monitor if self.fuses is not None else None  # type: ignore[attr-defined]
        self._rows = sorted(mon._buffer.attn) if mon is not None else []

    def _p99(self, heads: dict[str, list[list[float]]]) -> dict[int, float]:
        """Per layer, the frame's largest ``attn.logit_p99`` over heads (NaN: none)."""
        rows = heads.get("attn.logit_p99") or []
        if len(rows) != len(self._rows):
            return {}
        out = {}
        for layer, row in zip(self._rows, rows, strict=True):
            vals = [v for v in row if isinstance(v, float) and not math.isnan(v)]
            out[layer] = max(vals) if vals else math.nan
        return out

    def _tripped(self, p99: dict[int, float], skip: Any) -> list[int]:
        """Layers (not in ``skip``) whose p99 passed ``limit`` for ``patience`` samples."""
        out = []
        for layer, p in p99.items():
            if layer in skip:
                continue
            self._over[layer] = self._over.get(layer, 0) + 1 if p > self.limit else 0
            if self._over[layer] >= self.patience:
                out.append(layer)
        return out

    def _suggest(self, step: int, layers: list[int], p99: dict[int, float]) -> None:
        self._suggested = set(layers)
        if self._last_suggest is not None and step - self._last_suggest < 100:
            return
        first = self._last_suggest is None
        self._last_suggest = step
        self.record(step, "suggest", layers=layers,  # type: ignore[attr-defined]
                    p99=[round(p99[x], 3) for x in layers], does=self.describe())  # type: ignore[attr-defined]
        if first:
            log.info("logitwatch: fuse %s (suggest) would act on layers %s at step %d "
                     "(attn.logit_p99 past %g for %d samples); apply: "
                     "mon.fuses.apply(%r) or the collector's control", self.name, layers,
                     step, self.limit, self.patience, self.name)

    def path_unavailable(self, layer: int, what: str) -> None:
        """Say once per path that this fuse cannot rewrite a layer there (the fuse stays on
        for the layers it can rewrite)."""
        if what in self._paths:
            return
        self._paths.add(what)
        log.warning("logitwatch: fuse %s cannot rewrite layer %d: %s; left as it is",
                    self.name, layer, what)
        self.record(self.fuses._step if self.fuses is not None else 0,  # type: ignore[attr-defined]
                    "unavailable", layer=layer, path=what)
