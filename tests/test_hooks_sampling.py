"""How many samples a run gets: the interval's ceiling, what counts as cost, the last step.

No wall time is asserted: the cost meter is driven with explicit timestamps and host
times, and the monitor's schedule is checked with budgets whose outcome does not depend on
how loaded the machine is.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from logitwatch.client import Client
from logitwatch.hooks import attach
from logitwatch.hooks._cost import MAX_INTERVAL, CostMeter

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def capturing_client() -> tuple[Client, list[dict]]:
    frames: list[dict] = []
    client = Client(None, run="r")
    client.send = lambda step, scalars, heads, time=None, history=None: frames.append(  # type: ignore
        {"step": step, "scalars": scalars, "heads": heads, "history": history})
    return client, frames


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(32, 16)
        self.q_proj, self.k_proj = nn.Linear(16, 16), nn.Linear(16, 16)
        self.num_heads = 2
        self.lm_head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, 2, 8).transpose(1, 2)
        k = self.k_proj(x).view(b, t, 2, 8).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, k, is_causal=True)
        return self.lm_head(x + y.transpose(1, 2).reshape(b, t, 16))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, mon=None,
          between=None) -> list:
    """``steps`` steps on random tokens, clipped at 0.3; ``between(i)`` after step ``i``.
    Returns each step's (loss, gradient norm)."""
    gen = torch.Generator().manual_seed(1)
    seen = []
    for i in range(steps):
        ids = torch.randint(0, 32, (2, 8), generator=gen)
        loss = F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1))
        loss.backward()
        if mon is not None:
            mon.log(loss=loss)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
        opt.step()
        opt.zero_grad()
        seen.append((loss.item(), norm.item()))
        if between is not None:
            between(i)
    return seen


def test_the_interval_has_a_ceiling() -> None:
    meter = CostMeter(budget=0.01)
    meter.step_end(False, 0.0)
    meter.step_end(True, 0.0)  # warm-up
    now = 0.0
    for _ in range(5):
        now += 0.1
        meter.step_end(False, now)
    meter.add_host(1.0)  # a sampled step whose hooks took 1 s of CPU: 1000x the budget
    now += 1.1
    meter.step_end(True, now)
    assert MAX_INTERVAL == 50
    assert meter.interval(10) == 50
    assert meter.interval(80) == 80  # a wider requested interval is kept
    assert meter.overhead(50) == pytest.approx(0.2)  # what the ceiling costs, reported
    narrow = CostMeter(budget=0.01, max_interval=20)
    narrow._extra.append(1.0), narrow._plain.extend([0.1] * 3)
    assert narrow.interval(10) == 20


def test_cost_on_cpu_is_the_hooks_thread_time_not_a_slow_wall_clock() -> None:
    """A busy machine stretches the sampled step's wall duration (here 0.9 s over plain
    0.1 s steps) while the hooks used 5 ms of CPU: on CPU the budget sees the 5 ms;
    with the statistics on an accelerator the step's extra duration counts."""
    for device_work, expected in ((False, 5), (True, 900)):
        meter = CostMeter(budget=0.01, device_work=device_work, max_interval=10_000)
        meter.step_end(False, 0.0)
        meter.step_end(True, 0.0)
        now = 0.0
        for _ in range(5):
            now += 0.1
            meter.step_end(False, now)
        meter.add_host(0.005)
        now += 1.0
        meter.step_end(True, now)
        assert meter.last_extra == pytest.approx(0.005 if not device_work else 0.9)
        assert meter.interval(1) == expected


def test_the_budget_never_widens_past_the_ceiling_in_a_run() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client, frames = capturing_client()
    # any cost exceeds this budget, so the interval goes to the ceiling, whatever the load
    mon = attach(model, opt, run="r", client=client, sample_every=1, overhead_budget=1e-9,
                 max_sample_every=4)
    train(model, opt, 20, mon)
    mon.close()
    steps = [f["step"] for f in frames]
    assert max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= 4
    assert mon.effective_sample_every == 4
    with pytest.raises(ValueError, match="max_sample_every"):
        attach(model, run="r", max_sample_every=0)


def test_close_sends_the_unsampled_last_step_as_a_closing_frame() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client, frames = capturing_client()
    mon = attach(model, opt, run="r", client=client, sample_every=4, overhead_budget=None)
    seen = train(model, opt, 7, mon)  # steps 0 and 4 sampled; 5 and 6 not
    mon.close()
    assert [f["step"] for f in frames] == [0, 4, 6]
    closing = frames[-1]
    s = closing["scalars"]
    assert s["hooks.closing"] == 1.0
    assert s["loss"] == seen[6][0] and s["grad.norm"] == pytest.approx(seen[6][1], rel=1e-6)
    assert s["grad.clipped"] == float(seen[6][1] > 0.3) and s["lr"] == 0.01
    assert closing["history"]["steps"] == [5]
    assert closing["history"]["scalars"]["loss"] == [seen[5][0]]
    # q/k norms of the weights as the last update left them; no attention (it did not run)
    heads = closing["heads"]
    assert set(heads) == {"qk.q_weight_norm", "qk.k_weight_norm", "qk.q_bias_norm",
                          "qk.k_bias_norm"}
    w = model.q_proj.weight.detach()
    np.testing.assert_allclose(heads["qk.q_weight_norm"][0],
                               [w[:8].norm().item(), w[8:].norm().item()], rtol=1e-6)


