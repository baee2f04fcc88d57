"""The rollback fuse on a real tiny model (docs/FUSES.md, *Rollback and skip*): after a
rollback the weights, optimizer state, scheduler and RNG equal the snapshot exactly; bad
batches and an LR spike that diverge the run without the fuse are survived with it (the
batches skipped are the bad ones); the snapshots are copies; memory stays in the budget;
suggest, apply and undo; on disk; the HF and Lightning callbacks."""

from __future__ import annotations

import copy
import logging
import math
import os
import random

import pytest
import torch
from test_fuses import Net, capturing_client

from logitwatch.hooks import attach
from logitwatch.hooks.fuses import Rollback

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GEN = torch.Generator().manual_seed(3)
BATCHES = [torch.randint(0, 64, (4, 12), generator=GEN) for _ in range(80)]


def state_of(model, opt, sched) -> dict:
    return {"model": copy.deepcopy(model.state_dict()),
            "opt": copy.deepcopy(opt.state_dict()),
            "sched": copy.deepcopy(sched.state_dict()) if sched is not None else None,
            "rng": torch.get_rng_state().clone(), "py": random.getstate()}


def assert_same(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["opt"]["state"], b["opt"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for k in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])), (i, k)
    assert a["opt"]["param_groups"] == b["opt"]["param_groups"]
    assert a["sched"] == b["sched"]
    assert torch.equal(a["rng"], b["rng"]) and a["py"] == b["py"]


def test_rollback_restores_the_snapshot_exactly() -> None:
    model = Net()
    client, frames = capturing_client()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
    fuse = Rollback(every=5, keep=2, back=5, skip=3, mode="auto", scheduler=sched)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=4, fuses=[fuse])
    seen: dict[int, dict] = {}
    opt.register_step_post_hook(  # after the monitor's: the state the fuse copied
        lambda o, a, k: seen.setdefault(mon.step_index - 1, state_of(model, opt, sched)))
    for i in range(13):
        torch.manual_seed(100 + i)  # the RNG moves with training
        random.random()
        loss = model(BATCHES[i])
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    assert [s.step for s in fuse.ring] == [5, 10]
    before = state_of(model, opt, sched)
    mon.fuses.apply("rollback")  # a person, between steps 12 and 13
    assert_same(state_of(model, opt, sched), seen[5])  # 13 - 5 >= back: snapshot 5
    assert [s.step for s in fuse.ring] == [5]  # the discarded trajectory's are dropped
    assert mon.fuses.rollback_pending() == {"from_step": 13, "to_step": 5, "skip": 3}
    assert mon.fuses.rollback_pending() is None
    for _ in range(3):
        assert mon.fuses.skip_batch()
    assert not mon.fuses.skip_batch()
    for i in range(3):  # training on does not change the snapshot: it is a copy
        model(BATCHES[i]).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    kept = fuse.ring.items[0].state["model"]
    assert all(torch.equal(kept[k], v) for k, v in seen[5]["model"].items())
    assert not torch.equal(kept["head.weight"], model.head.weight.detach())
    # undo: back to the state before the rollback (kept: undo_state)
    mon.fuses.undo("rollback")
    assert_same(state_of(model, opt, sched), before)
    mon.close()
    actions = [e.action for e in mon.fuses.events]
    assert actions == ["armed", "rollback", "skipped", "undo"]
    rb = mon.fuses.events[1].detail
    assert rb["to_step"] == 5 and rb["steps_lost"] == 8 and rb["undo"] is True


def train_bad(fuses, *, sample_every: int, honour: bool, spike: bool, steps: int = 70):
    """SGD on a stream where steps 30-39 are bad: a corrupted batch (its loss 1e6 times
    too large) or an LR spike (x1000, by the loop's own step counter, which never
    rewinds). Returns (losses, skipped batch indices, monitor)."""
    torch.manual_seed(0)
    model = Net()
    client, _ = capturing_client()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=sample_every, fuses=fuses)
    losses, skipped = [], []
    for i in range(steps):
        if honour and mon.fuses.skip_batch():
            skipped.append(i)
            continue
        if not honour and mon.fuses and mon.fuses["rollback"].skipping:
            skipped.append(i)  # its update will be dropped
        bad = 30 <= i < 40
        opt.param_groups[0]["lr"] = 50.0 if bad and spike else 0.05
        loss = model(BATCHES[i])
        losses.append(float(loss.detach()))
        mon.log(loss=loss)
        (loss * (1e6 if bad and not spike else 1.0)).backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    return losses, skipped, mon


