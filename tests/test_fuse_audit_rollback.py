"""Audit fixes of the rollback fuse and its neighbours (docs/FUSES.md, *Rollback and skip*),
on the real tiny model of ``test_fuses``: a non-finite optimizer state never costs the ring
its good snapshot; a late alert about a step already rolled back for does not roll back
(or back off) again; with ``path=`` the undo copy is on disk and the memory it holds is
counted; QK-clip does not clip restored weights with the discarded forward's maxima; and
``restore_rng=False`` draws fresh batches after a rollback."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from test_fuses import IDS, Net
from test_fuses_qknorm import attached

from logitwatch.hooks.fuses import LRBackoff, QKClip, QKNorm, Rollback

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train(model, opt, mon, steps: int, *, hook=None) -> None:
    """``steps`` loop iterations on ``IDS`` (skipped batches ask the fuses first);
    ``hook(i)`` runs after iteration ``i``'s update."""
    for i in range(steps):
        if mon.fuses.skip_batch():
            continue
        loss = model(IDS)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if hook is not None:
            hook(i)


def adam_state_finite(opt) -> bool:
    return all(bool(torch.isfinite(t).all()) for s in opt.state.values()
               for t in s.values() if isinstance(t, torch.Tensor))


# -- 1: a non-finite optimizer state keeps the good snapshot ----------------------------


@pytest.mark.parametrize("mode", ["suggest", "auto"])
def test_nonfinite_optimizer_state_keeps_the_good_snapshot(mode: str) -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fuse = Rollback(every=5, keep=1, back=5, skip=2, mode=mode)
    mon, _, frames, client = attached(model, opt=opt, sample_every=100, fuses=[fuse])
    for i in range(11):
        loss = model(IDS)
        loss.backward()
        if i == 9:  # a huge, finite gradient: Adam's exp_avg_sq overflows, weights finite
            model.head.weight.grad.mul_(1e25)
        opt.step()
        opt.zero_grad()
        if i == 9:
            assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
            assert not adam_state_finite(opt)
            assert [s.step for s in fuse.ring] == [5]
    # step 10 copies: the state is not finite, so nothing is copied and nothing dropped
    events = [(e.action, e.detail.get("reason")) for e in mon.fuses.events
              if e.action != "armed"]
    reason = "non-finite optimizer state at step 10"
    if mode == "suggest":
        assert [s.step for s in fuse.ring] == [5]  # the good snapshot is still there
        assert events == [("suggest", reason)]
        mon.fuses.apply("rollback")  # a person can still roll back to it
    else:
        assert events == [("rollback", reason)]
    rb = [e for e in mon.fuses.events if e.action == "rollback"]
    assert len(rb) == 1 and rb[0].detail["to_step"] == 5
    assert adam_state_finite(opt)  # the state of step 5, finite
    assert [s.step for s in fuse.ring] == [5]
    mon.close()


# -- 2: one incident, one rollback (and one backoff) ------------------------------------


def test_late_alert_about_a_rolled_back_step_does_not_roll_back_again() -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fuse = Rollback(every=5, keep=2, back=5, skip=2, mode="auto")
    mon, _, frames, client = attached(model, opt=opt, sample_every=4, fuses=[fuse])
    for i in range(40):
        if mon.fuses.skip_batch():
            continue
        loss = model(IDS)
        if i == 12:
            loss = loss * float("nan")  # one bad batch: NaN weights after its update
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i == 20:  # the collector's critical alert about that NaN (step 12) comes late
            client._handle_answer({"alerts": [
                {"id": 1, "run": "r", "rule": "loss_nonfinite", "severity": "critical",
                 "started_step": 12, "fired_step": 12, "paged_step": 12}]})
        if i == 30:  # a new incident, after the rollback: it does roll back
            client._handle_answer({"alerts": [
                {"id": 2, "run": "r", "rule": "loss_jump", "severity": "critical",
                 "started_step": 27, "fired_step": 28, "paged_step": 28}]})
    rbs = [e.detail for e in mon.fuses.events if e.action == "rollback"]
    assert len(rbs) == 2, rbs
    assert rbs[0]["reason"] == "non-finite weights at step 15"
    assert rbs[1]["reason"] == "alert loss_jump"
    assert fuse.rollbacks == 2
    mon.close()


def test_late_alert_with_plain_step_is_ignored_and_does_not_restart_the_backoff() -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rb = Rollback(every=5, keep=2, back=5, skip=2, mode="auto")
    lrb = LRBackoff(factor=0.5, steps=50, mode="auto")
    mon, _, frames, client = attached(model, opt=opt, sample_every=100, fuses=[rb, lrb])
    multipliers: list[float] = []

    def hook(i: int) -> None:
        multipliers.append(lrb.multiplier)
        if i == 15:
            mon.fuses.apply("rollback")  # rolled back (and backed off) for step <= 16
        if i == 22:  # the collector's late alert about step 14 (in both fuses' rules)
            client._handle_answer({"alerts": [
                {"id": 1, "run": "r", "rule": "loss_jump", "severity": "critical",
                 "step": 14}]})

    train(model, opt, mon, 30, hook=hook)
    assert rb.rollbacks == 1
    backoffs = [e for e in mon.fuses.events if e.action == "backoff"]
    assert len(backoffs) == 1 and backoffs[0].detail["reason"] == "rollback"
    # the window started by the rollback goes on: the multiplier never falls back
    after = multipliers[-8:]
    assert after == sorted(after) and after[0] > lrb.factor, multipliers
    mon.close()