def test_close_after_a_sampled_last_step_sends_nothing_more() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client, frames = capturing_client()
    mon = attach(model, opt, run="r", client=client, sample_every=10, overhead_budget=None)
    mon.request_sample_at(5)  # e.g. the run's known last step
    mon.request_sample_at(0)  # already started: ignored
    train(model, opt, 6, mon)
    mon.close()
    assert [f["step"] for f in frames] == [0, 5]
    assert "hooks.closing" not in frames[-1]["scalars"]
    assert "attn.logit_max" in frames[-1]["heads"]
    assert frames[-1]["history"]["steps"] == [1, 2, 3, 4]
    with pytest.raises(TypeError):
        mon.request_sample_at(1.5)  # type: ignore[arg-type]


# -- the schedule at run time, the clip rate, the cost meter --------------------------------


def test_sampling_changes_at_run_time_and_on_demand() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client, frames = capturing_client()
    mon = attach(model, opt, run="r", client=client, sample_every=4, overhead_budget=None)

    def between(i: int) -> None:
        if i == 4:
            mon.sample_every = 2  # from the next scheduling decision on
        if i == 9:
            mon.request_sample()  # step 10 sampled although 8 + 4 > 10

    train(model, opt, 11, mon, between)
    mon.sample_every = 4
    train(model, opt, 3, mon)
    mon.close()
    # then 14, after the last step: close() sends step 13 as a closing frame
    assert [f["step"] for f in frames] == [0, 4, 6, 8, 10, 13]
    assert [f["scalars"]["hooks.sample_every"] for f in frames] == [4, 4, 2, 2, 2, 4]
    assert frames[-1]["scalars"]["hooks.closing"] == 1.0
    with pytest.raises(ValueError, match="sample_every"):
        mon.sample_every = 0


def test_clip_rate_counts_every_step_on_the_device() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client, frames = capturing_client()
    norms: list[float] = []
    original = torch.nn.utils.clip_grad_norm_
    with attach(model, opt, run="r", client=client, sample_every=3, overhead_budget=None):
        wrapped = torch.nn.utils.clip_grad_norm_

        def spy(params, max_norm, *a, **k):
            total = wrapped(params, max_norm, *a, **k)
            norms.append(total.item())
            return total

        torch.nn.utils.clip_grad_norm_ = spy
        try:
            train(model, opt, 6)
        finally:
            torch.nn.utils.clip_grad_norm_ = wrapped
    assert torch.nn.utils.clip_grad_norm_ is original
    hits = [n > 0.3 for n in norms]
    assert [f["step"] for f in frames] == [0, 3, 5]  # 5: close()'s closing frame
    assert frames[0]["scalars"]["grad.clip_rate"] == float(hits[0])
    assert frames[1]["scalars"]["grad.clip_rate"] == pytest.approx(sum(hits[1:4]) / 3)


def test_cost_meter_widens_and_narrows_the_interval() -> None:
    # on an accelerator the extra cost is the sampled step's duration over plain ones
    meter = CostMeter(budget=0.01, device_work=True)
    now = 0.0
    meter.step_end(False, now)  # the clock starts
    meter.step_end(True, now)  # the first sampled step is warm-up: not measured
    for _ in range(5):  # plain steps of 100 ms
        now += 0.1
        meter.step_end(False, now)
    now += 0.1 + 0.05  # a sampled step costing 50 ms extra
    meter.step_end(True, now)
    assert meter.interval(10) == 50  # 50 ms / (1 % of 100 ms)
    assert meter.overhead(50) == pytest.approx(0.01)
    for _ in range(5):  # sampled steps got cheap again (the median of the last 5 is used)
        now += 0.1 + 0.001
        meter.step_end(True, now)
    assert meter.interval(10) == 10
    assert CostMeter(budget=None).interval(7) == 7


def test_the_budget_is_on_by_default_and_off_for_an_explicit_interval() -> None:
    model = Tiny()
    with attach(model, run="r") as mon:
        assert mon.sample_every == 10 and mon.overhead_budget == 0.01
    with attach(model, run="r", sample_every=4) as mon:
        assert mon.sample_every == 4 and mon.overhead_budget is None
    with attach(model, run="r", sample_every=4, overhead_budget=0.05) as mon:
        assert mon.overhead_budget == 0.05
        mon.overhead_budget = None
        assert mon.overhead_budget is None
    with pytest.raises(ValueError, match="overhead_budget"):
        attach(model, run="r", overhead_budget=2.0)


def test_overhead_budget_reports_cost_and_widens() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client, frames = capturing_client()
    # a budget no measured step can meet (any cost > 0 exceeds it), so the outcome does not
    # depend on how loaded the machine is
    mon = attach(model, opt, run="r", client=client, sample_every=1, overhead_budget=1e-9)
    train(model, opt, 20, mon)
    assert mon.effective_sample_every > 1 and len(frames) < 20  # widened after measuring
    for _ in range(2):  # on demand: the next step is measured whatever the interval; a
        mon.request_sample()  # frame reports the cost measured on the sampled step before it
        train(model, opt, 1, mon)
    mon.close()
    last = frames[-1]["scalars"]
    assert {"hooks.host_ms", "hooks.cost_ms", "hooks.bytes", "hooks.sample_every",
            "hooks.syncs"} <= set(last)
    assert last["hooks.sample_every"] > 1
    assert last["hooks.syncs"] == 0.0  # CPU tensors: nothing to transfer
    assert last["hooks.bytes"] > 0 and last["hooks.host_ms"] > 0
