"""The attention call's inputs for a statistics pass: ``q``/``k`` in ``(B, H, L, D)``
layout, the GQA group, the scale and which (query, key) pairs count (:class:`_Mask`: the
mask as given, the causal flag and the real-token masks, turned into a bool block only for
the query rows being processed). Shared by the statistics (:mod:`._logits`) and the
max-only pass (:mod:`._maxlogit`)."""

from __future__ import annotations

import torch

from ._stats import MASKED_BELOW

__all__ = ["prepare_attention"]


def prepare_attention(
    query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
    scale: float | None, query_valid: torch.Tensor | None, key_valid: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, int, float, _Mask | None]:
    """``(q, k, group, scale, valid)`` for a statistics pass: q and k detached as ``(B, H,
    T, D)`` / ``(B, H_kv, S, D)`` (a key batch of one broadcast), the query heads per key
    head (GQA), the logit scale (default ``D ** -0.5``) and the valid pairs (None: all)."""
    full_shape = tuple(query.shape[:-1]) + (key.shape[-2],)
    q = _as_bhtd(query.detach())
    k = _as_bhtd(key.detach())
    b, h, t, d = q.shape
    s = k.shape[2]
    if k.shape[0] != b and k.shape[0] == 1:
        k = k.expand(b, *k.shape[1:])
    if k.shape[1] == 0 or h % k.shape[1]:
        raise ValueError(f"{h} query heads cannot share {k.shape[1]} key heads")
    group = h // k.shape[1]
    scale = d**-0.5 if scale is None else float(scale)
    rows = None if query_valid is None else _token_mask(query_valid, b, t, "query_valid")
    cols = None if key_valid is None else _token_mask(key_valid, b, s, "key_valid")
    if attn_mask is None and not is_causal and rows is None and cols is None:
        return q, k, group, scale, None
    mask = None
    if attn_mask is not None:
        mask = attn_mask.detach()
        if mask.shape[-1] > s:
            mask = mask[..., :s]  # as HF eager does with a longer mask
        if query.dim() != 4:
            mask = _as_bhtd(torch.broadcast_to(mask, full_shape))
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    return q, k, group, scale, _Mask(mask, is_causal, rows, cols)


def _token_mask(valid: torch.Tensor, b: int, n: int, what: str) -> torch.Tensor:
    """A ``(B, n)`` "real token" mask as bool (nonzero = real); a batch of one broadcasts."""
    if valid.dim() != 2 or valid.shape[-1] != n or valid.shape[0] not in (1, b):
        raise ValueError(f"{what} must be (batch, {n}), got {tuple(valid.shape)}")
    valid = valid.detach()
    return valid if valid.dtype == torch.bool else valid != 0


class _Mask:
    """The attention mask as given (never expanded), the causal flag and the real-token
    masks of queries (``rows``, ``(B, T)``) and keys (``cols``, ``(B, S)``); turned into a
    bool block only for the query rows being processed."""

    def __init__(self, mask: torch.Tensor | None, is_causal: bool,
                 rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> None:
        self.mask = mask
        self.is_causal = is_causal
        self.rows = rows
        self.cols = cols

    @property
    def causal_only(self) -> bool:
        """Whether the valid pairs follow from shapes alone (a causal mask, nothing else)."""
        return self.is_causal and self.mask is None and self.rows is None and self.cols is None

    def block(self, b: int, h0: int, h1: int, t0: int, t1: int, s: int,
              device: torch.device) -> torch.Tensor:
        v: torch.Tensor | None = None
        if self.mask is not None:
            m = self.mask if self.mask.shape[1] == 1 else self.mask[:, h0:h1]
            m = m[:, :, t0:t1] if m.shape[2] != 1 else m
            v = m if m.dtype == torch.bool else m > MASKED_BELOW
        if self.is_causal:  # top-left aligned, as SDPA: query i sees keys <= i
            rows = torch.arange(t0, t1, device=device).unsqueeze(1)
            causal = torch.arange(s, device=device).unsqueeze(0) <= rows
            v = causal if v is None else v & causal
        if self.rows is not None:
            r = self.rows[:, t0:t1].view(self.rows.shape[0], 1, t1 - t0, 1)
            v = r if v is None else v & r
        if self.cols is not None:
            c = self.cols.view(self.cols.shape[0], 1, 1, s)
            v = c if v is None else v & c
        assert v is not None
        return v  # broadcastable to (b, h1 - h0, t1 - t0, s), never expanded


def _as_bhtd(x: torch.Tensor) -> torch.Tensor:
    """View SDPA's ``(..., L, E)`` layouts as ``(B, H, L, E)`` (3-d: one head)."""
    if x.dim() == 4:
        return x
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() < 3:
        return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))
    return x.reshape(-1, *x.shape[-3:])
