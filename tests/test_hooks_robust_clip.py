"""A job that calls ``clip_grad_norm_`` more than once in a step (parameter groups clipped
apart, or the same parameters clipped twice): ``grad.norm`` is the norm of every clipped
parameter's gradient before its first clip, each counted once, on sampled steps and in the
history between them; ``grad.clipped`` is 1 when any call clipped, ``grad.clip_rate``
counts steps (not calls), ``grad.max_norm`` is the calls' common threshold. Before, the
last call's group norm was reported (and, the clip "seen", the global norm not computed).

The reference norms are computed here from the gradients before the job's first clip call,
in float64."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_history_hooks import Sink, tiny_lm

from logitwatch.hooks import attach
from logitwatch.hooks._probes import CountSyncs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Groups = Callable[[Any], list[list[torch.Tensor]]]


def split(model: Any) -> list[list[torch.Tensor]]:
    """The embedding apart from the rest: two disjoint groups."""
    return [[model.emb.weight], [p for n, p in model.named_parameters() if n != "emb.weight"]]


def twice(model: Any) -> list[list[torch.Tensor]]:
    """All parameters, clipped twice (a helper that clips, then the loop again)."""
    return [list(model.parameters()), list(model.parameters())]


def overlap(model: Any) -> list[list[torch.Tensor]]:
    """Two groups sharing ``qkv.weight``."""
    return [[model.emb.weight, model.qkv.weight],
            [model.qkv.weight, model.qkv.bias, model.out.weight, model.out.bias]]


def per_parameter(model: Any) -> list[list[torch.Tensor]]:
    """Each parameter clipped on its own (six calls a step)."""
    return [[p] for p in model.parameters()]


def reference(groups: list[list[torch.Tensor]], norm_type: float) -> torch.Tensor:
    """The norm of every listed parameter's gradient (each once), float64, not read yet."""
    params = list({id(p): p for g in groups for p in g}.values())
    norms = torch.stack([torch.linalg.vector_norm(p.grad.double(), norm_type) for p in params])
    return torch.linalg.vector_norm(norms, norm_type)


def run(groups_of: Groups, max_norms: list[float], *, steps: int = 8, every: int = 3,
        norm_type: float = 2.0, optimizer: bool = True, monitor: bool = True,
        ) -> tuple[list[dict[str, Any]], Sink, Any]:
    """Train ``steps`` steps clipping the groups with ``max_norms`` (cycled); per step the
    reference norm, whether any call clipped, the host reads made, and the model."""
    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    sink = Sink()
    mon = None
    if monitor:
        mon = attach(model, opt if optimizer else None, run="h", client=sink.client,
                     sample_every=every, overhead_budget=None, history_every=None)
    gen = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(steps):
        ids = torch.randint(0, 48, (2, 12), generator=gen)
        with CountSyncs() as syncs:  # the whole step; the test's own reads come after it
            model(ids).loss.backward()
            groups = groups_of(model)
            want = reference(groups, norm_type)
            hits = []
            for i, group in enumerate(groups):
                limit = max_norms[i % len(max_norms)]
                got = torch.nn.utils.clip_grad_norm_(group, limit, norm_type=norm_type)
                hits.append(got > limit)  # as the device compares
            if optimizer:
                opt.step()
                opt.zero_grad()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.3 * p.grad
                model.zero_grad()
                if mon is not None:
                    mon.step()
        seen.append({"norm": float(want), "clipped": float(any(bool(h) for h in hits)),
                     "syncs": syncs.calls})
    if mon is not None:
        mon.close()
    return seen, sink, model


def check_every_step(seen: list[dict[str, Any]], sink: Sink, rel: float = 1e-6) -> None:
    norms, flags = sink.every_step("grad.norm"), sink.every_step("grad.clipped")
    assert sorted(norms) == list(range(len(seen)))
    for step, want in enumerate(seen):
        assert norms[step] == pytest.approx(want["norm"], rel=rel), step
        assert flags[step] == want["clipped"], step
    sampled = set(sink.sampled())
    for step, want in enumerate(seen):
        if step not in sampled:
            assert want["syncs"] == [], step  # nothing read back between samples


@pytest.mark.parametrize("groups_of", [split, overlap, per_parameter],
                         ids=["split", "overlap", "per_parameter"])
def test_the_norm_of_groups_clipped_apart_is_the_global_one(groups_of: Groups) -> None:
    seen, sink, model = run(groups_of, [0.4])
    assert {s["clipped"] for s in seen} == {1.0}  # the test clips: a pre-clip norm matters
    check_every_step(seen, sink)
    for frame in sink.frames:
        if frame["step"] in sink.sampled():
            assert frame["scalars"]["grad.max_norm"] == pytest.approx(0.4)
    # the monitor changed nothing in training
    _, _, plain = run(groups_of, [0.4], monitor=False)
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_same_parameters_clipped_twice_count_once() -> None:
    """The second call sees gradients the first clipped: its norm is not added."""
    seen, sink, _ = run(twice, [0.4])
    check_every_step(seen, sink)


