"""The soft-cap fuse (docs/FUSES.md, *Soft-cap*) on real tiny models: the explicit capped
attention against a float64 reference (masks, GQA, fully masked rows, SDPA itself when the
cap is far), an SDPA model, HF Llama eager attention with padding, ``nn.MultiheadAttention``;
the trigger, suggest/apply/undo, a failure inside, and ``record_attention`` (QK-norm through
its return value; soft-cap unavailable there)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_fuses import IDS, Net
from test_fuses_qknorm import (  # noqa: F401
    PAD,
    MhaNet,
    attached,
    eager_spy,
    grow,
    llama,
    mha_io,
    mha_reference,
    ref_norm,
)
from torch import nn

from logitwatch.hooks import record_attention
from logitwatch.hooks.fuses import QKNorm, SoftCap, _rewrite

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def ref_attention(q, k, v, scale, cap, valid=None, additive=None):
    """float64 softmax(cap·tanh(q·kᵀ·scale/cap) [+ additive], masked) @ v, GQA by repeat;
    rows with no valid key give 0."""
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    s = cap * torch.tanh(s / cap)
    if additive is not None:
        s = s + additive.double()
    if valid is not None:
        s = s.masked_fill(~valid, -math.inf)
    p = s.softmax(-1)
    p = torch.nan_to_num(p, nan=0.0)
    return p @ v


def test_capped_sdpa_matches_a_float64_reference() -> None:
    g = torch.Generator().manual_seed(0)
    q = 3 * torch.randn(2, 4, 6, 8, generator=g)
    k = 3 * torch.randn(2, 2, 7, 8, generator=g)
    v = torch.randn(2, 2, 7, 8, generator=g)
    causal = torch.ones(6, 7, dtype=torch.bool).tril()
    out = _rewrite.capped_sdpa(q, k, v, is_causal=True, enable_gqa=True, cap=2.0)
    torch.testing.assert_close(out.double(), ref_attention(q, k, v, 8 ** -0.5, 2.0, causal),
                               rtol=1e-5, atol=1e-6)
    mask = torch.rand(2, 1, 6, 7, generator=g) > 0.3
    mask[0, 0, 2] = False  # a row with no key: 0, as SDPA
    out = _rewrite.capped_sdpa(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True, cap=5.0)
    torch.testing.assert_close(out.double(), ref_attention(q, k, v, 0.3, 5.0, mask),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))
    add = torch.randn(2, 1, 6, 7, generator=g)
    out = _rewrite.capped_sdpa(q, k, v, attn_mask=add, enable_gqa=True, cap=4.0)
    torch.testing.assert_close(out.double(), ref_attention(q, k, v, 8 ** -0.5, 4.0, None, add),
                               rtol=1e-5, atol=1e-6)
    far = _rewrite.capped_sdpa(q, k, v, is_causal=True, enable_gqa=True, cap=1e7)
    torch.testing.assert_close(far, F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True), rtol=1e-4, atol=1e-5)


def attn_io(model: Net):
    box: dict = {}
    model.blocks[0].register_forward_hook(
        lambda m, args, out: box.update(x=args[0].detach(), y=out.detach()))
    return box


def fused_reference(model: Net, x: torch.Tensor, cap: float) -> torch.Tensor:
    blk = model.blocks[0]
    w, b = blk.c_attn.weight.detach().double(), blk.c_attn.bias.detach().double()
    qkv = x.double() @ w.T + b
    q, k, v = (t.view(4, 12, 4, 8).transpose(1, 2) for t in qkv.split(32, dim=2))
    y = ref_attention(q, k, v, 8 ** -0.5, cap, torch.ones(12, 12, dtype=torch.bool).tril())
    y = y.transpose(1, 2).reshape(4, 12, 32)
    return y @ blk.c_proj.weight.detach().double().T + blk.c_proj.bias.detach().double()


def test_sdpa_layer_capped_output_and_measured_max() -> None:
    model = Net(layers=1, std=0.5)
    box = attn_io(model)
    fuse = SoftCap(cap=2.0, mode="auto", limit=1e9)
    mon, opt, frames, _ = attached(model, [fuse])
    fuse.cap_layers(0, [0], "test")
    model(IDS).backward()
    opt.step()
    mon.close()
    torch.testing.assert_close(box["y"].double(), fused_reference(model, box["x"], 2.0),
                               rtol=1e-5, atol=1e-5)
    heads = frames[0]["heads"]
    assert max(heads["attn.capped_logit_max"][0]) <= 2.0
    assert min(heads["attn.logit_max"][0]) > 2.0  # pre-cap: what grows stays visible
    assert frames[0]["scalars"]["fuse.soft_cap.layers"] == 1.0


def test_hf_eager_llama_capped_with_padding(eager_spy) -> None:  # noqa: F811
    model = llama()
    fuse = SoftCap(cap=1.5, mode="auto", limit=1e9)
    mon, opt, frames, _ = attached(model, [fuse])
    attention_mask = torch.ones(4, 12, dtype=torch.long)
    attention_mask[2, :3] = 0  # left padding
    seen: list[torch.Tensor] = []
    model.model.layers[0].self_attn.o_proj.register_forward_pre_hook(
        lambda m, args: seen.append(args[0].detach()))

    def step() -> None:
        eager_spy.clear()
        model(input_ids=IDS, attention_mask=attention_mask, labels=IDS).loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # not capped: the eager function (the spy) sees the raw q, k
    _, q, k = eager_spy[0]
    fuse.cap_layers(0, [0, 1], "test")
    step()
    mon.close()
    assert eager_spy == []  # both layers computed by the fuse
    attn = model.model.layers[0].self_attn
    valid = torch.ones(12, 12, dtype=torch.bool).tril()[None, None] & (
        attention_mask.bool()[:, None, None, :])
    # v: the v projection of the same hidden states (weights unchanged at lr 0)
    hidden = {}
    h = attn.v_proj.register_forward_hook(lambda m, a, o: hidden.update(v=o.detach()))
    with torch.no_grad():
        model(input_ids=IDS, attention_mask=attention_mask)
    h.remove()
    v = hidden["v"].view(4, 12, 2, 8).transpose(1, 2)
    ref = ref_attention(q, k, v, 8 ** -0.5, 1.5, valid).transpose(1, 2).reshape(4, 12, 32)
    real = attention_mask.bool()  # padded query rows attend nothing real: not compared
    torch.testing.assert_close(seen[1].double()[real], ref[real], rtol=1e-5, atol=1e-5)
    assert max(frames[1]["heads"]["attn.capped_logit_max"][0]) <= 1.5


def test_multihead_attention_capped() -> None:
    model = MhaNet()
    box = mha_io(model)
    fuse = SoftCap(cap=1.0, mode="auto", limit=1e9)
    mon, opt, frames, _ = attached(model, [fuse])
    fuse.cap_layers(0, [0], "test")
    model(IDS, PAD).backward()
    opt.step()
    mon.close()
    y_ref, maxes = mha_reference(model, box["x"], 0.0, 1.0, cap=1.0)
    torch.testing.assert_close(box["y"].double(), y_ref, rtol=1e-5, atol=1e-5)
    assert frames[0]["heads"]["attn.logit_max"][0] == pytest.approx(maxes, rel=1e-4)
    assert max(frames[0]["heads"]["attn.capped_logit_max"][0]) <= 1.0


def test_auto_caps_on_sustained_p99_and_undo_removes_at_once() -> None:
    fuse = SoftCap(cap=6.0, limit=8.0, patience=2, mode="auto")
    frames, mon, model = grow([fuse])
    caps = [e for e in mon.fuses.events if e.action == "cap"]
    assert caps and caps[0].detail["layers"]
    later = [f for f in frames if f["step"] > caps[0].step and "attn.logit_max" in f["heads"]]
    assert later
    for f in later:
        for layer in caps[0].detail["layers"]:
            received = f["heads"]["fuse.soft_cap.logit_max"][layer]
            assert max(received) <= 6.0
            assert received == pytest.approx([6.0 * math.tanh(m / 6.0) for m in
                                              f["heads"]["attn.logit_max"][layer]])
    layer = caps[0].detail["layers"][0]
    assert any(max(f["heads"]["attn.logit_max"][layer]) > 6.0 for f in later)  # not shrunk

    model = Net(layers=1, std=0.5)
    plain = Net(layers=1, std=0.5)(IDS).detach()
    fuse = SoftCap(cap=2.0, mode="auto", limit=1e9)
    mon, opt, frames, _ = attached(model, [fuse], sample_every=3)
    fuse.cap_layers(0, [0], "test")
    capped = model(IDS).detach()
    mon.fuses.undo("soft_cap")
    after = model(IDS).detach()
    mon.close()
    assert not torch.allclose(capped, plain) and torch.equal(after, plain)
    assert [e.action for e in mon.fuses.events] == ["cap", "removed", "undo"]
    assert fuse.state() == 1.0  # back to suggesting


def test_suggest_apply_and_the_alert_carries_it() -> None:
    model = Net(layers=2, std=0.5)
    fuse = SoftCap(cap=2.0, patience=2)
    mon, opt, frames, client = attached(model, [fuse, QKNorm(limit=1e9)])
    received: list[dict] = []
    client.on_alert(received.append)
    for _ in range(2):
        model(IDS).backward()
        opt.step()
        opt.zero_grad()
    assert [e.action for e in mon.fuses.events] == ["suggest"]
    assert not mon.attn_rewrite.active
    client._handle_answer({"alerts": [
        {"id": 1, "run": "r", "rule": "attn_logit_rising", "severity": "warning"}]})
    assert [f["fuse"] for f in received[0]["fuses"]] == ["soft_cap", "qk_norm"]
    mon.fuses.apply("soft_cap")
    assert mon.attn_rewrite.caps == {0: 2.0, 1: 2.0}
    model(IDS).backward()
    opt.step()
    mon.close()
    assert max(max(r) for r in frames[-1]["heads"]["attn.capped_logit_max"]) <= 2.0
    assert frames[-1]["scalars"]["fuse.soft_cap.state"] == 2


def test_an_exception_in_the_capped_attention_never_reaches_training(monkeypatch) -> None:
    want = Net(layers=1, std=0.5)(IDS).detach()

    def broken(*args, **kwargs):
        raise RuntimeError("cap bug")

    monkeypatch.setattr(_rewrite, "capped_sdpa", broken)
    model = Net(layers=1, std=0.5)
    fuse = SoftCap(cap=2.0, mode="auto", limit=1e9)
    mon, opt, frames, _ = attached(model, [fuse])
    fuse.cap_layers(0, [0], "test")
    losses = []
    for _ in range(2):
        loss = model(IDS)
        losses.append(loss.detach())
        loss.backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    assert all(torch.equal(x, want) for x in losses)
    assert [e.action for e in mon.fuses.events] == ["cap", "failed"]
    assert frames[-1]["scalars"]["fuse.soft_cap.state"] == -1


class Custom(nn.Module):
    """Attention by hand: ``record_attention`` before its own kernel."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(64, 32)
        self.qkv = nn.Linear(32, 96)
        self.head = nn.Linear(32, 64)
        with torch.no_grad():
            self.qkv.weight.normal_(0, 0.5)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        q, k, v = (t.view(4, 12, 4, 8).transpose(1, 2) for t in self.qkv(x).split(32, 2))
        q, k = record_attention(q, k, is_causal=True, layer=0)
        self.seen.append(q.detach())
        s = (q @ k.transpose(-1, -2) * 8 ** -0.5).masked_fill(
            ~torch.ones(12, 12, dtype=torch.bool).tril(), -math.inf)
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(4, 12, 32)
        return F.cross_entropy(self.head(x + y).reshape(-1, 64), ids.reshape(-1))


def test_record_attention_gets_the_norm_and_cannot_be_capped(caplog) -> None:
    model = Custom()
    norm = QKNorm(limit=1e9, tau=3.0, mode="auto", rescale=False)
    cap = SoftCap(cap=2.0, mode="auto", limit=1e9)
    mon, opt, frames, _ = attached(model, [norm, cap], sample_every=2)
    model(IDS).backward()
    opt.step()
    norm.insert(0, [0], "test")
    norm.rewrite.lam[0] = 0.4
    cap.cap_layers(0, [0], "test")
    for _ in range(2):  # a sampled step and one that is not
        model(IDS).backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    raw = model.seen[0]
    for q in model.seen[1:]:
        torch.testing.assert_close(q.double(), ref_norm(raw, 0.4, 3.0, 8 ** -0.5), rtol=1e-5,
                                   atol=1e-6)
    unavailable = [e for e in mon.fuses.events if e.action == "unavailable"]
    assert len(unavailable) == 1 and "record_attention" in unavailable[0].detail["path"]
    assert cap.state() == 2.0  # on for the layers it can reach