# -- 4: with path=, the undo copy is on disk; the memory held is counted -----------------


def test_undo_copy_goes_to_path_and_respects_the_budget(tmp_path) -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fuse = Rollback(every=5, keep=2, back=5, skip=0, mode="auto", path=str(tmp_path),
                    budget=10_000)  # far less than one copy: memory must hold nothing
    mon, _, frames, client = attached(model, opt=opt, sample_every=1, fuses=[fuse])
    train(model, opt, mon, 11)  # snapshots after steps 0, 5, 10
    before = copy.deepcopy(model.state_dict())
    mon.fuses.apply("rollback")  # at step 11, between steps: a snapshot step is next
    train(model, opt, mon, 1)
    undo = fuse._undo
    assert undo is not None and undo.state is None and undo.path is not None
    assert os.path.dirname(undo.path) == str(tmp_path) and os.path.exists(undo.path)
    assert undo.bytes > 10_000
    assert fuse.peak_bytes == 0 and fuse.held_bytes == 0
    assert frames[-1]["scalars"]["fuse.rollback.bytes"] == 0.0
    mon.fuses.undo("rollback")
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert not os.path.exists(undo.path) and fuse._undo is None
    mon.close()


def test_undo_copy_on_a_snapshot_step_does_not_share_its_file(tmp_path) -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fuse = Rollback(every=5, keep=2, back=5, skip=0, mode="auto", path=str(tmp_path))

    def hook(i: int) -> None:
        if i == 9:  # a critical alert read at step 10's end, before step 10's snapshot
            client._handle_answer({"alerts": [
                {"id": 1, "run": "r", "rule": "loss_jump", "severity": "critical",
                 "fired_step": 9}]})

    states: list[dict] = []  # after each update, before the monitor's hook (the fuses)
    opt.register_step_post_hook(lambda o, a, k: states.append(
        copy.deepcopy(model.state_dict())))
    mon, _, frames, client = attached(model, opt=opt, sample_every=100, fuses=[fuse])
    train(model, opt, mon, 11, hook=hook)
    assert fuse.rollbacks == 1 and [s.step for s in fuse.ring] == [5, 10]
    assert fuse._undo is not None and fuse._undo.path not in [s.path for s in fuse.ring]
    mon.fuses.undo("rollback")  # the undo file is whole: the state of step 10
    for k, v in states[10].items():
        assert torch.equal(model.state_dict()[k], v), k
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(s.path)
                                                  for s in fuse.ring)
    mon.close()


def test_bytes_count_the_undo_copy_in_memory() -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fuse = Rollback(every=5, keep=2, back=5, skip=0, mode="auto")
    mon, _, frames, client = attached(model, opt=opt, sample_every=1, fuses=[fuse])
    train(model, opt, mon, 12)
    mon.fuses.apply("rollback")
    train(model, opt, mon, 1)
    assert fuse._undo is not None and fuse._undo.state is not None
    held = fuse.ring.bytes + fuse._undo.bytes
    assert frames[-1]["scalars"]["fuse.rollback.bytes"] == float(held)
    assert fuse.peak_bytes >= held
    mon.close()


# -- 5: no clip of restored weights with the discarded forward's maxima ------------------


@pytest.mark.parametrize("order", ["rollback_first", "qk_clip_first"])
def test_qk_clip_does_not_clip_weights_a_rollback_restored(order: str) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights are the fuses'
    rb = Rollback(every=5, keep=2, back=5, skip=0, mode="auto")
    clip = QKClip(tau=1000, mode="auto")
    fuses = [rb, clip] if order == "rollback_first" else [clip, rb]
    mon, _, frames, client = attached(model, opt=opt, sample_every=1, fuses=fuses)
    w = model.blocks[0].c_attn
    w0, b0 = w.weight.detach().clone(), w.bias.detach().clone()
    for i in range(8):
        if i == 7:
            with torch.no_grad():
                w.weight.mul_(30)  # the run blows up: logits far past tau
            client._handle_answer({"alerts": [  # the collector's critical alert meanwhile
                {"id": 1, "run": "r", "rule": "loss_jump", "severity": "critical",
                 "fired_step": 6}]})
        loss = model(IDS)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert rb.rollbacks == 1
    # the weights are the snapshot's (step 0's: lr 0), not clipped after the restore
    assert torch.equal(w.weight.detach(), w0) and torch.equal(w.bias.detach(), b0)
    assert all(bool((c == 1).all()) for qk in clip._cum.values() for c in qk)  # none
    mon.fuses.undo("qk_clip")  # nothing to scale back
    assert torch.equal(w.weight.detach(), w0)
    # the next step measures the restored weights and clips nothing (under tau)
    train(model, opt, mon, 2)
    assert torch.equal(w.weight.detach(), w0)
    mon.close()


