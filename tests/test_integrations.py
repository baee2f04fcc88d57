"""Framework integrations on real tiny training runs: HF Trainer and PyTorch Lightning."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from logitwatch.client import Client

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def capturing_client(run: str = "r") -> tuple[Client, list[dict]]:
    frames: list[dict] = []
    client = Client(None, run=run)
    client.send = lambda step, scalars, heads, time=None: frames.append(  # type: ignore
        {"step": step, "scalars": scalars, "heads": heads, "rank": client.rank})
    return client, frames


def hf_trainer(tmp_path, callback) -> object:
    """A tiny GPT-2 under ``transformers.Trainer`` for 5 steps, with ``callback``."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, 64, (16, 12), generator=gen)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=5, per_device_train_batch_size=4,
        learning_rate=1e-3, max_grad_norm=0.5, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=data,
                                callbacks=[callback])


def test_hf_trainer_callback(tmp_path) -> None:
    pytest.importorskip("transformers")
    from logitwatch.hooks.hf import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=2, overhead_budget=None)
    hf_trainer(tmp_path, callback).train()  # type: ignore[attr-defined]
    client.shutdown(5.0)
    assert callback.monitor is None  # closed at on_train_end
    assert [f["step"] for f in frames] == [0, 2, 4]
    for frame in frames:
        s = frame["scalars"]
        assert {"loss", "grad.norm", "grad.clipped", "grad.clip_rate", "lr",
                "final.logz"} <= set(s)
        assert math.isfinite(s["loss"]) and s["grad.norm"] > 0
        assert s["grad.clipped"] == float(s["grad.norm"] > 0.5)
        assert len(frame["heads"]["attn.logit_max"]) == 2
        assert len(frame["heads"]["qk.q_weight_norm"][0]) == 4
    # the first step's loss of a random model is close to ln(vocab)
    assert frames[0]["scalars"]["loss.first_over_ln_vocab"] == pytest.approx(1.0, abs=0.1)


def test_hf_trainer_last_step_is_a_full_sample(tmp_path) -> None:
    """Steps 0-4 sampled every 3: step 4, the run's last, is sampled too (a full frame)."""
    pytest.importorskip("transformers")
    from logitwatch.hooks.hf import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=3, overhead_budget=None)
    planned = []
    end = callback.on_train_end

    def on_train_end(*a, **k):  # type: ignore[no-untyped-def]
        planned.append(callback.monitor.planned_steps)  # what a fuse's fraction reads
        return end(*a, **k)
    callback.on_train_end = on_train_end  # type: ignore[method-assign]
    hf_trainer(tmp_path, callback).train()  # type: ignore[attr-defined]
    client.shutdown(5.0)
    assert planned == [5]
    assert [f["step"] for f in frames] == [0, 3, 4]
    assert "hooks.closing" not in frames[-1]["scalars"]
    assert len(frames[-1]["heads"]["attn.logit_max"]) == 2
    assert "final.logz" in frames[-1]["scalars"]


def lightning_fit(callback, fail_at: int | None = None, hparams: dict | None = None,
                  lr: float | torch.Tensor = 0.1) -> None:
    """A tiny attention model under ``lightning.Trainer`` for 3 optimizer steps (two
    batches each); ``fail_at``: the training step raises at that batch; ``hparams``: the
    module saves them (``save_hyperparameters``); ``lr``: SGD's (a tensor: as capturable
    optimizers keep it)."""
    pl = pytest.importorskip("lightning.pytorch")

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(16, 16) for _ in range(3))
            self.num_heads = 2

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (p(x).view(b, t, 2, 8).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y.transpose(1, 2).reshape(b, t, 16)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.attn = Attn()
            self.lm_head = nn.Linear(16, 32)
            if hparams:
                self.save_hyperparameters(hparams)

        def training_step(self, batch, batch_idx):  # does not go through forward()
            if batch_idx == fail_at:
                raise RuntimeError("the training step failed")
            (ids,) = batch
            logits = self.lm_head(self.attn(self.emb(ids)))
            return F.cross_entropy(logits[:, :-1].reshape(-1, 32), ids[:, 1:].reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

    torch.manual_seed(0)
    ids = torch.randint(0, 32, (24, 10))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, gradient_clip_val=0.05,
                         accumulate_grad_batches=2, callbacks=[callback])
    trainer.fit(Module(), loader)


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_lightning_callback() -> None:
    pytest.importorskip("lightning.pytorch")
    from logitwatch.hooks.lightning import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=2, overhead_budget=None)
    lightning_fit(callback)
    client.shutdown(5.0)
    assert callback.monitor is None
    assert [f["step"] for f in frames] == [0, 2]  # optimizer steps, two batches each
    for frame in frames:
        s = frame["scalars"]
        assert {"loss", "grad.norm", "grad.clipped", "lr", "final.hidden_rms"} <= set(s)
        assert s["lr"] == pytest.approx(0.1) and s["grad.clipped"] == 1.0
        assert len(frame["heads"]["attn.entropy_mean"]) == 1
        assert len(frame["heads"]["qk.k_weight_norm"][0]) == 2


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_lightning_callback_reads_no_tensor_lr_back_between_samples() -> None:
    """A tensor LR (capturable optimizers keep it on the device): the callback's batch end
    reads nothing back to the host on a step that is not sampled, and the sampled frames
    still carry the LR."""
    pytest.importorskip("lightning.pytorch")
    from logitwatch.hooks._probes import CountSyncs
    from logitwatch.hooks.lightning import LogitwatchCallback

    reads: list[list[str]] = []  # the read-backs of each unsampled batch end

    class Counting(LogitwatchCallback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.monitor is not None and self.monitor.sampled:  # its capture mode is on
                super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
                return
            with CountSyncs() as probe:
                super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            reads.append(probe.calls)

    client, frames = capturing_client()
    callback = Counting(run="r", client=client, sample_every=2, overhead_budget=None)
    lightning_fit(callback, lr=torch.tensor(0.1))
    client.shutdown(5.0)
    assert len(reads) >= 2 and not any(reads), reads
    assert [f["step"] for f in frames] == [0, 2]
    assert all(f["scalars"]["lr"] == pytest.approx(0.1) for f in frames)


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_lightning_last_step_is_a_full_sample() -> None:
    pytest.importorskip("lightning.pytorch")
    from logitwatch.hooks.lightning import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=5, overhead_budget=None)
    lightning_fit(callback)  # 3 optimizer steps
    client.shutdown(5.0)
    assert [f["step"] for f in frames] == [0, 2]
    assert len(frames[-1]["heads"]["attn.entropy_mean"]) == 1


