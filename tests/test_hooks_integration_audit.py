"""Audit of the training-loop integrations against what the trainer itself reports: the
Hugging Face Trainer's gradient norm before clipping and its clip flag (accelerate clips
with ``get_total_norm`` + ``clip_grads_with_norm_``), its loss under gradient
accumulation, a run resumed from a checkpoint, several optimizers, and an optimizer
replaced mid-run."""

from __future__ import annotations

import logging
import math
import os

import pytest
import torch
import torch.nn.functional as F
from test_hooks_sampling import Tiny
from torch import nn

import logitwatch.hooks as H
from logitwatch.client import Client

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def capturing_client(run: str = "r") -> tuple[Client, list[dict]]:
    """test_hooks_sampling's, with the finish frame too."""
    frames: list[dict] = []
    client = Client(None, run=run)
    client.send = lambda step, scalars, heads, time=None, history=None: frames.append(  # type: ignore
        {"step": step, "scalars": scalars, "heads": heads, "history": history})
    client.finish = lambda step=None, **kw: frames.append(  # type: ignore
        {"step": step, "finish": True})
    return client, frames


def batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 32, (2, 8), generator=gen) for _ in range(n)]


def sent(frames: list[dict]) -> list[dict]:
    return [f for f in frames if not f.get("finish")]


class Recorder:
    """The Trainer's own logs (``logging_steps=1``): ``global_step -> logs``."""

    def __new__(cls) -> object:
        import transformers

        class _Rec(transformers.TrainerCallback):  # type: ignore[misc]
            def __init__(self) -> None:
                self.logs: dict[int, dict] = {}

            def on_log(self, args, state, control, logs=None, **kw):  # type: ignore[no-untyped-def]
                if logs and "loss" in logs:
                    self.logs[state.global_step] = dict(logs)

        return _Rec()


def hf_trainer(out: str, callbacks: list, *, steps: int, ga: int = 1, max_grad_norm: float = 0.5,
               save_steps: int | None = None, batch: int = 2) -> object:
    """A tiny random GPT-2 under ``transformers.Trainer`` on CPU."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (64, 12), generator=gen)
    ids[::3, 8:] = -100  # labels of unequal lengths: each micro-batch counts other tokens
    data = [{"input_ids": row.clamp(min=0), "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=ga, learning_rate=1e-3, max_grad_norm=max_grad_norm,
        report_to=[], save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500, logging_steps=1, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    return transformers.Trainer(model=model, args=args, train_dataset=data,
                                callbacks=callbacks)


# -- 1. the gradient norm before clipping, and the clip flag ------------------------------


def test_hf_trainer_grad_norm_is_the_trainers_before_clipping(tmp_path) -> None:
    """accelerate clips with ``clip_grads_with_norm_``: the frame's ``grad.norm`` is the
    Trainer's logged ``grad_norm`` (before clipping), clipped on every step (all over
    0.5), and the unsampled steps' history carries the same norms and flags."""
    from logitwatch.hooks.hf import LogitwatchCallback

    client, frames = capturing_client()
    cb = LogitwatchCallback(run="r", client=client, sample_every=3, overhead_budget=None,
                            history_every=None)
    rec = Recorder()
    hf_trainer(str(tmp_path), [cb, rec], steps=6).train()  # type: ignore[attr-defined]
    client.shutdown(5.0)
    logged = {g - 1: rec.logs[g]["grad_norm"] for g in rec.logs}  # monitor step = g - 1
    assert len(logged) == 6 and all(n > 0.5 for n in logged.values())
    frames = sent(frames)
    assert [f["step"] for f in frames] == [0, 3, 5]
    seen: dict[int, tuple[float, float]] = {}
    for f in frames:
        s = f["scalars"]
        seen[f["step"]] = (s["grad.norm"], s["grad.clipped"])
        assert s["grad.max_norm"] == pytest.approx(0.5)
        assert s["grad.clip_rate"] == 1.0
        h = f["history"]
        if h:
            for step, norm, hit in zip(h["steps"], h["scalars"]["grad.norm"],
                                       h["scalars"]["grad.clipped"], strict=True):
                seen[step] = (norm, hit)
    assert sorted(seen) == list(range(6))
    for step, (norm, hit) in seen.items():
        assert norm == pytest.approx(logged[step], rel=1e-4)
        assert hit == 1.0


