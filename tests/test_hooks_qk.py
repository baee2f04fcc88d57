"""q/k weight and bias norms on fused q/k/v projections, and the attach log line.

Every expected norm is computed here from an explicit split of the parameter (``[q | k |
v]`` along the output rows, heads of ``head_dim`` consecutive rows), after the step.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from logitwatch.client import Client
from logitwatch.hooks import attach

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def capturing_client() -> tuple[Client, list[dict]]:
    frames: list[dict] = []
    client = Client(None, run="r")
    client.send = lambda step, scalars, heads, time=None, history=None: frames.append(  # type: ignore
        {"step": step, "scalars": scalars, "heads": heads})
    return client, frames


def split_norms(w: torch.Tensor, heads: int, kv: int, hd: int) -> tuple[list, list]:
    """Per-head norms of the q and k slices of a fused ``[q | k | v]`` tensor (rows)."""
    w = w.detach().double()
    q = [w[h * hd:(h + 1) * hd].norm().item() for h in range(heads)]
    k0 = heads * hd
    k = [w[k0 + h * hd:k0 + (h + 1) * hd].norm().item() for h in range(kv)]
    return q, k


def assert_norms(heads: dict, layers: list[nn.Module], h: int, kv: int, hd: int,
                 bias: bool = True) -> None:
    for layer, proj in enumerate(layers):
        q, k = split_norms(proj.weight, h, kv, hd)
        np.testing.assert_allclose(heads["qk.q_weight_norm"][layer], q, rtol=1e-5)
        np.testing.assert_allclose(heads["qk.k_weight_norm"][layer], k, rtol=1e-5)
        if bias:
            qb, kb = split_norms(proj.bias.unsqueeze(1), h, kv, hd)
            np.testing.assert_allclose(heads["qk.q_bias_norm"][layer], qb, rtol=1e-5)
            np.testing.assert_allclose(heads["qk.k_bias_norm"][layer], kb, rtol=1e-5)
    if not bias:
        assert "qk.q_bias_norm" not in heads


def train_one(model: nn.Module, forward, **kwargs) -> dict:
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                **kwargs):
        forward(model).backward()
        opt.step()  # norms are read after the update
    return frames[0]["heads"]


# -- nanoGPT: c_attn is an nn.Linear (3E, E); n_head / n_embd -------------------------------


class CausalSelfAttention(nn.Module):
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


class NanoGPT(nn.Module):
    def __init__(self, attn=CausalSelfAttention) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte = nn.Embedding(64, 32)
        self.h = nn.ModuleList([attn(), attn()])
        self.lm_head = nn.Linear(32, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for block in self.h:
            x = x + block(x)
        return F.cross_entropy(self.lm_head(x).reshape(-1, 64), ids.reshape(-1))


IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def test_nanogpt_c_attn_linear(caplog) -> None:
    model = NanoGPT()
    with caplog.at_level(logging.INFO, logger="logitwatch.hooks"):
        heads = train_one(model, lambda m: m(IDS))
    assert_norms(heads, [blk.c_attn for blk in model.h], 4, 4, 8)
    lines = [r.getMessage() for r in caplog.records if "q/k norms" in r.getMessage()]
    assert lines == ["logitwatch: q/k norms for 2 of 2 attention modules: 2 "
                     "CausalSelfAttention (fused 'c_attn' (rows, 4 heads x 8))"]


# -- a custom fused qkv with no head attributes: read from the first sampled forward --------


class Anonymous(nn.Module):
    """A fused ``qkv`` with GQA (4 query heads, 2 key heads of 8) and no attribute naming
    the head count."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, (4 + 2 * 2) * 8)
        self.out = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([32, 16, 16], dim=2)
        q = q.view(b, t, 4, 8).transpose(1, 2)
        k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, t, 32))


def test_custom_fused_qkv_is_read_from_the_first_sampled_forward(caplog) -> None:
    model = NanoGPT(Anonymous)
    with caplog.at_level(logging.INFO, logger="logitwatch.hooks"):
        heads = train_one(model, lambda m: m(IDS))
    assert_norms(heads, [blk.qkv for blk in model.h], 4, 2, 8)
    lines = [r.getMessage() for r in caplog.records if "q/k norms" in r.getMessage()]
    assert lines == [
        "logitwatch: q/k norms for 0 of 2 attention modules; 2 fused projections read from "
        "the first sampled forward",
        "logitwatch: from the first sampled forward, q/k norms for 2 of 2 attention modules: "
        "2 Anonymous (fused 'qkv' (rows, 4/2 heads x 8, from the first sampled forward))"]
    for blk in model.h:  # the discovery hooks are gone after the first sampled step
        assert not blk.qkv._forward_hooks


