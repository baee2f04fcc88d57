"""The demo training job: three settings of one tiny byte-level GPT.

``SETTINGS["unstable"]`` lets the attention logits grow until half-precision attention
overflows and the loss diverges; ``SETTINGS["fused"]`` is the same run with fuses on
``auto`` (:attr:`DemoSetting.fuses`, handed to ``attach`` by ``logitwatch.demo.job``),
which train it through; ``SETTINGS["healthy"]`` trains the same model and data for the
same number of steps with QK-norm, without diverging. :func:`train` runs one setting and
exposes two hooks for a monitor: ``on_model(model, optimizer)`` once before training and
``on_step(step, loss)`` after every optimizer step. Gradient clipping is called as
``torch.nn.utils.clip_grad_norm_`` (looked up at call time, so it can be intercepted).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .data import ByteData
from .model import AttnDtype, GPTConfig, TinyGPT

DIVERGENCE_WINDOW = 10
DIVERGENCE_JUMP = 1.0


@dataclass(frozen=True)
class DemoSetting:
    """Everything that defines one demo run (deterministic for a given ``seed``)."""

    name: str
    description: str
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    seq_len: int = 64
    qk_norm: bool = False
    attn_dtype: AttnDtype = "float16"
    init_std: float = 0.1
    lr: float = 0.2  # peak learning rate, reached at the end of the warmup
    warmup: int = 1000  # linear warmup steps (the lr rises by lr/warmup per step)
    min_lr_ratio: float = 1.0  # cosine decay to lr*min_lr_ratio at `steps` (1.0: constant)
    batch_size: int = 16
    steps: int = 1200
    weight_decay: float = 0.0
    max_norm: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    seed: int = 0
    #: The fuses a monitor attaches with (``attach(fuses=...)``'s dict form); None: none.
    #: :func:`train` itself attaches nothing: the job (``logitwatch.demo.job``) does.
    fuses: dict[str, Any] | None = None

    @property
    def grad_clip(self) -> float:
        """Alias of ``max_norm`` (the ``max_grad_norm`` to give a monitor)."""
        return self.max_norm

    def model_config(self) -> GPTConfig:
        """The :class:`GPTConfig` of this setting."""
        return GPTConfig(
            d_model=self.d_model, n_layer=self.n_layer, n_head=self.n_head,
            seq_len=self.seq_len, qk_norm=self.qk_norm, attn_dtype=self.attn_dtype,
            init_std=self.init_std,
        )

    def lr_at(self, step: int, total: int | None = None) -> float:
        """Learning rate of ``step`` (0-based): linear warmup, then cosine decay."""
        total = total or self.steps
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = min(1.0, (step - self.warmup) / max(1, total - self.warmup))
        ratio = self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        return self.lr * ratio


_COMMON = (
    "Tiny byte-level GPT (d_model 64, 2 layers, 4 heads of 16, seq 64, batch 16, init std "
    "0.1), attention scores in float16; AdamW (betas 0.9/0.95, no weight decay, clip 1.0) "
    "with a linear warmup of 1000 steps toward a very high peak lr of 0.2. "
)

#: The fused setting's fuses (``attach(fuses=...)``; docs/FUSES.md). Rollback is left out:
#: with QK-clip holding the logits nothing triggers it, and alone it cannot remove this
#: run's cause (bench/README.md, *Fuses*).
FUSED: dict[str, Any] = {"qk_clip": {"tau": 50.0, "mode": "auto"}, "lr_backoff": "auto"}

SETTINGS: dict[str, DemoSetting] = {
    "unstable": DemoSetting(
        name="unstable",
        description=_COMMON + "No QK-norm: the per-head max attention logit grows from ~5 to "
        "thousands, then past the float16 limit (65504) and the loss turns NaN "
        "(steps ~750-1000 on the reference machine).",
        qk_norm=False,
    ),
    "fused": DemoSetting(
        name="fused",
        description=_COMMON + "No QK-norm, as 'unstable', with fuses on auto: QK-clip at tau "
        "50 scales W_q and W_k of each head whose max logit passed 50 after every step, so "
        "the logits stay far below the float16 limit, and each clip backs the lr off (x0.5, "
        "back over 200 steps): the run trains through all 1200 steps.",
        qk_norm=False,
        fuses=FUSED,
    ),
    "healthy": DemoSetting(
        name="healthy",
        description=_COMMON + "With QK-norm (RMSNorm on q and k): max logits stay below ~25 "
        "and the loss keeps decreasing for all 1200 steps.",
        qk_norm=True,
    ),
}


@dataclass
class TrainResult:
    """Outcome of :func:`train`: ``losses[i]`` is the loss of step ``i`` (0-based)."""

    setting: str
    losses: list[float] = field(default_factory=list)
    divergence_step: int | None = None
    wall_s: float = 0.0
    steps_done: int = 0


def divergence_step(
    losses: list[float], window: int = DIVERGENCE_WINDOW, jump: float = DIVERGENCE_JUMP
) -> int | None:
    """First step at which the loss has diverged, or ``None``.

    Step ``i`` (an index into ``losses``) is the divergence step when either
    * ``losses[i]`` is NaN or infinite, or
    * the mean of the ``window`` losses ending at ``i`` exceeds the lowest such
      ``window``-step mean seen at an earlier step by more than ``jump`` nats
      (defaults: 10 steps, 1.0 nat).

    Averaging over a window ignores single noisy batches; comparing with the best mean
    so far (not the first one) catches a blow-up after the loss had come down.
    """
    best = math.inf
    total = 0.0
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            return i
        total += loss
        if i >= window:
            total -= losses[i - window]
        if i + 1 < window:
            continue
        mean = total / window
        if mean > best + jump:
            return i
        best = min(best, mean)
    return None


def train(
    setting: DemoSetting,
    *,
    steps: int | None = None,
    on_model: Callable[[nn.Module, torch.optim.Optimizer], Any] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    on_loss: Callable[[torch.Tensor], None] | None = None,
    log: Callable[[str], None] = print,
    num_threads: int | None = None,
    stop_after_divergence: int = 30,
    log_every: int = 50,
) -> TrainResult:
    """Train ``setting`` for ``steps`` (default ``setting.steps``) optimizer steps.

    ``num_threads`` calls ``torch.set_num_threads`` first (1 lets two demo jobs share
    two cores). Training stops ``stop_after_divergence`` steps after
    :func:`divergence_step` first reports a divergence. ``log`` receives a progress line
    every ``log_every`` steps. Callbacks: ``on_model(model, optimizer)`` once after they
    are built (a monitor attaches there), ``on_loss(loss)`` after each forward, before
    backward, and ``on_step(step, loss)`` after each optimizer step.
    """
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    total = steps if steps is not None else setting.steps
    torch.manual_seed(setting.seed)
    model = TinyGPT(setting.model_config())
    data = ByteData(setting.seq_len, setting.batch_size, seed=setting.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": setting.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=setting.lr_at(0, total), betas=setting.betas, eps=setting.eps,
    )
    if on_model is not None:
        on_model(model, optimizer)
    result = TrainResult(setting=setting.name)
    log(f"{setting.name} (seed {setting.seed}, {total} steps): {setting.description}")
    start = time.perf_counter()
    model.train()
    for step in range(total):
        lr = setting.lr_at(step, total)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = data.batch()
        _, loss = model(x, y)
        assert loss is not None
        if on_loss is not None:
            on_loss(loss)  # before backward and step: where a job calls mon.log(loss=loss)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), setting.max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())
        result.losses.append(value)
        result.steps_done = step + 1
        if on_step is not None:
            on_step(step, value)
        if log_every and (step % log_every == 0 or step == total - 1):
            log(f"step {step:5d}  loss {value:7.4f}  lr {lr:.2e}  "
                f"{time.perf_counter() - start:6.1f}s")
        if result.divergence_step is None:
            result.divergence_step = divergence_step(result.losses)
            if result.divergence_step is not None:
                log(f"loss diverged at step {result.divergence_step}")
        elif step >= result.divergence_step + stop_after_divergence:
            log(f"stopping {stop_after_divergence} steps after the divergence")
            break
    result.wall_s = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> None:
    """``python -m logitwatch.demo.train {unstable,healthy} [--seed N] [--steps N]``."""
    import argparse
    import dataclasses

    parser = argparse.ArgumentParser(description="Run one demo training setting.")
    parser.add_argument("setting", choices=sorted(SETTINGS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    if args.seed is not None:
        setting = dataclasses.replace(setting, seed=args.seed)
    result = train(setting, steps=args.steps, num_threads=args.threads,
                   log=lambda msg: print(f"[{setting.name}] {msg}", flush=True))
    print(f"[{setting.name}] steps {result.steps_done}, divergence step "
          f"{result.divergence_step}, {result.wall_s:.1f}s "
          f"({result.steps_done / max(result.wall_s, 1e-9):.1f} steps/s)")


if __name__ == "__main__":
    main()
