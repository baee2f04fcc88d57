"""Capture of attention calls with a ``TorchFunctionMode``: SDPA and ``nn.MultiheadAttention``.

The mode is entered by the model's forward pre-hook on sampled steps only and exited by
its forward post-hook, so non-sampled steps pay nothing. While active it sees every
top-level torch call of the forward on this thread. For
``F.scaled_dot_product_attention`` it hands ``(q, k, mask, is_causal, scale)`` to a
recorder; for ``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` and
``nn.TransformerEncoder/Decoder`` layers dispatch to; the SDPA call inside it is not
top-level and is not seen twice) it rebuilds ``q`` and ``k`` from the fused
``in_proj_weight`` (or the separate projections), and the mask from ``attn_mask`` and
``key_padding_mask``; in self-attention (``query is key``, as ``nn.TransformerEncoder``
and the decoder's self-attention call it) ``key_padding_mask`` also marks the padded
*query* rows, which are left out. Then the original function runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["AttentionCall", "Recorder", "SdpaCapture", "mha_call", "parse_call", "sdpa_call"]

_SDPA = F.scaled_dot_product_attention
_MHA = F.multi_head_attention_forward
_SDPA_PARAMS = (
    "query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa",
)
_MHA_PARAMS = (
    "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight",
    "in_proj_bias", "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight",
    "out_proj_bias", "training", "key_padding_mask", "need_weights", "attn_mask",
    "use_separate_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
    "static_k", "static_v", "average_attn_weights", "is_causal",
)


class AttentionCall:
    """What the statistics need from one attention call (SDPA conventions)."""

    __slots__ = ("attn_mask", "is_causal", "key", "key_valid", "query", "query_valid",
                 "scale")

    def __init__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None,
        query_valid: torch.Tensor | None = None,
        key_valid: torch.Tensor | None = None,
    ) -> None:
        self.query = query
        self.key = key
        self.attn_mask = attn_mask
        self.is_causal = is_causal
        self.scale = scale
        self.query_valid = query_valid  # (B, T) bool: True = a real query token
        self.key_valid = key_valid  # (B, S) bool: True = a real key token


def sdpa_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AttentionCall:
    bound = dict(zip(_SDPA_PARAMS, args, strict=False))
    bound.update(kwargs)
    return AttentionCall(bound["query"], bound["key"], bound.get("attn_mask"),
                         bool(bound.get("is_causal", False)), bound.get("scale"))


def mha_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AttentionCall | None:
    """Rebuild per-head ``q``/``k`` and a bool "attend" mask from MHA's arguments.

    Returns None for what we do not model (``bias_k``, ``add_zero_attn``, static keys).
    """
    a = dict(zip(_MHA_PARAMS, args, strict=False))
    a.update(kwargs)
    if a.get("bias_k") is not None or a.get("add_zero_attn") or a.get("static_k") is not None:
        return None
    query, key = a["query"], a["key"]
    self_attention = query is key
    batched = query.dim() == 3
    if not batched:  # (L, E): one sequence
        query, key = query.unsqueeze(1), key.unsqueeze(1)
    tgt, bsz, embed = query.shape
    src = key.shape[0]
    heads = int(a["num_heads"])
    hd = embed // heads
    bias = a.get("in_proj_bias")
    with torch.no_grad():
        if a.get("use_separate_proj_weight"):
            wq, wk = a["q_proj_weight"], a["k_proj_weight"]
        else:
            wq, wk = a["in_proj_weight"][:embed], a["in_proj_weight"][embed : 2 * embed]
        bq = bk = None
        if bias is not None:
            bq, bk = bias[:embed], bias[embed : 2 * embed]
        q = F.linear(query.detach(), wq.detach(), None if bq is None else bq.detach())
        k = F.linear(key.detach(), wk.detach(), None if bk is None else bk.detach())
        q = q.view(tgt, bsz, heads, hd).permute(1, 2, 0, 3)
        k = k.view(src, bsz, heads, hd).permute(1, 2, 0, 3)
        valid = _mha_valid(a.get("attn_mask"), bsz, heads, tgt, src)
        kpm = a.get("key_padding_mask")
        keys = None if kpm is None else _as_valid(kpm).reshape(-1, src)
    rows = keys if self_attention and tgt == src else None
    return AttentionCall(q, k, valid, False, None, query_valid=rows, key_valid=keys)


def _as_valid(mask: torch.Tensor) -> torch.Tensor:
    """MHA masks: bool True = *not* allowed; float = additive."""
    from ._stats import MASKED_BELOW

    mask = mask.detach()
    return ~mask if mask.dtype == torch.bool else mask > MASKED_BELOW


def _mha_valid(
    attn_mask: torch.Tensor | None, bsz: int, heads: int, tgt: int, src: int,
) -> torch.Tensor | None:
    """``attn_mask`` as a bool "attend" mask broadcastable to ``(B, H, T, S)``."""
    if attn_mask is None:
        return None
    v = _as_valid(attn_mask)
    return v.view(1, 1, tgt, src) if v.dim() == 2 else v.view(bsz, heads, tgt, src)


#: ``record(func, args, kwargs)`` for the attention functions above; must not raise. It
#: returns None, or a rewritten call (``.func``, ``.args``, ``.kwargs``) to run instead.
Recorder = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
ATTENTION_FUNCTIONS = (_SDPA, _MHA)


def parse_call(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AttentionCall | None:
    """The :class:`AttentionCall` of an SDPA or MHA call (None: not modelled)."""
    return sdpa_call(args, kwargs) if func is _SDPA else mha_call(args, kwargs)


class SdpaCapture(TorchFunctionMode):
    """Calls ``record(func, args, kwargs)`` for each SDPA / MHA call while active, then
    runs it as is (or the call ``record`` returned: the QK-norm and soft-cap fuses).

    ``record`` must not raise (the monitor guards it). After :meth:`retire` the mode is a
    pure pass-through; :meth:`remove` takes it off the mode stack even when it is not on
    top. Under ``torch.compile`` tracing every call passes through unmeasured.
    """

    def __init__(self, record: Recorder) -> None:
        super().__init__()
        self._record: Recorder | None = record

    def retire(self) -> None:
        self._record = None

    def is_top(self) -> bool:
        """Whether this mode is the innermost torch function mode of this thread."""
        n = torch._C._len_torch_function_stack()
        return n > 0 and torch._C._get_function_stack_at(n - 1) is self

    def remove(self) -> bool:
        """Take this mode off this thread's mode stack wherever it is: the modes above it
        (another monitor's, or one someone left there) are popped and pushed back in
        order. A mode left on the stack, even retired, would cost every torch call of the
        rest of the process a Python dispatch. False (and retired): not on this stack."""
        self.retire()
        n = torch._C._len_torch_function_stack()
        at = next((i for i in range(n - 1, -1, -1)
                   if torch._C._get_function_stack_at(i) is self), None)
        if at is None:
            return False
        above = [torch._C._pop_torch_function_stack() for _ in range(n - 1 - at)]
        torch._C._pop_torch_function_stack()  # this mode
        for mode in reversed(above):  # popped innermost first: push the outermost first
            torch._C._push_on_torch_function_stack(mode)
        return True

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        # Under torch.compile (a compiled block inside an eagerly captured forward) Dynamo
        # would trace the statistics code into the graph and fail to compile it: compiled
        # code is passed through unmeasured and unrewritten (docs/HOOKS.md, torch.compile).
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        if self._record is not None and (func is _SDPA or func is _MHA):
            got = self._record(func, args, kwargs)
            if got is not None:  # a fuse rewrote the call (hooks/fuses/_rewrite.py)
                func, args, kwargs = got.func, got.args, got.kwargs
        return func(*args, **kwargs)
