"""Seven architectures, zero configuration: every per-head attention statistic against an
independent float64 recomputation over real tokens only.

Tiny models, random weights: nanoGPT-style (fused ``c_attn``, SDPA ``is_causal``); HF
Mistral (sliding window 4, GQA 4:2; eager and sdpa), Phi-3 (fused ``qkv_proj``, partial
RoPE, GQA), OLMo-2 (QK-norm over the whole projection, GQA), ViT (non-causal, q/k biases),
Gemma-2 (soft-cap 2.0, a sliding-window layer, GQA); ``nn.TransformerEncoder``
(``src_key_padding_mask``, causal and not). Token batches are padded right and left (a 2-D
``attention_mask`` / ``src_key_padding_mask``); nanoGPT and ViT have no padding.
After one sampled training step with just ``attach``:

* ``attn.logit_max/p99/mean/std`` and ``attn.entropy_mean/min`` per layer per head (and
  Gemma-2's ``attn.capped_logit_max/p99``) equal float64 NumPy at rtol 1e-5 (atol 1e-6
  near zero): p99 NumPy's 'linear', std with ddof=0, entropy of each real query row's
  softmax over the keys it may see (of the capped logits under a soft-cap). ``q``/``k``
  come from an attention function registered with transformers (after RoPE / QK-norm,
  before ``repeat_kv``), or from the module's own weights in float64 (nanoGPT, encoder);
  the counted pairs are built here from shapes (causal triangle, sliding window, query and
  key both real), never from the mask the model hands to its kernel;
* per-head arrays have the query heads, ``qk.k_weight_norm`` the key heads (GQA);
* ``qk.*`` weight (and bias) norms equal an explicit per-head split of the parameters,
  fused projections included;
* training is bit-for-bit unchanged: three AdamW steps with and without ``attach``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_hooks_qk import CausalSelfAttention  # nanoGPT's, fused c_attn
from test_hooks_sampling import capturing_client
from torch import nn

from logitwatch.hooks import attach

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RTOL, ATOL = 1e-5, 1e-6
ATTN = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
        "attn.entropy_mean", "attn.entropy_min")
CAPPED = ("attn.capped_logit_max", "attn.capped_logit_p99")
B, T, VOCAB, H, KV, HD = 4, 14, 64, 4, 2, 8
LENGTHS = (14, 11, 6, 9)  # real tokens per row
RECORDED: list[tuple[np.ndarray, np.ndarray, float, float | None]] = []


def recording_attention(module, query, key, value, attention_mask, scaling=None,
                        dropout=0.0, softcap=None, **kwargs):
    """Keeps float64 ``q``/``k`` as the kernel gets them (after RoPE / QK-norm, before
    ``repeat_kv``), the scale and the soft-cap, in call order; then runs HF's eager."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    RECORDED.append((query.detach().double().numpy(), key.detach().double().numpy(), scale,
                     softcap))
    eager = sys.modules[type(module).__module__].eager_attention_forward
    cap = {} if softcap is None else {"softcap": softcap}
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                 **cap, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def register_recorder() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("lw_arch_ref", recording_attention)
    AttentionMaskInterface.register("lw_arch_ref", eager_mask)


