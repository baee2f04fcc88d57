"""The monitor never hurts, nor misreads, a training job in awkward situations: blocks
compiled inside an eagerly captured model, two monitors on one model, a forward that raises
(and is retried), a KeyboardInterrupt in a forward, meta-device and empty attention calls.

Real models and real training loops; nothing of the monitor is mocked.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from logitwatch.client import Client
from logitwatch.hooks import Monitor, attach
from logitwatch.hooks.fuses import QKClip

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 64
ATTN = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
        "attn.entropy_mean", "attn.entropy_min")
FINAL = ("final.hidden_rms", "final.logz", "final.logit_max")


def capturing_client(run: str = "r") -> tuple[Client, list[dict]]:
    frames: list[dict] = []
    client = Client(None, run=run)
    client.send = lambda step, scalars, heads, time=None, history=None: frames.append(  # type: ignore
        {"step": step, "scalars": scalars, "heads": heads, "history": history})
    return client, frames


def watch(model: nn.Module, opt: torch.optim.Optimizer, run: str = "r",
          **kwargs: Any) -> tuple[Monitor, list[dict]]:
    client, frames = capturing_client(run)
    kwargs.setdefault("overhead_budget", None)
    return attach(model, opt, run=run, client=client, **kwargs), frames


def stack() -> list[Any]:
    """This thread's torch function modes, outermost first."""
    return [torch._C._get_function_stack_at(i)
            for i in range(torch._C._len_torch_function_stack())]


# -- a nanoGPT-style model (fused c_attn, SDPA is_causal) --------------------------------------


class Attn(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2)
                   for z in self.c_attn(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = Attn(d, h)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln(x))
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self, d: int = 32, h: int = 4, layers: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.lm_head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(x)
        return {"loss": F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)),
                "logits": logits}


def data(n: int, b: int = 4, t: int = 12, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (b, t + 1), generator=gen) for _ in range(n)]


def train(model: nn.Module, opt: torch.optim.Optimizer, batches: list[torch.Tensor],
          before_step: Callable[[int], None] | None = None) -> list[float]:
    losses = []
    for i, ids in enumerate(batches):
        out = model(ids[:, :-1], ids[:, 1:])
        out["loss"].backward()
        if before_step is not None:
            before_step(i)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(out["loss"].item())
    return losses


