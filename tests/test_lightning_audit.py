"""The Lightning callback under the audit's reproductions (/tmp/audit_train/pl_*.py): the
loss under ``accumulate_grad_batches``, the LR a step used under a per-step scheduler, and
manual optimization, on real tiny ``lightning.Trainer`` fits."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from logitwatch.client import Client

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]

BATCHES = 16  # a one-epoch loader of 16 batches of 2


def capturing_client() -> tuple[Client, list[dict]]:
    frames: list[dict] = []
    client = Client(None, run="r")

    def send(step, scalars, heads, time=None, history=None):  # type: ignore[no-untyped-def]
        frames.append({"step": step, "scalars": scalars, "history": history})

    client.send = send  # type: ignore[method-assign]
    return client, frames


def fit(callback, *, accumulate: int = 1, max_steps: int = 4, manual: bool = False,
        lr: float | torch.Tensor = 0.1, fits: int = 1, ckpt_path: str | None = None,
        save: str | None = None) -> list[float]:
    """A tiny attention model under ``lightning.Trainer`` (SGD, ``StepLR`` halving the LR
    at every optimizer step); returns each batch's own loss, in order. ``manual``: manual
    optimization, an optimizer step every two batches (Lightning's documented manual
    accumulation). ``fits``: that many fits with the same callback."""
    pl = pytest.importorskip("lightning.pytorch")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.automatic_optimization = not manual
            self.emb = nn.Embedding(64, 16)
            self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)
            self.head = nn.Linear(16, 64)
            self.seen: list[float] = []

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.emb(ids)
            b, t, _ = x.shape
            q = self.q(x).view(b, t, 2, 8).transpose(1, 2)
            k = self.k(x).view(b, t, 2, 8).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, k, is_causal=True)
            return self.head(x + y.transpose(1, 2).reshape(b, t, 16))

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            (ids,) = batch
            loss = F.cross_entropy(self(ids).reshape(-1, 64), ids.reshape(-1))
            self.seen.append(loss.item())
            if manual:
                opt = self.optimizers()
                self.manual_backward(loss / 2)
                if (batch_idx + 1) % 2 == 0:
                    opt.step()
                    opt.zero_grad()
            return loss

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            opt = torch.optim.SGD(self.parameters(), lr=lr)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (2 * BATCHES, 8), generator=gen)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=2)
    seen: list[float] = []
    for _ in range(fits):
        module = Module()
        trainer = pl.Trainer(max_steps=max_steps, max_epochs=1 if manual else None,
                             accumulate_grad_batches=accumulate, callbacks=[callback],
                             accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, loader, ckpt_path=ckpt_path)
        if save is not None:
            trainer.save_checkpoint(save)
        seen += module.seen
    return seen


def step_means(seen: list[float], accumulate: int, steps: int) -> list[float]:
    """Each optimizer step's mean batch loss: windows of ``accumulate`` batches, the
    epoch's last one shorter (Lightning steps at the epoch's last batch)."""
    means = []
    for s in range(steps):
        epoch, i = divmod(s, -(-BATCHES // accumulate))
        start = epoch * BATCHES + i * accumulate
        window = seen[start:min(start + accumulate, (epoch + 1) * BATCHES)]
        means.append(sum(window) / len(window))
    return means


# -- 1. accumulate_grad_batches: the loss is the step's mean batch loss, not 1/N of it --


@pytest.mark.parametrize(("accumulate", "steps"), [(1, 4), (4, 4), (3, 6)])
def test_lightning_audit_frame_loss_is_the_mean_micro_batch_loss(accumulate, steps) -> None:
    """Lightning hands ``on_train_batch_end`` the loss divided by accumulate_grad_batches
    (the last, shorter window's too: 16 batches by 3 end with a window of one): the
    frames' loss is the mean of the step's batches' own losses."""
    from logitwatch.hooks.lightning import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=1,
                                  overhead_budget=None, history_every=None)
    seen = fit(callback, accumulate=accumulate, max_steps=steps)
    client.shutdown(5.0)
    assert [f["step"] for f in frames] == list(range(steps))
    assert [f["scalars"]["loss"] for f in frames] == pytest.approx(
        step_means(seen, accumulate, steps), rel=1e-5)
    # a random model's first loss is about ln(vocab), whatever the accumulation
    assert frames[0]["scalars"]["loss.first_over_ln_vocab"] == pytest.approx(1.0, abs=0.1)


def test_lightning_audit_history_loss_is_the_mean_micro_batch_loss() -> None:
    """The unsampled steps' losses (the next frame's history) are not divided either."""
    from logitwatch.hooks.lightning import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=3,
                                  overhead_budget=None, history_every=None)
    seen = fit(callback, accumulate=4, max_steps=4)
    client.shutdown(5.0)
    assert [f["step"] for f in frames] == [0, 3]  # the last step is sampled
    history = frames[1]["history"]
    assert history["steps"] == [1, 2]
    truth = step_means(seen, 4, 4)
    assert history["scalars"]["loss"] == pytest.approx(truth[1:3], rel=1e-5)
    assert [f["scalars"]["loss"] for f in frames] == pytest.approx(truth[::3], rel=1e-5)


