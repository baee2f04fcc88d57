"""Audit fix of the fuses' control (docs/FUSES.md, *Modes*): the collector carries a run's
``control.fuses`` in every ingest answer for as long as the run exists, so the first one a
job's fuses see after attach is the baseline (recorded, not acted on): a job restarted or
resumed under the same run name does not redo what a person asked of its previous process;
only later changes act."""

from __future__ import annotations

import logging

import pytest
import torch
from test_fuse_audit_rollback import train
from test_fuses import Net, capturing_client

from logitwatch.hooks import attach
from logitwatch.hooks.fuses import LRBackoff, QKClip, Rollback

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def job():
    model = Net()
    client, frames = capturing_client()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fuses = [QKClip(tau=5, mode="auto"), LRBackoff(mode="auto"),
             Rollback(every=5, keep=2, back=5, skip=3, mode="auto")]
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=1, fuses=fuses)

    def step(n: int = 1) -> None:
        train(model, opt, mon, n)

    return mon, client, step


def acted(mon) -> list[tuple[str, str]]:
    return [(e.fuse, e.action) for e in mon.fuses.events
            if e.action in ("apply", "undo", "rollback") or e.detail.get("by")
            or str(e.detail.get("reason", "")).startswith("applied")]


def test_a_resumed_job_does_not_redo_the_control_of_its_previous_process(caplog) -> None:
    mon, client, step = job()
    step(7)
    assert acted(mon) == []
    # the first answer of the new process: what a person asked of the previous one
    stale = {"rollback": "apply", "lr_backoff": "apply", "qk_clip": "undo"}
    with caplog.at_level(logging.INFO, logger="logitwatch.hooks"):
        client._handle_answer({"control": {"fuses": dict(stale)}})
        step()
        client._handle_answer({"control": {"fuses": dict(stale)}})  # and every answer after
        step(2)
    assert acted(mon) == []  # no rollback, no backoff, no undo
    assert mon.fuses["rollback"].rollbacks == 0
    assert mon.fuses["qk_clip"].state() == 2.0  # still acting
    assert not [e for e in mon.fuses.events
                if e.fuse == "lr_backoff" and e.detail.get("reason") == "applied by control"]
    said = [r.getMessage() for r in caplog.records if "not acted on" in r.getMessage()]
    assert len(said) == 1 and "rollback" in said[0]
    # a change after the baseline acts (a person asks again)
    client._handle_answer({"control": {"fuses": {**stale, "qk_clip": "apply",
                                                 "lr_backoff": "undo"}}})
    step()
    assert acted(mon) == [("lr_backoff", "undo")]  # qk_clip was acting: apply is a no-op
    client._handle_answer({"control": {"fuses": {**stale, "qk_clip": "undo"}}})
    step()
    got = acted(mon)
    assert ("qk_clip", "undo") in got and ("lr_backoff", "backoff") in got
    assert mon.fuses["qk_clip"].state() == 1.0
    mon.close()


def test_a_fresh_run_acts_on_the_first_click() -> None:
    mon, client, step = job()
    step(7)
    client._handle_answer({"control": {}})  # the fresh run's answers: nothing asked
    step()
    client._handle_answer({"control": {"fuses": {"rollback": "apply"}}})  # a person clicks
    step()
    assert [e.detail["reason"] for e in mon.fuses.events if e.action == "rollback"] == [
        "applied by control"]
    mon.close()


def test_no_answer_yet_is_not_a_baseline() -> None:
    mon, client, step = job()
    step(3)  # no answer so far (the collector not reached yet): nothing is the baseline
    client._handle_answer({"control": {"fuses": {"rollback": "apply", "qk_clip": "undo"}}})
    step()  # the first answer: the baseline
    assert acted(mon) == [] and mon.fuses["rollback"].rollbacks == 0
    client._handle_answer({"control": {"fuses": {"rollback": "undo", "qk_clip": "undo"}}})
    step()  # a change: acts
    assert acted(mon) == [("rollback", "undo")]
    mon.close()


def test_a_client_answered_before_attach_gives_its_control_as_the_baseline() -> None:
    """A client that had an answer before this monitor attached (shared with an earlier
    monitor): its control at attach is the baseline, and a click that arrives after attach,
    before the first step ends, acts; it was taken for the baseline and swallowed
    (review)."""
    model = Net()
    client, _ = capturing_client()
    client._handle_answer({"control": {}})  # an answer before attach
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon = attach(model, opt, run="r", client=client, overhead_budget=None, lm_head=False,
                 sample_every=1, fuses=[Rollback(every=5, keep=2, back=5, skip=3,
                                                 mode="auto")])
    client._handle_answer({"control": {"fuses": {"rollback": "apply"}}})  # a person clicks
    train(model, opt, mon, 2)
    mon.close()
    # acted on at the first step's end (no snapshot yet there: said so), not swallowed
    assert [(e.action, e.detail.get("reason")) for e in mon.fuses.events
            if e.action != "armed"][:1] == [("no_snapshot", "applied by control")]