def same_params(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def measured(frame: dict) -> dict[str, Any]:
    """A frame's measured values (timing scalars left out)."""
    got: dict[str, Any] = {k: frame["heads"][k] for k in ATTN if k in frame["heads"]}
    got.update({k: frame["scalars"][k] for k in (*FINAL, "loss") if k in frame["scalars"]})
    return got


# -- A: blocks compiled inside an eagerly captured model ----------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_blocks_inside_an_eager_model_are_passed_through() -> None:
    """HOOKS.md: "compile only the blocks you do not need measured". The root forward is
    eager, so the capture mode is on the stack while the compiled blocks are traced: the
    trace must not see the statistics code (it failed to compile, raising into training),
    the compiled blocks are not measured, the eager blocks and the LM head are."""
    torch._dynamo.reset()
    try:
        plain, model = GPT(), GPT()
        eager = GPT()  # the same weights, every block eager: the reference of the rows
        opt_p = torch.optim.SGD(plain.parameters(), lr=0.1)
        opt_m = torch.optim.SGD(model.parameters(), lr=0.1)
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
        mon, frames = watch(model, opt_m, sample_every=2)
        ref, ref_frames = watch(eager, opt_e, run="e", sample_every=2)
        for m in (plain, model):
            m.blocks[1].compile(backend="aot_eager")
        batches = data(5)
        assert train(plain, opt_p, batches) == train(model, opt_m, batches)
        train(eager, opt_e, batches)
        mon.close()
        ref.close()
        assert same_params(plain, model)
        assert not mon.disabled
        assert [f["step"] for f in frames] == [0, 2, 4]
        first, ref_first = frames[0], ref_frames[0]
        for name in ATTN:  # blocks 0 and 2 measured; compiled block 1 has no row
            rows = np.array(first["heads"][name])
            assert rows.shape == (2, 4)
            want = np.array(ref_first["heads"][name])[[0, 2]]
            np.testing.assert_allclose(rows, want, rtol=1e-5, atol=1e-6, err_msg=name)
        for name in (*FINAL, "loss"):
            assert first["scalars"][name] == pytest.approx(ref_first["scalars"][name],
                                                           rel=1e-5)
        assert all(len(f["heads"]["attn.logit_max"]) == 2 for f in frames)
        assert stack() == []
    finally:
        torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compiled_hf_eager_attention_block_is_passed_through() -> None:
    """The same for HF ``eager`` attention, which the monitor intercepts by wrapping
    ``eager_attention_forward``: inside a compiled decoder layer the wrapper only calls
    the original."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    plain = transformers.LlamaForCausalLM(config)
    model = copy.deepcopy(plain)
    torch._dynamo.reset()
    try:
        opt_p = torch.optim.SGD(plain.parameters(), lr=0.1)
        opt_m = torch.optim.SGD(model.parameters(), lr=0.1)
        mon, frames = watch(model, opt_m, sample_every=1)
        for m in (plain, model):
            m.model.layers[0].compile(backend="aot_eager")
        losses = []
        for m, opt in ((plain, opt_p), (model, opt_m)):
            m.train()
            run = []
            for ids in data(3):
                out = m(input_ids=ids, labels=ids)
                out.loss.backward()
                opt.step()
                opt.zero_grad()
                run.append(out.loss.item())
            losses.append(run)
        mon.close()
        assert losses[0] == losses[1]
        assert same_params(plain, model)
        assert not mon.disabled
        assert [len(f["heads"]["attn.logit_max"]) for f in frames] == [1, 1, 1]  # layer 1
    finally:
        torch._dynamo.reset()


# -- B: two monitors on one model ------------------------------------------------------------


def test_two_monitors_on_one_model_unwind_their_modes() -> None:
    """Post-hooks unwind in the reverse order of the pre-hooks: each monitor pops its own
    mode, nothing is left on the mode stack, both measure, training is unchanged."""
    plain, model, single = GPT(), GPT(), GPT()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, model, single)]
    one, one_frames = watch(single, opts[2], run="s", sample_every=2)
    first, frames_1 = watch(model, opts[1], run="a", sample_every=2)
    second, frames_2 = watch(model, opts[1], run="b", sample_every=2)
    modes: list[int] = []
    batches = data(4)
    losses = train(model, opts[1], batches,
                   before_step=lambda i: modes.append(len(stack())))
    assert train(plain, opts[0], batches) == losses
    assert train(single, opts[2], batches) == losses
    first.close()
    second.close()
    one.close()
    assert same_params(plain, model)
    assert modes == [0, 0, 0, 0] and stack() == []
    assert not first.disabled and not second.disabled
    assert [f["step"] for f in frames_1] == [f["step"] for f in one_frames] == [0, 2, 3]
    for f1, f2, ref in zip(frames_1, frames_2, one_frames, strict=True):
        assert measured(f1) == measured(f2) == measured(ref)
        if f1["step"] < 3:  # the closing frame holds the last step's scalars only
            assert len(f1["heads"]["attn.logit_max"]) == 3


class LeftOn(TorchFunctionMode):
    """A mode some library enters inside the forward and never exits."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return func(*args, **(kwargs or {}))


def test_the_capture_mode_is_removed_from_under_a_mode_left_on_top() -> None:
    """A mode left on top of the monitor's: the monitor's mode is taken out from under it
    (the other is put back), not retired and left on the stack for the process."""
    model, plain = GPT(), GPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.1)
    left = LeftOn()
    inner = model.blocks[0].forward

    def leaves_a_mode(x: torch.Tensor) -> torch.Tensor:
        if left not in stack():
            left.__enter__()
        return inner(x)

    model.blocks[0].forward = leaves_a_mode
    mon, frames = watch(model, opt, sample_every=1)
    try:
        batches = data(2)
        losses = train(model, opt, batches)
        assert stack() == [left]  # only theirs: ours was taken out from under it
    finally:
        while stack():
            torch._C._pop_torch_function_stack()
        mon.close()
    assert train(plain, opt_p, batches) == losses
    assert not mon.disabled
    assert [len(f["heads"]["attn.logit_max"]) for f in frames if f["step"] < 1] == [3]


# -- C: a forward that raises, then a retry -------------------------------------------------------


def fail_once(block: nn.Module) -> dict[str, bool]:
    """Make ``block`` raise on its next call (a simulated CUDA OOM the job catches)."""
    state = {"fail": True}
    inner = block.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if state["fail"]:
            state["fail"] = False
            raise RuntimeError("CUDA out of memory (simulated)")
        return inner(x)

    block.forward = forward
    return state


def retried_step(model: GPT, opt: torch.optim.Optimizer, fail_first: bool,
                 check: Callable[[], None] | None = None) -> None:
    """One step whose forward first raises in block 1 on a big batch (after block 0 and
    its attention ran), then is retried on half of it, as a job catching an OOM does."""
    ids = data(1, b=8, seed=3)[0]
    if fail_first:
        fail_once(model.blocks[1])
        weight = model.blocks[0].attn.c_attn.weight
        kept = weight.detach().clone()
        with torch.no_grad():
            weight.mul_(30)  # huge logits in the failed try
        try:
            model(ids[:, :-1], ids[:, 1:])
        except RuntimeError:
            with torch.no_grad():
                weight.copy_(kept)
            if check is not None:
                check()
            out = model(ids[:4, :-1], ids[:4, 1:])  # retried inside the except block
    else:
        out = model(ids[:4, :-1], ids[:4, 1:])
    out["loss"].backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("micro", [1, 2])
