"""The temporary QK-norm fuse (docs/FUSES.md, *Temporary QK-norm*) on real tiny models: an
SDPA model (nanoGPT-style fused ``c_attn``), an HF Llama (eager attention, GQA) and
``nn.MultiheadAttention``. What reaches the attention kernel is read by a spy under the
monitor (a ``TorchFunctionMode`` entered before the forward, so below the monitor's own
mode; for HF eager, the eager function the monitor's wrapper calls) and compared with a
float64 reference of ``λ·g·q/rms(q) + (1-λ)·q`` from the recorded un-normed ``q``/``k``.

Optimizers are SGD at lr 0 unless said (the weights stay, so what changes the attention is
the fuse) and ``rescale=False`` where the weights are compared.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from test_fuses import IDS, Net, capturing_client
from torch import nn
from torch.overrides import TorchFunctionMode

from logitwatch.hooks import attach
from logitwatch.hooks.fuses import LRBackoff, QKNorm, _rewrite

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EPS = 1e-6


class Spy(TorchFunctionMode):
    """Records the ``q``/``k`` each SDPA call receives (below the monitor's mode: after its
    rewrite)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            a = dict(zip(("query", "key"), args, strict=False))
            a.update(kwargs)
            self.calls.append((a["query"].detach().clone(), a["key"].detach().clone()))
        return func(*args, **kwargs)


def ref_norm(x: torch.Tensor, lam: float, tau: float, scale: float) -> torch.Tensor:
    """float64 ``λ·g·x/rms(x) + (1-λ)·x``, ``g = sqrt(tau / (d·scale))``."""
    x = x.double()
    g = math.sqrt(tau / (x.shape[-1] * scale))
    n = g * x / (x.square().mean(-1, keepdim=True) + EPS).sqrt()
    return lam * n + (1 - lam) * x


