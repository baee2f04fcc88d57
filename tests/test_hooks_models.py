"""Coverage on real architectures: every attention signal against an explicit reference.

HF models are built from tiny configs (random weights, no downloads). The reference is
an independent attention implementation registered with transformers (with the eager
mask, so causal, padding and sliding-window masks are HF's own) that records the explicit
``q·kᵀ·scale`` logits; the monitored copy runs the stock ``eager`` or ``sdpa`` path.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_hooks_sampling import Tiny, capturing_client, train
from torch import nn

from logitwatch.hooks import attach, record_attention

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

ATTN = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
        "attn.entropy_mean", "attn.entropy_min")
REF: list[tuple[int, np.ndarray, np.ndarray, float | None]] = []


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def reference_attention(module, query, key, value, attention_mask, scaling=None,
                        dropout=0.0, softcap=None, **kwargs):
    """Records explicit float64 logits and the valid pairs, then runs the model's eager."""
    k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    logits = (query.detach().double() @ k.detach().double().transpose(-1, -2)) * scale
    t, s = logits.shape[-2:]
    if attention_mask is None:
        valid = np.ones((1, 1, t, s), bool)
    else:
        m = attention_mask[..., :s].detach()
        valid = (m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2).numpy()
    REF.append((module.layer_idx, logits.numpy(), np.broadcast_to(valid, logits.shape), softcap))
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                 softcap=softcap, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def register_reference() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("lw_ref", reference_attention)
    AttentionMaskInterface.register("lw_ref", eager_mask)


def signals(logits: np.ndarray, valid: np.ndarray, softcap: float | None) -> dict:
    """Every per-head signal from explicit logits (B, H, T, S) over valid pairs."""
    capped = np.tanh(logits / softcap) * softcap if softcap else logits
    out: dict[str, list[float]] = {}
    for h in range(logits.shape[1]):
        vals, v = logits[:, h][valid[:, h]], valid[:, h]
        ents = []
        for row, ok in zip(capped[:, h].reshape(-1, logits.shape[-1]),
                           v.reshape(-1, logits.shape[-1]), strict=True):
            if ok.any():
                p = np.exp(row[ok] - row[ok].max())
                p /= p.sum()
                ents.append(-(p[p > 0] * np.log(p[p > 0])).sum())
        values = {"attn.logit_max": vals.max(), "attn.logit_p99": np.percentile(vals, 99),
                  "attn.logit_mean": vals.mean(), "attn.logit_std": vals.std(),
                  "attn.entropy_mean": np.mean(ents), "attn.entropy_min": np.min(ents)}
        if softcap:
            cv = capped[:, h][valid[:, h]]
            values["attn.capped_logit_max"] = cv.max()
            values["attn.capped_logit_p99"] = np.percentile(cv, 99)
        for name, value in values.items():
            out.setdefault(name, []).append(value)
    return out


def real_queries(valid: np.ndarray, mask: torch.Tensor) -> np.ndarray:
    """HF's valid pairs without the rows of padded queries (``mask``: (B, T), 1 = real),
    which the hooks leave out (tests/test_hooks_padding.py checks padding in depth)."""
    return valid & mask.bool().numpy()[:, None, :, None]


def batch(vocab: int, b: int = 2, t: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, vocab, (b, t), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 10:] = 0  # right padding (no query row fully masked under a window of 4)
    return ids, mask


CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": lambda: transformers.LlamaConfig(  # RoPE, GQA 4 query heads : 2 kv heads
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, bos_token_id=0,
        eos_token_id=0, pad_token_id=0),
    "qwen3": lambda: transformers.Qwen3Config(  # q_norm/k_norm; a sliding-window layer
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=32,
        use_sliding_window=True, sliding_window=4, max_window_layers=0,
        layer_types=["sliding_attention", "full_attention"], bos_token_id=0,
        eos_token_id=0, pad_token_id=0),
    "gemma2": lambda: transformers.Gemma2Config(  # soft-cap 2 so that it bites; sliding
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=32,
        attn_logit_softcapping=2.0, final_logit_softcapping=None, sliding_window=4,
        query_pre_attn_scalar=8, bos_token_id=0, eos_token_id=0, pad_token_id=0),
}
CASES = [("gpt2", "eager"), ("gpt2", "sdpa"), ("llama", "eager"), ("llama", "sdpa"),
         ("qwen3", "eager"), ("qwen3", "sdpa"), ("gemma2", "eager")]


