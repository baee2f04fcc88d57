"""logitwatch.hooks._stats against NumPy references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from logitwatch.hooks import _logits
from logitwatch.hooks._logits import HIST_BINS, attention_head_stats, merge_head_stats
from logitwatch.hooks._probes import CountSyncs, LiveBytes
from logitwatch.hooks._stats import global_grad_norm, top_quantile


def attention_logit_stats(q, k, **kwargs):
    stats = attention_head_stats(q, k, **kwargs)
    return stats.maximum, stats.p99


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


@pytest.mark.parametrize("budget", [4000, 1200, 500])  # head chunks, query chunks, 1 row
def test_chunking_gives_the_same_answer(budget: int) -> None:
    gen = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 6, 7, 4, generator=gen), torch.randn(2, 3, 7, 4, generator=gen)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False
    whole = attention_head_stats(q, k, attn_mask=mask, is_causal=True, softcap=2.0).metrics()
    hc, tq, exact = _logits._plan(2, 6, 7, 7, budget)
    assert (hc, tq) != (6, 7) and exact
    part = attention_head_stats(q, k, attn_mask=mask, is_causal=True, softcap=2.0,
                                budget=budget).metrics()
    assert set(whole) == set(part)
    for name in whole:
        torch.testing.assert_close(part[name], whole[name], rtol=1e-5, atol=1e-6)


def test_more_than_2_pow_24_pairs_per_head() -> None:
    t = 4200  # 4200 * 4200 > 2**24: torch.quantile would refuse this
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 1, t, 2, generator=gen), torch.randn(1, 1, t, 2, generator=gen)
    assert _logits._plan(1, 1, t, t, _logits.DEFAULT_BUDGET)[2]  # the exact path
    got_max, got_p99 = attention_logit_stats(q, k, scale=1.0)
    logits = (q[0, 0] @ k[0, 0].T).numpy().ravel()
    np.testing.assert_allclose(got_max.numpy(), [logits.max()], rtol=1e-5)
    np.testing.assert_allclose(got_p99.numpy(), [np.percentile(logits, 99)], rtol=1e-5)


def _hard_blocks() -> list[torch.Tensor]:
    """(B, H, T, S) blocks that stress the grouped top-k: ties, -inf, clustered maxima."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 64, 96, generator=gen)
    causal = torch.ones(64, 96, dtype=torch.bool).tril()
    clustered = torch.arange(2 * 3 * 64 * 96, dtype=torch.float32).view(2, 3, 64, 96)
    one_group = torch.zeros(2, 3, 64, 96)
    one_group.view(2, 3, -1)[:, :, :: 64 * 96 // 8] = 5.0  # every member of one group
    return [
        x,
        x.masked_fill(~causal, -math.inf),
        x.round(),  # many ties
        torch.zeros(2, 3, 64, 96),  # all tied
        clustered,  # the largest values all in the last rows
        one_group,
        torch.full((2, 3, 64, 96), -math.inf).masked_fill(torch.rand(
            2, 3, 64, 96, generator=gen) > 0.995, 1.0),  # fewer valid pairs than k
    ]


@pytest.mark.parametrize("k_top", [1, 123, 2 * 64 * 96 // 100 + 2, 2 * 64 * 96])
def test_grouped_block_top_equals_topk(k_top: int) -> None:
    for i, block in enumerate(_hard_blocks()):
        got = _logits._block_top(block, k_top).sort(dim=1, descending=True).values
        want = block.transpose(0, 1).reshape(3, -1).topk(
            min(k_top, 2 * 64 * 96), dim=1).values
        assert torch.equal(got, want), i


def _deep_blocks() -> list[torch.Tensor]:
    """(2, 2, 128, 256) blocks: several grouping levels (65,536 values a head)."""
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(2, 2, 128, 256, generator=gen)
    causal = torch.ones(128, 256, dtype=torch.bool).tril()
    deep = torch.zeros(2, 2, 128, 256)
    n = 128 * 256
    for stride in (n // 4, n // 16, n // 64):  # whole groups of levels 1, 2 and 3
        deep.view(2, 2, -1)[:, :, ::stride] += 1.0
    return [x, x.masked_fill(~causal, -math.inf), x.round(), deep,
            torch.arange(2 * 2 * n, dtype=torch.float32).view(2, 2, 128, 256).flip(-1)]


@pytest.mark.parametrize("k_top", [1, 100, 2 * 128 * 256 // 100 + 2, 5000])
def test_multi_level_block_top_equals_topk(k_top: int) -> None:
    for i, block in enumerate(_deep_blocks()):
        got = _logits._block_top(block, k_top).sort(dim=1, descending=True).values
        want = block.transpose(0, 1).reshape(2, -1).topk(k_top, dim=1).values
        assert torch.equal(got, want), i


def test_grouped_block_top_is_the_path_taken_on_the_bench_shape() -> None:
    """The grouped selection (not the plain topk fallback) runs for GPT-2-like blocks."""
    taken = []
    real_topk = torch.Tensor.topk

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is real_topk:
                taken.append(args[0].shape[-1])
            return func(*args, **(kwargs or {}))

    block = torch.randn(2, 4, 256, 256)
    with Spy():
        # the top 1 % of the causal pairs, as attention_head_stats asks for
        _logits._block_top(block, 2 * _logits._causal_pairs(0, 256, 256) // 100 + 2)
    assert max(taken) <= _logits._TOPK_ROW  # only short rows: never a whole (batch, head)
    assert len(taken) >= 3  # the top level and at least two levels back down


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


def full_reference(q, k, valid, scale, softcap=None):
    """Every signal per head, float64 NumPy, row by row (valid: (B,H,T,S) bool)."""
    q64, k64 = q.double().numpy(), k.double().numpy()
    k64 = np.repeat(k64, q64.shape[1] // k64.shape[1], axis=1)
    logits = np.einsum("bhtd,bhsd->bhts", q64, k64) * scale
    capped = np.tanh(logits / softcap) * softcap if softcap else logits
    out: dict[str, list[float]] = {}
    for h in range(q64.shape[1]):
        vals = logits[:, h][valid[:, h]]
        ents = []
        for b in range(logits.shape[0]):
            for i in range(logits.shape[2]):
                row = capped[b, h, i][valid[b, h, i]]
                if row.size:
                    p = np.exp(row - row.max())
                    p /= p.sum()
                    ents.append(-(p[p > 0] * np.log(p[p > 0])).sum())
        for name, value in (("attn.logit_max", vals.max()),
                            ("attn.logit_p99", np.percentile(vals, 99)),
                            ("attn.logit_mean", vals.mean()), ("attn.logit_std", vals.std()),
                            ("attn.entropy_mean", np.mean(ents)),
                            ("attn.entropy_min", np.min(ents))):
            out.setdefault(name, []).append(value)
        if softcap:
            cv = capped[:, h][valid[:, h]]
            out.setdefault("attn.capped_logit_max", []).append(cv.max())
            out.setdefault("attn.capped_logit_p99", []).append(np.percentile(cv, 99))
    return out


@pytest.mark.parametrize("softcap", [None, 1.5])
def test_every_signal_matches_numpy_with_padding_and_gqa(softcap) -> None:
    gen = torch.Generator().manual_seed(5)
    b, h, t, d = 3, 4, 8, 6
    q = torch.randn(b, h, t, d, generator=gen) * 2
    k = torch.randn(b, 2, t, d, generator=gen) * 2
    keep = torch.ones(b, t, dtype=torch.bool)
    keep[1, 5:] = False
    keep[2, :3] = False  # left padding: the first query rows attend nothing
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    valid = (causal & keep[:, None, None, :]).expand(b, h, t, t)
    mask = torch.where(causal & keep[:, None, None, :], 0.0, torch.finfo(torch.float32).min)
    got = attention_head_stats(q, k, attn_mask=mask, scale=0.4, softcap=softcap).metrics()
    ref = full_reference(q, k, valid.numpy(), 0.4, softcap)
    assert set(got) == set(ref)
    for name, values in ref.items():
        np.testing.assert_allclose(got[name].numpy(), values, rtol=1e-5, atol=1e-5,
                                   err_msg=name)


def test_one_hot_attention_has_zero_entropy_and_uniform_has_log_s() -> None:
    q = torch.zeros(1, 2, 4, 2)
    k = torch.zeros(1, 2, 4, 2)
    q[0, 0, :, 0] = 1e4  # head 0: key 0 dominates every row
    k[0, 0, 0, 0] = 1.0
    got = attention_head_stats(q, k, scale=1.0).metrics()
    assert got["attn.entropy_min"][0] == 0.0 and got["attn.entropy_mean"][0] == 0.0
    torch.testing.assert_close(got["attn.entropy_mean"][1], torch.tensor(math.log(4)))
    torch.testing.assert_close(got["attn.logit_std"][1], torch.tensor(0.0))


def test_merge_pools_two_forwards_exactly() -> None:
    gen = torch.Generator().manual_seed(6)
    q, k = torch.randn(4, 2, 5, 3, generator=gen), torch.randn(4, 2, 5, 3, generator=gen)
    whole = attention_head_stats(q, k, is_causal=True).metrics()
    merged = merge_head_stats(attention_head_stats(q[:1], k[:1], is_causal=True),
                              attention_head_stats(q[1:], k[1:], is_causal=True)).metrics()
    for name in ("attn.logit_max", "attn.logit_mean", "attn.logit_std", "attn.entropy_mean",
                 "attn.entropy_min"):
        torch.testing.assert_close(merged[name], whole[name], rtol=1e-5, atol=1e-6)
    assert (merged["attn.logit_p99"] >= whole["attn.logit_p99"] - 1e-6).all()  # upper bound


def test_histogram_p99_is_within_one_bin_of_exact() -> None:
    """When the exact top 1 % does not fit the budget, the stated bound holds."""
    gen = torch.Generator().manual_seed(7)
    b, h, t, d = 1, 3, 400, 8
    q, k = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen) * 3
    budget = 40_000
    assert not _logits._plan(b, h, t, t, budget)[2]  # the histogram path
    got = attention_head_stats(q, k, is_causal=True, budget=budget)
    logits = (q.double() @ k.double().transpose(-1, -2) * d**-0.5).numpy()
    valid = np.tril(np.ones((t, t), bool))
    for head in range(h):
        vals = logits[0, head][valid]
        bound = (vals.max() - vals.min()) / HIST_BINS
        assert abs(got.p99[head].item() - np.percentile(vals, 99)) <= bound
        assert got.maximum[head].item() == pytest.approx(vals.max(), rel=1e-5)


def test_a_long_sequence_stays_within_the_memory_budget() -> None:
    b, h, t, d = 1, 2, 2048, 4
    budget = 2 << 20  # 2 MiB, while one head's T x T float32 logits take 16 MiB
    assert t * t * 4 > 4 * budget
    gen = torch.Generator().manual_seed(8)
    q, k = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)
    with LiveBytes() as meter:
        got = attention_head_stats(q, k, is_causal=True, budget=budget)
    assert meter.peak <= budget, meter.peak
    ref = (q[0, 1] @ k[0, 1].T * d**-0.5).masked_fill(
        ~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(got.maximum[1], ref.max())


def _spy_fused(monkeypatch) -> list[tuple]:
    """Record the calls of the fused pass (the path taken when the pairs follow from shapes)."""
    calls: list[tuple] = []
    real = _logits.fused_stats

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(_logits, "fused_stats", spy)
    return calls


@pytest.mark.parametrize(("b", "h", "hk", "t", "s", "causal"), [
    (2, 4, 4, 67, 67, True),   # several query blocks, a short last one
    (1, 2, 2, 5, 9, True),     # more keys than queries (top-left, as SDPA)
    (2, 3, 3, 40, 17, True),   # more queries than keys: the last rows see every key
    (2, 8, 2, 33, 33, True),   # GQA
    (3, 2, 1, 21, 30, False),  # no mask at all
    (1, 1, 1, 1, 1, True),     # one pair
])
def test_fused_pass_matches_numpy(monkeypatch, b, h, hk, t, s, causal) -> None:
    calls = _spy_fused(monkeypatch)
    gen = torch.Generator().manual_seed(b * 100 + t)
    q = torch.randn(b, h, t, 6, generator=gen) * 2
    k = torch.randn(b, hk, s, 6, generator=gen) * 2
    got = attention_head_stats(q, k, is_causal=causal, scale=0.4).metrics()
    assert calls, "the fused pass was not taken"
    pattern = np.tril(np.ones((t, s), bool)) if causal else np.ones((t, s), bool)
    ref = full_reference(q, k, np.broadcast_to(pattern, (b, h, t, s)), 0.4)
    assert set(got) == set(ref)
    for name, values in ref.items():
        np.testing.assert_allclose(got[name].numpy(), values, rtol=1e-5, atol=1e-5,
                                   err_msg=name)


def test_fused_pass_std_is_exact_far_from_zero_mean(monkeypatch) -> None:
    """Logits with a mean ~40 std away from 0: the centred sums keep M2 exact."""
    calls = _spy_fused(monkeypatch)
    gen = torch.Generator().manual_seed(9)
    b, h, t, d = 2, 2, 64, 8
    q = torch.randn(b, h, t, d, generator=gen) * 0.1 + 3.0
    k = torch.randn(b, h, t, d, generator=gen) * 0.1 + 3.0
    got = attention_head_stats(q, k, is_causal=True, scale=1.0).metrics()
    assert calls
    ref = full_reference(q, k, np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, h, t, t)),
                         1.0)
    assert min(ref["attn.logit_mean"]) > 30 * max(ref["attn.logit_std"])
    for name in ("attn.logit_mean", "attn.logit_std", "attn.logit_p99", "attn.entropy_mean"):
        np.testing.assert_allclose(got[name].numpy(), ref[name], rtol=1e-5, err_msg=name)


def test_fused_pass_with_a_full_selection_buffer_stays_exact(monkeypatch) -> None:
    """A budget small enough that the kept top values are selected several times."""
    calls = _spy_fused(monkeypatch)
    gen = torch.Generator().manual_seed(10)
    b, h, t, d = 1, 2, 600, 4
    q, k = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)
    budget = 400_000
    assert _logits._plan(b, h, t, t, budget)[2]  # exact
    got = attention_head_stats(q, k, is_causal=True, budget=budget).metrics()
    assert calls and calls[0][5] < t  # several query blocks
    ref = full_reference(q, k, np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, h, t, t)),
                         d**-0.5)
    for name, values in ref.items():
        np.testing.assert_allclose(got[name].numpy(), values, rtol=1e-5, atol=1e-5,
                                   err_msg=name)


def test_fused_pass_selects_once_when_the_call_fills_the_buffer_at_most_twice(
        monkeypatch) -> None:
    """A head's values over the call between one and two selection buffers: the buffer
    takes them all (one selection, no merge), still exact."""
    from logitwatch.hooks import _fused

    calls = _spy_fused(monkeypatch)
    selects: list[int] = []
    real_select = _fused._select

    def spy_select(ws, sel, used, k_top):
        selects.append(used)
        return real_select(ws, sel, used, k_top)

    monkeypatch.setattr(_fused, "_select", spy_select)
    gen = torch.Generator().manual_seed(11)
    b, h, t, d = 1, 2, 200, 4
    q, k = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)
    budget = 280_000  # two selection buffers of 11,666 values; a head's call: 22,861
    got = attention_head_stats(q, k, is_causal=True, budget=budget).metrics()
    assert calls and calls[0][5] < t  # several query blocks
    tq = calls[0][5]  # the values each block copies: its rows times the keys it sees
    visible = sum(b * (min(t, t0 + tq) - t0) * min(t, t0 + tq) for t0 in range(0, t, tq))
    assert selects == [visible] * h  # one selection per head chunk (one head each here)
    ref = full_reference(q, k, np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, h, t, t)),
                         d**-0.5)
    for name, values in ref.items():
        np.testing.assert_allclose(got[name].numpy(), values, rtol=1e-5, atol=1e-5,
                                   err_msg=name)


