"""Every-step scalars between sampled frames, on the hooks' side: a real training loop's
loss, gradient norm, clip flag, lr, log Z and hidden RMS at every step, kept on the device
and sent with the next frame, without a host read-back between sampled steps (the wire
format and the collector's side: ``test_history.py``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

# --- the hooks: every step's scalars, no sync between sampled steps ------------------------


class Sink:
    """Stands for the client: keeps what the monitor sends."""

    def __init__(self) -> None:
        from logitwatch.client import Client

        self.client = Client(None, run="h")
        self.frames: list[dict[str, Any]] = []

        def send(step: int, scalars: Any, heads: Any, time: float | None = None,
                 history: Any = None) -> None:
            self.frames.append({"step": step, "scalars": dict(scalars), "history": history})

        self.client.send = send  # type: ignore[method-assign]

    def sampled(self) -> list[int]:
        """The sampled steps: frames that are neither a flush of the history between
        samples nor the closing frame."""
        return [f["step"] for f in self.frames
                if "hooks.history_flush" not in f["scalars"]
                and "hooks.closing" not in f["scalars"]]

    def every_step(self, name: str) -> dict[int, float | None]:
        """``name`` at every step the frames tell of: their own scalars and histories."""
        out: dict[int, float | None] = {}
        for f in self.frames:
            h = f["history"]
            if h is not None:
                values = h["scalars"].get(name, [None] * len(h["steps"]))
                out.update(zip(h["steps"], values, strict=True))
            out[f["step"]] = f["scalars"].get(name)
        return out


def tiny_lm(seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(48, 32)
            self.qkv = nn.Linear(32, 96)
            self.out = nn.Linear(32, 48)
            self.plain = False  # return the loss tensor itself, not an HF-style output

        def forward(self, ids: Any) -> Any:
            from types import SimpleNamespace

            import torch.nn.functional as F

            x = self.emb(ids)
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            logits = self.out(x + y.transpose(1, 2).reshape(b, t, 32))
            loss = F.cross_entropy(logits.reshape(-1, 48), ids.roll(-1, 1).reshape(-1))
            return loss if self.plain else SimpleNamespace(loss=loss, logits=logits)

    return LM()


def train(model: Any, opt: Any, steps: int, *, clip: float | None = 1.3, micro: int = 1,
          log: Any = None, sched: Any = None, seed: int = 1) -> list[dict[str, Any]]:
    """A plain loop; per step what it saw: the loss (mean over micro-batches), the norm
    the clip call returned, the lr it trained with, and the host reads made."""
    import torch

    from logitwatch.hooks._probes import CountSyncs

    gen = torch.Generator().manual_seed(seed)
    seen = []
    heads: list[tuple[Any, Any]] = []  # per LM-head call: log Z (mean), hidden mean square

    def head_call(module: Any, args: Any, output: Any) -> None:
        with torch.no_grad():  # read after the step (a read in it would count as a sync)
            heads.append((torch.logsumexp(output.float(), -1).mean(),
                          args[0].float().square().mean()))

    handle = model.out.register_forward_hook(head_call)
    for _ in range(steps):
        losses = []
        heads.clear()
        with CountSyncs() as syncs:
            for _ in range(micro):
                ids = torch.randint(0, 48, (2, 12), generator=gen)
                out = model(ids)
                loss = out if model.plain else out.loss
                (loss / micro).backward()
                losses.append(loss.detach())
                if log is not None:
                    log(loss)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip) if clip else None
            lr = opt.param_groups[0]["lr"]
            opt.step()
            opt.zero_grad()
        if sched is not None:
            sched.step()
        mean = torch.stack(losses).mean() if micro > 1 else losses[0]
        seen.append({"loss": float(mean), "last": float(losses[-1]),
                     "norm": None if norm is None else float(norm), "lr": lr,
                     "clipped": None if norm is None else float(norm > clip),  # in float32
                     "syncs": syncs.calls,
                     "logz": sum(float(z) for z, _ in heads) / len(heads),
                     "rms": (sum(float(r) for _, r in heads) / len(heads)) ** 0.5})
    handle.remove()
    return seen


@pytest.fixture
def torch_one_thread(one_torch_thread: None) -> Any:
    import torch

    return torch


def test_every_step_loss_grad_norm_clip_flag_and_lr_without_a_sync(torch_one_thread: Any
                                                                   ) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)  # lr jumps mid-way
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None)
    seen = train(model, opt, 35, sched=sched)
    mon.close()
    assert [f["step"] for f in sink.frames] == [0, 10, 20, 30, 34]  # 34: close()'s
    assert sink.frames[0]["history"] is None
    assert [f["history"]["steps"] for f in sink.frames[1:]] == [
        list(range(1, 10)), list(range(11, 20)), list(range(21, 30)), [31, 32, 33]]
    covered = range(35)
    loss, norm = sink.every_step("loss"), sink.every_step("grad.norm")
    clipped, lr = sink.every_step("grad.clipped"), sink.every_step("lr")
    assert [loss[s] for s in covered] == [seen[s]["loss"] for s in covered]  # exactly
    assert [norm[s] for s in covered] == [seen[s]["norm"] for s in covered]
    assert [clipped[s] for s in covered] == [seen[s]["clipped"] for s in covered]
    assert 0 < sum(clipped.values()) < len(covered)  # both cases met
    assert [lr[s] for s in covered] == [seen[s]["lr"] for s in covered]
    assert {seen[s]["lr"] for s in covered} == {0.2, 0.1, 0.05, 0.025, 0.0125}
    for s in range(35):  # one read-back on a sampled step (a .cpu() too on an
        assert seen[s]["syncs"] == (["tolist"] if s % 10 == 0 else []), s  # accelerator)
    f = sink.frames[1]["scalars"]
    assert f["hooks.syncs"] == 0 and "hooks.history_dropped" not in f
    assert f["hooks.bytes"] >= 4 * 4 * 9  # the history's rows came back in that transfer


def test_a_job_that_does_not_clip_sends_no_grad_norm_between_samples(torch_one_thread: Any
                                                                    ) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    model.plain = True  # a loss tensor: Monitor.log(loss=...) gives it
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # (CPU Adam reads its step count)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None, max_grad_norm=1.0)
    seen = train(model, opt, 21, clip=None, micro=2, log=lambda loss: mon.log(loss=loss))
    mon.close()
    assert all(s["syncs"] == [] for i, s in enumerate(seen) if i % 10)
    for f in sink.frames[1:]:
        h = f["history"]
        assert set(h["scalars"]) == {"loss", "lr", "final.logz", "final.hidden_rms"}, (
            h["scalars"].keys())  # no grad norm: null everywhere, left out
        assert "grad.norm" in f["scalars"]  # measured on the sampled step itself
    # log() replaces, as on sampled steps: the step's loss is the last one logged
    loss = sink.every_step("loss")
    assert [loss[s] for s in range(21)] == [seen[s]["last"] for s in range(21)]


def monitored(torch: Any, steps: int, every: int, lr: float, micro: int = 1
              ) -> tuple[Sink, list[dict[str, Any]]]:
    """``tiny_lm`` trained ``steps`` steps with plain SGD, sampled one step in ``every``."""
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=every,
                 overhead_budget=None)
    seen = train(model, opt, steps, micro=micro)
    mon.close()
    return sink, seen


def test_gradient_accumulation_keeps_the_mean_loss(torch_one_thread: Any) -> None:
    sink, seen = monitored(torch_one_thread, 11, 5, 0.1, micro=3)
    loss = sink.every_step("loss")
    assert sorted(loss) == list(range(11))
    logz, rms = sink.every_step("final.logz"), sink.every_step("final.hidden_rms")
    for s in range(11):
        assert loss[s] == pytest.approx(seen[s]["loss"], rel=1e-6), s
        # the mean over the step's three LM-head calls, sampled step or not
        assert logz[s] == pytest.approx(seen[s]["logz"], rel=1e-5), s
        assert rms[s] == pytest.approx(seen[s]["rms"], rel=1e-5), s


def test_every_step_log_z_and_hidden_rms_without_a_sync(torch_one_thread: Any) -> None:
    sink, seen = monitored(torch_one_thread, 25, 10, 0.5)
    logz, rms = sink.every_step("final.logz"), sink.every_step("final.hidden_rms")
    assert sorted(logz) == sorted(rms) == list(range(25))
    for s in range(25):  # 24 positions a batch: the unsampled estimate reads them all
        assert logz[s] == pytest.approx(seen[s]["logz"], rel=1e-5), s
        assert rms[s] == pytest.approx(seen[s]["rms"], rel=1e-5), s
        assert seen[s]["syncs"] == (["tolist"] if s % 10 == 0 else []), s
    assert len({round(v, 4) for v in logz.values()}) > 20  # it moves: a value per step


def test_the_unsampled_log_z_reads_evenly_spaced_positions() -> None:
    import torch

    from logitwatch.hooks._final import step_final
    from logitwatch.hooks._probes import CountSyncs

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 300, 50, generator=gen).to(torch.bfloat16) * 4
    hidden = torch.randn(4, 300, 16, generator=gen)
    with CountSyncs() as syncs:
        logz, square = step_final(hidden, logits, rows=64)
    assert syncs.calls == [] and logz.dtype == square.dtype == torch.float32
    rows = logits.reshape(-1, 50).float()[torch.arange(9, 1200, 19)[:64]]  # odd stride
    assert float(logz) == pytest.approx(float(torch.logsumexp(rows, -1).mean()), rel=1e-6)
    assert float(square) == pytest.approx(float(hidden.square().mean()), rel=1e-5)
    every = torch.logsumexp(logits.float(), -1).flatten()
    # an estimate of the pooled mean: within 4 standard errors of a 64-position mean
    assert abs(float(logz) - float(every.mean())) < 4 * float(every.std()) / 64 ** 0.5


def test_the_unsampled_log_z_of_a_large_vocabulary_stays_in_bounded_memory() -> None:
    """A 256k vocabulary in bf16: the 64 positions' log Z is taken in chunks, so the step
    allocates a few tens of MiB at most, not a 64 MiB float32 copy plus as much again in
    temporaries; the value is the same."""
    import torch

    from logitwatch.hooks._final import STEP_ELEMENTS, step_final
    from logitwatch.hooks._probes import LiveBytes

    vocab = 1 << 18
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(1, 96, vocab, generator=gen) * 3).to(torch.bfloat16)
    hidden = torch.randn(1, 96, 8, generator=gen)
    with LiveBytes() as mem:
        logz, _ = step_final(hidden, logits, rows=64)
    assert mem.peak <= 3 * 4 * STEP_ELEMENTS, mem.peak  # 48 MiB; whole: 64 MiB copy + temps
    stride = 96 // 64 | 1
    rows = logits.reshape(-1, vocab)[stride // 2::stride][:64].double()
    assert float(logz) == pytest.approx(float(torch.logsumexp(rows, -1).mean()), rel=1e-6)


def test_a_full_ring_keeps_the_newest_steps_and_counts_the_rest(torch_one_thread: Any
                                                                ) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach
    from logitwatch.hooks._history import StepHistory

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None)
    mon._history = StepHistory(capacity=4)
    seen = train(model, opt, 21)
    mon.close()
    assert [f["history"] and f["history"]["steps"] for f in sink.frames] == [
        None, [6, 7, 8, 9], [16, 17, 18, 19]]
    assert [f["scalars"].get("hooks.history_dropped") for f in sink.frames] == [None, 5.0, 5.0]
    h = sink.frames[2]["history"]
    assert h["scalars"]["loss"] == [seen[s]["loss"] for s in (16, 17, 18, 19)]


def test_a_failing_history_is_disabled_and_training_goes_on(torch_one_thread: Any,
                                                            caplog: Any) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach

    def run(broken: bool) -> tuple[list[dict[str, Any]], Sink, Any]:
        model = tiny_lm()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sink = Sink()
        mon = attach(model, opt, run="h", client=sink.client, sample_every=4,
                     overhead_budget=None)
        if broken:
            def put(*args: Any) -> None:
                raise RuntimeError("broken history")

            mon._history.put = put  # type: ignore[method-assign]
        seen = train(model, opt, 9)
        mon.close()
        return seen, sink, mon

    good, _, _ = run(False)
    bad, sink, mon = run(True)
    assert [s["loss"] for s in bad] == [s["loss"] for s in good]  # training unchanged
    assert mon.disabled == {"history"} and "broken history" in caplog.text
    assert [f["step"] for f in sink.frames] == [0, 4, 8]  # frames still sent
    assert all(f["history"] is None for f in sink.frames)


def test_the_clip_flag_compares_as_the_device_does(torch_one_thread: Any) -> None:
    torch = torch_one_thread
    from logitwatch.hooks._history import StepHistory

    h = StepHistory(capacity=8)
    cases = [(0.1, 0.1), (0.2, 0.1), (0.05, 0.1), (math.nan, 1.0), (math.inf, 1.0),
             (1.0, math.inf), (2.0, torch.tensor(1.5)), (1.0, torch.tensor(1.5))]
    want = []
    for step, (norm, max_norm) in enumerate(cases):
        total = torch.tensor(norm, dtype=torch.float32)  # 0.1: just above 0.1 in float32
        hit = (total > max_norm).to(torch.int32)
        want.append(float(hit))
        h.put_norm(total, max_norm, hit)
        h.end_step(step)
    block = h.take()
    assert block is not None
    flat = [x for t in block.tensors for x in t.reshape(-1).tolist()]
    got = block.values(flat)["scalars"]["grad.clipped"]
    assert got == want == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_an_lr_jump_or_a_climb_past_the_settled_peak_samples_the_next_step(
        torch_one_thread: Any) -> None:
    """At sample_every=40: constant lr for 150 steps (settled), a x5 jump at step 160 and a
    climb from step 200 (doubling every 4 steps): the step after the jump and a few steps
    of the climb (one per doubling past 2x the settled peak) are sampled; nothing read on
    the others."""
    torch = torch_one_thread
    from logitwatch.hooks import attach
    from logitwatch.hooks._lrwatch import LrWatch

    def lr_at(step: int) -> float:
        if step < 160:
            return 1e-3
        if step < 200:
            return 5e-3 if step < 170 else 1e-3
        return 1e-3 * 2 ** ((step - 200) / 4)

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s) / 1e-3)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=40,
                 overhead_budget=None)
    seen = train(model, opt, 216, sched=sched)
    mon.close()
    assert sink.frames[-1]["step"] == 215  # close() sends the steps since the last frame
    sampled = sink.sampled()
    watch, expected, last = LrWatch(), [0], 0
    for s in range(215):
        if watch.step(s, seen[s]["lr"]) or s + 1 >= last + 40:
            expected.append(s + 1)
            last = s + 1
    assert sampled == expected
    assert 161 in sampled and 171 in sampled  # the jump up, and back down
    assert len([s for s in sampled if s > 200]) >= 2  # the climb
    for s in range(216):
        assert seen[s]["syncs"] == (["tolist"] if s in sampled else []), s
    # plain schedules never trigger it: a warm-up, a constant lr, a step decay
    w = LrWatch()
    assert not any(w.step(s, 1e-3 * min(1.0, (s + 1) / 100) * (0.5 if s > 500 else 1.0))
                   for s in range(1000))


def test_close_sends_the_steps_since_the_last_frame(torch_one_thread: Any) -> None:
    """A run that ends between two samples: close() sends the last steps (the newest as a
    frame of its own scalars, the others as its history), so its end is not lost."""
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None)
    seen = train(model, opt, 26)
    assert [f["step"] for f in sink.frames] == [0, 10, 20]
    mon.close()
    last = sink.frames[-1]
    assert last["step"] == 25 and last["history"]["steps"] == [21, 22, 23, 24]
    loss = sink.every_step("loss")
    assert [loss[s] for s in range(26)] == [seen[s]["loss"] for s in range(26)]
    assert last["scalars"]["grad.norm"] == seen[25]["norm"]


def test_a_loss_or_grad_spike_samples_the_next_step_without_a_sync(torch_one_thread: Any
                                                                    ) -> None:
    """At sample_every=50: a gradient spike (the loss scaled x1e4 on one step, no clipping
    to bound it) and later a NaN loss: each step's history is flushed as it ends and the
    step after each is sampled, so they reach the collector at once; the watch reads
    nothing through torch on the other steps (a CPU buffer is host memory; an
    accelerator's is copied non-blocking)."""
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=50,
                 overhead_budget=None)
    gen = torch.Generator().manual_seed(0)
    syncs: list[list[str]] = []
    from logitwatch.hooks._probes import CountSyncs

    for step in range(130):
        with CountSyncs() as probe:
            ids = torch.randint(0, 48, (2, 12), generator=gen)
            loss = model(ids).loss
            if step == 70:
                loss = loss * 1e4  # one exploding step
            if step == 110:
                loss = loss * float("nan")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            opt.step()
            opt.zero_grad()
        syncs.append(probe.calls)
    mon.close()
    sampled = sink.sampled()
    assert 71 in sampled and 111 in sampled, sampled
    assert [s for s in sampled if s < 71] == [0, 50]  # steady training: nothing extra
    # a CPU job sends the steps kept up to the spike at once, the spike's step last (a
    # flush, not the next step's frame): the collector judges it as the step ends
    flushed = {f["step"]: f for f in sink.frames if "hooks.history_flush" in f["scalars"]}
    assert 70 in flushed and 110 in flushed, sorted(flushed)
    assert flushed[70]["history"]["steps"] == list(range(61, 70))  # since the 60 flush
    assert flushed[70]["scalars"]["grad.norm"] > 100 * flushed[60]["scalars"]["grad.norm"]
    assert not math.isfinite(float(flushed[110]["scalars"]["grad.norm"]))  # NaN gradients
    assert all(syncs[s] == [] for s in range(130) if s not in sampled), syncs
    # after the blow-up the run stays broken: sampled at most BURST times in REARM steps
    from logitwatch.hooks._stepwatch import BURST, REARM

    extra = [s for s in sampled if s not in (0, 50, 100)]
    assert all(b - a >= REARM for a, b in zip(extra, extra[BURST:], strict=False)), extra