def test_qk_norm_does_not_rescale_weights_a_rollback_restored() -> None:
    model = Net(std=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    rb = Rollback(every=5, keep=2, back=5, skip=0, mode="auto")
    norm = QKNorm(limit=3.0, patience=1, stable=1000, mode="auto")  # inserted, rescaling
    mon, _, frames, client = attached(model, opt=opt, sample_every=1, fuses=[rb, norm])
    w = model.blocks[0].c_attn
    train(model, opt, mon, 7)
    assert norm.layers == {0: 1.0} and [s.step for s in rb.ring] == [0, 5]
    snap0 = rb.ring.items[0].load()["model"]  # the copy the rollback goes back to
    with torch.no_grad():
        w.weight.mul_(30)  # raw logits far past tau on the next forward
    client._handle_answer({"alerts": [
        {"id": 1, "run": "r", "rule": "loss_jump", "severity": "critical", "fired_step": 6}]})
    train(model, opt, mon, 1)  # step 7: rolled back at its end, to the state of step 0
    assert rb.rollbacks == 1
    for k in ("blocks.0.c_attn.weight", "blocks.0.c_attn.bias"):
        assert torch.equal(model.state_dict()[k], snap0[k]), k  # not rescaled after
    mon.close()


# -- 6: restore_rng ----------------------------------------------------------------------


def _rng_loop(restore_rng: bool | None) -> tuple[list[int], list[int]]:
    data = torch.randint(0, 64, (5000,), generator=torch.Generator().manual_seed(0))

    def get_batch() -> tuple[torch.Tensor, int]:  # nanoGPT: the global RNG draws a batch
        ix = torch.randint(len(data) - 13, (4,))
        return torch.stack([data[i:i + 12] for i in ix]), int(ix[0])

    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kw = {} if restore_rng is None else {"restore_rng": restore_rng}
    fuse = Rollback(every=10, keep=2, back=10, skip=3, mode="auto", **kw)
    mon, _, frames, client = attached(model, opt=opt, sample_every=100, fuses=[fuse])
    torch.manual_seed(1)
    trained: list[tuple[int, int]] = []
    for _ in range(32):
        if mon.fuses.skip_batch():
            continue
        x, bid = get_batch()
        trained.append((mon.step_index, bid))
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if mon.step_index == 25 and not fuse.rollbacks:
            mon.fuses.apply("rollback")  # back to the state after step 10
    mon.close()
    assert fuse.rollbacks == 1
    return [b for s, b in trained if 11 <= s <= 24], [b for s, b in trained if s >= 25]


def test_restored_rng_replays_the_batches_by_default() -> None:
    before, after = _rng_loop(None)
    assert after and after == before[:len(after)]  # documented: the same batches again


def test_restore_rng_false_draws_fresh_batches() -> None:
    before, after = _rng_loop(False)
    assert after and not set(after) & set(before)


def test_a_fuse_failing_in_its_optimizer_hook_records_a_failed_event() -> None:
    """docs/FUSES.md, *Safety*: a failing fuse is off for the rest of the run and leaves a
    ``failed`` event. The LR backoff's and the rollback's own optimizer hooks (outside
    FuseSet's guard) turned the fuse off without one: the run's events never said."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    backoff, rollback = LRBackoff(mode="auto"), Rollback(every=5, mode="auto")
    mon, _, frames, client = attached(model, opt=opt, sample_every=100, fuses=[backoff, rollback])
    train(model, opt, mon, 2)
    backoff._saved = [1]  # what the post-step hook restores: not (group, lr) pairs
    rollback.skipping, rollback.optimizer = 1, None  # its pre-step hook skips this one
    rollback.drop_update = None  # ... and cannot
    model(IDS).backward()  # a loop that does not ask skip_batch()
    opt.step()
    opt.zero_grad()
    assert backoff.failed and rollback.failed
    failed = sorted(e.fuse for e in mon.fuses.events if e.action == "failed")
    assert failed == ["lr_backoff", "rollback"]
    train(model, opt, mon, 2)  # training goes on
    mon.close()
    assert len([e for e in mon.fuses.events if e.action == "failed"]) == 2


def test_a_resumed_job_snapshots_at_its_first_step() -> None:
    """attach(start_step=103) (a resumed job): the first snapshot is at step 103, its first
    step, as a fresh job's is at step 0; by the step's index alone (step % every) none came
    before step 105, and a rollback in that window found none."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    fuse = Rollback(every=5, mode="auto")
    mon, _, frames, client = attached(model, opt=opt, sample_every=100, fuses=[fuse],
                                      start_step=103)
    train(model, opt, mon, 1)
    assert [s.step for s in fuse.ring] == [103]
    train(model, opt, mon, 5)
    mon.close()
    assert [s.step for s in fuse.ring] == [103, 108]
