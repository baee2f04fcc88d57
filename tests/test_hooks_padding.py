"""Padded batches: every attention statistic over real tokens only, against float64.

A pair (query, key) counts when both tokens are real and the attention lets the query see
the key. The references here build that set themselves (causal triangle, the padding of
the batch on both sides) from ``q``/``k`` recorded in float64 by an independent attention
function, never from the masks the model hands to its kernel.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from logitwatch.client import Client
from logitwatch.hooks import attach, record_attention
from logitwatch.hooks._probes import CountSyncs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RTOL, ATOL = 1e-5, 1e-6
RECORDED: list[tuple[int, np.ndarray, np.ndarray, float]] = []


def recording_attention(module, query, key, value, attention_mask, scaling=None,
                        dropout=0.0, softcap=None, **kwargs):
    """Keeps float64 ``q``/``k`` (after RoPE) and the scale, then runs HF's eager."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    RECORDED.append((module.layer_idx, query.detach().double().numpy(),
                     key.detach().double().numpy(), scale))
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                 softcap=softcap, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def register_recorder() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("lw_pad_ref", recording_attention)
    AttentionMaskInterface.register("lw_pad_ref", eager_mask)


def reference(q: np.ndarray, k: np.ndarray, scale: float, real: np.ndarray,
              causal: bool = True) -> dict[str, list[float]]:
    """Every per-head signal over the pairs whose query and key are real tokens and that
    the (causal) attention allows; float64 throughout."""
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    logits = q @ k.transpose(0, 1, 3, 2) * scale
    b, h, t, s = logits.shape
    valid = np.ones((t, s), bool)
    if causal:
        valid = np.tril(valid)
    valid = valid[None, None] & real[:, None, :, None] & real[:, None, None, :]
    valid = np.broadcast_to(valid, logits.shape)
    out: dict[str, list[float]] = {}
    for head in range(h):
        vals = logits[:, head][valid[:, head]]
        ents = []
        for row, ok in zip(logits[:, head].reshape(-1, s), valid[:, head].reshape(-1, s),
                           strict=True):
            if ok.any():
                z = row[ok]
                p = np.exp(z - z.max())
                p /= p.sum()
                ents.append(-(p[p > 0] * np.log(p[p > 0])).sum())
        for name, value in (("attn.logit_max", vals.max()),
                            ("attn.logit_p99", np.percentile(vals, 99)),
                            ("attn.logit_mean", vals.mean()), ("attn.logit_std", vals.std()),
                            ("attn.entropy_mean", np.mean(ents)),
                            ("attn.entropy_min", np.min(ents))):
            out.setdefault(name, []).append(value)
    return out


def capturing_client() -> tuple[Client, list[dict]]:
    frames: list[dict] = []
    client = Client(None, run="r")
    client.send = lambda step, scalars, heads, time=None, history=None: frames.append(  # type: ignore
        {"step": step, "scalars": scalars, "heads": heads})
    return client, frames