# -- 2. the LR a step used, not the next step's ------------------------------------------


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("tensor_lr", [False, True])
def test_lightning_audit_frame_lr_is_the_lr_the_step_used(accumulate, tensor_lr) -> None:
    """StepLR halves the LR after every optimizer step, and Lightning steps it before
    ``on_train_batch_end``: step 0's frame still says 0.1, the LR its update used. A tensor
    LR (updated in place by the scheduler) too."""
    from logitwatch.hooks.lightning import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=1,
                                  overhead_budget=None, history_every=None)
    fit(callback, accumulate=accumulate, lr=torch.tensor(0.1) if tensor_lr else 0.1)
    client.shutdown(5.0)
    assert [f["step"] for f in frames] == [0, 1, 2, 3]
    assert [f["scalars"]["lr"] for f in frames] == pytest.approx([0.1, 0.05, 0.025, 0.0125])


# -- 3. the LR of unsampled steps ---------------------------------------------------------


def test_lightning_audit_history_has_the_lr_of_unsampled_steps() -> None:
    """Monitor.log() kept only loss= on an unsampled step, and the callback's monitor has
    no optimizer of its own to read the lr from: the history had no lr at all."""
    from logitwatch.hooks.lightning import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=3,
                                  overhead_budget=None, history_every=None)
    fit(callback, max_steps=4)
    client.shutdown(5.0)
    history = frames[1]["history"]
    assert history["steps"] == [1, 2]
    assert history["scalars"]["lr"] == pytest.approx([0.05, 0.025])


# -- 4. manual optimization: a clear warning, no frames ----------------------------------


def test_lightning_audit_manual_optimization_warns_once_and_sends_nothing() -> None:
    """With ``automatic_optimization = False`` batches are not optimizer steps and the
    gradients at a batch's end are not the step's (zeroed, or half accumulated): the
    callback says so once, attaches nothing, and no frame with wrong step counts or norms
    is sent; a second fit with the same callback does not warn again."""
    from logitwatch.hooks.lightning import LogitwatchCallback

    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=1,
                                  overhead_budget=None, history_every=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(callback, manual=True, fits=2)
    client.shutdown(5.0)
    ours = [str(w.message) for w in caught if "logitwatch" in str(w.message)]
    assert len(ours) == 1, ours
    assert "automatic optimization only" in ours[0]
    assert "automatic_optimization = False" in ours[0]
    assert "does not attach" in ours[0]
    assert frames == []
    assert callback.monitor is None


# -- 5. a fit resumed from a checkpoint numbers its steps on -----------------------------


@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint")
def test_lightning_audit_a_resumed_fit_numbers_its_steps_on(tmp_path) -> None:
    """``trainer.fit(ckpt_path=)``: the resumed fit's frames continue at the checkpoint's
    step; they started at 0 again (``global_step`` still reads 0 at ``on_fit_start``),
    onto the first fit's frames, and its last step was never sampled."""
    from logitwatch.hooks.lightning import LogitwatchCallback

    ckpt = str(tmp_path / "three.ckpt")
    client, frames = capturing_client()
    fit(LogitwatchCallback(run="r", client=client, sample_every=1, overhead_budget=None,
                           history_every=None), max_steps=3, save=ckpt)
    first = [f["step"] for f in frames]
    frames.clear()
    fit(LogitwatchCallback(run="r", client=client, sample_every=4, overhead_budget=None,
                           history_every=None), max_steps=6, ckpt_path=ckpt)
    client.shutdown(5.0)
    assert first == [0, 1, 2]
    assert [f["step"] for f in frames] == [3, 5]  # sampled first, and the fit's last step


def test_lightning_audit_a_tensor_lr_is_copied_on_sampled_steps_only(monkeypatch) -> None:
    """A tensor LR (capturable optimizers) is copied for the frame of a sampled step only:
    the callback cloned it at every batch start and every optimizer step, device work on
    the steps between samples (60 clones for 20 steps of 2 micro-batches: review)."""
    import inspect

    from logitwatch.hooks.lightning import LogitwatchCallback

    clones: list[int] = []
    orig = torch.Tensor.clone

    def clone(self, *a, **k):  # type: ignore[no-untyped-def]
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        if caller is not None and caller.f_code.co_filename.endswith("hooks/lightning.py"):
            clones.append(1)
        return orig(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "clone", clone)
    client, frames = capturing_client()
    callback = LogitwatchCallback(run="r", client=client, sample_every=3,
                                  overhead_budget=None, history_every=None)
    fit(callback, max_steps=6, accumulate=2, lr=torch.tensor(0.1))
    client.shutdown(5.0)
    sampled = [f["step"] for f in frames if not f.get("finish")]
    assert sampled == [0, 3, 5]
    assert len(clones) == len(sampled)