def test_a_norm_read_with_an_infinite_max_norm_then_a_clip() -> None:
    """``clip_grad_norm_(params, inf)`` to read the norm, then the real clip: the norm is
    the first call's, the flag and the threshold the clip's."""
    seen, sink, _ = run(twice, [math.inf, 0.4])
    assert {s["clipped"] for s in seen} == {1.0}
    check_every_step(seen, sink)
    for frame in sink.frames:
        if frame["step"] in sink.sampled():
            assert frame["scalars"]["grad.max_norm"] == pytest.approx(0.4)


def test_the_clip_flag_is_any_call_and_the_rate_counts_steps() -> None:
    """Only the embedding's group clips (0.02), the rest never does (100): every step is
    clipped, the rate is 1 (it read 0.5 between samples when it counted calls), and no
    ``grad.max_norm`` is sent: no single threshold applies to the combined norm."""
    seen, sink, _ = run(split, [0.02, 100.0], steps=9, every=4)
    assert [s["clipped"] for s in seen] == [1.0] * 9
    check_every_step(seen, sink)
    frames = [f for f in sink.frames if f["step"] in sink.sampled()]
    assert [f["step"] for f in frames] == [0, 4, 8]
    for frame in frames:
        assert frame["scalars"]["grad.clip_rate"] == 1.0
        assert "grad.max_norm" not in frame["scalars"]


def test_an_infinity_norm_combines_as_the_max() -> None:
    # the largest gradient entry is in the first group clipped (``out.weight``)
    seen, sink, _ = run(lambda m: split(m)[::-1], [0.05], norm_type=math.inf)
    check_every_step(seen, sink)


def test_without_an_optimizer_the_calls_combine_at_once() -> None:
    seen, sink, _ = run(split, [0.4], optimizer=False)
    check_every_step(seen, sink)


def test_one_call_a_step_is_reported_as_the_call_returned() -> None:
    """The common case is unchanged: the value is the clip call's own, bit for bit."""
    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    sink = Sink()
    gen = torch.Generator().manual_seed(1)
    returned = []
    with attach(model, opt, run="h", client=sink.client, sample_every=3,
                overhead_budget=None, history_every=None):
        for _ in range(7):
            model(torch.randint(0, 48, (2, 12), generator=gen)).loss.backward()
            returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.4)))
            opt.step()
            opt.zero_grad()
    norms = sink.every_step("grad.norm")
    assert [norms[i] for i in range(7)] == returned


def test_clip_calls_with_new_gradients_between_them_start_the_step_over() -> None:
    """A clip after each micro-batch (gradient accumulation), and one before the first step:
    a forward between two calls means new gradients, so the step's norm is its last call's
    (what the job's update used), as before calls were combined, not its first call's."""
    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=2,
                 overhead_budget=None, history_every=None)
    gen = torch.Generator().manual_seed(1)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # no gradient yet: 0
    last = []
    for _ in range(5):
        # three micro-batches, clipped after each backward: the first two far over the
        # threshold (clipped), the last adding nothing, so its call, which the step's flag
        # is, sees the clipped sum just under 1.0 and does not clip
        for scale in (100.0, 100.0, 0.0):
            (model(torch.randint(0, 48, (2, 12), generator=gen)).loss * scale).backward()
            got = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        assert float(got) <= 1.0
        last.append(float(got))
        opt.step()
        opt.zero_grad()
    mon.close()
    norms = sink.every_step("grad.norm")
    assert [norms[s] for s in range(5)] == pytest.approx(last, rel=1e-6)
    rates = [f["scalars"]["grad.clip_rate"] for f in sink.frames
             if "grad.clip_rate" in f["scalars"]]
    # the earlier calls' flags left the count: one unclipped count a step
    assert rates and all(r == 0.0 for r in rates)


def test_many_clip_calls_without_an_optimizer_are_combined_once_a_step() -> None:
    """A monitor without an optimizer hook (the Lightning callback) and a job clipping each
    of 40 parameters apart: the step's calls are combined once, at ``Monitor.step()``, not
    again at every call (which cost the square of their number: 309 ms a step at 400
    parameters against 16 unmonitored)."""
    from torch.overrides import TorchFunctionMode

    class Stacks(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.n += getattr(func, "__name__", "") == "stack"
            return func(*args, **(kwargs or {}))

    def steps(monitored: bool) -> tuple[int, list[float]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(4, 4, bias=False) for _ in range(40)])
        sink = Sink()
        mon = attach(model, None, run="h", client=sink.client, sample_every=1000,
                     overhead_budget=None, history_every=None) if monitored else None
        x = torch.randn(2, 4)
        count = Stacks()
        total = []
        for i in range(4):
            model(x).sum().backward()
            with count if i == 3 else contextlib.nullcontext():
                norms = [torch.nn.utils.clip_grad_norm_([p], 1.0) for p in model.parameters()]
                if mon is not None:
                    mon.step()
            total.append(float(torch.linalg.vector_norm(torch.stack(norms))))
            model.zero_grad()
        if mon is not None:
            mon.close()
            got = sink.every_step("grad.norm")
            assert [got[s] for s in range(4)] == pytest.approx(total, rel=1e-5)
        return count.n, total

    plain, _ = steps(False)
    watched, _ = steps(True)
    assert watched - plain <= 2, (watched, plain)