def test_explicit_layout_for_an_unusual_name_and_off(caplog) -> None:
    class Odd(Anonymous):
        def __init__(self) -> None:
            super().__init__()
            self.proj_in = self.qkv  # a name discovery does not know
            del self.qkv

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.qkv = self.proj_in
            try:
                return super().forward(x)
            finally:
                del self.qkv

    model = NanoGPT(Odd)
    with caplog.at_level(logging.INFO, logger="logitwatch.hooks"):
        heads = train_one(model, lambda m: m(IDS),
                          qk_layout={"proj_in": {"heads": 4, "kv_heads": 2}})
    assert_norms(heads, [blk.proj_in for blk in model.h], 4, 2, 8)
    # one entry off by its full name, the other still measured
    heads = train_one(model, lambda m: m(IDS), qk_layout={
        "h.0.proj_in": None, "h.1.proj_in": {"heads": 4, "kv_heads": 2, "head_dim": 8}})
    q, _ = split_norms(model.h[1].proj_in.weight, 4, 2, 8)
    np.testing.assert_allclose(heads["qk.q_weight_norm"][0], q, rtol=1e-5)
    assert len(heads["qk.q_weight_norm"]) == 1
    with pytest.raises(ValueError, match="does not split"):
        attach(model, run="r", qk_layout={"proj_in": {"heads": 5}})
    with pytest.raises(TypeError, match="qk_layout"):
        attach(model, run="r", qk_layout={"proj_in": 4})  # type: ignore[dict-item]


def test_the_attach_line_says_what_is_missing_and_why(caplog) -> None:
    class Hidden(nn.Module):  # an attention whose projections discovery cannot see
        def __init__(self) -> None:
            super().__init__()
            self.weights = nn.Parameter(torch.randn(96, 32))

    class NeoXAttention(nn.Module):  # per-head interleaved: named, not read
        def __init__(self) -> None:
            super().__init__()
            self.query_key_value = nn.Linear(32, 96)
            self.num_attention_heads = 4

    model = nn.ModuleList([CausalSelfAttention(), Hidden(), NeoXAttention()])
    model.forward = lambda x: x  # type: ignore[method-assign]
    Hidden.__name__ = "HiddenAttention"
    with caplog.at_level(logging.INFO, logger="logitwatch.hooks"):
        attach(model, run="r", lm_head=False).close()
    lines = [r for r in caplog.records if "q/k norms" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert lines[0].getMessage() == (
        "logitwatch: q/k norms for 1 of 3 attention modules: 1 CausalSelfAttention (fused "
        "'c_attn' (rows, 4 heads x 8)); none for 1 NeoXAttention ('query_key_value' "
        "interleaves heads (not read)); 1 HiddenAttention (no q/k projection recognised "
        "(attach(qk_layout=...) maps a fused one))")


# -- HF Phi-3: qkv_proj with GQA splits ------------------------------------------------------


def test_phi3_qkv_proj_with_gqa() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.Phi3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, pad_token_id=0,
        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    heads = train_one(model, lambda m: m(input_ids=IDS, labels=IDS).loss)
    layers = [layer.self_attn.qkv_proj for layer in model.model.layers]
    assert_norms(heads, layers, 4, 2, 8, bias=False)
    assert np.array(heads["qk.k_weight_norm"]).shape == (2, 2)


# -- a fused qkv whose attention the monitor never measures: discovery gives up ------------


class HandAttention(nn.Module):
    """A fused ``qkv`` with no head attributes, its attention computed by hand (no SDPA,
    no HF eager function, no ``record_attention``): no measured call ever tells its
    heads."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        a = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~causal, -math.inf).softmax(-1)
        return self.out((a @ v).transpose(1, 2).reshape(b, t, 32))


def test_a_pending_fused_qkv_without_a_measured_attention_call_is_given_up(caplog) -> None:
    """Each sampled forward used to add every such layer to the pending list again, and
    the hooks stayed for the run (4,000 entries after 1,000 sampled steps of 4 layers):
    now the list holds each projection once, and after ``GIVE_UP_AFTER`` sampled steps the
    hooks are removed and one line says which projection has no q/k norms and why."""
    from logitwatch.hooks import _qk_find

    GIVE_UP_AFTER = getattr(_qk_find, "GIVE_UP_AFTER", 3)  # (getattr: runs before the fix)
    model = NanoGPT(HandAttention)
    twin = NanoGPT(HandAttention)  # the same weights, trained without a monitor
    client, frames = capturing_client()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    steps = GIVE_UP_AFTER + 4
    with caplog.at_level(logging.INFO, logger="logitwatch.hooks"):
        mon = attach(model, opts[0], run="r", client=client, sample_every=1,
                     overhead_budget=None, lm_head=False)
        for step in range(steps):
            for m, opt in zip((model, twin), opts, strict=True):
                m(IDS).backward()
                opt.step()
                opt.zero_grad()
            waiting = step + 1 < GIVE_UP_AFTER
            assert len(mon._qk_find._ran) <= (2 if waiting else 0)  # never one per forward
            assert all(bool(blk.qkv._forward_hooks) == waiting for blk in model.h), step
        mon.close()
    assert [f["step"] for f in frames] == list(range(steps))
    assert not any(name.startswith("qk.") for f in frames for name in f["heads"])
    lines = [r for r in caplog.records if "q/k norms" in r.getMessage()]
    assert len(lines) == 2  # at attach (pending), and once when given up
    assert lines[1].levelno == logging.WARNING
    given_up = lines[1].getMessage()
    assert "q/k norms for 0 of 2 attention modules; none for 2 HandAttention (fused 'qkv' " \
           "(96 outputs): heads unknown at attach" in given_up
    assert f"no attention call the monitor measures followed it in {GIVE_UP_AFTER}" in given_up
    assert "qk_layout" in given_up
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)  # training unchanged, bit for bit