def test_a_forward_that_raises_leaves_nothing_in_the_frame(micro: int) -> None:
    """The failed try's per-layer, LM-head and loss statistics are dropped: the retried
    step's frame equals that of the same step without the failed try (``micro=2``: a
    gradient-accumulation forward before the failing one is kept)."""
    got = []
    for fail_first in (False, True):
        model = GPT()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        mon, frames = watch(model, opt, sample_every=100)
        if micro == 2:
            ids = data(1, seed=5)[0]
            model(ids[:, :-1], ids[:, 1:])["loss"].backward()
        retried_step(model, opt, fail_first)
        mon.close()
        assert not mon.disabled and stack() == []
        got.append(measured(frames[0]))
    assert got[1] == got[0]


def test_a_raising_forward_gives_qk_clip_nothing_to_act_on() -> None:
    """With QK-clip acting (auto), a failed try whose max logits are far over tau must not
    scale W_q/W_k: the retried step, the one that trains, is far under it."""
    model = GPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # only the fuse could move weights
    before = [p.detach().clone() for p in model.parameters()]
    client, _ = capturing_client()
    mon = attach(model, opt, run="r", client=client, sample_every=100, overhead_budget=None,
                 fuses=[QKClip(tau=50, mode="auto")])
    retried_step(model, opt, fail_first=True)
    mon.close()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_raising_max_only_forward_leaves_no_maxima() -> None:
    """The same for a max-only forward (a fuse's :meth:`Monitor.request_max` step)."""
    model = GPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    mon, _ = watch(model, opt, sample_every=100)
    train(model, opt, data(1), before_step=lambda i: mon.request_max())  # step 0: sampled
    seen: list[dict] = []
    retried_step(model, opt, fail_first=True, check=lambda: seen.append(dict(mon.maxima)))
    mon.close()
    assert seen == [{}]  # step 1 is max-only: the failed try's maxima were dropped


# -- D: KeyboardInterrupt in a forward -----------------------------------------------------------


@pytest.mark.parametrize("at", [0, 1])
def test_an_interrupted_forward_does_not_stop_capture(at: int) -> None:
    """torch runs ``always_call`` hooks for ``Exception`` only: a KeyboardInterrupt (a
    notebook's Ctrl-C, caught, training resumed) skips the post-hook. The next steps are
    measured all the same (``at``: the interrupted step is sampled, or not)."""
    model = GPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon, frames = watch(model, opt, sample_every=2)
    inner = model.blocks[1].forward
    armed = {"on": False}

    def forward(x: torch.Tensor) -> torch.Tensor:
        if armed["on"]:
            armed["on"] = False
            raise KeyboardInterrupt
        return inner(x)

    model.blocks[1].forward = forward
    interrupted = 0
    for i, ids in enumerate(data(7)):
        armed["on"] = i == at
        try:
            out = model(ids[:, :-1], ids[:, 1:])
        except KeyboardInterrupt:
            interrupted += 1
            continue  # the user goes on with the next batch, in the same step
        out["loss"].backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    assert interrupted == 1
    assert stack() == [] and not mon.disabled
    later = [f for f in frames if f["step"] in (2, 4)]
    assert [f["step"] for f in later] == [2, 4]
    for frame in later:
        assert len(frame["heads"]["attn.logit_max"]) == 3
        assert "loss" in frame["scalars"] and "final.logz" in frame["scalars"]


# -- E: meta-device and empty attention calls ------------------------------------------------


class Probe(nn.Module):
    """Two attention calls per forward: a real one and an odd one (``kind``) before it."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        b, t, _ = x.shape
        q = self.lin(x).view(b, t, 4, 4).transpose(1, 2)
        if self.kind == "meta":  # a shape probe
            F.scaled_dot_product_attention(*(torch.empty(b, 4, t, 4, device="meta"),) * 3)
        else:  # an empty sequence
            F.scaled_dot_product_attention(*(q[:, :, :0],) * 3)
        y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return {"loss": y.pow(2).mean()}


@pytest.mark.parametrize("kind", ["meta", "empty"])
def test_meta_and_empty_attention_calls_are_skipped(kind: str, caplog) -> None:
    """A call on the meta device made the frame's read-back fail ('step' disabled for the
    run), an empty one disabled 'attention'. Both are skipped (their row number kept);
    the real call is measured on every sampled step."""
    model = Probe(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon, frames = watch(model, opt, sample_every=2, lm_head=False)
    xs = [torch.randn(3, 10, 16, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        for i, x in enumerate(xs):
            if i == 1:
                mon.request_max()  # an unsampled max-only step sees the odd call too
            model(x)["loss"].backward()
            assert all(not m.is_meta for m in mon.maxima.values())
            opt.step()
            opt.zero_grad()
    mon.close()
    assert not mon.disabled and "failed" not in caplog.text
    sampled = [f for f in frames if f["heads"]]
    assert [f["step"] for f in sampled] == [0, 2, 4]
    for frame in sampled:
        assert np.array(frame["heads"]["attn.logit_max"]).shape == (1, 4)
        assert all(np.isfinite(frame["heads"]["attn.logit_max"][0]))
