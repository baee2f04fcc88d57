"""Fuses on real tiny models, their control and safety (docs/FUSES.md): modes off /
suggest / auto, control from the collector's answer, undo; a failing fuse never breaks
training and one that cannot apply says why once; attach checks its fuses; LR backoff and its
restore; the HF and Lightning callbacks pass fuses through. The models, the loop and the
capturing client are ``test_fuses.py``'s, whose tests check which rows QK-clip scales.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.nn.functional as F
from test_fuses import IDS, Net, capturing_client, run
from torch import nn

from logitwatch.hooks import attach
from logitwatch.hooks.fuses import Fuse, LRBackoff, QKClip

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# -- modes, control, undo ----------------------------------------------------------------


def test_off_and_suggest_do_nothing_until_control_applies_then_undo() -> None:
    model = Net()
    w0 = model.blocks[0].c_attn.weight.detach().clone()
    frames, mon = run(model, 2, {"qk_clip": {"tau": 3.0, "mode": "off"}})
    torch.testing.assert_close(model.blocks[0].c_attn.weight.detach(), w0)
    assert frames[0]["scalars"]["fuse.qk_clip.state"] == 0 and not mon.fuses.events

    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=1, fuses=[QKClip(tau=3.0)])  # suggest: the default
    client._handle_answer({"control": {}})  # the first answer: the control's baseline

    def step() -> None:
        loss = model(IDS)
        loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step()
    torch.testing.assert_close(model.blocks[0].c_attn.weight.detach(), w0)  # suggested only
    assert frames[0]["scalars"]["fuse.qk_clip.suggested"] == 4
    assert frames[0]["scalars"]["fuse.qk_clip.state"] == 1
    assert [e.action for e in mon.fuses.events] == ["suggest"]
    # a person applies it: the collector's ingest answer carries the control
    client._handle_answer({"control": {"fuses": {"qk_clip": "apply"}}})
    step()  # the control is read at this step's end: clipped after its update
    assert frames[-1]["scalars"]["fuse.qk_clip.heads"] == 4
    assert frames[-1]["scalars"]["fuse.qk_clip.state"] == 2
    assert not torch.allclose(model.blocks[0].c_attn.weight.detach(), w0)
    client._handle_answer({"control": {"fuses": {"qk_clip": "apply"}}})  # repeated: once
    step()
    assert [e.action for e in mon.fuses.events] == ["suggest", "apply", "clip"]
    client._handle_answer({"control": {"fuses": {"qk_clip": "undo"}}})
    step()
    mon.close()
    torch.testing.assert_close(model.blocks[0].c_attn.weight.detach(), w0, rtol=1e-5,
                               atol=1e-6)  # lr 0: undo restores the weights
    assert mon.fuses.events[-1].action == "undo"
    assert mon.fuses["qk_clip"].engaged is False


class Broken(Fuse):
    name = "broken"

    def step_end(self, step: int, sampled: bool) -> None:
        raise RuntimeError("fuse bug")


def test_a_failing_fuse_never_breaks_training(caplog) -> None:
    plain = Net(layers=2)
    losses = []
    opt = torch.optim.SGD(plain.parameters(), lr=0.05)
    for _ in range(4):
        loss = plain(IDS)
        losses.append(float(loss.detach()))
        loss.backward()
        opt.step()
        opt.zero_grad()
    model = Net(layers=2)
    seen = []
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        frames, mon = run(model, 4, [Broken(mode="auto")], lr=0.05, sample_every=1,
                          forward=lambda m: seen.append(float(m(IDS).detach())) or m(IDS))
    assert seen == pytest.approx(losses, rel=1e-6)
    assert len([r for r in caplog.records if "fuse broken failed" in r.getMessage()]) == 1
    assert [e.action for e in mon.fuses.events] == ["failed"]
    assert frames[-1]["scalars"]["fuse.broken.state"] == -1
    assert "loss" in frames[-1]["scalars"]  # the monitor goes on


def test_a_fuse_that_cannot_apply_says_why_once(caplog) -> None:
    class Interleaved(nn.Module):  # GPT-NeoX's query_key_value: heads not recognised
        def __init__(self) -> None:
            super().__init__()
            self.query_key_value = nn.Linear(32, 96)
            self.num_heads = 4

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.query_key_value(x).view(b, t, 4, 24).transpose(1, 2).split(8, -1)
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, 32)

    model = Net()
    model.blocks[0] = Interleaved()
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        frames, mon = run(model, 3, [QKClip(tau=0.01, mode="auto")], lr=0.05, sample_every=1)
    lines = [r for r in caplog.records if "fuse qk_clip cannot apply" in r.getMessage()]
    assert len(lines) == 1 and "q/k projections found for 0" in lines[0].getMessage()
    assert frames[-1]["scalars"]["fuse.qk_clip.state"] == -1
    assert len(frames) == 3


def test_attach_checks_fuses() -> None:
    model = Net()
    with pytest.raises(ValueError, match="unknown fuse"):
        attach(model, run="r", fuses={"no_such_fuse": "auto"})
    with pytest.raises(ValueError, match="mode"):
        QKClip(mode="on")
    with pytest.raises(ValueError, match="named twice"):
        attach(model, run="r", fuses=[QKClip(), QKClip()])
    mon = attach(model, run="r")
    try:
        assert not mon.fuses  # off by default
    finally:
        mon.close()
    # a refused spec leaves nothing installed (the clip patch is the global one to check)
    import torch

    from logitwatch.hooks import _clip

    listeners, clip_fn = len(_clip._listeners), torch.nn.utils.clip_grad_norm_
    with pytest.raises((TypeError, ValueError)):
        attach(model, run="r", fuses={"no_such_fuse": "auto"})
    assert len(_clip._listeners) == listeners and torch.nn.utils.clip_grad_norm_ is clip_fn
    assert not model._forward_pre_hooks and not model._forward_hooks


# -- LR backoff ----------------------------------------------------------------------------


def test_lr_backoff_scales_and_restores_without_touching_the_schedule() -> None:
    model = Net()
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=1, fuses=[LRBackoff(factor=0.25, steps=4, shape="linear",
                                                  mode="auto")])
    used: list[float] = []
    opt.register_step_pre_hook(lambda o, a, k: used.append(o.param_groups[0]["lr"]))
    scheduled: list[float] = []
    for i in range(8):
        if i == 2:
            mon.fuses.apply("lr_backoff")
        scheduled.append(opt.param_groups[0]["lr"])
        model(IDS).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    mon.close()
    mult = [1, 1, 0.25, 0.4375, 0.625, 0.8125, 1, 1]  # applied before step 2's update
    assert used == pytest.approx([s * m for s, m in zip(scheduled, mult, strict=True)])
    assert sched.get_last_lr()[0] == pytest.approx(0.1 / 9)  # the schedule never saw it
    assert [f["scalars"]["lr"] for f in frames] == pytest.approx(used)  # effective lr
    assert [f["scalars"]["fuse.lr_backoff.multiplier"] for f in frames] == pytest.approx(mult)
    assert [e.action for e in mon.fuses.events] == ["backoff", "restored"]


def test_lr_backoff_on_an_alert_and_the_alert_carries_the_fuses() -> None:
    model = Net()
    client, frames = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    received: list[dict] = []
    client.on_alert(received.append)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=1, fuses=[LRBackoff(factor=0.5, steps=10, mode="auto"),
                                        QKClip(tau=1e6)])
    client._handle_answer({"alerts": [
        {"id": 1, "run": "r", "rule": "grad_norm_rising", "severity": "warning"},
        {"id": 2, "run": "r", "rule": "attn_logit_departure", "severity": "warning"}]})
    assert [f["fuse"] for f in received[0]["fuses"]] == ["lr_backoff"]
    assert received[0]["fuses"][0]["apply"]["control"] == {"fuses": {"lr_backoff": "apply"}}
    assert [f["fuse"] for f in received[1]["fuses"]] == ["lr_backoff", "qk_clip"]
    for _ in range(3):
        model(IDS).backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    assert frames[1]["scalars"]["lr"] == pytest.approx(0.05)  # the step after the alert
    assert opt.param_groups[0]["lr"] == 0.1
    assert [e.action for e in mon.fuses.events] == ["backoff"]
    assert mon.fuses.events[0].detail["reason"] == "alert grad_norm_rising"


# -- integrations ----------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_hf_and_lightning_callbacks_pass_fuses_through(tmp_path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("lightning.pytorch")
    from test_integrations import hf_trainer, lightning_fit

    from logitwatch.hooks.hf import LogitwatchCallback as HFCallback
    from logitwatch.hooks.lightning import LogitwatchCallback as PLCallback

    client, frames = capturing_client()
    callback = HFCallback(run="r", client=client, overhead_budget=None,
                          fuses={"qk_clip": {"tau": 0.01, "mode": "auto"}})
    hf_trainer(tmp_path, callback).train()  # type: ignore[attr-defined]
    # armed: steps 1-3 are measured max-only (no frame), the last step is sampled
    assert [f["step"] for f in frames] == [0, 4]
    assert frames[0]["scalars"]["fuse.qk_clip.heads"] == 8  # 2 layers x 4 heads
    assert frames[1]["scalars"]["fuse.qk_clip.steps"] == 4  # steps 1-4 clipped
    assert frames[1]["scalars"]["fuse.qk_clip.heads"] >= 4
    assert all(f["scalars"]["fuse.qk_clip.state"] == 2 for f in frames)

    client, frames = capturing_client()
    callback = PLCallback(run="r", client=client, overhead_budget=None,
                          fuses=[QKClip(tau=0.05, mode="auto", measure="full"),
                                 LRBackoff(factor=0.5, steps=50, mode="auto")])
    lightning_fit(callback)
    assert [f["step"] for f in frames] == [0, 1, 2]
    assert frames[0]["scalars"]["fuse.qk_clip.heads"] > 0
    assert frames[1]["scalars"]["fuse.lr_backoff.multiplier"] == 0.5
