"""QK-clip's calm schedule (docs/FUSES.md, QK-clip, *Cost*): acting, with every head far
under tau, the fuse measures every step for ``calm_steps`` measured steps, then one step in
``calm_every``; a measured max at or above ``calm * tau`` goes back to every step at once;
a clip is what it was; ``calm_every=1`` is the old schedule; the steps left out read
nothing back.

The model is test_fuses.py's (nanoGPT-style fused ``c_attn``, max logit about 32), SGD at
lr 0: only the test (scaling a head's q rows) and the fuse change the weights. Only step 0
is a monitor sample; the other measured steps are the max-only capture's, counted by its
``head_max`` calls (one a layer and step).
"""

from __future__ import annotations

import os

import pytest
import torch
from test_fuses import IDS, Net, capturing_client, run

from logitwatch.hooks import _capture, attach
from logitwatch.hooks._probes import CountSyncs
from logitwatch.hooks.fuses import QKClip, _calm
from logitwatch.hooks.fuses._calm import SLOTS, Calm

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TAU = 1e4  # the model's max logit is about 32: calm (under 5e3) from the start


class Trainer:
    """Steps a :class:`Net` under QK-clip, recording per step: measured max-only (the
    ``head_max`` calls), the host read-backs, the calm state at the step's end."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, clip: QKClip, layers: int = 1
                 ) -> None:
        self.model = Net(layers)
        self.clip = clip
        client, self.frames = capturing_client()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.0)
        self.mon = attach(self.model, self.opt, run="r", client=client, overhead_budget=None,
                          lm_head=False, fuses=[clip], sample_every=10_000)
        self.calls: list[int] = []  # the step index of each max-only call
        self.syncs: list[list[str]] = []
        self.calm: list[bool] = []
        self.clipped: list[int] = []  # the steps whose end changed the weights (lr 0: a clip)
        real = _capture.head_max

        def spy(*args, **kwargs):
            self.calls.append(self.mon.step_index)
            return real(*args, **kwargs)

        monkeypatch.setattr(_capture, "head_max", spy)

    def steps(self, n: int) -> None:
        for _ in range(n):
            before = [p.detach().clone() for p in self.model.parameters()]
            step = self.step
            with CountSyncs() as probe:
                loss = self.model(IDS)
                self.mon.log(loss=loss)
                loss.backward()
                self.opt.step()
                self.opt.zero_grad()
            self.syncs.append(probe.calls)
            self.calm.append(self.clip.calm_now)
            if any(not torch.equal(a, p) for a, p in zip(before, self.model.parameters(),
                                                         strict=True)):
                self.clipped.append(step)

    @property
    def step(self) -> int:
        return self.mon.step_index

    def scale_q(self, factor: float, head: int = 1, layer: int = 0) -> None:
        """Multiply one head's q rows and bias: its logits scale by ``factor``."""
        attn = self.model.blocks[layer].c_attn
        with torch.no_grad():
            attn.weight[8 * head:8 * head + 8].mul_(factor)
            attn.bias[8 * head:8 * head + 8].mul_(factor)

    def measured(self) -> list[int]:
        """The steps measured: step 0 (the monitor's sample) and the max-only ones."""
        return [0] + sorted(set(self.calls))

    def close(self) -> None:
        self.mon.close()


def test_calm_measures_every_step_then_one_in_calm_every(monkeypatch) -> None:
    t = Trainer(monkeypatch, QKClip(tau=TAU, mode="auto", calm_steps=20, calm_every=4),
                layers=2)
    t.steps(40)
    t.close()
    # steps 0-19 measured (20 calm readings, step 0 the monitor's sample), then 23, 27, ...
    assert t.measured() == list(range(20)) + [23, 27, 31, 35, 39]
    assert len(t.calls) == 2 * (19 + 5)  # one max-only pass a layer and measured step
    assert t.calm == [False] * 19 + [True] * 21
    # the steps left out read nothing back; steps 20+ are never sampled
    for s in range(20, 40):
        if s not in (23, 27, 31, 35, 39):
            assert t.syncs[s] == [], s
    assert t.clipped == []


