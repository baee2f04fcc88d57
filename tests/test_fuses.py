"""Fuses on real tiny models (docs/FUSES.md): QK-clip scales exactly the right rows or
columns (biases, fused q/k/v, GQA) and caps the next forward's max logit at tau; its
max-only steps and head maxima match the full statistics. Modes, control, undo, failing
fuses, LR backoff and the callbacks: ``test_fuses_control.py``; the models and the loop here
are shared with the other ``test_fuses_*`` modules, and so is the hooks tests' capturing
client, imported here.

Every optimizer here is SGD at lr 0 unless said: the update leaves the weights alone, so
what changes them is the fuse, and the next forward on the same batch measures what the
clip did exactly.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from test_hooks_sampling import capturing_client
from torch import nn

from logitwatch.hooks import attach
from logitwatch.hooks.fuses import QKClip

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FusedAttn(nn.Module):
    """nanoGPT-style: ``c_attn`` an ``nn.Linear`` (3E, E) with bias, [q | k | v] rows."""

    def __init__(self, n_embd: int = 32, n_head: int = 4) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Net(nn.Module):
    def __init__(self, layers: int = 1, std: float = 0.5) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(64, 32)
        self.blocks = nn.ModuleList(FusedAttn() for _ in range(layers))
        self.head = nn.Linear(32, 64)
        with torch.no_grad():
            for blk in self.blocks:
                blk.c_attn.weight.normal_(0, std)
                blk.c_attn.bias.normal_(0, std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for blk in self.blocks:
            x = x + blk(x)
        return F.cross_entropy(self.head(x)[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))


IDS = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))


def run(model: nn.Module, steps: int, fuses, lr: float = 0.0, forward=None, **kw):
    """Train ``steps`` steps on one batch; returns (frames, monitor)."""
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    forward = forward or (lambda m: m(IDS))
    kw.setdefault("sample_every", 1)  # a frame a step (max-only capture: its own test)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 fuses=fuses, **kw)
    for _ in range(steps):
        loss = forward(model)
        mon.log(loss=loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    return frames, mon


def per_index(per_head: list[float], hd: int) -> torch.Tensor:
    return torch.tensor(per_head, dtype=torch.float64).repeat_interleave(hd)


# -- QK-clip: which rows, by how much ----------------------------------------------------


def test_qk_clip_scales_fused_linear_rows_and_biases_and_caps_the_next_max() -> None:
    tau = 3.0
    model = Net()
    w0 = model.blocks[0].c_attn.weight.detach().double().clone()
    b0 = model.blocks[0].c_attn.bias.detach().double().clone()
    frames, mon = run(model, 2, [QKClip(tau=tau, mode="auto")])
    first, second = frames[0], frames[1]
    maxes = first["heads"]["attn.logit_max"][0]
    assert max(maxes) > tau and min(maxes) > tau  # every head clipped at step 0
    s = [math.sqrt(tau / m) for m in maxes]
    e, hd = 32, 8
    w, b = model.blocks[0].c_attn.weight.detach().double(), model.blocks[0].c_attn.bias.detach()
    torch.testing.assert_close(w[:e], w0[:e] * per_index(s, hd)[:, None], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w[e:2 * e], w0[e:2 * e] * per_index(s, hd)[:, None], rtol=1e-5,
                               atol=1e-7)
    torch.testing.assert_close(w[2 * e:], w0[2 * e:])  # v untouched
    torch.testing.assert_close(b.double()[:e], b0[:e] * per_index(s, hd), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(b.double()[e:2 * e], b0[e:2 * e] * per_index(s, hd), rtol=1e-5,
                               atol=1e-7)
    torch.testing.assert_close(b.double()[2 * e:], b0[2 * e:])
    # the next forward (same batch) measures tau in every clipped head
    assert second["heads"]["attn.logit_max"][0] == pytest.approx([tau] * 4, rel=1e-4)
    assert first["heads"]["fuse.qk_clip.factor"][0] == pytest.approx(
        [tau / m for m in maxes], rel=1e-5)
    assert first["scalars"]["fuse.qk_clip.heads"] == 4
    assert second["scalars"]["fuse.qk_clip.heads"] == 0  # at tau: left alone
    assert [e.action for e in mon.fuses.events] == ["clip"]


@pytest.mark.parametrize("layers", [1, 2])
def test_max_only_steps_clip_exactly_as_full_samples(layers: int) -> None:
    """Acting, the steps outside the monitor's samples are measured max-only (no frame):
    the weights end exactly where sampling every step puts them, and the next frame says
    what the clip did since the previous one (head-steps, steps, the factors' product)."""
    tau, steps = 3.0, 12
    full = Net(layers)
    frames_full, _ = run(full, steps, [QKClip(tau=tau, mode="auto", measure="full")],
                         lr=0.05, sample_every=10)
    cheap = Net(layers)
    frames, mon = run(cheap, steps, [QKClip(tau=tau, mode="auto")], lr=0.05,
                      sample_every=10)
    for a, b in zip(full.parameters(), cheap.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert [f["step"] for f in frames_full] == list(range(steps))
    assert [f["step"] for f in frames][:2] == [0, 10]
    w = frames[1]["scalars"]
    assert w["fuse.qk_clip.steps"] == sum(
        f["scalars"]["fuse.qk_clip.heads"] > 0 for f in frames_full[1:11])
    assert w["fuse.qk_clip.heads"] == sum(
        f["scalars"]["fuse.qk_clip.heads"] for f in frames_full[1:11])
    prod = [[math.prod(f["heads"]["fuse.qk_clip.factor"][r][h] for f in frames_full[1:11])
             for h in range(4)] for r in range(layers)]
    for r in range(layers):
        assert frames[1]["heads"]["fuse.qk_clip.factor"][r] == pytest.approx(prod[r],
                                                                             rel=1e-4)
    clips = [e for e in mon.fuses.events if e.action == "clip"]
    assert clips[1].step == 10 and clips[1].detail["steps"] == w["fuse.qk_clip.steps"]


def test_head_max_matches_the_full_statistics_and_screens_on_cpu() -> None:
    from logitwatch.hooks._logits import attention_head_stats
    from logitwatch.hooks._maxlogit import head_max

    g = torch.Generator().manual_seed(0)
    for b, h, hk, t, s, causal, masked, pad in [(2, 4, 4, 16, 16, True, False, False),
                                                (2, 8, 2, 12, 12, True, False, True),
                                                (1, 4, 4, 10, 14, False, True, False),
                                                (3, 4, 2, 9, 9, False, True, True)]:
        q = torch.randn(b, h, t, 8, generator=g) * 3
        k = torch.randn(b, hk, s, 8, generator=g)
        am = torch.rand(b, h, t, s, generator=g) > 0.3 if masked else None
        qv = kv = None
        if pad:
            qv = torch.ones(b, t, dtype=torch.bool)
            qv[0, -3:] = False
            kv = qv.clone()
        kw = dict(attn_mask=am, is_causal=causal, query_valid=qv, key_valid=kv)
        ref = attention_head_stats(q, k, **kw).maximum
        torch.testing.assert_close(head_max(q, k, budget=4096, **kw), ref)
        below = float(ref.median())
        got = head_max(q, k, below=below, **kw)  # screened heads: their bound, >= max
        assert (got >= ref - 1e-5).all()
        torch.testing.assert_close(got[ref > below], ref[ref > below])
        assert ((got > below) == (ref > below)).all()  # the same clip decisions


@pytest.mark.parametrize("b, h, hk, t, s, causal", [
    (2, 4, 4, 256, 256, True), (2, 8, 2, 100, 100, True), (1, 4, 1, 40, 72, True),
    (3, 4, 2, 72, 40, True), (2, 4, 4, 33, 33, False), (1, 2, 2, 1, 5, True)])
def test_head_max_from_shapes_matches_the_full_statistics(b: int, h: int, hk: int, t: int,
                                                           s: int, causal: bool) -> None:
    """The shapes-only path (no mask, or causal without padding: row tiles over all heads,
    GQA broadcast, the diagonal square masked in place) at the default budget and at one
    that splits heads and rows, in float32 and from bfloat16 inputs."""
    from logitwatch.hooks._logits import attention_head_stats
    from logitwatch.hooks._maxlogit import head_max

    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, t, 16, generator=g) * 2
    k = torch.randn(b, hk, s, 16, generator=g)
    k[:, :, -1] *= 50  # the last key: seen only by the rows that reach it when causal
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd = q.to(dtype), k.to(dtype)
        ref = attention_head_stats(qd, kd, is_causal=causal).maximum
        for budget in (None, 3000):
            kw = {} if budget is None else {"budget": budget}
            torch.testing.assert_close(head_max(qd, kd, is_causal=causal, **kw), ref)
        below = float(ref.median())
        got = head_max(qd, kd, is_causal=causal, below=below)
        torch.testing.assert_close(got[ref > below], ref[ref > below])
    # a negative scale: the max of the scaled logits, not the scaled max
    ref = attention_head_stats(q, k, is_causal=causal, scale=-0.1).maximum
    torch.testing.assert_close(head_max(q, k, is_causal=causal, scale=-0.1), ref)
    # under CPU autocast the matmuls run in bfloat16, as the model's and the full
    # statistics' do (their blocks differ: equal to a bfloat16 rounding); float32 out,
    # screened or not
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = attention_head_stats(q, k, is_causal=causal).maximum.float()
        below = float(ref.median())
        for kw in ({}, {"below": below}):
            got = head_max(q, k, is_causal=causal, **kw)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got[ref > below], ref[ref > below], rtol=8e-3,
                                       atol=1e-2)


