"""The final-layer statistics (``hooks/_final.py``) and the batched q/k norms
(``hooks/_qk.py``) against float64 references."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from logitwatch.hooks import _qk
from logitwatch.hooks._final import final_stats
from logitwatch.hooks._logits import CPU_BLOCK_ELEMENTS
from logitwatch.hooks._qk import Part, QKSource, qk_norms


def reference(hidden: torch.Tensor, logits: torch.Tensor) -> dict[str, float]:
    h, lg = hidden.double(), logits.double().reshape(-1, logits.shape[-1])
    return {"final.hidden_rms": h.square().mean().sqrt().item(),
            "final.logz": torch.logsumexp(lg, dim=-1).mean().item(),
            "final.logit_max": lg.max().item()}


def metrics(stats) -> dict[str, float]:
    return {name: value.item() for name, value in stats.metrics().items()}


@pytest.mark.parametrize("shape,vocab,offset,spread", [
    ((2, 5), 7, 0.0, 1.0),  # one chunk, tiny
    ((3, 100), 4096, 0.0, 3.0),  # several CPU chunks and a short last one
    ((2, 64), 5000, 30.0, 0.5),  # far from 0: log Z is about the offset
    ((1, 33), 1000, -9.0, 0.01),  # log Z near 0 (rows of nearly equal logits)
])
def test_final_stats_against_float64(shape, vocab, offset, spread) -> None:
    gen = torch.Generator().manual_seed(sum(shape) + vocab)
    hidden = torch.randn(*shape, 16, generator=gen)
    logits = torch.randn(*shape, vocab, generator=gen) * spread + offset
    got = metrics(final_stats(hidden, logits, 1 << 20))
    ref = reference(hidden, logits)
    for name, value in ref.items():
        assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_final_stats_rows_with_masked_entries_chunks_and_bf16() -> None:
    """-inf entries (a masked vocabulary) add nothing; a small budget makes many chunks;
    bf16 logits are reduced in float32; merging two forwards pools exactly."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 9, 8, generator=gen)
    logits = torch.randn(4, 9, 300, generator=gen) * 4
    logits[..., 250:] = -math.inf
    logits[0, 0, 0] = 80.0
    whole = metrics(final_stats(hidden, logits, 4 * 3 * 300 * 5))  # 5 rows a chunk
    ref = reference(hidden, logits)
    for name, value in ref.items():
        assert whole[name] == pytest.approx(value, rel=1e-5), name
    half = final_stats(hidden[:2], logits[:2], 1 << 20)
    half.merge(final_stats(hidden[2:], logits[2:], 1 << 20))
    for name, value in metrics(half).items():
        assert value == pytest.approx(ref[name], rel=1e-5), name
    b16 = logits.bfloat16()
    got = metrics(final_stats(hidden, b16, 1 << 20))
    assert got["final.logz"] == pytest.approx(reference(hidden, b16.float())["final.logz"],
                                              rel=1e-5)


def test_final_stats_do_not_alias_the_scratch_buffers() -> None:
    """The CPU scratch is reused by the next call; a kept result must not change."""
    gen = torch.Generator().manual_seed(4)
    v = 1024
    rows = 2 * CPU_BLOCK_ELEMENTS // v + 3
    first_logits = torch.randn(rows, v, generator=gen)
    first = final_stats(torch.ones(2, 2), first_logits, 1 << 28)
    before = metrics(first)
    final_stats(torch.ones(2, 2), torch.randn(rows, v, generator=gen) + 5, 1 << 28)
    assert metrics(first) == before
    assert before["final.logz"] == pytest.approx(
        reference(torch.ones(2, 2), first_logits)["final.logz"], rel=1e-5)


def _ref_norms(part: Part, kind: str, hd: int) -> list[float]:
    t = part.get().double()
    if t.dim() == 1:
        return t.reshape(-1, hd).norm(dim=1).tolist()
    if kind == "rows":
        return t.reshape(-1, hd, t.shape[-1]).square().sum(dim=(1, 2)).sqrt().tolist()
    return t.reshape(t.shape[0], -1, hd).square().sum(dim=(0, 2)).sqrt().tolist()


def test_qk_norms_batched_match_float64_and_the_fallback() -> None:
    """Rows (separate q/k Linears, a fused Linear with GQA), Conv1D columns, biases on
    some parts: the batched path against float64; a mixed head size falls back to the
    part-by-part path with the same values."""
    torch.manual_seed(0)
    hd = 8
    sep_q, sep_k = nn.Linear(32, 32), nn.Linear(32, 16, bias=False)  # 4 q heads, 2 kv
    fused = nn.Linear(32, (4 + 2 * 2) * hd)  # [q | k | v] rows, GQA
    conv_w = torch.randn(32, 3 * 32) * 0.3  # GPT-2 Conv1D: (in, 3E), heads along columns
    conv_b = torch.randn(3 * 32)
    sources = [
        QKSource("rows", Part(sep_q.weight), Part(sep_k.weight), Part(sep_q.bias), None, hd),
        QKSource("rows", Part(fused.weight, 0, 0, 32), Part(fused.weight, 0, 32, 48),
                 Part(fused.bias, 0, 0, 32), Part(fused.bias, 0, 32, 48), hd),
        QKSource("cols", Part(conv_w, 1, 0, 32), Part(conv_w, 1, 32, 64),
                 Part(conv_b, 0, 0, 32), Part(conv_b, 0, 32, 64), hd),
    ]
    batched = _qk._batched_norms(sources)
    assert batched is not None
    seen: dict[str, int] = {}
    for layer, src in enumerate(sources):
        for name, part in _qk._named_parts(src):  # rows in order of the sources having it
            row = batched[name][seen.setdefault(name, 0)]
            seen[name] += 1
            assert row.tolist() == pytest.approx(_ref_norms(part, src.kind, hd),
                                                 rel=1e-6), (name, layer)
    out = qk_norms(sources)
    assert "qk.k_bias_norm" not in out and len(out["qk.q_weight_norm"]) == 3
    mixed = sources + [QKSource("rows", Part(sep_q.weight), Part(sep_q.weight), None,
                                None, 16)]
    assert _qk._batched_norms(mixed) is None
    fallback = qk_norms(mixed)
    for name in ("qk.q_weight_norm", "qk.k_weight_norm"):
        for a, b in zip(fallback[name][:3], out[name], strict=True):
            assert a.tolist() == pytest.approx(b.tolist(), rel=1e-5)
