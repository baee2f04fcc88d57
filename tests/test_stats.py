"""logitwatch.hooks._stats against NumPy references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from logitwatch.hooks import _stats
from logitwatch.hooks._stats import attention_logit_stats, global_grad_norm, top_quantile

SYNCS = {"item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"}


class CountSyncs(TorchFunctionMode):
    """Counts calls that read tensor values back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNCS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def reference(q, k, valid, scale):
    """Per-head (max, p99) with float64 NumPy over the valid pairs; valid: (B,H,T,S) bool."""
    q64, k64 = q.double().numpy(), k.double().numpy()
    if k64.shape[1] != q64.shape[1]:
        k64 = np.repeat(k64, q64.shape[1] // k64.shape[1], axis=1)
    logits = np.einsum("bhtd,bhsd->bhts", q64, k64) * scale
    maxima, p99 = [], []
    for h in range(q64.shape[1]):
        vals = logits[:, h][valid[:, h]]
        maxima.append(vals.max())
        p99.append(np.percentile(vals, 99))
    return np.array(maxima), np.array(p99)


def check(q, k, valid, scale, **kwargs):
    got_max, got_p99 = attention_logit_stats(q, k, scale=scale, **kwargs)
    ref_max, ref_p99 = reference(q, k, valid, scale if scale is not None else q.shape[-1] ** -0.5)
    assert got_max.shape == got_p99.shape == (q.shape[1],)
    np.testing.assert_allclose(got_max.numpy(), ref_max, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_p99.numpy(), ref_p99, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m", [1, 2, 3, 99, 100, 101, 257, 5000])
def test_top_quantile_matches_numpy(m: int) -> None:
    gen = torch.Generator().manual_seed(m)
    for n in sorted({1, max(1, m // 7), max(1, m - 1), m}):
        values = torch.randn(3, m, generator=gen) * 4
        values[1] = values[1].round()  # ties
        ref = np.percentile(values[:, :n].double().numpy(), 99, axis=1)
        masked = values.clone()
        masked[:, n:] = -math.inf
        masked = masked[:, torch.randperm(m, generator=gen)]
        got = top_quantile(masked, torch.full((3,), n), 99)
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5)


def test_top_quantile_empty_row_is_minus_inf() -> None:
    values = torch.full((2, 5), -math.inf)
    values[0, 0] = 1.0
    got = top_quantile(values, torch.tensor([1, 0]))
    assert got.tolist() == [1.0, -math.inf]


def test_causal_random_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        b, h, t, d = 2, 4, 11, 8
        q, k = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)
        scale = float(torch.rand(1, generator=gen)) * 2 + 0.01
        valid = np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, h, t, t))
        check(q, k, valid, scale, is_causal=True)
    check(q, k, np.ones((b, h, t, t), bool), None)  # no mask, default scale


def test_causal_with_more_keys_than_queries() -> None:
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 9, 4)
    valid = np.broadcast_to(np.tril(np.ones((5, 9), bool)), (1, 2, 5, 9))  # top-left, as SDPA
    check(q, k, valid, 0.5, is_causal=True)


def test_padding_as_float_mask_hf_style() -> None:
    b, h, t, d = 3, 2, 7, 4
    q, k = torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    lengths = [7, 4, 2]
    valid = np.zeros((b, 1, t, t), bool)
    for i, n in enumerate(lengths):
        valid[i, 0, :, :n] = np.tril(np.ones((t, t), bool))[:, :n]
    for fill in (torch.finfo(torch.float32).min, -math.inf, -1e4):
        mask = torch.zeros(b, 1, t, t)
        mask[~torch.from_numpy(valid)] = fill
        check(q, k, np.broadcast_to(valid, (b, h, t, t)), 0.3, attn_mask=mask)


def test_float_mask_bias_does_not_shift_the_logits() -> None:
    q, k = torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)
    mask = torch.full((4, 4), -2.0)  # an additive bias (ALiBi-like) is not a mask
    check(q, k, np.ones((1, 2, 4, 4), bool), 1.0, attn_mask=mask)


def test_bool_mask_per_head_and_combined_with_causal() -> None:
    gen = torch.Generator().manual_seed(1)
    b, h, t, d = 2, 3, 6, 4
    q, k = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)
    mask = torch.rand(b, h, t, t, generator=gen) > 0.3
    mask[..., 0] = True
    check(q, k, mask.numpy(), 0.7, attn_mask=mask)
    both = mask.numpy() & np.tril(np.ones((t, t), bool))
    check(q, k, both, 0.7, attn_mask=mask, is_causal=True)


def test_gqa_keys_are_repeated_interleaved() -> None:
    q, k = torch.randn(2, 8, 5, 4), torch.randn(2, 2, 5, 4)
    valid = np.broadcast_to(np.tril(np.ones((5, 5), bool)), (2, 8, 5, 5))
    check(q, k, valid, 0.5, is_causal=True)


def test_three_dim_layout_is_one_head() -> None:
    q, k = torch.randn(3, 5, 4), torch.randn(3, 5, 4)
    got_max, _ = attention_logit_stats(q, k, is_causal=True)
    logits = (q @ k.transpose(-1, -2)) * 0.5
    ref = logits.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf).amax()
    assert got_max.shape == (1,) and torch.allclose(got_max[0], ref)


def test_head_chunking_gives_the_same_answer(monkeypatch) -> None:
    q, k = torch.randn(2, 6, 5, 4), torch.randn(2, 6, 5, 4)
    whole = attention_logit_stats(q, k, is_causal=True)
    monkeypatch.setattr(_stats, "_CHUNK_ELEMENTS", 2 * 5 * 5 * 2)  # two heads at a time
    chunked = attention_logit_stats(q, k, is_causal=True)
    assert all(torch.equal(a, b) for a, b in zip(whole, chunked, strict=True))


def test_more_than_2_pow_24_pairs_per_head() -> None:
    t = 4200  # 4200 * 4200 > 2**24: torch.quantile would refuse this
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 1, t, 2, generator=gen), torch.randn(1, 1, t, 2, generator=gen)
    got_max, got_p99 = attention_logit_stats(q, k, scale=1.0)
    logits = (q[0, 0] @ k[0, 0].T).numpy().ravel()
    np.testing.assert_allclose(got_max.numpy(), [logits.max()], rtol=1e-5)
    np.testing.assert_allclose(got_p99.numpy(), [np.percentile(logits, 99)], rtol=1e-5)


def test_no_host_sync_and_no_autograd_graph() -> None:
    q = torch.randn(2, 4, 6, 8, requires_grad=True)
    k = torch.randn(2, 2, 6, 8, requires_grad=True)
    mask = torch.zeros(2, 1, 6, 6)
    mask[1, ..., 4:] = -math.inf
    with CountSyncs() as counter:
        maximum, p99 = attention_logit_stats(q * 1, k * 1, attn_mask=mask, is_causal=True)
    assert counter.calls == []
    assert not maximum.requires_grad and not p99.requires_grad


def test_global_grad_norm_equals_clip_grad_norm() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    model(torch.randn(4, 5)).square().sum().backward()
    ours = global_grad_norm(model.parameters())
    with CountSyncs() as counter:
        global_grad_norm(model.parameters())
    assert counter.calls == []
    theirs = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    assert ours is not None and torch.equal(ours, theirs)
    assert global_grad_norm([torch.nn.Parameter(torch.ones(2))]) is None