def test_clip_grads_with_norm_shared_total_counts_once() -> None:
    """A job (accelerate under FSDP2, one call per device mesh) clipping parameter groups
    apart with one global norm: the norm counts once, the step counts as clipped."""
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    client, frames = capturing_client()
    mon = H.attach(model, opt, run="r", client=client, sample_every=1, overhead_budget=None)
    half = len(list(model.parameters())) // 2
    truth = []
    for ids in batches(3):
        F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
        params = list(model.parameters())
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        truth.append(total.item())
        torch.nn.utils.clip_grads_with_norm_(params[:half], 0.1, total)
        torch.nn.utils.clip_grads_with_norm_(params[half:], 0.1, total)
        opt.step()
        opt.zero_grad()
    mon.close()
    got = [f["scalars"] for f in sent(frames)]
    assert [s["grad.norm"] for s in got] == pytest.approx(truth, rel=1e-5)
    assert [s["grad.clipped"] for s in got] == [1.0, 1.0, 1.0]


def test_unseen_clip_is_never_reported_unclipped() -> None:
    """A clip the monitor cannot see (``clip_grad_norm_`` bound before attach): the norm it
    measures at the optimizer step is the threshold, counted as clipped."""
    clip = torch.nn.utils.clip_grad_norm_  # bound before attach: not observed
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    client, frames = capturing_client()
    mon = H.attach(model, opt, run="r", client=client, sample_every=1, overhead_budget=None,
                   max_grad_norm=0.1)
    for ids in batches(2):
        F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
        assert clip(model.parameters(), 0.1) > 0.1
        opt.step()
        opt.zero_grad()
    mon.close()
    for f in sent(frames):
        assert f["scalars"]["grad.clipped"] == 1.0
        assert f["scalars"]["grad.norm"] == pytest.approx(0.1, rel=1e-3)


# -- 2. the loss under gradient accumulation ----------------------------------------------


@pytest.mark.parametrize("ga", [1, 4])
def test_hf_trainer_loss_is_the_trainers(tmp_path, ga: int) -> None:
    """The frames' loss (sampled and history) is the loss the Trainer logs, with and
    without gradient accumulation (each micro-batch's loss is divided by the step's
    token count: the step's loss is their sum)."""
    from logitwatch.hooks.hf import LogitwatchCallback

    client, frames = capturing_client()
    cb = LogitwatchCallback(run="r", client=client, sample_every=2, overhead_budget=None,
                            history_every=None)
    rec = Recorder()
    hf_trainer(str(tmp_path), [cb, rec], steps=4, ga=ga).train()  # type: ignore[attr-defined]
    client.shutdown(5.0)
    logged = {g - 1: rec.logs[g]["loss"] for g in rec.logs}
    seen: dict[int, float] = {}
    for f in sent(frames):
        seen[f["step"]] = f["scalars"]["loss"]
        if f["history"]:
            seen.update(zip(f["history"]["steps"], f["history"]["scalars"]["loss"],
                            strict=True))
    assert sorted(seen) == [0, 1, 2, 3]
    for step, loss in seen.items():
        assert loss == pytest.approx(logged[step], rel=1e-4), step
    # a random model's first loss is close to ln(vocab)
    assert seen[0] == pytest.approx(math.log(64), rel=0.2)


# -- 3. resume from a checkpoint ----------------------------------------------------------