def test_a_head_past_calm_tau_goes_back_to_every_step_at_once(monkeypatch) -> None:
    t = Trainer(monkeypatch, QKClip(tau=TAU, mode="auto"))
    t.steps(24)  # calm from step 19's end; step 23 measured
    assert t.calm[-1] and t.measured()[-1] == 23
    t.scale_q(200.0)  # about 6.3e3: past calm * tau (5e3), under tau
    t.steps(2)  # 24, 25 left out: still calm, nothing measured sees it
    assert t.calm[-1] and t.measured()[-1] == 23
    t.steps(4)  # 26, 27: 27 measured, not calm from its end; 28 and 29 measured
    assert t.measured()[-3:] == [27, 28, 29]
    assert t.calm[-4:] == [True, False, False, False]
    assert t.clipped == []  # under tau: no clip
    t.scale_q(1 / 200.0)  # calm again after calm_steps more readings
    t.steps(22)  # 30..51: readings 30-49 calm (20) -> calm from 49's end; 53 next
    t.close()
    assert t.measured()[-3:] == [47, 48, 49] and t.calm[-3:] == [True, True, True]


def test_a_clip_is_the_same_on_a_measured_step_and_waits_for_one(monkeypatch) -> None:
    """Past tau on a measured step: the clip is exactly what every-step measuring does
    (the next max exactly tau); past tau after a calm measurement: it waits for the next
    measured step (at most calm_every - 1 steps later), then clips the same way."""
    runs = {}
    for every in (4, 1):
        t = Trainer(monkeypatch, QKClip(tau=TAU, mode="auto", calm_every=every))
        t.steps(27)  # calm: 23 and 27 measured (calm_every 4); every step (calm_every 1)
        t.scale_q(400.0)  # about 1.26e4: past tau
        t.steps(1)  # step 27: measured in both
        assert t.clipped == [27]
        runs[every] = t
        t.close()
    a, b = runs[4], runs[1]
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    assert a.calm[-1] is False and b.calm == [False] * len(b.calm)
    assert b.measured() == list(range(28))  # calm_every=1: the old schedule

    late = Trainer(monkeypatch, QKClip(tau=TAU, mode="auto"))
    late.steps(24)  # 23 measured, calm
    late.scale_q(400.0)
    late.steps(3)  # 24, 25, 26 left out: no clip yet
    assert late.clipped == []
    late.steps(2)  # 27 measured: clipped (to exactly tau on that input); 28 measured
    late.close()
    assert late.clipped == [27]
    for pa, pb in zip(late.model.parameters(), a.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    assert late.measured()[-2:] == [27, 28]


def test_calm_every_1_keeps_every_step_and_the_frame_says_calm(monkeypatch) -> None:
    old = Trainer(monkeypatch, QKClip(tau=TAU, mode="auto", calm_every=1))
    old.steps(30)
    old.close()
    assert old.measured() == list(range(30)) and not any(old.calm)

    frames, _ = run(Net(), 31, [QKClip(tau=TAU, mode="auto")], sample_every=10)
    calm = {f["step"]: f["scalars"]["fuse.qk_clip.calm"] for f in frames}
    assert calm == {0: 0.0, 10: 0.0, 20: 1.0, 30: 1.0}


def test_suggest_and_undo_leave_calm_off(monkeypatch) -> None:
    t = Trainer(monkeypatch, QKClip(tau=TAU))  # suggest: measures only the samples
    t.steps(25)
    assert not any(t.calm) and t.calls == []
    t.mon.fuses.apply("qk_clip")
    t.steps(22)  # 25..46: 26-45 measured (20 readings: calm from 45's end), 46 left out
    assert t.measured()[1:] == list(range(26, 46)) and t.calm[-2:] == [True, True]
    t.mon.fuses.undo("qk_clip")
    assert not t.clip.calm_now
    t.close()


@pytest.mark.parametrize("kw", [{"calm": 0}, {"calm": 1.5}, {"calm": float("nan")},
                                {"calm_steps": 0}, {"calm_every": 0}, {"calm_every": 2.0},
                                {"calm_steps": True}])
def test_calm_options_are_checked(kw) -> None:
    with pytest.raises(ValueError):
        QKClip(**kw)


def test_calm_readings_nan_and_lost_slots() -> None:
    c = Calm(5.0, steps=2, every=3)
    c.measured([torch.tensor([1.0, 2.0])])
    c.measured([torch.tensor([4.9])])
    assert c.calm and c.skip() and c.skip() and not c.skip() and c.skip()
    c.measured([torch.tensor([1.0, float("nan")])])  # NaN: not calm
    assert not c.calm and c.run == 0 and not c.skip()
    c.measured([torch.tensor([1.0]), torch.tensor([5.0])])  # at the threshold: not calm
    assert c.run == 0
    assert Calm(5.0, steps=1, every=1).on is False
    mixed = Calm(5.0, steps=1, every=4)  # layers on several devices: every step for the run
    mixed.measured([torch.tensor([1.0]), torch.empty(1, device="meta")])
    assert not mixed.on and not mixed.calm and not mixed.skip()
    assert SLOTS >= 4


class _FakeSlot:
    """A staging slot whose copy completes when the test says (``done``)."""

    done = False

    def __init__(self, n: int) -> None:
        self.pinned = torch.empty(n)
        self.view = self.pinned.numpy()
        slot = self

        class Event:
            def record(self) -> None:
                slot.recorded = True

            def query(self) -> bool:
                return _FakeSlot.done

        self.event = Event()


def test_staged_readings_are_read_in_order_once_done_and_lost_when_all_in_flight(
        monkeypatch) -> None:
    """The accelerator path's bookkeeping (``_stage``/``poll``), CPU tensors in fake pinned
    slots: every step until a reading is read, readings in order, a lost one not calm."""
    monkeypatch.setattr(_calm, "_Slot", _FakeSlot)
    monkeypatch.setattr(_FakeSlot, "done", False)
    c = Calm(5.0, steps=2, every=4)
    c._stage(torch.tensor([1.0, 2.0]))
    c._stage(torch.tensor([3.0, 4.0]))
    c.poll()
    assert not c.calm and c.state()["pending"] == 2  # not read yet: every step
    assert not c.skip()
    _FakeSlot.done = True
    c.poll()
    assert c.calm and c.state()["pending"] == 0 and c.skip()
    _FakeSlot.done = False
    c._stage(torch.tensor([9.0, 1.0]))  # past the threshold, not read yet: still calm
    assert c.calm
    _FakeSlot.done = True
    c.poll()
    assert not c.calm and c.run == 0
    _FakeSlot.done = False
    for _ in range(SLOTS):
        c._stage(torch.tensor([1.0, 1.0]))
    c._stage(torch.tensor([1.0, 1.0]))  # every slot in flight: lost
    assert c.lost == 1 and c.state()["pending"] == SLOTS and not c.calm
    _FakeSlot.done = True
    c.poll()  # the readings before the lost one, then the loss: not calm
    assert not c.calm and c.run == 0
    c._stage(torch.tensor([1.0, 1.0]))
    c._stage(torch.tensor([1.0, 1.0]))
    c.poll()
    assert c.calm
    c._stage(torch.tensor([1.0, 1.0, 1.0]))  # another layer count: new slots, run restarts
    assert c.run == 0 and c.state()["pending"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_calm_on_cuda_reads_pinned_copies_without_a_sync() -> None:
    c = Calm(5.0, steps=3, every=4)
    c.measured([torch.tensor([1.0, 2.0], device="cuda")])  # makes the slots (numpy views)
    with CountSyncs() as probe:
        for _ in range(2):
            c.measured([torch.tensor([1.0, 2.0], device="cuda")])
        c.poll()
    assert probe.calls == []  # staged copies, event queries, host memory
    torch.cuda.synchronize()
    c.poll()
    assert c.calm and c.state()["pending"] == 0
    c.measured([torch.tensor([9.0], device="cuda")])  # another layer count: new slots
    torch.cuda.synchronize()
    c.poll()
    assert not c.calm
