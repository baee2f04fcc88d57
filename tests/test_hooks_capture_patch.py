"""The cheaper capture of attention calls (hooks/_sdpa_patch.py): after the checked forwards
the monitor replaces ``torch.nn.functional``'s SDPA/MHA attributes for a sampled forward
instead of running a torch function mode, and measures the same numbers; a model whose
calls escape the patch keeps the mode; other threads and an MHA call's inner SDPA pass
through; the attributes are put back after every forward."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.functional import scaled_dot_product_attention as bound_sdpa

from logitwatch.client import Client
from logitwatch.hooks import _capture, attach
from logitwatch.hooks._sdpa_patch import SdpaPatch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SDPA = F.scaled_dot_product_attention  # the function itself, bound before any capture
MHA = F.multi_head_attention_forward
ATTN = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
        "attn.entropy_mean", "attn.entropy_min")


def capturing_client() -> tuple[Client, list[dict]]:
    frames: list[dict] = []
    client = Client(None, run="r")
    client.send = lambda step, scalars, heads, time=None, history=None: frames.append(  # type: ignore
        {"step": step, "scalars": scalars, "heads": heads})
    return client, frames


class Net(nn.Module):
    """Two causal SDPA layers; ``bound``: the layers call a reference to SDPA bound at import
    (as ``from torch.nn.functional import scaled_dot_product_attention`` does)."""

    def __init__(self, bound: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bound = bound
        self.emb = nn.Embedding(32, 16)
        self.qkv = nn.ModuleList(nn.Linear(16, 48) for _ in range(2))
        self.lm_head = nn.Linear(16, 32)
        self.modes: list[int] = []  # torch function modes active during each forward

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.modes.append(torch._C._len_torch_function_stack())
        x = self.emb(ids)
        b, t, _ = x.shape
        for proj in self.qkv:
            q, k, v = proj(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
            attend = bound_sdpa if self.bound else F.scaled_dot_product_attention
            x = x + attend(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 16)
        return self.lm_head(x)


def train(model: nn.Module, steps: int, **attach_kw) -> list[dict]:
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    with attach(model, opt, run="r", client=client, sample_every=1, overhead_budget=None,
                **attach_kw):
        for _ in range(steps):
            ids = torch.randint(0, 32, (2, 12), generator=gen)
            F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
            assert F.scaled_dot_product_attention is SDPA  # put back after every forward
            assert F.multi_head_attention_forward is MHA
    return frames


def attention(frames: list[dict]) -> list[dict]:
    return [{m: f["heads"][m] for m in ATTN} for f in frames if "attn.logit_max" in f["heads"]]


def test_after_the_checked_forwards_no_mode_runs_and_the_numbers_are_the_same(
        monkeypatch) -> None:
    model = Net()
    frames = train(model, 6)
    assert model.modes[:_capture.CHECKED] == [1] * _capture.CHECKED  # checked: the mode
    assert model.modes[_capture.CHECKED:] == [0] * (6 - _capture.CHECKED)  # the patch alone
    monkeypatch.setattr(_capture, "CHECKED", 10**9)  # the mode on every forward
    mode_only = Net()
    reference = train(mode_only, 6)
    assert mode_only.modes == [1] * 6
    got, want = attention(frames), attention(reference)
    assert len(got) == len(want) == 6
    assert all(len(f["attn.logit_max"]) == 2 for f in got)  # both layers, every step
    assert got == want  # bit for bit: the same calls measured the same way


def test_calls_that_escape_the_patch_keep_the_mode(caplog) -> None:
    model = Net(bound=True)
    with caplog.at_level(logging.INFO, logger="logitwatch.hooks"):
        frames = train(model, 5)
    assert model.modes == [1] * 5  # checked once, then the mode alone
    got = attention(frames)
    assert len(got) == 5 and all(len(f["attn.logit_max"]) == 2 for f in got)
    lines = [r.getMessage() for r in caplog.records if "did not go through" in r.getMessage()]
    assert len(lines) == 1 and "2 attention call(s)" in lines[0]
    # the same numbers as a model that calls through torch.nn.functional
    assert got == attention(train(Net(), 5))


def test_other_threads_and_an_mha_calls_inner_sdpa_pass_through() -> None:
    seen: list[object] = []
    q = k = v = torch.randn(1, 2, 4, 8)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 4, 8)
    with SdpaPatch(lambda func, args, kwargs: seen.append(func)) as patch:
        worker = threading.Thread(target=F.scaled_dot_product_attention, args=(q, k, v))
        worker.start()
        worker.join()
        assert seen == []  # another thread's call is not this capture's
        F.scaled_dot_product_attention(q, k, v)
        mha(x, x, x, need_weights=False)  # SDPA inside MHA: recorded once, as MHA
        assert seen == [SDPA, MHA] and patch.seen == 2
    assert F.scaled_dot_product_attention is SDPA and F.multi_head_attention_forward is MHA


def test_a_patch_replaced_after_it_is_left_in_place_and_passes_through() -> None:
    seen: list[object] = []
    q = k = v = torch.randn(1, 2, 4, 8)
    patch = SdpaPatch(lambda func, args, kwargs: seen.append(func)).__enter__()
    ours = F.scaled_dot_product_attention

    def theirs(*a, **kw):  # someone else's wrapper, installed after ours
        return ours(*a, **kw)

    F.scaled_dot_product_attention = theirs
    try:
        patch.__exit__(None, None, None)
        assert F.scaled_dot_product_attention is theirs  # not torn out from under them
        F.scaled_dot_product_attention(q, k, v)
        assert seen == []  # ours only passes through now
    finally:
        F.scaled_dot_product_attention = SDPA
        F.multi_head_attention_forward = MHA


def test_a_forward_that_raises_puts_the_attributes_back() -> None:
    class Failing(Net):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            out = super().forward(ids)
            if len(self.modes) > _capture.CHECKED:  # a forward captured by the patch alone
                raise RuntimeError("out of memory, say")
            return out

    model = Failing()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ids = torch.randint(0, 32, (2, 12))
    with attach(model, opt, run="r", client=capturing_client()[0], sample_every=1,
                overhead_budget=None):
        for _ in range(_capture.CHECKED):
            F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
        with pytest.raises(RuntimeError, match="out of memory"):
            model(ids)
        assert model.modes[-1] == 0  # it was the patch
        assert F.scaled_dot_product_attention is SDPA and F.multi_head_attention_forward is MHA
