"""logitwatch.hooks: frames from real training loops, checked against explicit attention;
GPT-2, closing, and no host sync between sampled steps (the loop's other behaviours:
``test_hooks_loop.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import logitwatch
import logitwatch.hooks as lwh
from logitwatch.client import Client
from logitwatch.hooks import _monitor, attach
from logitwatch.hooks._probes import CountSyncs
from tests.hooks_tiny import (
    ATTN,
    COST,
    FINAL,
    HEADS,
    LATER,
    SCALARS,
    TinyLM,
    assert_frame_matches,
    batches,
    keys,
    reference,
    train_tiny,
    watch,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_public_surface() -> None:
    assert lwh.__all__ == ["Monitor", "attach", "record_attention"]
    assert logitwatch.__all__ == ["Client", "ClientConfig", "Monitor", "attach",
                                  "record_attention"]
    assert logitwatch.record_attention is lwh.record_attention
    assert logitwatch.attach is attach


def test_custom_sdpa_model_frames(recorder) -> None:
    rec, client = recorder
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, opt, run="r", client=client, sample_every=3) as mon:
        steps = train_tiny(model, opt, mon, batches(7), clip=0.5)
    frames = rec.frames
    assert [f["step"] for f in frames] == [0, 3, 6]
    for frame in frames:
        step = steps[frame["step"]]
        assert keys(frame) == SCALARS and set(frame["heads"]) == ATTN  # q/kv: unknown layout
        assert_frame_matches(frame, step)
        assert frame["scalars"]["grad.norm"] == pytest.approx(step["norm"].item(), rel=1e-6)
        assert frame["scalars"]["grad.clipped"] == float(step["norm"].item() > 0.5)
        assert frame["scalars"]["grad.max_norm"] == 0.5
        assert frame["scalars"]["loss"] == pytest.approx(step["losses"][0].item(), rel=1e-6)
        assert frame["scalars"]["lr"] == 0.05
        assert frame["scalars"]["optim.adaptive"] == 0.0  # SGD: a kick's update is unbounded
        assert frame["rank"] == 0 and frame["run"] == "r"


def test_optimizer_kind_says_whether_a_kick_is_bounded() -> None:
    """``optim.adaptive``: 1 for optimizers that normalise each step by a running RMS (a
    subclass counts as its base), 0 for plain SGD, nothing for one of neither family."""
    from logitwatch.hooks._optim_kind import adaptive

    class MyAdamW(torch.optim.AdamW):
        pass

    params = list(nn.Linear(2, 2).parameters())
    assert adaptive(torch.optim.SGD(params, lr=0.1)) == 0.0
    assert adaptive(torch.optim.AdamW(params)) == 1.0
    assert adaptive(torch.optim.RMSprop(params)) == 1.0
    assert adaptive(MyAdamW(params)) == 1.0
    assert adaptive(torch.optim.Rprop(params)) is None
    assert adaptive(None) is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.distributed.optim's jit
def test_optimizer_kind_looks_through_a_wrapper() -> None:
    """ZeroRedundancyOptimizer (a real one, on a one-process gloo group) is judged by the
    optimizer class it shards; a wrapper whose attribute raises leaves the kind unknown."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from logitwatch.hooks._optim_kind import adaptive

    params = list(nn.Linear(2, 2).parameters())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for cls, want in ((torch.optim.AdamW, 1.0), (torch.optim.SGD, 0.0)):
            zero = ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=1e-3)
            assert adaptive(zero) == want
    finally:
        dist.destroy_process_group()

    class Broken:
        def step(self) -> None: ...

        @property
        def optim(self) -> None:
            raise RuntimeError("not ready")

    assert adaptive(Broken()) is None