def test_hf_trainer_resume_continues_step_numbers(tmp_path) -> None:
    """A run resumed from its step-3 checkpoint sends steps 3..5, not 0..2 again, and its
    last step (5) is the full sample the callback requests."""
    from logitwatch.hooks.hf import LogitwatchCallback

    out = str(tmp_path / "out")
    steps: dict[str, list] = {}
    for phase, total, resume in (("first", 3, None), ("resumed", 6, True)):
        client, frames = capturing_client()
        cb = LogitwatchCallback(run="r", client=client, sample_every=2, overhead_budget=None)
        trainer = hf_trainer(out, [cb], steps=total, save_steps=3)
        trainer.train(resume_from_checkpoint=resume)  # type: ignore[attr-defined]
        client.shutdown(5.0)
        assert trainer.state.global_step == total  # type: ignore[attr-defined]
        steps[phase] = [(f["step"], bool(f.get("finish"))) for f in frames]
    assert steps["first"] == [(0, False), (2, False)]
    assert steps["resumed"] == [(3, False), (5, False)]


def test_attach_start_step(monkeypatch) -> None:
    with pytest.raises(ValueError, match="start_step"):
        H.attach(Tiny(), run="r", start_step=-1)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    client, frames = capturing_client()
    mon = H.attach(model, opt, run="r", client=client, sample_every=2, overhead_budget=None,
                   start_step=100)
    assert mon.step_index == 100
    mon.request_sample_at(101)
    for ids in batches(3):
        F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    assert [f["step"] for f in frames] == [100, 101, 102]
    # an owned client says the job ended at the last step run, none before the first
    ends: list = []
    monkeypatch.setattr(Client, "finish", lambda self, step=None, **kw: ends.append(step))
    monkeypatch.setattr(Client, "send", lambda self, step, *a, **kw: ends.append(("send", step)))
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = H.attach(model, opt, run="r", sample_every=5, overhead_budget=None, start_step=7)
    for ids in batches(2):
        F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
        opt.step()
    mon.close()
    assert ends == [("send", 7), ("send", 8), 8]  # step 8: the closing frame, then finish
    ends.clear()
    H.attach(Tiny(), run="r", start_step=7).close()  # closed before its first step
    assert ends == []


# -- 4. several optimizers ----------------------------------------------------------------


def test_grad_norm_is_the_attached_optimizers_not_stale_gradients() -> None:
    """An optimizer over part of the model, the rest not frozen (a fine-tune of the head):
    the rest's gradients are never zeroed and add up. ``grad.norm`` (no clip call) is the
    optimizer's parameters' norm; taken over every parameter with a gradient it grew
    step after step (1.27, 10.8, 20.6, 30.1 at steps 0, 100, 200, 300 in the review)."""
    model = Tiny()
    head = [p for n, p in model.named_parameters() if not n.startswith("emb")]
    opt = torch.optim.SGD(head, lr=0.02)
    client, frames = capturing_client()
    mon = H.attach(model, opt, run="r", client=client, sample_every=5, overhead_budget=None)
    truth = []
    for ids in batches(11):
        F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
        truth.append(torch.nn.utils.get_total_norm([p.grad for p in head]).item())
        opt.step()
        opt.zero_grad()  # the embedding's gradient stays and grows
    mon.close()
    got = {f["step"]: f["scalars"]["grad.norm"] for f in sent(frames)}
    assert [got[s] for s in (0, 5, 10)] == pytest.approx([truth[s] for s in (0, 5, 10)],
                                                          rel=1e-5)


# -- 5. an optimizer replaced mid-run -----------------------------------------------------