def build(name: str, impl: str) -> nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[name](),
                                                         attn_implementation=impl)


@pytest.mark.parametrize(("name", "impl"), CASES)
def test_hf_models_every_signal_matches_the_explicit_reference(name: str, impl: str) -> None:
    model = build(name, impl)
    ref_model = build(name, "lw_ref")
    ref_model.load_state_dict(model.state_dict())
    vocab = model.config.vocab_size
    ids, mask = batch(vocab)
    labels = ids.masked_fill(mask == 0, -100)
    REF.clear()
    final: dict[str, torch.Tensor] = {}
    head = ref_model.get_output_embeddings()
    handle = head.register_forward_hook(
        lambda m, a, o: final.update(hidden=a[0].detach(), logits=o.detach()))
    ref_model.train()
    ref_loss = ref_model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    handle.remove()
    reference = sorted(REF, key=lambda r: r[0])
    assert len(reference) == model.config.num_hidden_layers

    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: parameters stay put
    with attach(model, opt, run="r", client=client, overhead_budget=None, sample_every=5):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
    frame = frames[0]
    softcap = reference[0][3]
    expected_names = set(ATTN) | ({"attn.capped_logit_max", "attn.capped_logit_p99"}
                                  if softcap else set())
    assert expected_names <= set(frame["heads"])
    for layer, (_, logits, valid, cap) in enumerate(reference):
        ref = signals(logits, real_queries(valid, mask), cap)
        for metric, values in ref.items():
            np.testing.assert_allclose(frame["heads"][metric][layer], values, rtol=1e-4,
                                       atol=1e-5, err_msg=f"{name}/{impl} {metric} {layer}")
    s = frame["scalars"]
    assert s["loss"] == pytest.approx(ref_loss, rel=1e-5)
    assert s["loss.first_over_ln_vocab"] == pytest.approx(ref_loss / math.log(vocab), rel=1e-5)
    hidden, logits = final["hidden"].double(), final["logits"].double()
    assert s["final.hidden_rms"] == pytest.approx(hidden.square().mean().sqrt().item(), rel=1e-5)
    assert s["final.logz"] == pytest.approx(torch.logsumexp(logits, -1).mean().item(), rel=1e-5)
    assert s["final.logit_max"] == pytest.approx(logits.max().item(), rel=1e-5)
    check_qk_norms(model, frame["heads"])


def check_qk_norms(model: nn.Module, heads: dict) -> None:
    """Per-head q/k weight and bias norms from an explicit split of the parameters."""
    config = model.config
    n_head = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_head
    for layer, attn in enumerate(m for m in model.modules() if type(m).__name__.endswith(
            "Attention")):
        if hasattr(attn, "c_attn"):  # GPT-2: Conv1D weight (in, 3E), columns q | k | v
            e = config.n_embd
            w, b = attn.c_attn.weight.detach(), attn.c_attn.bias.detach()
            hd = e // n_head
            q_w = [w[:, h * hd:(h + 1) * hd].norm() for h in range(n_head)]
            k_w = [w[:, e + h * hd:e + (h + 1) * hd].norm() for h in range(n_head)]
            q_b = [b[h * hd:(h + 1) * hd].norm() for h in range(n_head)]
            k_b = [b[e + h * hd:e + (h + 1) * hd].norm() for h in range(n_head)]
            np.testing.assert_allclose(heads["qk.q_bias_norm"][layer], q_b, rtol=1e-5)
            np.testing.assert_allclose(heads["qk.k_bias_norm"][layer], k_b, rtol=1e-5)
        else:
            hd = attn.head_dim
            q_w = [attn.q_proj.weight[h * hd:(h + 1) * hd].norm().item() for h in range(n_head)]
            k_w = [attn.k_proj.weight[h * hd:(h + 1) * hd].norm().item() for h in range(n_kv)]
        np.testing.assert_allclose(heads["qk.q_weight_norm"][layer], q_w, rtol=1e-5)
        np.testing.assert_allclose(heads["qk.k_weight_norm"][layer], k_w, rtol=1e-5)


# -- torch.nn.MultiheadAttention / TransformerEncoder ---------------------------------------


class EncoderLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.lm_head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True = not allowed
        x = self.encoder(self.emb(ids), mask=causal, src_key_padding_mask=pad, is_causal=True)
        return self.lm_head(x)