def train_demo_gpt(client: Client, attn_dtypes: list[str], steps: int = 3) -> None:
    """The demo GPT, one layer per entry of ``attn_dtypes`` (the dtype its attention runs in)."""
    from logitwatch.demo.model import GPTConfig, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(d_model=32, n_layer=len(attn_dtypes), n_head=4, seq_len=16))
    for block, dtype in zip(model.blocks, attn_dtypes, strict=True):
        block.attn.attn_dtype = dtype
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with watch(model, opt, run="r", client=client, sample_every=2):
        for ids in batches(steps, b=2, t=16):
            _, loss = model(ids, ids.roll(-1, 1))
            loss.backward()
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize(("attn_dtypes", "expected"), [
    (["float32", "float32"], 3.4028235e38),
    (["float16", "float16"], 65504.0),
    (["float32", "float16"], 65504.0),  # layers differ: the smallest maximum
])
def test_attention_dtype_max_is_sent_on_sampled_steps(attn_dtypes, expected, recorder) -> None:
    rec, client = recorder
    train_demo_gpt(client, attn_dtypes)
    assert [f["step"] for f in rec.frames] == [0, 2]
    for frame in rec.frames:
        assert frame["scalars"]["attn.dtype_max"] == pytest.approx(expected, rel=1e-7)
        # read from dtypes on the host: nothing added to the one transfer (lr is a float too)
        per_head = sum(len(row) for rows in frame["heads"].values() for row in rows)
        tensor_scalars = (set(frame["scalars"]) - COST - LATER
                          - {"attn.dtype_max", "lr", "optim.adaptive"})  # host floats
        # and the history's rows (6 float32 columns a step: its log Z is on the device)
        rows = len((frame.get("history") or {}).get("steps", []))
        assert frame["scalars"]["hooks.bytes"] == 4 * (per_head + len(tensor_scalars) + 6 * rows)


def test_attention_dtype_max_reads_dtypes_only() -> None:
    meta = lambda dtype: torch.empty(2, 4, 8, 16, device="meta", dtype=dtype)  # noqa: E731
    dtype_max = _monitor.attention_dtype_max
    assert dtype_max(meta(torch.float32), meta(torch.float32)) == torch.finfo(torch.float32).max
    assert dtype_max(meta(torch.bfloat16), meta(torch.bfloat16)) == torch.finfo(
        torch.bfloat16).max
    assert dtype_max(meta(torch.float32), meta(torch.float16)) == 65504.0
    assert dtype_max(meta(torch.int64), meta(torch.int64)) is None
    q = torch.zeros(1, 1, 2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the kernel runs in bfloat16
        assert dtype_max(q, q) == torch.finfo(torch.bfloat16).max


def test_grad_norm_without_a_clip_call(recorder) -> None:
    rec, client = recorder
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    expected = []

    def before_step(i: int) -> None:
        grads = [p.grad for p in model.parameters()]
        expected.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())

    with watch(model, opt, run="r", client=client, sample_every=1, max_grad_norm=1e-3) as mon:
        train_tiny(model, opt, mon, batches(2), clip=None, hook=before_step)
    for frame, norm in zip(rec.frames, expected, strict=True):
        assert frame["scalars"]["grad.norm"] == pytest.approx(norm, rel=1e-5)
        assert frame["scalars"]["grad.clipped"] == 1.0


def test_no_clip_threshold_means_no_grad_clipped(recorder) -> None:
    rec, client = recorder
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, opt, run="r", client=client) as mon:
        train_tiny(model, opt, mon, batches(1), clip=None)
    assert keys(rec.frames[0]) == ({"loss", "grad.norm", "lr", "attn.dtype_max", "optim.adaptive"}
                                   | FINAL | COST)


@pytest.fixture(scope="module")
def gpt2_config():
    transformers = pytest.importorskip("transformers")
    return transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )


def build_gpt2(config, impl: str) -> nn.Module:
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel._from_config(config, attn_implementation=impl)


