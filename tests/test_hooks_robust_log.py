"""``Monitor.log()`` with a value that is not a real number: the value is skipped (one
warning per name), the rest of the frame and every later frame still go out. Before, one
``float(None)`` in the step buffer disabled the monitor's whole 'step' part: no frame for
the rest of the run."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from test_history_hooks import Sink, tiny_lm

from logitwatch.hooks import _buffer, attach
from logitwatch.hooks._probes import CountSyncs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Values a job may log that are not one real number: each is skipped.
BAD = {
    "val_acc": None,  # an optional metric before its first evaluation
    "phase": "warmup",
    "numeric_text": "1.5",  # a string, even one float() would parse
    "huge": 10**400,  # an int too large for a float
    "cplx": 1 + 2j,
    "per_token": torch.ones(3),  # several elements: not one scalar
    "cplx_t": torch.tensor(1 + 1j),
    "empty": torch.ones(0),
    "np_vec": np.ones(2),
    "a_list": [1.0],
}
#: Values that are one real number, and what the frame must carry for them.
GOOD = {
    "f": (0.25, 0.25),
    "i": (3, 3.0),
    "flag": (True, 1.0),
    "np_f32": (np.float32(0.5), 0.5),
    "np_i64": (np.int64(7), 7.0),
    "np_bool": (np.bool_(True), 1.0),
    "np_one": (np.array([1.5]), 1.5),
    "t0": (torch.tensor(2.0), 2.0),
    "t1": (torch.tensor([4.0]), 4.0),
    "t_int": (torch.tensor(5), 5.0),
    "t_grad": (torch.tensor(6.0, requires_grad=True) * 1, 6.0),
}


def monitored() -> tuple[Any, torch.optim.Optimizer, Sink, Any]:
    """The tiny LM, its SGD, the sink and a monitor sampling one step in 5."""
    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=5,
                 overhead_budget=None, history_every=None)
    return model, opt, sink, mon


def test_a_non_numeric_logged_value_is_skipped_and_the_frames_go_on(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # warnings are once per name, process-wide (raising=False: the test runs before the fix)
    monkeypatch.setattr(_buffer, "_WARNED", set(), raising=False)
    model, opt, sink, mon = monitored()
    gen = torch.Generator().manual_seed(0)
    syncs_in_log: list[list[str]] = []
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        for step in range(40):
            ids = torch.randint(0, 48, (2, 12), generator=gen)
            model(ids).loss.backward()
            values = {name: value for name, (value, _) in GOOD.items()}
            values.update(BAD)
            if step >= 30:
                values["val_acc"] = 0.5  # known from step 30 on
            with CountSyncs() as syncs:
                mon.log(**values)
            syncs_in_log.append(syncs.calls)
            opt.step()
            opt.zero_grad()
    mon.close()
    assert "step" not in mon.disabled
    assert sink.sampled() == [0, 5, 10, 15, 20, 25, 30, 35]
    for frame in sink.frames:
        if frame["step"] not in sink.sampled():
            continue
        scalars = frame["scalars"]
        for name, (_, want) in GOOD.items():
            assert scalars[name] == pytest.approx(want), name
        for name in BAD:
            if name == "val_acc" and frame["step"] >= 30:
                assert scalars[name] == 0.5
            else:
                assert name not in scalars, name
        assert "loss" in scalars and "grad.norm" in scalars  # the rest of the frame
    # no value was read back to the host to check it (types and shapes only)
    assert syncs_in_log == [[]] * 40
    skipped = [r.getMessage() for r in caplog.records if "skipped a value" in r.getMessage()]
    assert sorted(m.split("(")[1].split("=")[0] for m in skipped) == sorted(BAD)  # once each
    none_line = next(m for m in skipped if "(val_acc=" in m)
    assert "NoneType" in none_line and "Accepted:" in none_line and "tensor" in none_line
    assert not [r for r in caplog.records if "disabled" in r.getMessage()]


def test_the_warned_names_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job logging ever new names with a bad value grows no set without end."""
    monkeypatch.setattr(_buffer, "_WARNED", set())
    buf = _buffer.StepBuffer()
    for i in range(_buffer._WARNED_MAX + 50):
        buf.log(f"val_{i}", None)
    assert len(_buffer._WARNED) == _buffer._WARNED_MAX
    assert buf.logged == {}


def test_a_loss_that_is_not_a_number_between_samples_keeps_the_history(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``Monitor.log(loss=None)`` on a step that is not sampled (a job that logs its loss
    before it has one): skipped, as on a sampled step, and the history of every step's
    scalars goes on. Before, it disabled the 'history' part for the rest of the run."""
    monkeypatch.setattr(_buffer, "_WARNED", set(), raising=False)
    model, opt, sink, mon = monitored()
    gen = torch.Generator().manual_seed(0)
    losses = {}
    for step in range(12):
        ids = torch.randint(0, 48, (2, 12), generator=gen)
        loss = model(ids).loss
        loss.backward()
        mon.log(loss=None if step == 1 else loss)
        losses[step] = loss.item()
        opt.step()
        opt.zero_grad()
    mon.close()
    assert "history" not in mon.disabled and "step" not in mon.disabled
    every = sink.every_step("loss")
    for step in (2, 3, 4, 6, 7, 8, 9):  # unsampled steps after the skipped value
        assert every[step] == pytest.approx(losses[step], rel=1e-6), step