@pytest.mark.parametrize("sample_every", [1, 1000])
@pytest.mark.parametrize("spike", [False, True], ids=["bad-batches", "lr-spike"])
def test_a_diverging_run_is_survived_and_the_bad_batches_skipped(sample_every, spike) -> None:
    plain, _, _ = train_bad(None, sample_every=sample_every, honour=True, spike=spike)
    assert not math.isfinite(plain[-1])  # diverged without the fuse
    healthy = Net()  # the healthy twin: the same stream without the bad steps
    opt = torch.optim.SGD(healthy.parameters(), lr=0.05)
    for i in [i for i in range(70) if not 30 <= i < 40]:
        healthy(BATCHES[i]).backward()
        opt.step()
        opt.zero_grad()
    twin = float(healthy(BATCHES[69]).detach())
    # a loop that skips (honour) and one that does not (the update is dropped)
    for honour in (True, False):
        fuse = Rollback(every=10, keep=2, back=10, skip=12, mode="auto")
        losses, skipped, mon = train_bad([fuse], sample_every=sample_every, honour=honour,
                                         spike=spike)
        rb = [e for e in mon.fuses.events if e.action == "rollback"]
        assert len(rb) == 1, [e.as_dict() for e in mon.fuses.events]
        at = rb[0].step
        assert 30 <= at <= 34  # the first non-finite loss after a bad update
        assert rb[0].detail["to_step"] == 20  # 10+ steps back, before the bad steps
        assert skipped == list(range(at + 1, at + 13))  # the rest of the bad ones
        assert set(range(30, 40)) <= {*range(30, at + 1), *skipped}
        assert all(math.isfinite(x) for x in losses[-20:])
        final = float(mon.model(BATCHES[69]).detach())
        assert final == pytest.approx(twin, rel=0.1), (honour, final, twin)


def test_memory_stays_within_the_budget_and_is_reported() -> None:
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    one = params * 3 + 4 * len(list(model.parameters()))  # weights, two moments, steps
    client, frames = capturing_client()
    fuse = Rollback(every=2, keep=5, budget=int(2.5 * one), mode="auto")
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=1, fuses=[fuse])
    for i in range(14):
        model(BATCHES[i]).backward()
        opt.step()
        opt.zero_grad()
        assert fuse.ring.bytes <= fuse.budget
    mon.fuses.apply("rollback")  # the undo copy fits: 2 + 1 snapshots > 2.5: not kept
    mon.close()
    assert fuse.snapshot_bytes == one  # measured exactly: the copies' bytes
    assert len(fuse.ring) <= 2 and fuse.peak_bytes <= fuse.budget
    assert mon.fuses.events[-1].detail["undo"] is False
    assert max(f["scalars"]["fuse.rollback.bytes"] for f in frames) == 2 * one
    assert frames[-1]["scalars"]["fuse.rollback.snapshots"] == 2

    small = Rollback(budget=one // 2, mode="auto")  # not even one fits: says so once
    client, frames = capturing_client()
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=1, fuses=[small])
    for i in range(3):
        model(BATCHES[i]).backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    assert frames[-1]["scalars"]["fuse.rollback.state"] == -1 and len(small.ring) == 0
    assert [e.action for e in mon.fuses.events] == ["unavailable"]  # nothing copied


def test_suggest_mode_keeps_snapshots_and_only_suggests(caplog) -> None:
    losses = []
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        losses, _, mon = train_bad([Rollback(every=10, back=10)], sample_every=1000,
                                   honour=True, spike=False)
    fuse = mon.fuses["rollback"]
    assert not math.isfinite(losses[-1])  # nothing done
    assert [e.action for e in mon.fuses.events][:2] == ["armed", "suggest"]
    assert len(fuse.ring) == 2
    assert len([r for r in caplog.records if "would roll back" in r.getMessage()]) == 1


def test_an_alert_triggers_it_and_carries_it() -> None:
    model = Net()
    client, _ = capturing_client()
    received: list[dict] = []
    client.on_alert(received.append)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 fuses=[Rollback(every=2, back=2, skip=1, mode="auto")])
    for i in range(6):
        if i == 5:
            client._handle_answer({"alerts": [
                {"id": 1, "run": "r", "rule": "loss_jump", "severity": "warning"},
                {"id": 2, "run": "r", "rule": "grad_blowup", "severity": "critical"}]})
        model(BATCHES[i]).backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    assert [f["fuse"] for f in received[0]["fuses"]] == ["rollback"]
    rb = [e for e in mon.fuses.events if e.action == "rollback"]
    assert len(rb) == 1 and rb[0].detail["reason"] == "alert grad_blowup"  # critical only
    assert rb[0].step == 5 and rb[0].detail["to_step"] == 2