def test_bind_optimizer_keeps_counting_steps() -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    client, frames = capturing_client()
    mon = H.attach(model, opt, run="r", client=client, sample_every=2, overhead_budget=None)
    with pytest.raises(TypeError):
        mon.bind_optimizer(object())  # type: ignore[arg-type]
    for i, ids in enumerate(batches(10)):
        if i == 4:
            old, opt = opt, torch.optim.AdamW(model.parameters(), lr=1e-3)
            mon.bind_optimizer(opt)
        F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    old.step()  # the old optimizer no longer ends steps
    assert mon.step_index == 10
    assert mon.optimizer is opt
    mon.close()
    got = sent(frames)
    # step 5 sampled too: the lr watch saw the new optimizer's lr jump (0.1 -> 1e-3)
    assert [f["step"] for f in got] == [0, 2, 4, 5, 7, 9]
    assert got[3]["scalars"]["lr"] == pytest.approx(1e-3)
    assert got[3]["scalars"]["optim.adaptive"] == 1.0


def test_warns_once_when_the_optimizer_never_steps(caplog) -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = H.attach(model, opt, run="r", sample_every=2, overhead_budget=None)
    new = torch.optim.SGD(model.parameters(), lr=0.1)  # replaced, not bound
    mon.stall_forwards = 50  # (1,000 by default)
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        for ids in batches(120):
            F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
            new.step()
            new.zero_grad()
    mon.close()
    hits = [r for r in caplog.records if "bind_optimizer" in r.getMessage()]
    assert len(hits) == 1


def test_no_stall_warning_while_the_optimizer_steps(caplog) -> None:
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = H.attach(model, opt, run="r", sample_every=2, overhead_budget=None)
    with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
        for ids in batches(60):
            F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for ids in batches(60):  # evaluation forwards do not count
                model(ids)
    mon.close()
    assert not [r for r in caplog.records if "bind_optimizer" in r.getMessage()]


# -- no host-device sync on unsampled steps, on the new paths ------------------------------


