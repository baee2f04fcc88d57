"""logitwatch.hooks in the training loop on the tiny model: the sampling interval the
collector asks for, eval and no-grad forwards, micro-batches, a failing part, an exception
in forward, a loop without an optimizer, attach's argument checks."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from logitwatch.client import Client
from logitwatch.hooks import Monitor, _capture, _frames, _optimizer_step, attach
from logitwatch.hooks._attach import resolve_rank
from tests.hooks_tiny import (
    COST,
    FINAL,
    VOCAB,
    TinyLM,
    assert_frame_matches,
    batches,
    keys,
    reference,
    train_tiny,
    watch,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_sampling_interval_follows_control(recorder) -> None:
    rec, client = recorder
    rec.control = {"sample_every": 2}
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = watch(model, opt, run="r", client=client, sample_every=5)
    train_tiny(model, opt, mon, batches(1))
    assert client.flush(5.0) and client.control == {"sample_every": 2}
    train_tiny(model, opt, mon, batches(6, seed=1))
    rec.control = {"sample_every": True}  # not an int: back to attach's 5
    assert client.flush(5.0) and client.control == {"sample_every": True}
    train_tiny(model, opt, mon, batches(7, seed=2))  # steps 7..13: next sample at 6 + 5
    mon.close()
    assert [f["step"] for f in rec.frames] == [0, 2, 4, 6, 11, 13]  # 13: close()'s


def test_eval_and_no_grad_forwards_are_not_captured(recorder) -> None:
    rec, client = recorder
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def evaluate(i: int) -> None:
        huge = torch.full((2, 10), 7)
        model.eval()
        with torch.no_grad():
            model(huge, huge)
        model.train()
        with torch.no_grad():
            model(huge, huge)

    with watch(model, opt, run="r", client=client, sample_every=1) as mon:
        recorded_before = []
        steps = train_tiny(model, opt, mon, batches(2),
                           hook=lambda i: (recorded_before.append(list(model.recorded)),
                                           evaluate(i)))
    for frame, step, rec_train in zip(rec.frames, steps, recorded_before, strict=True):
        step["recorded"] = rec_train
        assert_frame_matches(frame, step)
        assert frame["scalars"]["loss"] == pytest.approx(step["losses"][0].item(), rel=1e-6)


def test_micro_batches_are_combined(recorder) -> None:
    rec, client = recorder
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    kept: list[torch.Tensor] = []

    def keep(i: int) -> None:  # what the monitor holds just before the optimizer step
        buf = mon._buffer
        for stats in buf.attn.values():
            kept.extend(t for t in vars(stats).values() if isinstance(t, torch.Tensor))
        kept.extend([buf.auto_loss, *buf.final.metrics().values()])

    with watch(model, opt, run="r", client=client, sample_every=1) as mon:
        steps = train_tiny(model, opt, mon, batches(4), micro=2, hook=keep)
    assert kept and all(t.grad_fn is None and not t.requires_grad for t in kept)
    assert len(rec.frames) == 2
    for frame, step in zip(rec.frames, steps, strict=True):
        first, second = step["recorded"][:2], step["recorded"][2:]
        max_a, p99_a = reference(first)
        max_b, p99_b = reference(second)
        np.testing.assert_allclose(frame["heads"]["attn.logit_max"], np.maximum(max_a, max_b),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(frame["heads"]["attn.logit_p99"], np.maximum(p99_a, p99_b),
                                   rtol=1e-5, atol=1e-6)
        mean_loss = torch.stack(step["losses"]).mean().item()
        assert frame["scalars"]["loss"] == pytest.approx(mean_loss, rel=1e-6)


def run_tiny(mon_factory, n: int = 4) -> tuple[list[torch.Tensor], Monitor | None]:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = mon_factory(model, opt)
    train_tiny(model, opt, mon, batches(n), clip=None)  # grad.norm from the pre-step hook
    if mon is not None:
        mon.close()
    return [p.detach().clone() for p in model.parameters()], mon


@pytest.mark.parametrize("where", ["attention", "grad", "step"])
def test_a_failure_disables_one_part_and_training_is_unaffected(
    recorder, monkeypatch, caplog, where
) -> None:
    rec, client = recorder

    def boom(*args, **kwargs):
        raise RuntimeError("injected failure")

    target = {"attention": (_capture, "attention_head_stats"),
              "grad": (_optimizer_step, "global_grad_norm"),
              "step": (_frames, "collect")}[where]
    expected, _ = run_tiny(lambda model, opt: None)
    monkeypatch.setattr(*target, boom)
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        params, mon = run_tiny(
            lambda model, opt: watch(model, opt, run="r", client=client, sample_every=1)
        )
    assert all(torch.equal(a, b) for a, b in zip(params, expected, strict=True))
    assert mon is not None and mon.disabled == {where}
    assert caplog.text.count("part of the monitor failed") == 1 and f"'{where}' part" in caplog.text
    assert torch._C._len_torch_function_stack() == 0
    if where == "attention":
        assert len(rec.frames) == 4 and all(f["heads"] == {} for f in rec.frames)
        assert all("loss" in f["scalars"] for f in rec.frames)
    if where == "step":
        assert rec.frames == []


def test_an_exception_in_forward_leaves_no_mode_behind(recorder) -> None:
    rec, client = recorder
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = watch(model, opt, run="r", client=client, sample_every=1)
    with pytest.raises(IndexError):
        model(torch.full((1, 4), VOCAB + 5))  # out of range token: the job's own bug
    assert torch._C._len_torch_function_stack() == 0 and not mon.capturing
    train_tiny(model, opt, mon, batches(1))
    mon.close()
    assert [f["step"] for f in rec.frames] == [0] and rec.frames[0]["heads"]


def test_without_optimizer_monitor_step_ends_steps(recorder) -> None:
    rec, client = recorder
    model = TinyLM()
    mon = watch(model, run="r", client=client, sample_every=2)
    for ids in batches(3):
        out = model(ids, ids.roll(-1, 1))
        out.loss.backward()
        mon.step()
        model.zero_grad()
    mon.close()
    assert [f["step"] for f in rec.frames] == [0, 2]
    assert keys(rec.frames[0]) == {"loss", "grad.norm", "attn.dtype_max"} | FINAL | COST


def test_attach_validates_arguments(monkeypatch) -> None:
    model = TinyLM()
    with pytest.raises(ValueError, match="sample_every"):
        attach(model, run="r", sample_every=0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        attach(model, run="r", max_grad_norm=-1.0)
    with pytest.raises(TypeError, match="model"):
        attach(object(), run="r")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run"):
        attach(model, run="r", client=Client(None, run="other"))
    with pytest.raises(ValueError, match="run"):
        attach(model, run="not a valid name")
    monkeypatch.setenv("RANK", "3")
    assert resolve_rank(None) == 3 and resolve_rank(1) == 1
    monkeypatch.delenv("RANK")
    assert resolve_rank(None) == 0
    with attach(model, run="r") as mon:  # url=None: a dry run that discards
        assert mon.client.url is None and mon.client.rank == 0
    assert math.isfinite(mon.step_index)