def test_transformer_encoder_fused_in_proj() -> None:
    torch.manual_seed(0)
    model = EncoderLM()
    ids = torch.randint(0, 32, (2, 7))
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
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
    real = ~pad.numpy()  # padded query rows and keys are both left out
    valid = np.tril(np.ones((7, 7), bool))[None, None] & real[:, None, None, :]
    valid = valid & real[:, None, :, None]
    valid = np.broadcast_to(valid, (2, 4, 7, 7))
    for layer, (x, mod) in enumerate(zip(inputs, model.encoder.layers, strict=True)):
        attn = mod.self_attn
        wq, wk, _ = attn.in_proj_weight.detach().double().chunk(3)
        bq, bk, _ = attn.in_proj_bias.detach().double().chunk(3)
        q = (x.double() @ wq.T + bq).view(2, 7, 4, 4).transpose(1, 2)
        k = (x.double() @ wk.T + bk).view(2, 7, 4, 4).transpose(1, 2)
        ref = signals((q @ k.transpose(-1, -2) / 2.0).numpy(), valid, None)
        for metric, values in ref.items():
            np.testing.assert_allclose(heads[metric][layer], values, rtol=1e-4, atol=1e-5,
                                       err_msg=metric)
        q_norms = [wq[h * 4:(h + 1) * 4].norm().item() for h in range(4)]
        np.testing.assert_allclose(heads["qk.q_weight_norm"][layer], q_norms, rtol=1e-5)
        np.testing.assert_allclose(heads["qk.k_bias_norm"][layer],
                                   [bk[h * 4:(h + 1) * 4].norm().item() for h in range(4)],
                                   rtol=1e-5)


# -- the adapter for any other attention -----------------------------------------------------


class HandWritten(nn.Module):
    """softmax(q kᵀ) by hand: invisible to the monitor without the adapter."""

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        self.seen = (q.detach(), k.detach())
        record_attention(q, k, is_causal=True, scale=0.5, softcap=3.0, layer=self.layer)
        logits = torch.tanh(q @ k.transpose(-1, -2) * 0.5 / 3.0) * 3.0
        logits = logits.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
        return (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 16)


def test_record_attention_adapter() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(32, 16), HandWritten(1), HandWritten(0))
    ids = torch.randint(0, 32, (2, 6))
    client, frames = capturing_client()
    record_attention(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))  # no monitor: no-op
    with attach(model, run="r", client=client, overhead_budget=None, lm_head=False) as mon:
        model(ids).sum().backward()
        mon.step()
        model.eval()
        with torch.no_grad():
            model(ids)  # not a training forward: the adapter records nothing
        mon.step()
    # step 1 (its forward an eval one) is sent by close() as a closing frame: no attention
    assert [f["step"] for f in frames] == [0, 1]
    assert frames[1]["scalars"]["hooks.closing"] == 1.0
    assert not any(name.startswith("attn.") for name in frames[1]["heads"])
    heads = frames[0]["heads"]
    valid = np.broadcast_to(np.tril(np.ones((6, 6), bool)), (2, 2, 6, 6))
    for layer, module in ((1, model[1]), (0, model[2])):
        q, k = module.seen
        ref = signals((q.double() @ k.double().transpose(-1, -2) * 0.5).numpy(), valid, 3.0)
        for metric, values in ref.items():
            np.testing.assert_allclose(heads[metric][layer], values, rtol=1e-4, atol=1e-5)