def train_gpt2(model, client, steps: int = 3) -> tuple[list, list]:
    """Train with a right-padded batch; record q and k from c_attn (split into heads)."""
    recorded: list = []
    hd = model.config.n_embd // model.config.n_head

    def grab(module, args, output):
        q, k, _ = output.split(model.config.n_embd, dim=2)
        b, t, _ = q.shape
        heads = lambda x: x.view(b, t, -1, hd).transpose(1, 2).detach().clone()  # noqa: E731
        recorded.append((heads(q), heads(k), hd**-0.5))

    handles = [blk.attn.c_attn.register_forward_hook(grab) for blk in model.transformer.h]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(3)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    norms, per_step = [], []
    with watch(model, opt, run="r", client=client, sample_every=2):
        for _ in range(steps):
            recorded.clear()
            ids = torch.randint(1, 256, (2, 12), generator=gen)
            labels = ids.masked_fill(mask == 0, -100)
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
            opt.step()
            opt.zero_grad()
            per_step.append(list(recorded))
    for handle in handles:
        handle.remove()
    return per_step, norms


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_gpt2_frames_match_explicit_attention(gpt2_config, impl, recorder) -> None:
    rec, client = recorder
    model = build_gpt2(gpt2_config, impl)
    per_step, norms = train_gpt2(model, client)
    assert [f["step"] for f in rec.frames] == [0, 2]
    mask = torch.ones(2, 12)
    mask[1, 8:] = 0
    for frame in rec.frames:
        assert keys(frame) == SCALARS
        ref_max, ref_p99 = reference(per_step[frame["step"]], mask)
        np.testing.assert_allclose(frame["heads"]["attn.logit_max"], ref_max, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(frame["heads"]["attn.logit_p99"], ref_p99, rtol=1e-5, atol=1e-6)
        assert frame["scalars"]["grad.norm"] == pytest.approx(norms[frame["step"]], rel=1e-6)


def test_gpt2_eager_and_sdpa_give_identical_stats(gpt2_config) -> None:
    got: dict[str, list] = {"eager": [], "sdpa": []}
    for impl, frames in got.items():
        client = Client(None, run="r")
        client.send = lambda step, scalars, heads, time=None, out=frames: out.append(
            (scalars, heads)
        )
        train_gpt2(build_gpt2(gpt2_config, impl), client, steps=1)
    (s_eager, h_eager), (s_sdpa, h_sdpa) = got["eager"][0], got["sdpa"][0]
    assert set(h_eager) == set(h_sdpa) == HEADS
    for name in HEADS:
        np.testing.assert_allclose(h_eager[name], h_sdpa[name], rtol=1e-5, atol=1e-5)
    assert s_eager["loss"] == pytest.approx(s_sdpa["loss"], rel=1e-5)


def test_close_restores_the_model_and_patches(gpt2_config, recorder) -> None:
    from transformers.models.gpt2 import modeling_gpt2

    _, client = recorder
    eager_fn, clip_fn = modeling_gpt2.eager_attention_forward, torch.nn.utils.clip_grad_norm_
    first, second = build_gpt2(gpt2_config, "eager"), build_gpt2(gpt2_config, "eager")
    opt = torch.optim.SGD(first.parameters(), lr=0.1)
    mon1 = watch(first, opt, run="r", client=client)
    mon2 = watch(second, run="r", client=client)
    assert modeling_gpt2.eager_attention_forward is not eager_fn
    assert torch.nn.utils.clip_grad_norm_ is not clip_fn
    first(input_ids=torch.ones(1, 4, dtype=torch.long), labels=torch.ones(1, 4, dtype=torch.long))
    mon1.close()
    mon1.close()  # idempotent
    assert modeling_gpt2.eager_attention_forward is not eager_fn  # still needed by mon2
    mon2.detach()
    assert modeling_gpt2.eager_attention_forward is eager_fn
    assert torch.nn.utils.clip_grad_norm_ is clip_fn
    for model in (first, second):
        for module in model.modules():
            assert len(module._forward_hooks) == 0 and len(module._forward_pre_hooks) == 0
            assert len(module._forward_hooks_always_called) == 0
    assert len(opt._optimizer_step_pre_hooks) == 0 and len(opt._optimizer_step_post_hooks) == 0
    assert torch._C._len_torch_function_stack() == 0


def test_no_host_sync_on_non_sampled_steps(recorder) -> None:
    rec, client = recorder
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = watch(model, opt, run="r", client=client, sample_every=3)
    calls, losses, norms = [], [], []
    for ids in batches(7):
        with CountSyncs() as counter:
            out = model(ids, ids.roll(-1, 1))
            out.loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            mon.log(loss=out.loss, extra=out.loss * 2)
            opt.step()
            opt.zero_grad()
        calls.append(counter.calls)
        losses.append(out.loss.item())
        norms.append(norm.item())
    mon.close()
    assert [calls[i] for i in (1, 2, 4, 5)] == [[], [], [], []]
    for i in (0, 3, 6):
        assert calls[i] == ["tolist"]  # the one read-back (a .cpu() too on an accelerator)
    assert [f["step"] for f in rec.frames] == [0, 3, 6]
    assert rec.frames[0]["scalars"]["extra"] == pytest.approx(2 * rec.frames[0]["scalars"]["loss"])
    # The steps in between came back in that one read-back, as the next frame's history.
    assert [f.get("history", {}).get("steps") for f in rec.frames] == [None, [1, 2], [4, 5]]
    for f in rec.frames[1:]:
        steps = f["history"]["steps"]
        assert f["history"]["scalars"]["loss"] == [losses[s] for s in steps]
        assert f["history"]["scalars"]["grad.norm"] == [norms[s] for s in steps]


def _cuda_train(sample_every: int, steps: int) -> tuple[list[Any], list[float], list[float]]:
    """``steps`` steps of TinyLM on CUDA, sync debug mode "error" on the steps not sampled
    by the interval: the frames sent ``(step, scalars, history, heads)``, and each step's
    loss and clip norm as the loop saw them."""
    model = TinyLM().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    frames: list[Any] = []
    client = Client(None, run="r")
    client.send = lambda step, scalars, heads, time=None, history=None: frames.append(
        (step, scalars, history, heads))
    mon = watch(model, opt, run="r", client=client, sample_every=sample_every)
    losses, norms = [], []
    for i, ids in enumerate(batches(steps)):
        ids = ids.cuda()
        torch.cuda.set_sync_debug_mode("error" if i % sample_every else "default")
        try:
            out = model(ids, ids.roll(-1, 1))
            out.loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        losses.append(out.loss.item())
        norms.append(norm.item())
    mon.close()
    return frames, losses, norms


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_non_sampled_steps_do_not_sync() -> None:
    frames, losses, norms = _cuda_train(3, 7)
    assert [f[0] for f in frames] == [0, 3, 6]
    assert [f[1]["hooks.syncs"] for f in frames] == [1.0, 1.0, 1.0]
    assert [f[2] and f[2]["steps"] for f in frames] == [None, [1, 2], [4, 5]]
    for _, _, history, _ in frames[1:]:
        steps = history["steps"]
        assert history["scalars"]["loss"] == [losses[s] for s in steps]
        assert history["scalars"]["grad.norm"] == [norms[s] for s in steps]
        assert history["scalars"]["grad.clipped"] == [float(norms[s] > 1.0) for s in steps]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_history_flushes_do_not_sync() -> None:
    """At sample_every=25 the history goes out every 10 unsampled steps through pinned
    memory and an event: no sync on any unsampled step (sync debug mode "error"), each step
    told once with what it trained on, the flush frames scalars-only."""
    frames, losses, norms = _cuda_train(25, 40)
    flushes = [f for f in frames if "hooks.history_flush" in f[1]]
    assert flushes and all(f[3] == {} for f in flushes)
    assert [f[0] for f in frames if "hooks.history_flush" not in f[1]
            and "hooks.closing" not in f[1]] == [0, 25]
    told: dict[int, tuple[float, float]] = {}
    for step, scalars, history, _ in frames:
        rows = list(zip(history["steps"], history["scalars"]["loss"],
                        history["scalars"]["grad.norm"], strict=True)) if history else []
        rows.append((step, scalars.get("loss"), scalars.get("grad.norm")))
        for s, loss, norm in rows:
            assert s not in told, s  # each step exactly once
            told[s] = (loss, norm)
    assert sorted(told) == list(range(40))
    for s in range(40):
        if s not in (0, 25):  # a sampled step's loss is the frame's own, pooled the same
            assert told[s] == (losses[s], norms[s]), s