def causal_max(q: torch.Tensor, k: torch.Tensor, scale: float) -> list[float]:
    """Per-head max of ``q·kᵀ·scale`` over causal pairs (float64; GQA by repeat)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q.double() @ k.double().transpose(-1, -2) * scale
    t = s.shape[-1]
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    return s.amax(dim=(0, 2, 3)).tolist()


def attached(model: nn.Module, fuses, lr: float = 0.0, opt=None, **kw):
    client, frames = capturing_client()
    opt = opt or torch.optim.SGD(model.parameters(), lr=lr)
    kw.setdefault("sample_every", 1)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 fuses=fuses, **kw)
    return mon, opt, frames, client


def sdpa_step(model: nn.Module, opt) -> tuple[list, torch.Tensor]:
    with Spy() as spy:
        loss = model(IDS)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return spy.calls, loss.detach()


# -- the norm as the formula predicts, on each path -------------------------------------------


def test_sdpa_logits_follow_the_interpolation_exactly() -> None:
    model = Net(layers=2, std=0.5)
    fuse = QKNorm(limit=1e9, tau=6.0, mode="auto", rescale=False)
    mon, opt, frames, _ = attached(model, [fuse])
    raw, _ = sdpa_step(model, opt)
    fuse.insert(0, [1], "test")
    fuse.rewrite.lam[1] = 0.3
    got, _ = sdpa_step(model, opt)
    mon.close()
    assert torch.equal(got[0][0], raw[0][0]) and torch.equal(got[0][1], raw[0][1])  # layer 0
    scale = 8 ** -0.5
    q_ref, k_ref = (ref_norm(t, 0.3, 6.0, scale) for t in raw[1])
    torch.testing.assert_close(got[1][0].double(), q_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1][1].double(), k_ref, rtol=1e-5, atol=1e-6)
    # the monitor measured what the softmax received
    assert frames[1]["heads"]["attn.logit_max"][1] == pytest.approx(
        causal_max(q_ref, k_ref, scale), rel=1e-4)
    assert frames[0]["heads"]["attn.logit_max"][1] == pytest.approx(
        causal_max(*raw[1], scale), rel=1e-4)
    # at λ = 1 every logit is tau·cos(q, k): bounded by tau
    q1, k1 = (ref_norm(t, 1.0, 6.0, scale) for t in raw[1])
    assert max(causal_max(q1, k1, scale)) <= 6.0 + 1e-9
    assert [e.action for e in mon.fuses.events] == ["insert"]


def llama(layers: int = 2):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=64,
                                      max_position_embeddings=32, initializer_range=0.4)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager")


@pytest.fixture
def eager_spy(monkeypatch):
    """The HF Llama eager attention replaced by a spy (before attach: the monitor's wrapper
    then calls it with what it rewrote)."""
    pytest.importorskip("transformers")
    import transformers.models.llama.modeling_llama as ml

    original = ml.eager_attention_forward
    seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def eager_attention_forward(module, query, key, value, attention_mask, *args, **kwargs):
        seen.append((module.layer_idx, query.detach().clone(), key.detach().clone()))
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    monkeypatch.setattr(ml, "eager_attention_forward", eager_attention_forward)
    return seen


def test_hf_eager_gqa_logits_follow_the_interpolation_exactly(eager_spy) -> None:
    model = llama()
    fuse = QKNorm(limit=1e9, tau=5.0, mode="auto", rescale=False)
    mon, opt, frames, _ = attached(model, [fuse])

    def step() -> None:
        eager_spy.clear()
        model(input_ids=IDS, labels=IDS).loss.backward()
        opt.step()
        opt.zero_grad()

    step()
    raw = {layer: (q, k) for layer, q, k in eager_spy}
    fuse.insert(0, [1], "test")  # the last layer: the first one's input stays
    fuse.rewrite.lam[1] = 0.55
    step()
    got = {layer: (q, k) for layer, q, k in eager_spy}
    mon.close()
    scale = 8 ** -0.5
    assert got[1][1].shape[1] == 2 and got[1][0].shape[1] == 4  # GQA: 2 key heads
    q_ref, k_ref = (ref_norm(t, 0.55, 5.0, scale) for t in raw[1])
    torch.testing.assert_close(got[1][0].double(), q_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1][1].double(), k_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[0][0], raw[0][0])  # layer 0 untouched
    assert frames[1]["heads"]["attn.logit_max"][1] == pytest.approx(
        causal_max(q_ref, k_ref, scale), rel=1e-4)


class MhaNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(64, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 64)
        with torch.no_grad():
            self.attn.in_proj_weight.normal_(0, 0.5)
            self.attn.in_proj_bias.normal_(0, 0.3)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True: not allowed
        y, _ = self.attn(x, x, x, attn_mask=causal, key_padding_mask=pad)
        x = x + y
        return F.cross_entropy(self.head(x)[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))


PAD = torch.zeros(4, 12, dtype=torch.bool)
PAD[1, 9:] = True


def mha_reference(model: MhaNet, x: torch.Tensor, lam: float, tau: float,
                  cap: float | None = None) -> tuple[torch.Tensor, list[float]]:
    """float64 MHA output with the norm (and cap), and per-head max logit over valid pairs."""
    a = model.attn
    w = a.in_proj_weight.detach().double()
    b = a.in_proj_bias.detach().double()
    x = x.double()
    q, k, v = ((x @ w[i * 32:(i + 1) * 32].T + b[i * 32:(i + 1) * 32]).view(4, 12, 4, 8)
               .transpose(1, 2) for i in range(3))
    scale = 8 ** -0.5
    q, k = ref_norm(q, lam, tau, scale), ref_norm(k, lam, tau, scale)
    s = q @ k.transpose(-1, -2) * scale
    valid = torch.ones(12, 12, dtype=torch.bool).tril()[None, None] & ~PAD[:, None, None, :]
    rows = valid & ~PAD[:, None, :, None]
    maxes = s.masked_fill(~rows, -math.inf).amax(dim=(0, 2, 3)).tolist()
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    p = s.masked_fill(~valid, -math.inf).softmax(-1)
    y = (p @ v).transpose(1, 2).reshape(4, 12, 32)
    y = y @ a.out_proj.weight.detach().double().T + a.out_proj.bias.detach().double()
    return y, maxes


def mha_io(model: MhaNet):
    box: dict = {}
    model.attn.register_forward_hook(
        lambda m, args, out: box.update(x=args[0].detach(), y=out[0].detach()))
    return box


def test_multihead_attention_output_follows_the_interpolation() -> None:
    model = MhaNet()
    box = mha_io(model)
    fuse = QKNorm(limit=1e9, tau=4.0, mode="auto", rescale=False)
    mon, opt, frames, _ = attached(model, [fuse])

    def step() -> None:
        model(IDS, PAD).backward()
        opt.step()
        opt.zero_grad()

    step()
    y_ref0, max0 = mha_reference(model, box["x"], 0.0, 4.0)
    torch.testing.assert_close(box["y"].double(), y_ref0, rtol=1e-5, atol=1e-5)
    fuse.insert(0, [0], "test")
    fuse.rewrite.lam[0] = 0.7
    step()
    mon.close()
    y_ref, maxes = mha_reference(model, box["x"], 0.7, 4.0)
    torch.testing.assert_close(box["y"].double(), y_ref, rtol=1e-5, atol=1e-5)
    assert frames[1]["heads"]["attn.logit_max"][0] == pytest.approx(maxes, rel=1e-4)
    assert frames[0]["heads"]["attn.logit_max"][0] == pytest.approx(max0, rel=1e-4)


# -- nothing added, gradients flow ---------------------------------------------------------------


def test_no_parameter_added_and_gradients_flow_through_the_norm() -> None:
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _rewrite.norm_qk(t, 0.4, 1.7), (x,))
    assert torch.autograd.gradcheck(lambda t: _rewrite.norm_qk(t, 1.0, 1.7), (x,))

    plain = Net(layers=1, std=0.5)
    plain(IDS).backward()
    g_plain = plain.blocks[0].c_attn.weight.grad[:64].clone()

    model = Net(layers=1, std=0.5)
    fuse = QKNorm(limit=1e9, mode="auto", rescale=False)
    mon, opt, _, _ = attached(model, [fuse])
    before = [id(p) for g in opt.param_groups for p in g["params"]]
    names = [n for n, _ in model.named_parameters()]
    modules = len(list(model.modules()))
    fuse.insert(0, [0], "test")
    for lam in (1.0, 0.5):
        fuse.rewrite.lam[0] = lam
        model(IDS).backward()
        g = model.blocks[0].c_attn.weight.grad[:64]  # W_q and W_k rows
        assert torch.isfinite(g).all() and g[:32].abs().sum() > 0 and g[32:].abs().sum() > 0
        assert not torch.allclose(g, g_plain)
        opt.step()
        opt.zero_grad()
    mon.close()
    assert [id(p) for g in opt.param_groups for p in g["params"]] == before
    assert [n for n, _ in model.named_parameters()] == names
    assert len(list(model.modules())) == modules
    assert list(model.state_dict()) == list(Net(layers=1).state_dict())


# -- the anneal, removal, LR backoff ------------------------------------------------------------


def test_lambda_follows_the_cosine_on_every_step_and_removal_is_bit_exact() -> None:
    model = Net(layers=1, std=0.5)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    fuse = QKNorm(limit=1e9, tau=5.0, mode="auto", anneal=10, rescale=False)
    backoff = LRBackoff(factor=0.5, steps=5, mode="auto", rules=())
    mon, opt, frames, _ = attached(model, [fuse, backoff], sample_every=4)
    raw, loss0 = sdpa_step(model, opt)
    fuse.insert(0, [0], "test")
    fuse.start_anneal(0, [0], "test")
    scale = 8 ** -0.5
    lams = []
    for _ in range(12):
        lam = fuse.rewrite.lam.get(0, 0.0)
        lams.append(lam)
        got, loss = sdpa_step(model, opt)  # 3 of 4 steps are not sampled: still rewritten
        if lam:
            torch.testing.assert_close(got[0][0].double(), ref_norm(raw[0][0], lam, 5.0, scale),
                                       rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(got[0][0], raw[0][0]) and torch.equal(loss, loss0)
    expected = [0.5 * (1 + math.cos(math.pi * k / 10)) for k in range(10)] + [0.0, 0.0]
    assert lams == pytest.approx(expected, abs=1e-12)
    assert not mon.attn_rewrite.active
    model.eval()  # an evaluation forward after removal is the model's own
    with torch.no_grad(), Spy() as spy:
        out = model(IDS)
    assert torch.equal(spy.calls[0][0], raw[0][0]) and torch.equal(out, loss0)
    mon.close()
    for n, p in model.named_parameters():  # lr 0, no rescale: nothing touched the weights
        assert torch.equal(p.detach(), w0[n]), n
    acts = [(e.fuse, e.action) for e in mon.fuses.events]
    assert acts == [("qk_norm", "insert"), ("qk_norm", "anneal"), ("lr_backoff", "backoff"),
                    ("lr_backoff", "restored"), ("qk_norm", "removed")]
    assert mon.fuses.events[2].detail["reason"] == "qk_norm"
    assert fuse.steps_annealing == 10 and [lam for _, _, lam in fuse.trace] == pytest.approx(
        expected[1:10])
    lam_series = [f["scalars"].get("fuse.qk_norm.lambda") for f in frames]
    assert lam_series[0] == 0.0 and 0.0 < lam_series[1] < 1.0 and lam_series[-1] == 0.0


def test_an_inserted_norm_holds_in_evaluation_forwards() -> None:
    model = Net(layers=1, std=0.5)
    fuse = QKNorm(limit=1e9, tau=5.0, mode="auto", rescale=False)
    mon, opt, _, _ = attached(model, [fuse], sample_every=1000)
    fuse.insert(0, [0], "test")
    train_loss = model(IDS).detach()
    with torch.no_grad():
        eval_loss = model(IDS)
    mon.close()
    plain = Net(layers=1, std=0.5)(IDS).detach()
    assert torch.equal(train_loss, eval_loss) and not torch.allclose(train_loss, plain)


# -- triggers, modes -------------------------------------------------------------------------


def grow(fuses, steps: int = 40):
    """A run whose attention logits grow (Adam at a high lr, one batch)."""
    model = Net(layers=2, std=0.2)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    mon, opt, frames, client = attached(model, fuses, opt=opt, sample_every=2)
    for _ in range(steps):
        model(IDS).backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    return frames, mon, model


def p99_max(frame: dict, layer: int | None = None) -> float:
    rows = frame["heads"].get("attn.logit_p99") or [[-math.inf]]
    rows = rows if layer is None else [rows[layer]]
    return max(v for row in rows for v in row)


def test_auto_inserts_on_sustained_high_p99_and_bounds_the_logits() -> None:
    limit = 8.0
    frames, _, _ = grow(None)
    assert p99_max(frames[0]) < limit < max(p99_max(f) for f in frames)  # the logits grow
    fuse = QKNorm(limit=limit, patience=2, stable=1000, mode="auto")
    frames, mon, _ = grow([fuse])
    inserts = [e for e in mon.fuses.events if e.action == "insert"]
    assert inserts and inserts[0].detail["layers"]
    first = inserts[0]
    over = [f["step"] for f in frames if p99_max(f) > limit]
    assert first.step == over[1]  # two samples past the limit (patience 2)
    for f in frames:
        if f["step"] > first.step and "attn.logit_max" in f["heads"]:  # λ = 1: <= tau
            for layer in first.detail["layers"]:
                assert max(f["heads"]["attn.logit_max"][layer]) <= fuse.tau * (1 + 1e-5)
                assert f["scalars"]["fuse.qk_norm.lambda"] == 1.0
    last = [f for f in frames if "fuse.qk_norm.layers" in f["scalars"]][-1]
    assert last["scalars"]["fuse.qk_norm.layers"] >= 1
    assert last["scalars"]["fuse.qk_norm.state"] == 2
    assert any("fuse.qk_norm.raw_max" in f["scalars"] for f in frames)


def test_rescale_brings_raw_logits_to_tau_then_the_anneal_starts() -> None:
    fuse = QKNorm(limit=8.0, patience=2, stable=2, anneal=6, mode="auto")
    frames, mon, _ = grow([fuse], steps=60)
    acts = [e.action for e in mon.fuses.events]
    assert acts[0] == "insert" and "anneal" in acts and "removed" in acts
    raw = [f["scalars"]["fuse.qk_norm.raw_max"] for f in frames
           if "fuse.qk_norm.raw_max" in f["scalars"]]
    assert raw[0] > fuse.limit and min(raw[1:]) <= fuse.limit  # rescaled down


def test_suggest_carries_the_fuse_in_alerts_control_applies_and_undo_anneals() -> None:
    model = Net(layers=2, std=0.5)
    fuse = QKNorm(limit=3.0, patience=2, anneal=4, rescale=False)  # suggest: the default
    mon, opt, frames, client = attached(model, [fuse])
    client._handle_answer({"control": {}})  # the first answer: the control's baseline
    received: list[dict] = []
    client.on_alert(received.append)

    def step() -> None:
        model(IDS).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step()
    assert [e.action for e in mon.fuses.events] == ["suggest"]
    assert mon.fuses.events[0].detail["layers"] == [0, 1]
    assert not mon.attn_rewrite.active and frames[-1]["scalars"]["fuse.qk_norm.state"] == 1
    client._handle_answer({"alerts": [
        {"id": 1, "run": "r", "rule": "attn_p99_trend", "severity": "warning"}]})
    carried = received[0]["fuses"]
    assert [f["fuse"] for f in carried] == ["qk_norm"]
    assert carried[0]["apply"]["control"] == {"fuses": {"qk_norm": "apply"}}
    client._handle_answer({"control": {"fuses": {"qk_norm": "apply"}}})
    step()
    assert mon.fuses.events[-1].action == "insert"
    assert mon.fuses.events[-1].detail["reason"] == "applied by control"
    assert mon.attn_rewrite.lam == {0: 1.0, 1: 1.0}
    step()
    assert frames[-1]["scalars"]["fuse.qk_norm.state"] == 2
    mon.fuses.undo("qk_norm")
    assert mon.fuses.events[-1].action == "undo" and mon.fuses.events[-2].action == "anneal"
    for _ in range(4):
        assert mon.attn_rewrite.active
        step()
    assert not mon.attn_rewrite.active and mon.fuses.events[-1].action == "removed"
    assert frames[-1]["scalars"]["fuse.qk_norm.state"] == 1  # back to suggesting
    mon.close()


def test_the_dict_form_and_off() -> None:
    model = Net(layers=1, std=0.5)
    mon, opt, frames, _ = attached(model, {"qk_norm": {"limit": 1.0, "patience": 1,
                                                        "mode": "off"}})
    model(IDS).backward()
    opt.step()
    model(IDS).backward()
    opt.step()
    mon.close()
    assert not mon.fuses.events and frames[-1]["scalars"]["fuse.qk_norm.state"] == 0
    assert mon.attn_rewrite is None
    with pytest.raises(ValueError, match="anneal"):
        QKNorm(anneal=0)


# -- safety -------------------------------------------------------------------------------------


def test_an_exception_in_the_rewrite_never_reaches_training(monkeypatch, caplog) -> None:
    plain = Net(layers=2, std=0.5)
    want = plain(IDS).detach()

    def broken(*args, **kwargs):
        raise RuntimeError("norm bug")

    monkeypatch.setattr(_rewrite, "norm_qk", broken)
    model = Net(layers=2, std=0.5)
    fuse = QKNorm(limit=1e9, mode="auto", rescale=False)
    mon, opt, frames, _ = attached(model, [fuse])
    fuse.insert(0, [0, 1], "test")
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        losses = []
        for _ in range(3):
            loss = model(IDS)
            losses.append(loss.detach())
            loss.backward()
            opt.step()
            opt.zero_grad()
    mon.close()
    assert all(torch.equal(x, want) for x in losses)  # the model's own attention
    assert [e.action for e in mon.fuses.events] == ["insert", "failed"]
    assert frames[-1]["scalars"]["fuse.qk_norm.state"] == -1
    assert not mon.attn_rewrite.active
    assert len([r for r in caplog.records if "fuse qk_norm failed" in r.getMessage()]) == 1


def test_a_fractional_anneal_takes_the_runs_planned_steps_from_the_monitor() -> None:
    """anneal=0.1 without total_steps: a tenth of the steps the monitor knows are left (the
    framework callbacks set ``planned_steps``), else a tenth of 2000; total_steps wins."""
    def window(planned: int | None, **kw) -> int:  # type: ignore[no-untyped-def]
        model = Net(layers=1, std=0.5)
        fuse = QKNorm(limit=1e9, tau=5.0, mode="auto", anneal=0.1, rescale=False, **kw)
        mon, opt, _, _ = attached(model, [fuse])
        mon.planned_steps = planned
        fuse.insert(100, [0], "test")
        fuse.start_anneal(100, [0], "test")
        steps = fuse.annealing[0][1]
        mon.close()
        return steps
    assert window(1100) == 100      # (1100 - 100) / 10
    assert window(None) == 200      # 2000 / 10: nothing known of the run
    assert window(1100, total_steps=600) == 50
