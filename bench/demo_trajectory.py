"""Print the trajectory of a demo setting: loss and per-layer max attention logit.

Every ``--every`` steps the script records, for each layer, the maximum over heads (and
over the batch and all causal query/key pairs) of ``q.k * scale``, computed in float32
from the ``q`` and ``k`` the model passes to ``F.scaled_dot_product_attention``. It reads
them the way a monitor does: a ``TorchFunctionMode`` that intercepts the SDPA call,
entered by a forward pre-hook on sampled steps only; the model code is not changed.

    python bench/demo_trajectory.py unstable --seed 0
    python bench/demo_trajectory.py healthy --every 50 --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from logitwatch.demo.train import SETTINGS, train


def max_causal_logit(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-head max of ``q.k*scale`` over causal pairs, in float32 (``[H]``)."""
    s = q.float() @ k.float().transpose(-2, -1) * scale
    t_q, t_k = s.shape[-2:]
    s = s.masked_fill(~torch.ones(t_q, t_k, dtype=torch.bool).tril(), -math.inf)
    return s.amax(dim=(0, 2, 3)) if s.dim() == 4 else s.amax(dim=(-2, -1))


class _SDPAProbe(TorchFunctionMode):
    def __init__(self, sink: list[torch.Tensor]) -> None:
        super().__init__()
        self.sink = sink

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k = args[0], args[1]
            scale = kwargs.get("scale") or q.shape[-1] ** -0.5
            with torch.no_grad():
                self.sink.append(max_causal_logit(q, k, scale))
        return func(*args, **kwargs)


class LogitProbe:
    """Records per-layer max logits (list of ``[H]`` tensors) on every ``every``-th step."""

    def __init__(self, every: int = 10) -> None:
        self.every = every
        self.step = 0
        self.rows: dict[int, list[torch.Tensor]] = {}
        self._mode: _SDPAProbe | None = None

    def attach(self, model: nn.Module, optimizer: Any = None) -> None:
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def _pre(self, module: nn.Module, args: Any) -> None:
        if self.step % self.every == 0:
            self.rows[self.step] = []
            self._mode = _SDPAProbe(self.rows[self.step])
            self._mode.__enter__()

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    def on_step(self, step: int, loss: float) -> None:
        self.step = step + 1

    def layer_max(self, step: int) -> list[float]:
        """Max over heads of the max logit, per layer, at ``step``."""
        return [float(h.max()) for h in self.rows.get(step, [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", choices=sorted(SETTINGS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    setting = SETTINGS[args.setting]
    if args.seed is not None:
        setting = dataclasses.replace(setting, seed=args.seed)
    probe = LogitProbe(args.every)
    result = train(setting, steps=args.steps, on_model=probe.attach, on_step=probe.on_step,
                   num_threads=args.threads, log=lambda s: None)
    print(f"{'step':>5} {'loss':>8} {'mean10':>8}  max logit per layer (max over heads)")
    for step in sorted(probe.rows):
        if step < len(result.losses):
            mean10 = sum(result.losses[max(0, step - 9) : step + 1]) / min(step + 1, 10)
            logits = "  ".join(f"{v:10.1f}" for v in probe.layer_max(step))
            print(f"{step:5d} {result.losses[step]:8.4f} {mean10:8.4f}  {logits}")
    print(f"setting={setting.name} seed={setting.seed} steps_done={result.steps_done} "
          f"divergence_step={result.divergence_step} wall={result.wall_s:.1f}s "
          f"({result.steps_done / result.wall_s:.1f} steps/s)")


if __name__ == "__main__":
    main()
