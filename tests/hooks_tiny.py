"""What the hooks' tests on the tiny model share (``test_hooks.py``, ``test_hooks_loop.py``):
a custom model that calls SDPA itself (GQA, a custom scale), a plain training loop, an
explicit float64 reference and the frame's expected names. The recording collector and its
``recorder`` fixture live in ``conftest.py``. Not a test module."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from logitwatch.hooks import Monitor, attach

COST = {"hooks.host_ms", "hooks.syncs", "hooks.bytes", "hooks.sample_every"}
#: Present once the monitor has measured a sampled step against plain ones / on frame 0.
LATER = {"hooks.cost_ms", "hooks.overhead", "loss.first_over_ln_vocab"}
FINAL = {"final.hidden_rms", "final.logz", "final.logit_max"}
SCALARS = ({"loss", "grad.norm", "grad.clipped", "grad.max_norm", "grad.clip_rate", "lr",
            "attn.dtype_max", "optim.adaptive"}
           | FINAL | COST)
ATTN = {"attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
        "attn.entropy_mean", "attn.entropy_min"}
QK = {"qk.q_weight_norm", "qk.k_weight_norm", "qk.q_bias_norm", "qk.k_bias_norm"}
HEADS = ATTN | QK
VOCAB = 64


# -- a custom model that calls SDPA itself (GQA, custom scale) ----------------------------


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, scale: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.scale = heads, kv_heads, dim // heads, scale
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.hd)
        self.o = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, recorded: list | None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.hd).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if recorded is not None:
            recorded.append((q.detach().clone(), k.detach().clone(), self.scale))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=True
        )
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class TinyLM(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, 0.3 + i) for i in range(layers))
        self.head = nn.Linear(dim, VOCAB)
        self.recorded: list | None = None

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.emb(ids)
        for block in self.blocks:
            x = x + block(x, self.recorded)
        logits = self.head(x)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits)


def watch(*args, **kwargs) -> Monitor:
    """``attach`` with a fixed schedule (no overhead budget) unless the test says so."""
    kwargs.setdefault("overhead_budget", None)
    return attach(*args, **kwargs)


def batches(n: int, seed: int = 0, b: int = 3, t: int = 10) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (b, t), generator=gen) for _ in range(n)]


def reference(recorded: list, mask: torch.Tensor | None = None) -> tuple[list, list]:
    """Explicit eager attention logits from recorded (q, k, scale): per layer, per head."""
    maxima, p99s = [], []
    for q, k, scale in recorded:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        logits = (q.double() @ k.double().transpose(-1, -2) * scale).numpy()
        t, s = logits.shape[-2:]
        valid = np.broadcast_to(np.tril(np.ones((t, s), bool)), logits.shape)
        if mask is not None:  # (B, S) padding, 1 = real token: keys and queries
            real = mask.bool().numpy()
            valid = valid & real[:, None, None, :] & real[:, None, :, None]
        maxima.append([logits[:, h][valid[:, h]].max() for h in range(q.shape[1])])
        p99s.append([np.percentile(logits[:, h][valid[:, h]], 99) for h in range(q.shape[1])])
    return maxima, p99s


def train_tiny(
    model: TinyLM,
    opt: torch.optim.Optimizer,
    mon: Monitor | None,
    data: list[torch.Tensor],
    *,
    clip: float | None = 1.0,
    micro: int = 1,
    hook: Callable[[int], None] | None = None,
) -> list[dict]:
    """A plain training loop; returns per step what the test needs to check frames."""
    steps = []
    for i in range(0, len(data), micro):
        model.recorded = []
        losses = []
        for ids in data[i : i + micro]:
            out = model(ids, ids.roll(-1, 1))
            (out.loss / micro).backward()
            losses.append(out.loss.detach())
        if hook is not None:
            hook(i // micro)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip) if clip else None
        opt.step()
        opt.zero_grad()
        steps.append({"recorded": model.recorded, "losses": losses, "norm": norm})
    model.recorded = None
    return steps


def assert_frame_matches(frame: dict, step: dict, layers: int = 2, heads: int = 4) -> None:
    ref_max, ref_p99 = reference(step["recorded"])
    got_max = np.array(frame["heads"]["attn.logit_max"])
    got_p99 = np.array(frame["heads"]["attn.logit_p99"])
    assert got_max.shape == got_p99.shape == (layers, heads)
    np.testing.assert_allclose(got_max, ref_max, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_p99, ref_p99, rtol=1e-5, atol=1e-6)


def keys(frame: dict) -> set[str]:
    """The frame's scalar names without those that depend on timing or frame order."""
    return set(frame["scalars"]) - LATER