def padded(b: int, t: int, side: str, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and a 0/1 mask with rows of 12, 9, 5 and 12 real tokens, padded on ``side``."""
    ids = torch.randint(1, vocab, (b, t), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(b, t, dtype=torch.long)
    for row, n in enumerate((12, 9, 5, 12)[:b]):
        if side == "right":
            mask[row, n:] = 0
        else:
            mask[row, : t - n] = 0
    return ids.masked_fill(mask == 0, 0), mask


CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0,
        eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": lambda: transformers.LlamaConfig(  # RoPE, GQA 4 query heads : 2 kv heads
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, bos_token_id=0,
        eos_token_id=0, pad_token_id=0),
}


def build(name: str, impl: str) -> nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[name](),
                                                         attn_implementation=impl)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(("name", "impl"), [("gpt2", "eager"), ("gpt2", "sdpa"),
                                            ("llama", "eager"), ("llama", "sdpa")])
def test_hf_padded_batches_count_real_tokens_only(name: str, impl: str, side: str) -> None:
    model = build(name, impl)
    ref_model = build(name, "lw_pad_ref")
    ref_model.load_state_dict(model.state_dict())
    ids, mask = padded(4, 12, side, model.config.vocab_size)
    labels = ids.masked_fill(mask == 0, -100)
    RECORDED.clear()
    ref_model.train()
    ref_model(input_ids=ids, attention_mask=mask, labels=labels)
    recorded = sorted(RECORDED, key=lambda r: r[0])
    assert len(recorded) == 2
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with attach(model, opt, run="r", client=client, overhead_budget=None, sample_every=5):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
    heads = frames[0]["heads"]
    real = mask.bool().numpy()
    for layer, (_, q, k, scale) in enumerate(recorded):
        for metric, values in reference(q, k, scale, real).items():
            np.testing.assert_allclose(heads[metric][layer], values, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}/{impl}/{side} {metric} {layer}")


def test_hf_positional_mask_and_unpadded_batches() -> None:
    """The mask is found positionally too; a mask of real tokens only changes nothing."""
    model = build("llama", "sdpa")
    ids, mask = padded(4, 12, "right", 64)
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with attach(model, opt, run="r", client=client, overhead_budget=None, sample_every=1):
        for m in (mask, torch.ones_like(mask), None):
            model(ids, m, labels=ids).loss.backward()  # positional attention_mask
            opt.step()
    for metric in ("attn.logit_mean", "attn.entropy_mean"):
        with_pad, ones, none = (np.array(f["heads"][metric]) for f in frames)
        np.testing.assert_array_equal(ones, none)
        assert not np.allclose(with_pad, none, rtol=1e-4, atol=0)


# -- nn.TransformerEncoder: key_padding_mask in self-attention ------------------------------


class EncoderLM(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.emb = nn.Embedding(32, 16)
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.lm_head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1) if self.causal else None
        x = self.encoder(self.emb(ids), mask=mask, src_key_padding_mask=pad,
                         is_causal=self.causal)
        return self.lm_head(x)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("side", ["right", "left"])
def test_transformer_encoder_padded_rows_are_left_out(side: str, causal: bool) -> None:
    torch.manual_seed(0)
    model = EncoderLM(causal)
    ids, mask = padded(3, 12, side, 32)
    pad = mask == 0  # True = padding, as key_padding_mask
    inputs: list[torch.Tensor] = []
    handles = [layer.self_attn.register_forward_pre_hook(
        lambda m, a: inputs.append(a[0].detach())) for layer in model.encoder.layers]
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with attach(model, opt, run="r", client=client, overhead_budget=None):
        F.cross_entropy(model(ids, pad).reshape(-1, 32), ids.reshape(-1)).backward()
        opt.step()
    for h in handles:
        h.remove()
    heads = frames[0]["heads"]
    real = mask.bool().numpy()
    for layer, (x, mod) in enumerate(zip(inputs, model.encoder.layers, strict=True)):
        attn = mod.self_attn
        wq, wk, _ = attn.in_proj_weight.detach().double().chunk(3)
        bq, bk, _ = attn.in_proj_bias.detach().double().chunk(3)
        q = (x.double() @ wq.T + bq).view(3, 12, 4, 4).transpose(1, 2).numpy()
        k = (x.double() @ wk.T + bk).view(3, 12, 4, 4).transpose(1, 2).numpy()
        for metric, values in reference(q, k, 0.5, real, causal).items():
            np.testing.assert_allclose(heads[metric][layer], values, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{side} causal={causal} {metric} {layer}")


# -- record_attention(query_mask=, key_mask=) and a custom model's attention_mask ----------


class Attn(nn.Module):
    """Hand-written attention that reports itself with the adapter."""

    def __init__(self, explicit: bool) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.explicit = explicit

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        self.seen = (q.detach(), k.detach())
        extra = {"query_mask": real, "key_mask": real} if self.explicit else {}
        record_attention(q, k, is_causal=True, scale=0.25, **extra)
        allowed = torch.ones(t, t, dtype=torch.bool).tril() & real.bool()[:, None, None, :]
        logits = (q @ k.transpose(-1, -2) * 0.25).masked_fill(~allowed, -math.inf)
        return (logits.softmax(-1).nan_to_num() @ v).transpose(1, 2).reshape(b, t, 16)


class AdapterLM(nn.Module):
    def __init__(self, explicit: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.attn = Attn(explicit)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                real: torch.Tensor | None = None) -> torch.Tensor:
        return self.attn(self.emb(ids), attention_mask if real is None else real)


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("side", ["right", "left"])
def test_record_attention_query_and_key_masks(side: str, explicit: bool) -> None:
    torch.manual_seed(0)
    model = AdapterLM(explicit)
    ids, mask = padded(3, 12, side, 32)
    client, frames = capturing_client()
    with attach(model, run="r", client=client, overhead_budget=None, lm_head=False) as mon:
        if explicit:  # the adapter's arguments; the model's forward has no mask argument
            model(ids, real=mask).sum().backward()
        else:  # nothing explicit: the forward's attention_mask is used
            model(ids, attention_mask=mask).sum().backward()
        mon.step()
    q, k = (x.double().numpy() for x in model.attn.seen)
    for metric, values in reference(q, k, 0.25, mask.bool().numpy()).items():
        np.testing.assert_allclose(frames[0]["heads"][metric][0], values, rtol=RTOL,
                                   atol=ATOL, err_msg=f"{side} {metric}")


def test_the_mask_is_not_read_on_non_sampled_steps() -> None:
    """Non-sampled steps only pass the mask through: no read-back, no statistic."""
    torch.manual_seed(0)
    model = AdapterLM(False)
    ids, mask = padded(3, 12, "right", 32)
    client, frames = capturing_client()
    calls = []
    with attach(model, run="r", client=client, sample_every=3, overhead_budget=None,
                lm_head=False) as mon:
        for _ in range(4):
            with CountSyncs() as counter:
                model(ids, attention_mask=mask).sum().backward()
                mon.step()
            calls.append(counter.calls)
    assert calls[1] == calls[2] == []
    assert [f["step"] for f in frames][:2] == [0, 3]