def test_weights_only_leaves_the_bias_path_and_misses_tau() -> None:
    """Scaling W alone (biases=False) does not bring the max to tau: the biases' part of
    q and k stays (the bias refuge); with biases it is exact (previous test)."""
    tau = 3.0
    model = Net()
    b0 = model.blocks[0].c_attn.bias.detach().clone()
    frames, _ = run(model, 2, [QKClip(tau=tau, mode="auto", biases=False)])
    torch.testing.assert_close(model.blocks[0].c_attn.bias.detach(), b0)
    after = frames[1]["heads"]["attn.logit_max"][0]
    assert max(abs(m - tau) for m in after) > 0.05 * tau


def test_qk_clip_gpt2_conv1d_columns_and_biases() -> None:
    transformers = pytest.importorskip("transformers")
    tau = 2.0
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64,
                                     n_positions=32, initializer_range=0.3,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    c_attn = model.transformer.h[0].attn.c_attn
    with torch.no_grad():
        c_attn.bias.normal_(0, 0.3)
    w0, b0 = c_attn.weight.detach().double().clone(), c_attn.bias.detach().double().clone()
    frames, _ = run(model, 2, {"qk_clip": {"tau": tau, "mode": "auto"}},
                    forward=lambda m: m(input_ids=IDS, labels=IDS).loss)
    maxes = frames[0]["heads"]["attn.logit_max"][0]
    s = per_index([math.sqrt(min(1.0, tau / m)) for m in maxes], 8)
    w, b = c_attn.weight.detach().double(), c_attn.bias.detach().double()
    torch.testing.assert_close(w[:, :32], w0[:, :32] * s[None, :], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w[:, 32:64], w0[:, 32:64] * s[None, :], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w[:, 64:], w0[:, 64:])
    torch.testing.assert_close(b[:32], b0[:32] * s, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(b[32:64], b0[32:64] * s, rtol=1e-5, atol=1e-7)
    assert max(maxes) > tau
    after = frames[1]["heads"]["attn.logit_max"][0]
    for m0, m1 in zip(maxes, after, strict=True):
        assert m1 == pytest.approx(min(m0, tau), rel=1e-4)


def test_qk_clip_gqa_shared_key_follows_its_largest_query_head() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=64, max_position_embeddings=32,
                                      attention_bias=True, initializer_range=0.4)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager")
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.q_proj.bias.normal_(0, 0.3)
        attn.k_proj.bias.normal_(0, 0.3)
    q0, k0 = attn.q_proj.weight.detach().double().clone(), attn.k_proj.weight.detach().double(
    ).clone()
    qb0, kb0 = attn.q_proj.bias.detach().double().clone(), attn.k_proj.bias.detach().double(
    ).clone()
    forward = lambda m: m(input_ids=IDS, labels=IDS).loss  # noqa: E731
    probe, _ = run(model, 1, None, forward=forward)
    maxes = probe[0]["heads"]["attn.logit_max"][0]
    tau = sorted(maxes)[1] * 0.999  # three heads over tau, one under
    frames, _ = run(model, 2, [QKClip(tau=tau, mode="auto")], forward=forward)
    assert frames[0]["heads"]["attn.logit_max"][0] == pytest.approx(maxes, rel=1e-5)
    r = [min(1.0, tau / m) for m in maxes]
    s_k = [math.sqrt(min(r[0], r[1])), math.sqrt(min(r[2], r[3]))]
    s_q = [min(1.0, r[h] / s_k[h // 2]) for h in range(4)]
    torch.testing.assert_close(attn.q_proj.weight.detach().double(),
                               q0 * per_index(s_q, 8)[:, None], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(attn.k_proj.weight.detach().double(),
                               k0 * per_index(s_k, 8)[:, None], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(attn.q_proj.bias.detach().double(), qb0 * per_index(s_q, 8),
                               rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(attn.k_proj.bias.detach().double(), kb0 * per_index(s_k, 8),
                               rtol=1e-5, atol=1e-7)
    after = frames[1]["heads"]["attn.logit_max"][0]
    for h in range(4):  # every head at most tau; each key group's largest head exactly tau
        assert after[h] <= tau * (1 + 1e-4)
    for group in ((0, 1), (2, 3)):
        top = max(group, key=lambda h: maxes[h])
        if maxes[top] > tau:
            assert after[top] == pytest.approx(tau, rel=1e-4)
