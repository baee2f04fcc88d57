"""A tiny byte-level GPT for the demo training job.

Token + learned position embeddings, pre-LN transformer blocks (causal self-attention,
GELU MLP), a final LayerNorm and an untied LM head.

Attention always goes through :func:`torch.nn.functional.scaled_dot_product_attention`
(``is_causal=True``, explicit ``scale``) so that a monitor intercepting that function
(for example with a ``TorchFunctionMode``) sees the model's ``q`` and ``k``. See
:func:`attention` for the two ``attn_dtype`` modes and how the float16 overflow is
reproduced on CPU.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

FP16_MAX = 65504.0

AttnDtype = Literal["float32", "float16"]


@dataclass(frozen=True)
class GPTConfig:
    """Model options (see :class:`TinyGPT`)."""

    vocab_size: int = 256
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    seq_len: int = 64
    qk_norm: bool = False
    attn_dtype: AttnDtype = "float32"
    init_std: float = 0.02


def fp16_overflow_poison(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """NaN for each query row whose causal float16 scores overflow, else 0.

    Scores ``q @ k^T * scale`` are computed in float32 from the (already float16) ``q``
    and ``k`` and rounded to float16, as a half-precision attention kernel stores them.
    A row holding ``+inf`` (a score of 65520 or more; 65504 is the largest finite half) or
    ``NaN`` among its causal pairs makes the softmax ``exp(s - max)`` produce NaN for that
    row, which is what this returns (shape ``[..., T, 1]``, float32, no gradient).
    """
    with torch.no_grad():
        scores = (q.float() @ k.float().transpose(-2, -1) * scale).to(torch.float16)
        t_q, t_k = scores.shape[-2], scores.shape[-1]
        causal = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril()
        bad = (torch.isposinf(scores) | torch.isnan(scores)) & causal
        row_bad = bad.any(dim=-1, keepdim=True)
        return torch.where(row_bad, float("nan"), 0.0).to(torch.float32)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, attn_dtype: AttnDtype
) -> torch.Tensor:
    """Causal attention of ``q, k, v`` (``[B, H, T, head_dim]``), returned in float32.

    * ``"float32"``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True,
      scale=scale)`` on the float32 tensors.
    * ``"float16"``: ``q``, ``k`` and ``v`` are cast to float16 and the same call is made
      with the half tensors (the intercepted ``q``/``k`` are float16). PyTorch's CPU
      kernel accumulates half attention in float32 and does not overflow, so the GPU
      behaviour is emulated: :func:`fp16_overflow_poison` is added to the output, turning
      every query row with a causal score ``q.k*scale`` beyond the float16 range into
      NaN (it then spreads through later layers and makes the loss NaN). On CPU the call
      runs under ``sdpa_kernel(SDPBackend.MATH)``: the same numbers (CPU half attention
      is computed in float32 either way) but about 4x faster than the fused CPU kernel.
    """
    if attn_dtype == "float32":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if attn_dtype != "float16":
        raise ValueError(f"attn_dtype must be 'float32' or 'float16', not {attn_dtype!r}")
    qh, kh, vh = q.to(torch.float16), k.to(torch.float16), v.to(torch.float16)
    backend = sdpa_kernel(SDPBackend.MATH) if q.device.type == "cpu" else nullcontext()
    with backend:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    return out.to(torch.float32) + fp16_overflow_poison(qh, kh, scale)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learned gain (used for QK-norm)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; ``q_norm``/``k_norm`` are ``Identity`` without
    QK-norm (their outputs are the ``q``/``k`` passed to attention, ``[B, H, T, hd]``)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError("d_model must be divisible by n_head")
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.attn_dtype = cfg.attn_dtype
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.q_norm: nn.Module = RMSNorm(self.head_dim) if cfg.qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(self.head_dim) if cfg.qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        y = attention(q, k, v, scale=self.scale, attn_dtype=self.attn_dtype)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Tiny GPT language model over byte tokens.

    ``model(idx, targets=None) -> (logits [B, T, vocab], mean cross-entropy or None)``.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        resid_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
        for blk in self.blocks:
            nn.init.normal_(blk.attn.proj.weight, std=resid_std)
            nn.init.normal_(blk.mlp[2].weight, std=resid_std)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for ``idx`` (``LongTensor[B, T]``, ``T <= seq_len``) and, given
        ``targets`` of the same shape, the mean next-token cross-entropy."""
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence length {t} exceeds seq_len {self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss
