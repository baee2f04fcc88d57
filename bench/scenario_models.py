"""Models and the training loop of the recorded alert scenarios (``record_scenarios.py``).

One job: build a model and its optimizer for a :class:`RunSpec` and train it step by step
on the demo's corpus, with an optional monitor attached (the real hooks) and the scenario's
injections applied. Tokens are the corpus's bytes (:class:`logitwatch.demo.data.ByteData`,
vocabulary 256) or, with ``vocab`` above 256, a byte-level BPE of that size trained on the
same corpus (:class:`BPEData`): a larger vocabulary moves every loss, log Z and gradient
scale the rules read, so a set recorded with it tests that they do not lean on bytes. Families:

* ``demo``: the demo's own SDPA model (:class:`logitwatch.demo.model.TinyGPT`): pre-LN,
  optional QK-norm, attention scores in float16 (``attn_dtype="float16"``, the overflow
  emulated) or float32;
* ``gpt2``: HF ``GPT2LMHeadModel`` from a tiny ``GPT2Config``, eager attention (its fused
  ``c_attn`` has biases: the QK-clip bias-refuge case);
* ``llama``: HF ``LlamaForCausalLM`` (RoPE, RMSNorm, SwiGLU, GQA: ``n_kv_head`` <
  ``n_head``), SDPA or eager attention;
* ``gemma2``: HF ``Gemma2ForCausalLM``, eager, attention logits soft-capped as
  ``c*tanh(x/c)`` (``softcap``) and the output logits at 30;
* ``postln``: post-LN ``torch.nn.TransformerEncoder`` (``norm_first=False``, causal mask)
  with token/position embeddings and an untied LM head.

Precision: float32, bf16 autocast (``autocast="bfloat16"``: forward and loss under
``torch.autocast("cpu", dtype=torch.bfloat16)``, backward outside it) or, for ``demo``,
float16 attention scores. Optimizers: AdamW, Adam (L2 weight decay, not decoupled), SGD
with momentum, RMSprop. Gradient clipping goes through ``torch.nn.utils.clip_grad_norm_``
looked up at call time (as the demo does), so the hooks see it; ``max_norm=None`` does not
clip (the hooks then measure the norm themselves).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("demo", "gpt2", "llama", "gemma2", "postln")
VOCAB = 256


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one scenario run (deterministic for a given ``seed``)."""

    family: str = "demo"
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int | None = None  # llama/gemma2: key/value heads (GQA); None: n_head
    seq_len: int = 64
    batch_size: int = 16
    init_std: float = 0.02  # weights' init std (the demo's own default is 0.1)
    qk_norm: bool = False  # demo only
    attn_dtype: str = "float32"  # demo only: "float16" computes the scores in half
    attn_impl: str = "eager"  # llama: "sdpa" or "eager" (gpt2/gemma2: eager)
    softcap: float | None = None  # gemma2: attn_logit_softcapping
    autocast: str | None = None  # "bfloat16": the forward under CPU autocast
    optimizer: str = "adamw"  # adamw | adam | sgd | rmsprop
    lr: float = 1e-3  # peak learning rate
    warmup: int = 100  # linear warm-up steps
    min_lr_ratio: float = 1.0  # cosine decay to lr*min_lr_ratio at `steps` (1.0: constant)
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd, rmsprop
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    max_norm: float | None = 1.0  # None: no clipping
    steps: int = 800
    seed: int = 0
    # -- injections ------------------------------------------------------------------------
    # piecewise lr multipliers ((from_step, factor), ...): a jump, or a bump that ends
    lr_steps: tuple[tuple[int, float], ...] = ()
    # (start, length, factor): a second linear warm-up from the scheduled lr to factor x it
    # over `length` steps, held there afterwards
    rewarm: tuple[int, int, float] | None = None
    # ((step, factor), ...): every gradient times factor on that step, before the clip
    grad_spikes: tuple[tuple[int, float], ...] = ()
    # ((step, fraction), ...): gradients rescaled so their norm is fraction x max_norm
    # (a blip just under the clip); only where the norm is below that already
    grad_blips: tuple[tuple[int, float], ...] = ()
    # (from_step, rate, until_step | None): the LM head's weight times (1 + rate) after every
    # step in [from, until): the output logits (log Z) drift
    head_drift: tuple[int, float, int | None] | None = None
    # ((start, end, kind), ...): steps [start, end) train on bad batches: "random" (uniform
    # random bytes), "shuffle" (each row's tokens permuted), "zeros" (byte 0, never in the
    # corpus), "upper" (the text upper-cased)
    bad_data: tuple[tuple[int, int, str], ...] = ()
    # QK-clip (MuonClip): after every step, heads whose max logit in that step's forward
    # exceeded tau get W_q and W_k scaled by sqrt(tau / max); biases NOT (gpt2 only)
    qk_clip: float | None = None
    # ... and the head's q and k biases by the same factor, as the project's QK-clip fuse
    # does (the remedy: the logit has no bias path to return through)
    qk_clip_biases: bool = False
    # tokens: 256 = the corpus's bytes; more = a byte-level BPE of that many tokens
    vocab: int = VOCAB

    def lr_at(self, step: int) -> float:
        """Learning rate of ``step`` (0-based): warm-up, cosine decay, then injections."""
        if step < self.warmup:
            lr = self.lr * (step + 1) / self.warmup
        else:
            frac = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
            lr = self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5
                            * (1 + math.cos(math.pi * frac)))
        factor = 1.0
        for start, f in self.lr_steps:
            if step >= start:
                factor = f
        if self.rewarm is not None and step >= self.rewarm[0]:
            start, length, peak = self.rewarm
            factor *= 1 + (peak - 1) * min(1.0, (step - start + 1) / length)
        return lr * factor


# -- models -------------------------------------------------------------------------------


class PostLN(nn.Module):
    """Token + position embeddings, post-LN ``nn.TransformerEncoder`` (causal), LM head."""

    def __init__(self, spec: RunSpec) -> None:
        super().__init__()
        d = spec.d_model
        self.tok_emb = nn.Embedding(spec.vocab, d)
        self.pos_emb = nn.Embedding(spec.seq_len, d)
        layer = nn.TransformerEncoderLayer(d, spec.n_head, dim_feedforward=4 * d, dropout=0.0,
                                           activation="gelu", batch_first=True,
                                           norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, spec.n_layer, enable_nested_tensor=False)
        self.head = nn.Linear(d, spec.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=spec.init_std)
            if isinstance(m, nn.MultiheadAttention):
                nn.init.normal_(m.in_proj_weight, std=spec.init_std)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(
            spec.seq_len), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        x = self.encoder(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(x)


def build_model(spec: RunSpec) -> nn.Module:
    """The model of ``spec`` (seeded by the caller)."""
    kv = spec.n_kv_head or spec.n_head
    if spec.family == "demo":
        from logitwatch.demo.model import GPTConfig, TinyGPT

        return TinyGPT(GPTConfig(vocab_size=spec.vocab, d_model=spec.d_model, n_layer=spec.n_layer,
                                 n_head=spec.n_head, seq_len=spec.seq_len, qk_norm=spec.qk_norm,
                                 attn_dtype=spec.attn_dtype,  # type: ignore[arg-type]
                                 init_std=spec.init_std))
    if spec.family == "postln":
        return PostLN(spec)
    if spec.family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(
            vocab_size=spec.vocab, n_positions=spec.seq_len, n_embd=spec.d_model,
            n_layer=spec.n_layer, n_head=spec.n_head, initializer_range=spec.init_std,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            tie_word_embeddings=False, attn_implementation="eager"))
    if spec.family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(
            vocab_size=spec.vocab, hidden_size=spec.d_model,
            intermediate_size=8 * spec.d_model // 3,
            num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
            num_key_value_heads=kv, max_position_embeddings=spec.seq_len,
            initializer_range=spec.init_std, bos_token_id=0, eos_token_id=0, pad_token_id=0,
            tie_word_embeddings=False, attn_implementation=spec.attn_impl))
    if spec.family == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM

        return Gemma2ForCausalLM(Gemma2Config(
            vocab_size=spec.vocab, hidden_size=spec.d_model,
            intermediate_size=8 * spec.d_model // 3,
            num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
            num_key_value_heads=kv, head_dim=spec.d_model // spec.n_head,
            max_position_embeddings=spec.seq_len, initializer_range=spec.init_std,
            attn_logit_softcapping=spec.softcap, final_logit_softcapping=30.0,
            bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
            attn_implementation="eager"))
    raise ValueError(f"unknown family {spec.family!r}; one of {FAMILIES}")


def logits_and_loss(model: nn.Module, spec: RunSpec, x: torch.Tensor, y: torch.Tensor
                    ) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model`` on ``(x, y)``."""
    if spec.family == "demo":
        _, loss = model(x, y)
        return loss
    if spec.family == "postln":
        logits = model(x)
    else:
        logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().reshape(-1, spec.vocab), y.reshape(-1))


def output_head(model: nn.Module) -> nn.Module:
    """The LM head (the module whose weight :attr:`RunSpec.head_drift` scales)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise ValueError("the model has no LM head")
    return head


def build_optimizer(model: nn.Module, spec: RunSpec) -> torch.optim.Optimizer:
    """The optimizer of ``spec``; weight decay only on matrices."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": spec.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    lr = spec.lr_at(0)
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=spec.betas, eps=spec.eps)
    if spec.optimizer == "adam":  # L2 decay added to the gradient, not decoupled
        return torch.optim.Adam(groups, lr=lr, betas=spec.betas, eps=spec.eps)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=spec.momentum)
    if spec.optimizer == "rmsprop":
        return torch.optim.RMSprop(groups, lr=lr, alpha=0.99, eps=spec.eps,
                                   momentum=spec.momentum)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}")


# -- data and injections ----------------------------------------------------------------


def bad_batch(kind: str, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator,
              data: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A corrupted batch of ``x``'s shape (see :attr:`RunSpec.bad_data`); ``data`` is the
    run's :class:`BPEData` when its tokens are not bytes."""
    vocab = data.vocab if isinstance(data, BPEData) else VOCAB
    full = torch.cat([x, y[:, -1:]], dim=1)
    if kind == "random":
        chunk = torch.randint(0, vocab, full.shape, generator=gen)
    elif kind == "shuffle":
        perm = torch.argsort(torch.rand(full.shape, generator=gen), dim=1)
        chunk = torch.gather(full, 1, perm)
    elif kind == "zeros":  # byte 0 is never in the corpus; BPE token 0 is a rare one
        chunk = torch.zeros_like(full)
    elif kind == "upper":
        if isinstance(data, BPEData):
            chunk = data.upper(full)
        else:
            chunk = torch.where((full >= 97) & (full <= 122), full - 32, full)
    else:
        raise ValueError(f"unknown bad-data kind {kind!r}")
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


@lru_cache(maxsize=4)
def bpe_tokenizer(vocab: int) -> Any:
    """A byte-level BPE of ``vocab`` tokens trained on the demo corpus with HF ``tokenizers``
    (deterministic for a given corpus and size: the same ids in every process; about a
    second)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from logitwatch.demo.data import load_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(load_corpus().split("\n\n"), trainer=trainer)
    if tok.get_vocab_size() != vocab:
        raise ValueError(f"the corpus yields a BPE of {tok.get_vocab_size()} tokens, not "
                         f"{vocab}")
    return tok


class BPEData:
    """:class:`logitwatch.demo.data.ByteData`'s sampler over BPE tokens of the corpus
    (:func:`bpe_tokenizer`): the same split, window and seeded-offset rules."""

    def __init__(self, seq_len: int, batch_size: int, *, vocab: int, seed: int = 0,
                 val_fraction: float = 0.05) -> None:
        from logitwatch.demo.data import ByteData, load_corpus

        self.vocab = vocab
        self.tokenizer = bpe_tokenizer(vocab)
        ids = torch.tensor(self.tokenizer.encode(load_corpus()).ids, dtype=torch.long)
        self._inner = ByteData(seq_len, batch_size, seed=seed, val_fraction=val_fraction)
        n_val = int(len(ids) * val_fraction)
        self._inner.train_tokens = ids[: len(ids) - n_val]
        self._inner.val_tokens = ids[len(ids) - n_val:]

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Next random training batch ``(x, y)``."""
        return self._inner.batch()

    def upper(self, chunk: torch.Tensor) -> torch.Tensor:
        """Each row's text upper-cased and re-encoded, cut (or repeated) to its length.
        Upper-case text takes 2-3x the tokens of the same text in the corpus's case, so a
        row keeps the first 35-50 % of its text: garbage of another kind than the byte
        runs' "upper" (every byte of the row, upper-cased), used as the same injection."""
        out = []
        n = chunk.shape[1]
        for row in chunk.tolist():
            ids = self.tokenizer.encode(self.tokenizer.decode(row).upper()).ids or [0]
            out.append((ids * (n // len(ids) + 1))[:n])
        return torch.tensor(out, dtype=torch.long)


def make_data(spec: RunSpec) -> Any:
    """The batch sampler of ``spec``: the corpus's bytes, or its BPE tokens."""
    from logitwatch.demo.data import ByteData

    if spec.vocab == VOCAB:
        return ByteData(spec.seq_len, spec.batch_size, seed=spec.seed)
    return BPEData(spec.seq_len, spec.batch_size, vocab=spec.vocab, seed=spec.seed)


class QKClip:
    """QK-clip on GPT-2's fused ``c_attn``: records each head's max causal logit in the
    forward and, after the optimizer step, scales that head's q and k weight columns by
    ``sqrt(tau / max)`` where ``max > tau``, leaving the q/k biases as they are unless
    ``spec.qk_clip_biases`` (then scaled by the same factor)."""

    def __init__(self, model: nn.Module, spec: RunSpec, tau: float) -> None:
        self.tau = tau
        self.biases = spec.qk_clip_biases
        self.layers: list[tuple[nn.Module, int, int]] = []
        self.maxes: dict[int, torch.Tensor] = {}
        self.clipped = 0
        for block in model.transformer.h:  # type: ignore[union-attr]
            attn = block.attn
            idx = len(self.layers)
            self.layers.append((attn.c_attn, attn.num_heads, attn.head_dim))
            attn.c_attn.register_forward_hook(self._hook(idx))

    def _hook(self, idx: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            if not torch.is_grad_enabled():
                return
            _, h, d = self.layers[idx]
            with torch.no_grad():
                b, t, _ = out.shape
                q, k, _ = out.float().split(h * d, dim=2)
                q = q.view(b, t, h, d).transpose(1, 2)
                k = k.view(b, t, h, d).transpose(1, 2)
                s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
                causal = torch.ones(t, t, dtype=torch.bool).tril()
                self.maxes[idx] = s.masked_fill(~causal, -math.inf).amax(dim=(0, 2, 3))
        return hook

    @torch.no_grad()
    def apply(self) -> None:
        for idx, (c_attn, h, d) in enumerate(self.layers):
            m = self.maxes.get(idx)
            if m is None:
                continue
            e = h * d
            for head in range(h):
                mx = float(m[head])
                if math.isfinite(mx) and mx > self.tau:
                    f = math.sqrt(self.tau / mx)
                    c_attn.weight[:, head * d:(head + 1) * d] *= f  # W_q, head's columns
                    c_attn.weight[:, e + head * d:e + (head + 1) * d] *= f  # W_k
                    if self.biases:
                        c_attn.bias[head * d:(head + 1) * d] *= f  # b_q
                        c_attn.bias[e + head * d:e + (head + 1) * d] *= f  # b_k
                    self.clipped += 1
        self.maxes.clear()


# -- the loop -----------------------------------------------------------------------------


@dataclass
class TrainResult:
    """Per-step records of :func:`train` (index = step, 0-based)."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    clipped: list[int | None] = field(default_factory=list)  # None: no clipping
    lrs: list[float] = field(default_factory=list)
    steps_done: int = 0
    stop: str = "end"
    wall_s: float = 0.0
    qk_clips: int = 0


def train(spec: RunSpec, *, attach: Callable[[nn.Module, torch.optim.Optimizer], Any]
          | None = None, should_stop: Callable[[list[float]], str | None] | None = None,
          ) -> TrainResult:
    """Train ``spec`` for ``spec.steps`` steps (or until ``should_stop(losses)`` returns a
    reason). ``attach(model, optimizer)`` returns the monitor (``None``: no monitor); the
    loss reaches it with ``mon.log(loss=loss)`` before backward, as a job does."""
    torch.manual_seed(spec.seed)
    model = build_model(spec)
    opt = build_optimizer(model, spec)
    clip = QKClip(model, spec, spec.qk_clip) if spec.qk_clip is not None else None
    mon = attach(model, opt) if attach is not None else None
    data = make_data(spec)
    gen = torch.Generator().manual_seed(10_000 + spec.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    spikes, blips = dict(spec.grad_spikes), dict(spec.grad_blips)
    head = output_head(model) if spec.head_drift is not None else None
    cast = getattr(torch, spec.autocast) if spec.autocast else None
    res = TrainResult()
    t0 = time.perf_counter()
    model.train()
    for step in range(spec.steps):
        lr = spec.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = data.batch()
        for start, end, kind in spec.bad_data:
            if start <= step < end:
                x, y = bad_batch(kind, x, y, gen, data)
        if cast is not None:
            with torch.autocast("cpu", dtype=cast):
                loss = logits_and_loss(model, spec, x, y)
        else:
            loss = logits_and_loss(model, spec, x, y)
        if mon is not None:
            mon.log(loss=loss)
        loss.backward()
        if step in spikes:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(spikes[step])
        if step in blips and spec.max_norm is not None:
            norm = float(torch.nn.utils.get_total_norm([p.grad for p in params
                                                        if p.grad is not None]))
            target = blips[step] * spec.max_norm
            if 0 < norm < target:
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(target / norm)
        if spec.max_norm is not None:
            total = torch.nn.utils.clip_grad_norm_(params, spec.max_norm)
            gnorm = float(total)
            res.clipped.append(int(gnorm > spec.max_norm))
        else:
            gnorm = float(torch.nn.utils.get_total_norm([p.grad for p in params
                                                         if p.grad is not None]))
            res.clipped.append(None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if clip is not None:
            clip.apply()
        if head is not None and spec.head_drift is not None:
            start, rate, until = spec.head_drift
            if step >= start and (until is None or step < until):
                with torch.no_grad():
                    head.weight.mul_(1.0 + rate)  # type: ignore[operator]
        res.losses.append(float(loss.detach()))
        res.grad_norms.append(gnorm)
        res.lrs.append(lr)
        res.steps_done = step + 1
        if should_stop is not None:
            reason = should_stop(res.losses)
            if reason:
                res.stop = reason
                break
    if mon is not None:
        mon.close(timeout=30)
    res.wall_s = time.perf_counter() - t0
    res.qk_clips = clip.clipped if clip is not None else 0
    return res
