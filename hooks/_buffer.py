"""Per-step, on-device statistics and the one host transfer at the end of a sampled step."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["StepBuffer", "to_host"]

Scalar = torch.Tensor | float


def to_host(tensors: list[torch.Tensor]) -> list[list[float]]:
    """Read ``tensors`` back as lists of floats with at most one device-to-host copy.

    Tensors on accelerators are concatenated on the first one's device (peer copies, no
    host sync) and moved to the CPU by a single ``.cpu()``; CPU tensors need no transfer.
    """
    device_idx = [i for i, t in enumerate(tensors) if t.device.type != "cpu"]
    host_idx = [i for i, t in enumerate(tensors) if t.device.type == "cpu"]
    parts: list[torch.Tensor] = []
    if device_idx:
        main = tensors[device_idx[0]].device
        moved = [tensors[i].detach().float().reshape(-1).to(main) for i in device_idx]
        parts.append(torch.cat(moved).cpu())
    parts.extend(tensors[i].detach().float().reshape(-1) for i in host_idx)
    if not parts:
        return []
    flat = torch.cat(parts).tolist() if len(parts) > 1 else parts[0].tolist()
    out: list[list[float]] = [[] for _ in tensors]
    pos = 0
    for i in device_idx + host_idx:
        n = tensors[i].numel()
        out[i] = flat[pos : pos + n]
        pos += n
    return out


class StepBuffer:
    """Statistics of the current sampled step, kept as detached device tensors.

    Several forwards in one step (gradient accumulation) are combined: attention max and
    p99 take the elementwise **maximum** over the forwards (so the max is exact and the
    p99 is the largest of the forwards' exact p99s: exact with one forward per step, an
    upper bound of the pooled p99 otherwise, never under-reporting a heating head); the
    automatic loss is the **mean** over the forwards.
    """

    def __init__(self) -> None:
        self.attn_max: dict[int, torch.Tensor] = {}
        self.attn_p99: dict[int, torch.Tensor] = {}
        self.auto_loss: torch.Tensor | None = None
        self.auto_loss_count = 0
        self.logged: dict[str, Scalar] = {}
        self.grad_norm: torch.Tensor | None = None
        self.max_norm: Any = None

    def add_attention(self, layer: int, maximum: torch.Tensor, p99: torch.Tensor) -> None:
        old_max, old_p99 = self.attn_max.get(layer), self.attn_p99.get(layer)
        if old_max is not None and old_p99 is not None and old_max.shape == maximum.shape:
            maximum = torch.maximum(old_max, maximum)
            p99 = torch.maximum(old_p99, p99)
        self.attn_max[layer] = maximum
        self.attn_p99[layer] = p99

    def add_auto_loss(self, loss: torch.Tensor) -> None:
        loss = loss.detach().float().mean()
        self.auto_loss = loss if self.auto_loss is None else self.auto_loss + loss
        self.auto_loss_count += 1

    def log(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.logged[name] = value.detach()
        else:
            self.logged[name] = float(value)

    def collect(
        self, *, lr: Any = None, default_max_norm: float | None = None
    ) -> tuple[dict[str, float], dict[str, list[list[float]]]]:
        """Build the frame's ``(scalars, heads)`` with one host transfer."""
        scalars: dict[str, Scalar] = {}
        if self.auto_loss is not None:
            scalars["loss"] = self.auto_loss / self.auto_loss_count
        if self.grad_norm is not None:
            scalars["grad.norm"] = self.grad_norm
            max_norm = self.max_norm if self.max_norm is not None else default_max_norm
            if max_norm is not None:
                if isinstance(max_norm, torch.Tensor):
                    max_norm = max_norm.detach().to(self.grad_norm.device)
                scalars["grad.clipped"] = (self.grad_norm > max_norm).float()
        if lr is not None:
            scalars["lr"] = lr.detach() if isinstance(lr, torch.Tensor) else float(lr)
        scalars.update(self.logged)  # Monitor.log() wins, including over the auto loss

        names: list[str] = []
        tensors: list[torch.Tensor] = []
        host: dict[str, float] = {}
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor):
                names.append(name)
                tensors.append(value.float().mean().reshape(1))
            else:
                host[name] = value
        layers = sorted(self.attn_max)
        tensors.extend(self.attn_max[i] for i in layers)
        tensors.extend(self.attn_p99[i] for i in layers)
        values = to_host(tensors)
        out_scalars = {name: values[j][0] for j, name in enumerate(names)}
        out_scalars.update(host)
        heads: dict[str, list[list[float]]] = {}
        if layers:
            n = len(names)
            heads["attn.logit_max"] = values[n : n + len(layers)]
            heads["attn.logit_p99"] = values[n + len(layers) :]
        return out_scalars, heads