# -- torch.compile ----------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_compile_with_the_monitor_attached() -> None:
    torch.manual_seed(0)
    plain = Tiny()
    compiled_src = Tiny()
    compiled_src.load_state_dict(plain.state_dict())
    opt_a = torch.optim.SGD(plain.parameters(), lr=0.1)
    train(plain, opt_a, 3)
    opt_b = torch.optim.SGD(compiled_src.parameters(), lr=0.1)
    client, frames = capturing_client()
    mon = attach(compiled_src, opt_b, run="r", client=client, sample_every=1,
                 overhead_budget=None)
    compiled = torch.compile(compiled_src, backend="aot_eager")
    train(compiled, opt_b, 3, mon)
    mon.close()
    torch._dynamo.reset()
    for a, b in zip(plain.parameters(), compiled_src.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert [f["step"] for f in frames] == [0, 1, 2]
    for frame in frames:  # what is captured under compile: the optimizer side + weights
        assert {"loss", "grad.norm", "grad.clipped", "lr"} <= set(frame["scalars"])
        assert {"qk.q_weight_norm", "qk.k_weight_norm"} <= set(frame["heads"])
        assert "attn.logit_max" not in frame["heads"]
    for module in compiled_src.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


@pytest.mark.parametrize("how", ["bf16-weights", "bf16-autocast"])
def test_bf16_llama_sdpa_matches_the_reference_on_the_same_inputs(how: str) -> None:
    """The dtype most large runs train in: statistics of bf16 ``q``/``k`` computed in
    float32, equal to float64 ones from the same bf16 inputs; ``attn.dtype_max`` is
    bf16's. Layer 0 sees identical ``q``/``k`` in both models (checked tightly); later
    layers differ by the attention kernels' bf16 rounding (checked loosely)."""
    model, ref_model = build("llama", "sdpa"), build("llama", "lw_ref")
    ref_model.load_state_dict(model.state_dict())
    if how == "bf16-weights":
        model, ref_model = model.to(torch.bfloat16), ref_model.to(torch.bfloat16)
    ids, mask = batch(model.config.vocab_size)
    labels = ids.masked_fill(mask == 0, -100)

    def forward(m: nn.Module) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=how == "bf16-autocast"):
            return m(input_ids=ids, attention_mask=mask, labels=labels).loss

    REF.clear()
    ref_model.train()
    forward(ref_model)
    reference = sorted(REF, key=lambda r: r[0])
    assert len(reference) == model.config.num_hidden_layers
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with attach(model, opt, run="r", client=client, overhead_budget=None, sample_every=5):
        forward(model).backward()
        opt.step()
    frame = frames[0]
    assert frame["scalars"]["attn.dtype_max"] == pytest.approx(
        torch.finfo(torch.bfloat16).max, rel=1e-6)
    for layer, (_, logits, valid, cap) in enumerate(reference):
        tight = layer == 0
        for metric, values in signals(logits, real_queries(valid, mask), cap).items():
            np.testing.assert_allclose(frame["heads"][metric][layer], values,
                                       rtol=1e-5 if tight else 5e-2,
                                       atol=1e-6 if tight else 5e-2,
                                       err_msg=f"{how} {metric} layer {layer}")


def test_an_encoder_decoder_keeps_one_row_per_attention_on_both_paths() -> None:
    """T5 numbers the layers of its encoder, its decoder and its cross-attention each from
    0: keyed by ``layer_idx`` the eager path pooled three attentions into one row (2 rows
    for 6 attentions, beside 6 rows of q/k norms). Each attention has its own row, in module
    order, as the SDPA path's call order gives, with the same values."""
    cfg = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=64,
               decoder_start_token_id=0, pad_token_id=0, dropout_rate=0.0)
    got = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = transformers.T5ForConditionalGeneration(
            transformers.T5Config(**cfg, attn_implementation=impl))
        gen = torch.Generator().manual_seed(1)
        ids, labels = (torch.randint(3, 64, (2, n), generator=gen) for n in (10, 6))
        client, frames = capturing_client()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        with attach(model, opt, run="r", client=client, overhead_budget=None,
                    sample_every=5):
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
        got[impl] = frames[0]["heads"]
        assert len(got[impl]["attn.logit_max"]) == len(got[impl]["qk.q_weight_norm"]) == 6
    np.testing.assert_allclose(got["eager"]["attn.logit_max"], got["sdpa"]["attn.logit_max"],
                               rtol=1e-4, atol=1e-5)


def test_an_attention_the_hooks_cannot_see_is_said_once(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """GPT-2 with ``reorder_and_upcast_attn`` computes its attention in its own method, not
    through SDPA or ``eager_attention_forward``: its frames carry q/k norms but no attn.*
    statistics, which a warning now says (once) instead of an info line reading as full
    coverage. The default GPT-2 says nothing."""
    seen = {}
    for upcast in (False, True):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32,
            reorder_and_upcast_attn=upcast, attn_implementation="eager"))
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        client, frames = capturing_client()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        caplog.clear()
        with caplog.at_level("WARNING", logger="logitwatch.hooks"), attach(
                model, opt, run="r", client=client, overhead_budget=None, sample_every=1):
            for _ in range(3):
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
        seen[upcast] = [r.getMessage() for r in caplog.records
                        if "no attention call" in r.getMessage()]
        assert ("attn.logit_max" in frames[0]["heads"]) is not upcast
        assert "qk.q_weight_norm" in frames[0]["heads"]
    assert seen[False] == [] and len(seen[True]) == 1
    assert "GPT2LMHeadModel" in seen[True][0] and "record_attention" in seen[True][0]
