"""``record_attention()``: one line that instruments any other attention implementation.

Attention that neither calls ``F.scaled_dot_product_attention`` nor goes through
``nn.MultiheadAttention`` or HF's ``eager_attention_forward`` (a hand-written
``softmax(q @ k.T)``, a custom kernel, FlashAttention's own API) is invisible to the
monitor. Call :func:`record_attention` with the post-RoPE, post-QK-norm ``q`` and ``k``
just before the kernel::

    from logitwatch.hooks import record_attention

    def forward(self, x):
        q, k, v = ...                          # (B, H, T, D), (B, H_kv, S, D)
        record_attention(q, k, is_causal=True, scale=self.scale, layer=self.layer_idx)
        return my_kernel(q, k, v)

Outside a sampled training forward it returns at once (no tensor is touched); under
``torch.compile`` tracing it is skipped. It returns the ``q, k`` to use (changed only
while a temporary QK-norm fuse is inserted on that layer).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._monitor import Monitor

__all__ = ["record_attention"]

_local = threading.local()


def _active() -> list[Monitor]:
    active = getattr(_local, "monitors", None)
    if active is None:
        active = _local.monitors = []
    return active


def push(monitor: Monitor) -> None:
    """Mark ``monitor`` as capturing on this thread (called by the monitor)."""
    _active().append(monitor)


def pop(monitor: Monitor) -> None:
    active = _active()
    if monitor in active:
        active.remove(monitor)


def record_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    layer: int | None = None,
    query_mask: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hand one attention call's ``q`` and ``k`` to every monitor capturing on this thread.

    Returns the ``(q, k)`` to run the kernel with: ``(query, key)`` themselves, unless a
    temporary QK-norm fuse is inserted on this layer (docs/FUSES.md); a caller that wants
    that fuse writes ``q, k = record_attention(q, k, ...)``. A soft-cap fuse cannot reach
    a caller's kernel (it says so once).

    Args:
        query: ``(B, H, T, D)`` (or SDPA's other layouts), after RoPE and QK-norm.
        key: ``(B, H_kv, S, D)``.
        attn_mask: Bool (True = attend) or additive float mask, broadcastable to
            ``(B, H, T, S)``; combined with ``is_causal``.
        is_causal: Query ``i`` attends keys ``<= i`` (top-left aligned, as SDPA).
        scale: Logit scale (default ``D ** -0.5``).
        softcap: Logit soft-cap ``c`` if the kernel applies ``c·tanh(x/c)``.
        layer: Row of the per-head matrices; default: call order in the forward.
        query_mask: ``(B, T)`` bool or 0/1, True/1 = a real (unpadded) query token. The
            rows of padded queries are left out of every statistic. Default: the
            monitored model's 2-D ``attention_mask`` forward argument where its shape
            matches, else every query is real.
        key_mask: ``(B, S)``, True/1 = a real key token; pairs with a padded key are
            left out (as if ``attn_mask`` excluded them). Default as ``query_mask``.

    Never raises into the caller; a failure disables the monitor's attention part.
    """
    if torch.compiler.is_compiling():
        return query, key
    active = getattr(_local, "monitors", None)
    if not active:
        return query, key
    out = query, key
    for monitor in list(active):
        got = monitor.record(query, key, attn_mask=attn_mask, is_causal=is_causal,
                             scale=scale, softcap=softcap, layer=layer, query_mask=query_mask,
                             key_mask=key_mask)
        if got is not None:
            out = got
    return out