def test_snapshots_on_disk(tmp_path) -> None:
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fuse = Rollback(every=3, keep=2, back=3, skip=0, mode="auto", path=str(tmp_path))
    client, _ = capturing_client()
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 fuses=[fuse])
    seen: dict[int, dict] = {}
    opt.register_step_post_hook(
        lambda o, a, k: seen.setdefault(mon.step_index - 1, state_of(model, opt, None)))
    for i in range(8):
        model(BATCHES[i]).backward()
        opt.step()
        opt.zero_grad()
    assert len(os.listdir(tmp_path)) == 2 and fuse.ring.bytes == 0
    mon.fuses.apply("rollback")
    mon.close()
    assert_same(state_of(model, opt, None), {**seen[3], "rng": torch.get_rng_state(),
                                             "py": random.getstate()})
    names = os.listdir(tmp_path)  # snapshot 6 dropped with its trajectory; the undo copy
    assert len(names) == 2 and sum(n.startswith("rollback-undo-") for n in names) == 1


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_hf_and_lightning_callbacks_roll_back_and_drop_updates(tmp_path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("lightning.pytorch")
    from test_integrations import hf_trainer, lightning_fit

    from logitwatch.hooks.hf import LogitwatchCallback as HFCallback
    from logitwatch.hooks.lightning import LogitwatchCallback as PLCallback

    # loss_limit 0: the first loss triggers it; limit 1: once
    client, _ = capturing_client()
    fuse = Rollback(every=1, keep=2, back=1, skip=2, mode="auto", loss_limit=0.0, limit=1)
    callback = HFCallback(run="r", client=client, overhead_budget=None, fuses=[fuse])
    trainer = hf_trainer(tmp_path, callback)
    trainer.train()  # type: ignore[attr-defined]
    assert fuse.scheduler is trainer.lr_scheduler  # type: ignore[attr-defined]
    actions = [e.action for e in callback.monitor.fuses.events] if callback.monitor else None
    events = [e.action for e in fuse.fuses.events]  # type: ignore[union-attr]
    assert actions is None and events[:3] == ["armed", "rollback", "skipped"]
    assert fuse.skipped == 2

    client, _ = capturing_client()
    fuse = Rollback(every=1, keep=2, back=1, skip=1, mode="auto", loss_limit=0.0, limit=1)
    lightning_fit(PLCallback(run="r", client=client, overhead_budget=None, fuses=[fuse]))
    events = [e.action for e in fuse.fuses.events]  # type: ignore[union-attr]
    assert events[:3] == ["armed", "rollback", "skipped"] and fuse.skipped == 1


@pytest.mark.parametrize("on_disk,undo_rollback", [(False, False), (True, False),
                                                   (False, True)])
def test_a_qk_clip_undone_after_a_rollback_gives_back_the_weights(tmp_path, on_disk,
                                                                   undo_rollback) -> None:
    """QK-clip scales heads at step 3; a rollback restores the weights of step 2, before
    the clip; undoing QK-clip then must leave those weights as they are. Its factors used
    to stay those of the clip, and the undo divided the restored heads by them: W_q 3.3-4x
    its size (found by an audit). The snapshot keeps the fuses' factors with the weights.
    Undoing the rollback gives back the clipped weights and their factors too."""
    from test_fuses import IDS

    from logitwatch.hooks.fuses import QKClip

    torch.manual_seed(0)
    m = Net(layers=1, std=0.5)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)  # lr 0: only the fuses move the weights
    rollback = Rollback(every=1, keep=5, back=4, mode="suggest",
                        path=str(tmp_path) if on_disk else None)
    mon = attach(m, opt, run="r", url=None, sample_every=1, overhead_budget=None,
                 lm_head=False, fuses=[QKClip(tau=2.0, mode="suggest"), rollback])
    try:
        def q() -> torch.Tensor:
            return m.blocks[0].c_attn.weight[:32].detach().clone()

        w0 = q()
        for s in range(6):
            if s == 3:
                mon.fuses.apply("qk_clip")
            m(IDS).backward()
            opt.step()
            opt.zero_grad()
        clipped = q()
        assert (clipped / w0).max() < 0.5  # every head clipped
        mon.fuses.apply("rollback")
        assert torch.allclose(q(), w0)
        if undo_rollback:  # back to the clipped weights, with the clip's factors
            mon.fuses.undo("rollback")
            assert torch.allclose(q(), clipped)
        mon.fuses.undo("qk_clip")
        assert torch.allclose(q(), w0)
        assert not any(f.failed for f in mon.fuses)
    finally:
        mon.close()


def test_a_qk_clip_that_became_unavailable_can_still_be_undone() -> None:
    """QK-clip (auto) scales heads, then the monitor's attention capture goes off (any
    later failure of the part it reads): the fuse is unavailable, and its undo used to be
    refused, the heads left scaled for good. It scales them back."""
    from test_fuses import IDS

    from logitwatch.hooks.fuses import QKClip

    torch.manual_seed(0)
    m = Net(layers=1, std=0.5)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    mon = attach(m, opt, run="r", url=None, sample_every=1, overhead_budget=None,
                 lm_head=False, fuses=[QKClip(tau=2.0, mode="auto")])
    try:
        w0 = m.blocks[0].c_attn.weight[:32].detach().clone()
        for s in range(3):
            if s == 2:
                mon.disabled.add("attention")  # the attention part failed
            m(IDS).backward()
            opt.step()
            opt.zero_grad()
        fuse = mon.fuses["qk_clip"]
        assert fuse.unavailable is not None
        assert (m.blocks[0].c_attn.weight[:32] / w0).max() < 0.5
        mon.fuses.undo("qk_clip")
        assert torch.allclose(m.blocks[0].c_attn.weight[:32], w0)
    finally:
        mon.close()