# -- the end of training: the run finishes (or, on an error, does not) --------------------


def run_status(url: str, name: str) -> tuple[str, int | None]:
    import httpx

    (run,) = [r for r in httpx.get(f"{url}/api/v1/runs", timeout=10).json()
              if r["name"] == name]
    return run["status"], run["end_step"]


def test_hf_on_train_end_finishes_the_run(tmp_path) -> None:
    pytest.importorskip("transformers")
    from logitwatch.demo.runner import Collector
    from logitwatch.hooks.hf import LogitwatchCallback

    with Collector(f"sqlite:///{tmp_path / 'c.db'}") as col:
        callback = LogitwatchCallback(run="hf", url=col.url, sample_every=2,
                                      overhead_budget=None)
        hf_trainer(tmp_path, callback).train()  # type: ignore[attr-defined]
        assert run_status(col.url, "hf") == ("finished", 4)


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.parametrize(("fail_at", "status"), [(None, ("finished", 2)), (3, ("running", None))])
def test_lightning_on_fit_end_finishes_the_run(tmp_path, fail_at, status) -> None:
    pytest.importorskip("lightning.pytorch")
    from logitwatch.demo.runner import Collector
    from logitwatch.hooks.lightning import LogitwatchCallback

    with Collector(f"sqlite:///{tmp_path / 'c.db'}") as col:
        callback = LogitwatchCallback(run="pl", url=col.url, sample_every=1,
                                      overhead_budget=None)
        if fail_at is None:
            lightning_fit(callback)
        else:
            with pytest.raises(RuntimeError, match="training step failed"):
                lightning_fit(callback, fail_at=fail_at)
        assert callback.monitor is None  # closed either way
        assert run_status(col.url, "pl") == status


def _scaled_steps(model: nn.Module, opt: torch.optim.Optimizer, skip: set[int], mon,
                  end_skipped, begin=None, end=None) -> list[float]:
    """Six steps under a real ``torch.amp.GradScaler``; at the iterations in ``skip`` a
    gradient is made non-finite (an fp16 overflow), so the scaler skips ``opt.step()`` and
    ``end_skipped(i)`` is called; ``begin``/``end`` around each step (a Trainer's
    callbacks); the loss goes to ``mon()`` (the model returns logits). Returns each
    iteration's loss."""
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for i in range(6):
        if begin is not None:
            begin()
        ids = torch.randint(0, 32, (2, 8), generator=gen)
        loss = F.cross_entropy(model(ids).reshape(-1, 32), ids.reshape(-1))
        mon().log(loss=loss)
        scaler.scale(loss).backward()
        if i in skip:
            next(model.parameters()).grad[0, 0] = math.inf
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scale:
            end_skipped(i)
        if end is not None:
            end()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("how", ["plain", "hf"])
def test_a_step_the_loss_scaler_skipped_is_a_step_of_its_own(tmp_path, how: str) -> None:
    """fp16 AMP: a loss scaler skips ``optimizer.step()`` on non-finite gradients, so the
    optimizer's step hooks never end the step. Ended by ``mon.step(skipped=True)`` (a plain
    loop) or by the Hugging Face callback's ``on_step_end``, each iteration is a step: one
    frame each, its own loss, the skipped ones with their non-finite gradient norm."""
    from test_hooks_sampling import Tiny

    from logitwatch.hooks import attach

    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    client, frames = capturing_client()
    skipped: list[int] = []
    if how == "plain":
        mon = attach(model, opt, run="r", client=client, sample_every=1, overhead_budget=None)
        losses = _scaled_steps(model, opt, {2, 4}, lambda: mon,
                               lambda i: (skipped.append(i), mon.step(skipped=True)))
        mon.close()
    else:
        transformers = pytest.importorskip("transformers")
        from logitwatch.hooks.hf import LogitwatchCallback

        callback = LogitwatchCallback(run="r", client=client, sample_every=1,
                                      overhead_budget=None)
        args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                              report_to=[], max_grad_norm=0.0)
        state, control = transformers.TrainerState(), transformers.TrainerControl()
        callback.on_train_begin(args, state, control, model=model, optimizer=opt)
        losses = _scaled_steps(model, opt, {2, 4}, lambda: callback.monitor, skipped.append,
                               lambda: callback.on_step_begin(args, state, control),
                               lambda: callback.on_step_end(args, state, control))
        callback.on_train_end(args, state, control)
    client.shutdown(5.0)
    assert skipped == [2, 4]
    assert [f["step"] for f in frames] == list(range(6))
    for i, frame in enumerate(frames):
        s = frame["scalars"]
        assert s["loss"] == pytest.approx(losses[i], rel=1e-6), i
        assert math.isfinite(s["grad.norm"]) == (i not in skipped), (i, s["grad.norm"])