def test_fused_pass_computes_only_the_visible_keys(monkeypatch) -> None:
    """Causal blocks of query rows multiply only the keys they see: about 5/8 of T x S."""
    sizes: list[int] = []
    real = torch.matmul

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is real:
                sizes.append(out.numel())
            return out

    q, k = torch.randn(2, 4, 256, 16), torch.randn(2, 4, 256, 16)
    with Spy():
        attention_head_stats(q, k, is_causal=True)
    assert sum(sizes) <= 0.65 * 2 * 4 * 256 * 256, sizes


@pytest.mark.parametrize("k_top", [1, 123, 2 * 64 * 96 // 100 + 2, 2 * 64 * 96])
def test_top_values_equals_topk(k_top: int) -> None:
    from logitwatch.hooks._stats import top_values

    for i, block in enumerate(_hard_blocks() + _deep_blocks()):
        flat = block.transpose(0, 1).reshape(block.shape[1], -1)
        kk = min(k_top, flat.shape[1])
        want = flat.topk(kk, dim=1).values
        got = top_values(flat, k_top).sort(dim=1, descending=True).values
        assert torch.equal(got, want), i
        superset = top_values(flat, k_top, final=False)  # holds the kk largest
        assert superset.shape[1] >= kk
        assert torch.equal(superset.topk(kk, dim=1).values, want), i