class ItemsLM(nn.Module):
    """A model taking ``num_items_in_batch`` as HF's causal LMs do: its ``.loss`` is the
    summed token loss over the whole step's token count."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Tiny()

    def forward(self, ids: torch.Tensor, num_items_in_batch: object = None) -> object:
        logits = self.inner(ids)
        loss = F.cross_entropy(logits.reshape(-1, 32), ids.reshape(-1), reduction="sum")
        return type("Out", (), {"loss": loss / num_items_in_batch, "logits": logits})()


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA"))])
def test_accelerate_style_steps_do_not_sync(device: str) -> None:
    """Two micro-batches a step given ``num_items_in_batch`` (their losses summed, times
    ``loss_items_scale``), clipped as accelerate does (``get_total_norm`` then
    ``clip_grads_with_norm_``): no read-back on an unsampled step, and every step's
    loss, norm and clip flag as the loop computed them."""
    from logitwatch.hooks._probes import CountSyncs

    model = ItemsLM().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    client, frames = capturing_client()
    mon = H.attach(model, opt, run="r", client=client, sample_every=3, overhead_budget=None,
                   history_every=None)
    mon.loss_items_scale = 2.0
    data = batches(14)
    truth = []
    for i in range(7):
        micro = [ids.to(device) for ids in data[2 * i:2 * i + 2]]
        items = torch.tensor(sum(m.numel() for m in micro), device=device)
        unsampled = i % 3 != 0
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("error" if unsampled else "default")
        losses = []
        try:
            with CountSyncs() as probe:
                for ids in micro:
                    out = model(ids, num_items_in_batch=items)
                    out.loss.backward()
                    losses.append(out.loss.detach())
                params = list(model.parameters())
                total = torch.nn.utils.get_total_norm([p.grad for p in params])
                torch.nn.utils.clip_grads_with_norm_(params, 1.0, total)
                opt.step()
                opt.zero_grad()
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        if unsampled:
            assert probe.calls == [], i
        truth.append((2.0 * sum(x.item() for x in losses), total.item()))
    mon.close()
    seen: dict[int, tuple[float, float, float]] = {}
    for f in sent(frames):
        s = f["scalars"]
        seen[f["step"]] = (s["loss"], s["grad.norm"], s["grad.clipped"])
        if f["history"]:
            h = f["history"]["scalars"]
            seen.update(zip(f["history"]["steps"], zip(
                h["loss"], h["grad.norm"], h["grad.clipped"], strict=True), strict=True))
    assert sorted(seen) == list(range(7))
    for step, (loss, norm, hit) in seen.items():
        assert loss == pytest.approx(truth[step][0], rel=1e-5)
        assert norm == pytest.approx(truth[step][1], rel=1e-5)
        assert hit == float(truth[step][1] > 1.0)


def test_hf_train_again_after_an_interrupted_train_gets_its_own_monitor(tmp_path) -> None:
    """A train() interrupted (Ctrl-C, an exception: the Trainer has no exception hook for
    callbacks) left its monitor attached, and the next train() reused it: its hooks, its
    step count (frames numbered on from the interrupted run's steps). The old monitor is
    closed as a job that did not say it ended; the new train() numbers from its own
    start."""
    from logitwatch.hooks.hf import LogitwatchCallback

    client, frames = capturing_client()
    cb = LogitwatchCallback(run="r", client=client, sample_every=1, overhead_budget=None)
    trainer = hf_trainer(str(tmp_path / "out"), [cb], steps=4)

    class Interrupt(Exception):
        pass

    def stop(args, state, control, **kw):  # type: ignore[no-untyped-def]
        if state.global_step == 2:
            raise Interrupt

    cb.on_step_end = stop  # type: ignore[method-assign]
    with pytest.raises(Interrupt):
        trainer.train()  # type: ignore[attr-defined]
    first = cb.monitor
    assert first is not None and [f["step"] for f in sent(frames)] == [0, 1]
    del cb.on_step_end  # the class's own again
    frames.clear()
    trainer.train()  # type: ignore[attr-defined]
    client.shutdown(5.0)
    assert first._closed and cb.monitor is None  # closed; the second closed at its end
    assert [f["step"] for f in sent(frames)][:4] == [0, 1, 2, 3]


def test_a_compiled_forward_is_warned_of_once(caplog) -> None:
    """Attached, then compiled (the documented order): inside the compiled graph the hooks
    do nothing, and the frames lacked attn.*, final.* and the loss without a word. Said
    once, at the end of the first sampled step (outside the graph); an eager model is not
    warned of."""
    for compiled in (False, True):
        caplog.clear()
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon = H.attach(model, opt, run="r", sample_every=1, overhead_budget=None)
        mon.client.send = lambda *a, **k: None  # type: ignore[method-assign]
        run = torch.compile(model, backend="eager") if compiled else model
        with caplog.at_level(logging.WARNING, logger="logitwatch.hooks"):
            for ids in batches(3):
                F.cross_entropy(run(ids).reshape(-1, 32), ids.reshape(-1)).backward()
                opt.step()
                opt.zero_grad()
        mon.close()
        hits = [r for r in caplog.records if "none of its forwards" in r.getMessage()]
        assert len(hits) == (1 if compiled else 0), (compiled, caplog.text)


@pytest.mark.parametrize(("world", "n_gpu", "tp", "scale"),
                         [(1, 1, None, 1.0), (4, 1, None, 4.0), (4, 1, 2, 2.0), (1, 2, None, 2.0)])
def test_hf_loss_scale_is_the_trainers(world: int, n_gpu: int, tp: int | None,
                                       scale: float) -> None:
    """Where the Trainer averages tokens across devices it multiplies a forward's loss by
    its processes over the tensor-parallel size, or by the GPUs under DataParallel
    (``Trainer.compute_loss``); the callback scaled by the processes alone (review)."""
    from types import SimpleNamespace

    from logitwatch.hooks.hf import _loss_scale

    args = SimpleNamespace(average_tokens_across_devices=True, world_size=world, n_gpu=n_gpu)
    model = SimpleNamespace(_tp_size=tp)
    assert _loss_scale(args, model) == scale
    args.average_tokens_across_devices = False
    assert _loss_scale(args, model) == 1.0