def test_the_steps_between_samples_are_flushed_every_10_without_a_read_back(
        torch_one_thread: Any) -> None:
    """At sample_every=50 the kept steps go out every 10 unsampled steps as a scalars-only
    frame (``hooks.history_flush``), each step told exactly once with what it trained on,
    no host read on any unsampled step (the flush steps included), and the frames pass the
    collector's schema; ``history_every=None`` sends them with the sampled frames only."""
    torch = torch_one_thread
    from logitwatch.hooks import attach
    from logitwatch.server.schemas import IngestIn

    def run(**kw: Any) -> tuple[Sink, list[dict[str, Any]]]:
        model = tiny_lm()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        sink = Sink()
        mon = attach(model, opt, run="h", client=sink.client, sample_every=50,
                     overhead_budget=None, **kw)
        seen = train(model, opt, 75)
        mon.close()
        return sink, seen

    sink, seen = run()
    steps = [f["step"] for f in sink.frames]
    assert steps == [0, 10, 20, 30, 40, 50, 60, 70, 74], steps
    assert sink.sampled() == [0, 50]
    flushes = [f for f in sink.frames if "hooks.history_flush" in f["scalars"]]
    assert [f["step"] for f in flushes] == [10, 20, 30, 40, 60, 70]
    assert flushes[0]["history"]["steps"] == list(range(1, 10))
    assert sink.frames[5]["history"]["steps"] == list(range(41, 50))  # since the flush
    told = sorted(s for f in sink.frames for s in [*(f["history"] or {}).get("steps", []),
                                                   f["step"]])
    assert told == list(range(75))  # each step exactly once
    loss = sink.every_step("loss")
    assert all(loss[s] == pytest.approx(seen[s]["loss"], rel=1e-6) for s in range(75))
    norm = sink.every_step("grad.norm")
    assert all(norm[s] == pytest.approx(seen[s]["norm"], rel=1e-5) for s in range(75))
    assert all(seen[s]["syncs"] == [] for s in range(75) if s not in (0, 50)), seen
    wire = [{"run": "h", "seq": i + 1, "time": 1.0, "step": f["step"],
             "scalars": f["scalars"], "heads": {},
             **({"history": f["history"]} if f["history"] else {})}
            for i, f in enumerate(sink.frames)]
    assert [f.step for f in IngestIn.model_validate({"frames": wire}).frames] == steps

    off, _ = run(history_every=None)
    assert [f["step"] for f in off.frames] == [0, 50, 74]
    assert off.frames[1]["history"]["steps"] == list(range(1, 50))
    with pytest.raises(ValueError, match="history_every"):
        run(history_every=-1)