def allowed(t: int, causal: bool, window: int | None) -> np.ndarray:
    """``(T, T)``: may query ``i`` see key ``j``. transformers 5.x (masking_utils.py):
    ``causal_mask_function`` is ``kv_idx <= q_idx`` and ``sliding_window_overlay(w)`` adds
    ``kv_idx > q_idx - w``, so a query sees the ``w`` keys ``i - w < j <= i``, itself
    included (positions in the padded row: padding is contiguous, so these are also the
    last ``w`` real tokens)."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    ok = np.ones((t, t), bool)
    if causal:
        ok &= j <= i
    if window:
        ok &= j > i - window
    return ok


def reference(q: np.ndarray, k: np.ndarray, scale: float, real: np.ndarray, causal: bool,
              window: int | None = None, softcap: float | None = None) -> dict[str, list]:
    """Every per-head statistic, float64, over the pairs whose query and key are real
    (``real``: (B, T) bool) and that the attention allows."""
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)  # query head h uses key head h // g
    logits = q @ k.transpose(0, 1, 3, 2) * scale
    b, h, t, s = logits.shape
    valid = allowed(t, causal, window)[None] & real[:, :, None] & real[:, None, :]
    capped = softcap * np.tanh(logits / softcap) if softcap else logits
    out: dict[str, list] = {}
    for head in range(h):
        vals = logits[:, head][valid]
        ents = []
        for row, ok in zip(capped[:, head].reshape(-1, s), valid.reshape(-1, s), strict=True):
            if ok.any():
                p = np.exp(row[ok] - row[ok].max())
                p /= p.sum()
                ents.append(-(p[p > 0] * np.log(p[p > 0])).sum())
        values = [vals.max(), np.percentile(vals, 99), vals.mean(), vals.std(),
                  np.mean(ents), np.min(ents)]
        if softcap:
            cv = capped[:, head][valid]
            values += [cv.max(), np.percentile(cv, 99)]
        for name, value in zip(ATTN + CAPPED, values, strict=False):
            out.setdefault(name, []).append(value)
    return out


def one_step(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor],
             watch: Sequence[nn.Module] = ()) -> tuple[dict, list[torch.Tensor]]:
    """One sampled training step with a plain ``attach``: the frame's ``heads``, and the
    input each module of ``watch`` got (forward pre-hooks)."""
    seen: list[torch.Tensor] = []
    handles = [m.register_forward_pre_hook(lambda mod, a: seen.append(a[0].detach()))
               for m in watch]
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay put
    with attach(model, opt, run="r", client=client, overhead_budget=None, sample_every=5):
        loss_fn(model).backward()
        opt.step()
    for handle in handles:
        handle.remove()
    assert [f["step"] for f in frames] == [0]
    return frames[0]["heads"], seen


def check_attention(heads: dict, refs: list[dict], label: str) -> None:
    names = set(refs[0])
    assert names <= set(heads), sorted(names - set(heads))
    if not names & set(CAPPED):
        assert not set(CAPPED) & set(heads)
    for metric in names:  # layers x query heads
        assert np.asarray(heads[metric]).shape == (len(refs), len(refs[0][metric])), metric
    for layer, ref in enumerate(refs):
        for metric, values in ref.items():
            np.testing.assert_allclose(heads[metric][layer], values, rtol=RTOL, atol=ATOL,
                                       strict=True, err_msg=f"{label} {metric} layer {layer}")


def per_head(t: torch.Tensor, n: int) -> list[float]:
    """Norms of ``n`` equal consecutive slices of ``t`` along dim 0, in float64."""
    return [part.norm().item() for part in t.detach().double().chunk(n)]


def check_qk(heads: dict, layers: list[tuple], h: int, kv: int, label: str) -> None:
    """``layers``: per layer ``(q weight, k weight, q bias, k bias)``, heads along dim 0,
    sliced here from the parameters (biases None where the projection has none)."""
    assert np.asarray(heads["qk.q_weight_norm"]).shape == (len(layers), h)
    assert np.asarray(heads["qk.k_weight_norm"]).shape == (len(layers), kv)
    assert np.asarray(heads["attn.logit_max"]).shape == (len(layers), h)
    for layer, (qw, kw, qb, kb) in enumerate(layers):
        for metric, t, n in (("qk.q_weight_norm", qw, h), ("qk.k_weight_norm", kw, kv),
                             ("qk.q_bias_norm", qb, h), ("qk.k_bias_norm", kb, kv)):
            if t is None:
                assert metric not in heads, metric
                continue
            np.testing.assert_allclose(heads[metric][layer], per_head(t, n), rtol=RTOL,
                                       strict=True, err_msg=f"{label} {metric} layer {layer}")


def padded(side: str, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and a 0/1 mask with rows of :data:`LENGTHS` real tokens, padded on ``side``."""
    ids = torch.randint(1, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(T) < torch.tensor(LENGTHS)[:, None]).long()
    mask = mask if side == "right" else mask.flip(1)
    return ids.masked_fill(mask == 0, 0), mask


# -- HF causal language models ---------------------------------------------------------------
COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=H,
              num_key_value_heads=KV, vocab_size=VOCAB, max_position_embeddings=32,
              bos_token_id=0, eos_token_id=0, pad_token_id=0,
              initializer_range=0.2)  # logits of a few units (0.02 gives ~0.01)
CONFIGS = {
    "mistral": lambda: transformers.MistralConfig(sliding_window=4, **COMMON),
    "phi3": lambda: transformers.Phi3Config(partial_rotary_factor=0.5, **COMMON),
    "olmo2": lambda: transformers.Olmo2Config(**COMMON),
    "gemma2": lambda: transformers.Gemma2Config(
        head_dim=HD, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,  # scale 1/4
        final_logit_softcapping=None, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **COMMON),
}
WINDOWS = {"mistral": (4, 4), "phi3": (None, None), "olmo2": (None, None),
           "gemma2": (4, None)}
HF_CASES = [("mistral", "eager"), ("mistral", "sdpa"), ("phi3", "eager"), ("phi3", "sdpa"),
            ("olmo2", "eager"), ("olmo2", "sdpa"), ("gemma2", "eager")]


def build(name: str, impl: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "vit":
        config = transformers.ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=H, intermediate_size=64,
            image_size=16, patch_size=4, num_channels=3, num_labels=3, qkv_bias=True,
            initializer_range=0.2)
        model = transformers.AutoModelForImageClassification.from_config(
            config, attn_implementation=impl)
        for attn in (m for m in model.modules() if type(m).__name__ == "ViTAttention"):
            nn.init.normal_(attn.q_proj.bias, std=0.5)  # HF initialises biases to 0
            nn.init.normal_(attn.k_proj.bias, std=0.5)
        return model
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[name](),
                                                         attn_implementation=impl)


def hf_qk_parts(model: nn.Module) -> list[tuple]:
    """Per layer (q weight, k weight, q bias, k bias), split by hand from the parameters."""
    out = []
    for attn in (m for m in model.modules() if type(m).__name__.endswith("Attention")):
        if hasattr(attn, "qkv_proj"):  # Phi-3: rows [q (H·D) | k (H_kv·D) | v (H_kv·D)]
            w = attn.qkv_proj.weight
            out.append((w[:H * HD], w[H * HD:(H + KV) * HD], None, None))
        else:
            out.append((attn.q_proj.weight, attn.k_proj.weight, attn.q_proj.bias,
                        attn.k_proj.bias))
    return out


def recorded_step(name: str, impl: str, loss_fn: Callable[[nn.Module], torch.Tensor]
                  ) -> tuple[nn.Module, list[tuple], dict]:
    """The monitored model, the q/k a copy of it recorded in the same forward (the
    reference implementation), and the monitored step's ``heads``."""
    model, ref_model = build(name, impl), build(name, "lw_arch_ref")
    ref_model.load_state_dict(model.state_dict())
    RECORDED.clear()
    ref_model.train()
    loss_fn(ref_model)
    recorded = list(RECORDED)
    assert len(recorded) == 2
    return model, recorded, one_step(model, loss_fn)[0]


def hf_lm_loss(ids: torch.Tensor, mask: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    labels = ids.masked_fill(mask == 0, -100)
    return lambda m: m(input_ids=ids, attention_mask=mask, labels=labels).loss


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(("name", "impl"), HF_CASES)
def test_hf_language_models_match_float64_over_real_tokens(name: str, impl: str,
                                                            side: str) -> None:
    ids, mask = padded(side)
    model, recorded, heads = recorded_step(name, impl, hf_lm_loss(ids, mask))
    real = mask.bool().numpy()
    refs = [reference(q, k, scale, real, True, window, cap)
            for (q, k, scale, cap), window in zip(recorded, WINDOWS[name], strict=True)]
    assert recorded[0][0].shape[1] == H and recorded[0][1].shape[1] == KV
    if name == "phi3":  # partial RoPE: 2 frequencies rotate 4 of the 8 dimensions
        assert model.model.rotary_emb.inv_freq.numel() == HD // 4
    if name == "gemma2":  # the cap bites: the capped max is well under the raw one
        assert recorded[0][3] == 2.0 and recorded[0][2] == 0.25
        assert max(np.subtract(refs[1]["attn.logit_max"], refs[1][CAPPED[0]])) > 0.5
    check_attention(heads, refs, f"{name}/{impl}/{side}")
    check_qk(heads, hf_qk_parts(model), H, KV, f"{name}/{impl}")


# -- HF ViT: non-causal, q/k biases, pixels ------------------------------------------------
PIXELS = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
VIT_LABELS = torch.tensor([0, 2, 1])


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_vit_matches_float64(impl: str) -> None:
    model, recorded, heads = recorded_step(
        "vit", impl, lambda m: m(pixel_values=PIXELS, labels=VIT_LABELS).loss)
    assert recorded[0][0].shape == (3, H, 17, HD)  # CLS + 16 patches
    real = np.ones((3, 17), bool)
    refs = [reference(q, k, scale, real, False) for q, k, scale, _ in recorded]
    check_attention(heads, refs, f"vit/{impl}")
    check_qk(heads, hf_qk_parts(model), H, H, f"vit/{impl}")


# -- nanoGPT: fused c_attn, SDPA is_causal ---------------------------------------------------
class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int = VOCAB, n_embd: int = 32, n_head: int = H) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(T, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(2)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def qk_from_inputs(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, heads: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``q``/``k`` ``(B, H, T, D)`` from the layer input and the fused weight."""
    e = x.shape[-1]
    w, b, x = w.detach().double(), b.detach().double(), x.double()
    q, k = (x @ w[i * e:(i + 1) * e].T + b[i * e:(i + 1) * e] for i in (0, 1))
    return tuple(z.view(*x.shape[:2], heads, e // heads).transpose(1, 2).numpy()
                 for z in (q, k))


def test_nanogpt_fused_c_attn_matches_float64() -> None:
    model = NanoGPT()
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(2))
    heads, seen = one_step(model, lambda m: m(ids, ids)[1], [blk.attn for blk in model.h])
    real = np.ones((B, T), bool)
    refs = [reference(*qk_from_inputs(x, blk.attn.c_attn.weight, blk.attn.c_attn.bias, H),
                      HD**-0.5, real, True) for x, blk in zip(seen, model.h, strict=True)]
    check_attention(heads, refs, "nanogpt")
    e = 32
    parts = [(a.weight[:e], a.weight[e:2 * e], a.bias[:e], a.bias[e:2 * e])
             for a in (blk.attn.c_attn for blk in model.h)]
    check_qk(heads, parts, H, H, "nanogpt")


# -- nn.TransformerEncoder: src_key_padding_mask --------------------------------------------
class EncoderLM(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.causal = causal
        self.emb = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, H, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.lm_head = nn.Linear(32, VOCAB)
        for layer in self.encoder.layers:  # in_proj_bias starts at 0: make it count
            nn.init.normal_(layer.self_attn.in_proj_bias, std=0.5)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1) if self.causal else None
        x = self.encoder(self.emb(ids), mask=mask, src_key_padding_mask=pad,
                         is_causal=self.causal)
        return self.lm_head(x)


def encoder_loss(ids: torch.Tensor, mask: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    labels = ids.masked_fill(mask == 0, -100)
    return lambda m: F.cross_entropy(m(ids, mask == 0).flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("side", ["right", "left"])
def test_transformer_encoder_matches_float64(side: str, causal: bool) -> None:
    model = EncoderLM(causal)
    ids, mask = padded(side)
    layers = list(model.encoder.layers)
    heads, seen = one_step(model, encoder_loss(ids, mask), [x.self_attn for x in layers])
    real = mask.bool().numpy()
    refs = [reference(*qk_from_inputs(x, layer.self_attn.in_proj_weight,
                                      layer.self_attn.in_proj_bias, H), HD**-0.5, real,
                      causal) for x, layer in zip(seen, layers, strict=True)]
    check_attention(heads, refs, f"encoder/{side}/causal={causal}")
    parts = [(*x.self_attn.in_proj_weight.chunk(3)[:2], *x.self_attn.in_proj_bias.chunk(3)[:2])
             for x in layers]  # rows [q | k | v]
    check_qk(heads, parts, H, H, "encoder")


# -- training is bit-for-bit unchanged -------------------------------------------------------
TRAINED = {"nanogpt": NanoGPT, "encoder": lambda: EncoderLM(True),
           "vit": lambda: build("vit", "sdpa"), "mistral": lambda: build("mistral", "sdpa"),
           "phi3": lambda: build("phi3", "sdpa"), "olmo2": lambda: build("olmo2", "eager"),
           "gemma2": lambda: build("gemma2", "eager")}


def step_loss(name: str, seed: int) -> Callable[[nn.Module], torch.Tensor]:
    """Step ``seed``'s batch (padded on the right, then the left, ...) and loss."""
    ids, mask = padded("left" if seed % 2 else "right", seed)
    if name == "nanogpt":
        return lambda m: m(ids, ids)[1]
    if name == "encoder":
        return encoder_loss(ids, mask)
    if name == "vit":
        px = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
        return lambda m: m(pixel_values=px, labels=VIT_LABELS).loss
    return hf_lm_loss(ids, mask)


def train(model: nn.Module, losses: list[Callable], monitored: bool) -> tuple[list, list]:
    client, frames = capturing_client()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx = (attach(model, opt, run="r", client=client, overhead_budget=None, sample_every=2)
           if monitored else contextlib.nullcontext())
    out = []
    with ctx:
        for loss_fn in losses:
            opt.zero_grad()
            loss = loss_fn(model)
            loss.backward()
            opt.step()
            out.append(loss.item())
    return out, frames


@pytest.mark.parametrize("name", list(TRAINED))
def test_training_is_bit_for_bit_unchanged(name: str) -> None:
    model = TRAINED[name]()
    losses = [step_loss(name, seed) for seed in range(3)]
    plain, monitored = copy.deepcopy(model), copy.deepcopy(model)
    plain_losses, _ = train(plain, losses, False)
    monitored_losses, frames = train(monitored, losses, True)
    assert [f["step"] for f in frames] == [0, 2]  # sampled, then not, then sampled
    assert all("attn.logit_max" in f["heads"] and "qk.k_weight_norm" in f["heads"]
               for f in frames)
    assert monitored_losses == plain_losses
    for (n, a), (_, b) in zip(plain.named_parameters(), monitored.named_parameters(),
                              strict=True):
        assert torch.equal(a, b), n
    assert not torch.equal(next(model.parameters()), next(plain.parameters()))  # it trained


@pytest.mark.parametrize("kind", ["bool", "int", "float", "additive", "additive_inf"])
def test_a_2d_attention_mask_of_any_convention_marks_the_same_tokens(kind: str) -> None:
    """``attention_mask`` as HF tokenizers give it (1 real, 0 padded: bool, int or float)
    or additive (0 real, a large negative or -inf padded): the same real tokens. An additive
    mask used to be read the other way round (its padded positions taken as real)."""
    from logitwatch.hooks._padding import PaddingMask

    real = torch.tensor([[True, True, True, False], [False, True, True, True]])
    mask = {"bool": real, "int": real.long(), "float": real.float(),
            "additive": (~real).float() * -1e9,
            "additive_inf": torch.where(real, 0.0, float("-inf"))}[kind]
    pm = PaddingMask(nn.Linear(2, 2))
    pm.capture((), {"attention_mask": mask})
    q, k = pm.for_call(2, 4, 4)
    assert q is not None and k is not None and torch.equal(q, real) and torch.equal(k, real)
