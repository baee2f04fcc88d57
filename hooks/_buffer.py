"""Per-step, on-device statistics and the one host transfer at the end of a sampled step."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ._final import FinalStats
from ._logits import HeadStats, merge_head_stats
from ._shard import is_dtensor

__all__ = ["StepBuffer", "logged_value", "to_host", "warn_skipped"]

log = logging.getLogger("logitwatch.hooks")

Scalar = torch.Tensor | float

#: ``Monitor.log()`` names already warned about a skipped value (process-wide: a
#: :class:`StepBuffer` lives one sampled step). Bounded: a job logging ever new names
#: (``f"val_{step}"``) must not grow it without end; past the bound, skips are silent.
_WARNED: set[str] = set()
_WARNED_MAX = 256
#: A norm measured at the optimizer step within this fraction under the clip threshold
#: counts as clipped (``StepBuffer.norm_after_clip``): a clip leaves the norm at the
#: threshold, up to rounding (bf16 gradients round to about 0.4%)
AFTER_CLIP_TOL = 5e-3
#: What :meth:`StepBuffer.log` accepts, for the warning.
ACCEPTED = ("an int, float or bool, a NumPy scalar or one-element array, or a real "
            "one-element tensor (0-d or 1 element, on any device)")


def logged_value(value: Any) -> Scalar | None:
    """``value`` as a frame scalar: a detached one-element tensor (left on its device: no
    read-back before the step's one transfer) or a float; None when it is not a real
    number. Decided from types and shapes only (no tensor value is read: no sync)."""
    try:
        return _scalar(value)
    except Exception:  # never escapes into the job's log() call
        return None


def _scalar(value: Any) -> Scalar | None:
    if isinstance(value, torch.Tensor):
        if is_dtensor(value):  # replicated: this rank's copy (a collective is no option)
            if not all(type(p).__name__ == "Replicate" for p in value.placements):
                return None
            value = value.to_local()
        # metadata only; a tensor that the step's one transfer could not read (meta,
        # sparse) or would misread (complex: ``.float()`` drops the imaginary part)
        if (value.numel() != 1 or value.is_complex() or value.layout != torch.strided
                or value.device.type == "meta"):
            return None
        return value.detach()
    if value is None or isinstance(value, (str, bytes, bytearray, complex)):
        return None  # float("1.5") would parse a string: not a number the job computed
    if hasattr(value, "item") and hasattr(value, "size"):  # NumPy scalars and arrays
        if value.size != 1:
            return None
        value = value.item()  # no DeprecationWarning, unlike float() of a 1-d array
        if isinstance(value, complex):
            return None
    # int (one too large for a float: OverflowError), bool, Fraction, __float__
    return float(value)


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


def warn_skipped(name: str, value: Any) -> None:
    """Say once per ``name`` that a ``Monitor.log()`` value was skipped, what it was and
    what is accepted."""
    if name in _WARNED or len(_WARNED) >= _WARNED_MAX:
        return
    _WARNED.add(name)
    log.warning("logitwatch: Monitor.log(%s=...) skipped a value of type %s (%s): not a "
                "real number. Accepted: %s. The rest of the frame is sent; further skipped "
                "values of %r are not logged", name, type(value).__name__, _describe(value),
                ACCEPTED, name)


def _describe(value: Any) -> str:
    """A short description of a skipped value, reading no tensor value (no sync)."""
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)}, {value.dtype}, {value.device}"
    if value is None or isinstance(value, (str, bytes, int, float, complex)):
        try:  # only plain values: another object's repr may be costly (or read a device)
            text = repr(value)
        except Exception:  # an int past Python's digit limit
            return "a very large int" if isinstance(value, int) else "unprintable"
        return text if len(text) <= 60 else text[:57] + "..."
    shape = getattr(value, "shape", None)
    return f"shape {tuple(shape)}" if isinstance(shape, tuple) else "not a number"


def _rectangular(rows: list[list[float]]) -> list[list[float]]:
    """Pad rows with NaN to the longest (a layer with fewer heads)."""
    width = max((len(r) for r in rows), default=0)
    return [r + [math.nan] * (width - len(r)) for r in rows]


class StepBuffer:
    """Statistics of the current sampled step, kept as detached device tensors.

    Several forwards in one step (gradient accumulation) are pooled per layer with
    :func:`~logitwatch.hooks._logits.merge_head_stats` (max, mean, std, entropy exact;
    p99 the largest per-forward exact p99, an upper bound of the pooled one) and the final
    statistics with :meth:`FinalStats.merge`; the automatic loss is the **mean** over the
    forwards, or their **sum** where each forward's loss is already its share of the step's
    (``add_auto_loss(summed=True)``: the Hugging Face Trainer's ``num_items_in_batch``).
    """

    def __init__(self) -> None:
        self.attn: dict[int, HeadStats] = {}
        self.final: FinalStats | None = None
        self.auto_loss: torch.Tensor | None = None
        self.auto_loss_count = 0
        self.logged: dict[str, Scalar] = {}
        self.grad_norm: torch.Tensor | None = None
        self.max_norm: Any = None
        #: Several clip calls this step: 1 where any of them clipped (int32, on the
        #: device; ``_optimizer_step._StepClips``), else None (``grad_norm > max_norm``)
        self.clipped: torch.Tensor | None = None
        #: ``grad_norm`` was measured at the optimizer step, not taken from a clip call: a
        #: clip the monitor did not see may have run before (its norm is then the threshold)
        self.norm_after_clip = False
        #: the automatic loss is the **sum** of the forwards' (``add_auto_loss(summed=True)``)
        self.auto_loss_summed = False
        self.dtype_max: float | None = None

    def add_dtype_max(self, value: float) -> None:
        """Keep the smallest ``finfo(dtype).max`` of the attention calls seen (host float)."""
        if self.dtype_max is None or value < self.dtype_max:
            self.dtype_max = value

    def add_attention(self, layer: int, stats: HeadStats) -> None:
        old = self.attn.get(layer)
        if old is not None and old.maximum.shape == stats.maximum.shape:
            stats = merge_head_stats(old, stats)
        self.attn[layer] = stats

    def add_final(self, stats: FinalStats) -> None:
        if self.final is None:
            self.final = stats
        else:
            self.final.merge(stats)

    def add_auto_loss(self, loss: torch.Tensor, summed: bool = False) -> None:
        """One forward's loss. ``summed``: the forward's loss is already its share of the
        step's (the Hugging Face Trainer's ``num_items_in_batch``: each micro-batch's loss
        divided by the whole step's token count), so the step's loss is the sum."""
        loss = loss.detach().float().mean()
        self.auto_loss = loss if self.auto_loss is None else self.auto_loss + loss
        self.auto_loss_count += 1
        self.auto_loss_summed = self.auto_loss_summed or summed

    def log(self, name: str, value: Any) -> None:
        """Keep ``value`` as scalar ``name`` of this step's frame. A value that is not a
        real number (None before a metric is first computed, a string, a complex or too
        large int, a tensor of several elements) is skipped with one warning per name:
        raising here would disable the whole frame (the monitor's 'step' part) for the
        rest of the run, for one bad optional metric."""
        got = logged_value(value)
        if got is None:
            warn_skipped(name, value)
            return
        self.logged[name] = got

    def scalars(
        self, *, lr: Any = None, default_max_norm: float | None = None,
        ln_vocab: float | None = None,
    ) -> dict[str, Scalar]:
        """The frame's scalars, still on the device where they were computed."""
        scalars: dict[str, Scalar] = {}
        if self.auto_loss is not None:
            scalars["loss"] = (self.auto_loss if self.auto_loss_summed
                               else self.auto_loss / self.auto_loss_count)
        if self.grad_norm is not None:
            scalars["grad.norm"] = self.grad_norm
            max_norm = self.max_norm if self.max_norm is not None else default_max_norm
            if self.clipped is not None:  # the job's own calls: their flag, their threshold
                scalars["grad.clipped"] = self.clipped.float()
                if self.max_norm is not None:
                    scalars["grad.max_norm"] = (
                        self.max_norm.detach().float() if isinstance(self.max_norm, torch.Tensor)
                        else float(self.max_norm))
            elif max_norm is not None:
                if isinstance(max_norm, torch.Tensor):
                    max_norm = max_norm.detach().to(self.grad_norm.device)
                if self.norm_after_clip:
                    # measured after any clip the monitor did not see: such a clip leaves
                    # the norm at the threshold (``max_norm / (norm + 1e-6)`` times it), so
                    # a norm at it counts as clipped, never as an unclipped norm
                    scalars["grad.clipped"] = (
                        self.grad_norm >= max_norm * (1 - AFTER_CLIP_TOL)).float()
                else:
                    scalars["grad.clipped"] = (self.grad_norm > max_norm).float()
                # the job's clip threshold: a norm under it is one the job allows (the
                # alert rules do not call it a blow-up); a tensor travels in the transfer
                scalars["grad.max_norm"] = (max_norm.float() if isinstance(max_norm, torch.Tensor)
                                            else float(max_norm))
        if lr is not None:
            scalars["lr"] = lr.detach() if isinstance(lr, torch.Tensor) else float(lr)
        if self.final is not None:
            scalars.update(self.final.metrics())
        if self.dtype_max is not None:
            scalars["attn.dtype_max"] = self.dtype_max  # a host float: no transfer
        scalars.update(self.logged)  # Monitor.log() wins, including over the auto loss
        if ln_vocab is not None and "loss" in scalars:
            loss = scalars["loss"]
            scalars["loss.first_over_ln_vocab"] = (
                loss.float() / ln_vocab if isinstance(loss, torch.Tensor) else loss / ln_vocab
            )
        return scalars

    def heads(self) -> dict[str, list[torch.Tensor]]:
        """Per-head metrics: name -> one ``(H,)`` tensor per layer, layers in order."""
        out: dict[str, list[torch.Tensor]] = {}
        for layer in sorted(self.attn):
            for name, value in self.attn[layer].metrics().items():
                out.setdefault(name, []).append(value)
        n = len(self.attn)
        return {name: rows for name, rows in out.items() if len(rows) == n}


def collect(
    scalars: dict[str, Scalar], heads: dict[str, list[torch.Tensor]],
    host: dict[str, float] | None = None, extra: list[torch.Tensor] | None = None,
) -> tuple[dict[str, float], dict[str, list[list[float]]], int, int, list[float]]:
    """Read everything back with one transfer: ``(scalars, heads, syncs, bytes, extra)``.

    ``extra`` (e.g. the history's rows) is read in the same transfer and returned as one
    flat list of floats, row-major in order. ``syncs`` is 1 when a tensor lived on an
    accelerator (the one ``.cpu()``), else 0; ``bytes`` counts the float32 values read
    back from tensors.
    """
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    out_scalars: dict[str, float] = {}
    for name, value in scalars.items():
        if isinstance(value, torch.Tensor):
            names.append(name)
            tensors.append(value.float().mean().reshape(1))
        else:
            out_scalars[name] = value
    head_names = list(heads)
    for name in head_names:
        tensors.extend(heads[name])
    more = list(extra or ())
    tensors.extend(more)
    syncs = int(any(t.device.type != "cpu" for t in tensors))
    nbytes = 4 * sum(t.numel() for t in tensors)
    values = to_host(tensors)
    out_scalars.update({name: values[j][0] for j, name in enumerate(names)})
    if host:
        out_scalars.update(host)
    out_heads: dict[str, list[list[float]]] = {}
    pos = len(names)
    for name in head_names:
        n = len(heads[name])
        out_heads[name] = _rectangular(values[pos : pos + n])
        pos += n
    flat = [x for part in values[pos:] for x in part] if len(more) > 1 else (
        values[pos] if more else [])
    return out_scalars, out_heads, syncs, nbytes, flat
