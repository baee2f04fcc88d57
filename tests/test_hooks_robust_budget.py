"""The memory budget of one attention call's statistics on the general (masked) path: a
4-D additive mask (HF eager) and causal + padding peaked at 2.02 MiB under a 2 MiB budget
(the merge of the kept top 1 % holds up to 20 bytes a value where the plan counted 12).
Live tensor bytes are counted (``LiveBytes``); T = 2048 while one head's logits take 16
MiB. The values are checked against a float64 reference on the same pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitwatch.hooks import _logits
from logitwatch.hooks._logits import attention_head_stats
from logitwatch.hooks._probes import LiveBytes
from logitwatch.hooks._workspace import release_workspace

pytestmark = pytest.mark.usefixtures("one_torch_thread")

B, H, T, D = 1, 2, 2048, 4
BUDGET = 2 << 20
TRIL = torch.ones(T, T, dtype=torch.bool).tril()
PAD = torch.ones(B, T, dtype=torch.bool)
PAD[:, -100:] = False
WINDOW = TRIL & ~torch.ones(T, T, dtype=torch.bool).tril(-257)  # 256 keys back

#: name -> (keyword arguments, the valid (query, key) pairs)
CASES = {
    "causal (fused pass)": (dict(is_causal=True), TRIL),
    "4-D additive mask": (dict(attn_mask=torch.zeros(1, 1, T, T).masked_fill(
        ~TRIL, torch.finfo(torch.float32).min)), TRIL),
    "causal + padding": (dict(is_causal=True, query_valid=PAD, key_valid=PAD),
                         TRIL & PAD[0][:, None] & PAD[0][None, :]),
    "bool sliding window": (dict(attn_mask=WINDOW), WINDOW),
    "soft-cap + causal": (dict(is_causal=True, softcap=30.0), TRIL),
}


@pytest.mark.parametrize("budget", [BUDGET, BUDGET // 2], ids=["2MiB", "1MiB-histogram"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_masked_long_sequence_stays_within_the_memory_budget(case: str, budget: int) -> None:
    assert T * T * 4 > 4 * budget
    kwargs, valid = CASES[case]
    gen = torch.Generator().manual_seed(8)
    q, k = torch.randn(B, H, T, D, generator=gen), torch.randn(B, H, T, D, generator=gen)
    release_workspace()  # buffers kept from an earlier call would not be counted
    with LiveBytes() as meter:
        got = attention_head_stats(q, k, budget=budget, **kwargs)
    release_workspace()
    assert meter.peak <= budget, (case, meter.peak / 2**20)
    exact = _logits._plan(B, H, T, T, budget)[2]
    assert exact == (budget == BUDGET)  # both the exact top 1 % and the histogram p99
    logits = (q[0].double() @ k[0].double().transpose(-1, -2) * D**-0.5).numpy()
    keep = valid.numpy()
    for head in range(H):
        vals = logits[head][keep]
        assert got.maximum[head].item() == pytest.approx(vals.max(), rel=1e-5)
        p99 = np.percentile(vals, 99)
        if exact:
            assert got.p99[head].item() == pytest.approx(p99, rel=1e-5)
        else:
            bound = (vals.max() - vals.min()) / _logits.HIST_BINS
            assert abs(got.p99[head].item() - p99) <= bound + 1e-6
        assert got.count[head].item() == vals.size

