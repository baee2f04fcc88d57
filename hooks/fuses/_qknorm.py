"""Temporary QK-norm: inserted into the running model on the layers whose attention logits
stay too high, removed again by a cosine anneal once they stay in range.

* **Trigger**: a layer's ``attn.logit_p99`` (the monitor's sampled statistic, the largest
  over the layer's heads) past ``limit`` on ``patience`` consecutive sampled steps. In
  ``auto`` mode that layer gets the norm at once (``λ = 1``, event ``insert``); in
  ``suggest`` mode the fuse says so (event ``suggest``, the alerts it addresses carry it)
  and a person's ``apply`` inserts it on the layers it named.
* **The norm** (``_rewrite.py``): ``q ← λ·n(q) + (1-λ)·q``, the same for ``k``,
  ``n(x) = g·x/rms(x)`` per head, ``g`` such that a normed logit is ``tau·cos(q, k)``
  (``|logit| <= tau``). Applied to the attention call's ``q``/``k`` through the monitor's
  interception (SDPA, HF eager, ``nn.MultiheadAttention``; ``record_attention`` when its
  caller uses the returned ``q, k``), on every forward while inserted or annealing. No
  module or parameter is added: the optimizer is untouched.
* **Rescale while inserted** (``rescale=True``): at ``λ = 1`` the forward does not depend on
  the scale of a head's ``q`` or ``k`` (the norm divides it out, up to ``eps``), so on each
  sampled step the fuse scales ``W_q``/``W_k`` (and their biases) of the inserted layers'
  heads whose *raw* max logit (``q·k·scale`` before the norm, measured max-only on that
  sampled forward) passed ``tau`` down to ``tau`` (per head, ``sqrt`` each, GQA as
  QK-clip). Without it the raw logits keep the size that tripped the fuse (under a norm the
  gradient does not shrink them) and the anneal would bring them back.
* **Removal**: once an inserted layer's raw max stays at most ``limit`` on ``stable``
  consecutive samples, ``λ`` follows ``(1 + cos(πk/W))/2`` from 1 to 0 over ``W`` steps
  (``anneal``: steps, or a fraction of the remaining ``total_steps``), event ``anneal``; the
  LR backoff fuse, when present, is triggered then (its own window: a lower LR while
  annealing). A layer whose p99 passes ``limit`` for ``patience`` samples while annealing
  goes back to ``λ = 1`` (event ``insert``, reason ``annealing``). At ``λ = 0`` the layer's
  calls are the model's own again (event ``removed``): the rewrite is gone, not a
  multiplication by 1.
* **Undo** (``mon.fuses.undo("qk_norm")``): every inserted layer starts the anneal (never a
  switch) and the fuse goes back to suggesting; :meth:`QKNorm.remove_now` removes it at
  once.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

from ._base import Fuse, log
from ._qkclip import _count, _scale
from ._rewrite import LayerFuse

__all__ = ["QKNorm"]

#: Steps kept in :attr:`QKNorm.trace` (step, layer, λ while annealing).
TRACE = 20_000


class QKNorm(LayerFuse, Fuse):
    """Temporary QK-norm (see the module docstring).

    Args:
        limit: The p99 logit past which a layer trips (default 50).
        tau: The normed logits' bound, and the raw max the rescale brings heads to
            (default ``limit / 2``).
        patience: Consecutive sampled steps past ``limit`` that trip a layer (default 3).
        stable: Consecutive samples with the raw max at most ``limit`` before the anneal
            starts (default 3).
        anneal: The anneal's length: steps (an int, default 200) or a fraction of the
            remaining steps (a float in (0, 1), with ``total_steps``, else of 2000; 0.05-0.15
            is the design's range; then at least 10 steps).
        total_steps: The run's planned number of optimizer steps (for a fractional anneal;
            default: what the Hugging Face or Lightning callback told the monitor
            (``Monitor.planned_steps``), else the anneal takes that fraction of 2000).
        rescale: Scale the inserted heads' W_q/W_k to bring their raw logits to ``tau``
            while ``λ = 1`` (default True).
        mode: ``"off"``, ``"suggest"`` (default) or ``"auto"``.
    """

    name = "qk_norm"

    def __init__(self, limit: float = 50.0, *, tau: float | None = None, patience: int = 3,
                 stable: int = 3, anneal: int | float = 200, total_steps: int | None = None,
                 rescale: bool = True, mode: str = "suggest") -> None:
        super().__init__(mode)
        for what, v in (("limit", limit), ("tau", limit / 2 if tau is None else tau)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) and v > 0):
                raise ValueError(f"QKNorm: {what} must be a finite number > 0, got {v!r}")
        for what, v in (("patience", patience), ("stable", stable)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"QKNorm: {what} must be an int >= 1, got {v!r}")
        if isinstance(anneal, bool) or not (
                (isinstance(anneal, int) and anneal >= 1)
                or (isinstance(anneal, float) and 0 < anneal < 1)):
            raise ValueError(f"QKNorm: anneal must be an int >= 1 or a float in (0, 1), "
                             f"got {anneal!r}")
        self.limit = float(limit)
        self.tau = float(limit / 2 if tau is None else tau)
        self.patience, self.stable = patience, stable
        self.anneal, self.total_steps, self.rescale = anneal, total_steps, bool(rescale)
        self._init_layers()
        self.annealing: dict[int, list[int]] = {}  # layer -> [k, W]
        self._calm: dict[int, int] = {}
        self._raw_frame: dict[int, torch.Tensor] = {}
        self.steps_inserted = 0  # steps with a layer at λ = 1
        self.steps_annealing = 0  # steps with a layer annealing
        self.rescaled = 0  # head rescales (sampled steps x heads, counted on the device)
        self.trace: deque[tuple[int, int, float]] = deque(maxlen=TRACE)
        self._warned_rescale = False

    def describe(self) -> str:
        return (f"temporary QK-norm: on layers whose attention p99 stays past "
                f"{self.limit:g}, q and k RMS-normed (logits <= {self.tau:g}), removed by a "
                f"cosine anneal once their raw logits stay in range")

    def bind(self, fuses: Any) -> None:
        super().bind(fuses)
        self._bind_rewrite(fuses)
        if self.rewrite is not None:
            self.rewrite.tau = self.tau

    @property
    def layers(self) -> dict[int, float]:
        """λ per layer where the norm is in (inserted or annealing)."""
        return dict(self.rewrite.lam) if self.rewrite is not None else {}

    # -- actions ---------------------------------------------------------------------------

    def insert(self, step: int, layers: list[int], reason: str) -> None:
        """Insert the norm (``λ = 1``) on ``layers`` now."""
        if self.rewrite is None or not layers:
            return
        for layer in layers:
            self.rewrite.lam[layer] = 1.0
            self.annealing.pop(layer, None)
            self._calm[layer] = self._over[layer] = 0
        self.rewrite.measure_raw = {x for x in self.rewrite.lam if x not in self.annealing}
        self.record(step, "insert", layers=sorted(layers), reason=reason, tau=self.tau)

    def _planned(self) -> int | None:
        """The run's planned steps as the monitor knows them (the framework callbacks)."""
        monitor = self.fuses.monitor if self.fuses is not None else None
        planned = getattr(monitor, "planned_steps", None)
        return planned if isinstance(planned, int) and planned > 0 else None

    def start_anneal(self, step: int, layers: list[int], reason: str) -> None:
        """Start the cosine anneal of ``layers`` (λ from 1 to 0)."""
        if self.rewrite is None or not layers:
            return
        if isinstance(self.anneal, float):
            total = self.total_steps or self._planned()
            left = (total - step) if total else 2000
            window = max(10, round(self.anneal * max(0, left)))
        else:
            window = self.anneal
        for layer in layers:
            self.annealing[layer] = [0, window]
        self.record(step, "anneal", layers=sorted(layers), steps=window, reason=reason)
        if self.fuses is not None:
            self.fuses.trigger("lr_backoff", step, "qk_norm")

    def remove_now(self, step: int | None = None) -> None:
        """Remove the norm from every layer at once (a switch: the logits jump back)."""
        if self.rewrite is None or not self.rewrite.lam:
            return
        layers = sorted(self.rewrite.lam)
        self.rewrite.lam.clear()
        self.annealing.clear()
        at = step if step is not None else (self.fuses._step if self.fuses else 0)
        self.record(at, "removed", layers=layers, at_once=True)

    def apply(self, step: int, by: str) -> None:
        """A person applies it: insert on the layers last suggested, then act as ``auto``."""
        super().apply(step, by)
        layers = sorted(x for x in self._suggested if x not in self.layers)
        if layers:
            self.insert(step, layers, f"applied by {by}")

    def undo(self, step: int, by: str) -> None:
        """Anneal every inserted layer out (never a switch) and go back to suggesting."""
        if self.rewrite is not None:
            self.start_anneal(step, sorted(x for x in self.rewrite.lam
                                           if x not in self.annealing), f"undo by {by}")
        super().undo(step, by)

    # -- the step --------------------------------------------------------------------------

    def step_end(self, step: int, sampled: bool) -> None:
        rw = self.rewrite
        if rw is None:
            return
        stale = self.fuses is not None and self.fuses.stale  # weights restored: not theirs
        if sampled and rw.raw_max and not stale:
            self._raw_frame = dict(rw.raw_max)
            if self.rescale:
                self._rescale(step, rw.raw_max)
        rw.raw_max.clear()
        if any(layer not in self.annealing for layer in rw.lam):
            self.steps_inserted += 1
        if self.annealing:
            self.steps_annealing += 1
        for layer, kw in list(self.annealing.items()):
            kw[0] += 1
            k, w = kw
            if k >= w:
                del self.annealing[layer]
                rw.lam.pop(layer, None)
                self.record(step, "removed", layers=[layer], steps=w)
            else:
                lam = 0.5 * (1.0 + math.cos(math.pi * k / w))
                rw.lam[layer] = lam
                self.trace.append((step + 1, layer, lam))
        rw.measure_raw = {x for x in rw.lam if x not in self.annealing}

    def _rescale(self, step: int, raw: dict[int, torch.Tensor]) -> None:
        """Scale W_q/W_k of the inserted layers' heads whose raw max passed tau (at λ = 1,
        the forward does not change: the norm divides the scale out)."""
        mon = self.fuses.monitor if self.fuses is not None else None
        sources = list(getattr(mon, "_qk", None) or [])
        rows = self._rows_now(mon)
        if len(sources) != len(rows):
            if not self._warned_rescale:
                self._warned_rescale = True
                log.warning("logitwatch: fuse qk_norm: %d attention layers measured but q/k "
                            "projections found for %d: no rescale, the anneal waits for the "
                            "raw logits to come into range", len(rows), len(sources))
            return
        with torch.no_grad():
            for layer, m in raw.items():
                if layer not in rows or layer in self.annealing:
                    continue
                src = sources[rows.index(layer)]
                hd = src.head_dim
                heads, kv = _count(src.q_weight, hd), _count(src.k_weight, hd)
                if m.numel() != heads or heads % kv:
                    continue
                m = torch.nan_to_num(m.float(), nan=0.0, posinf=1e30)
                ratio = (self.tau / m.clamp(min=self.tau)).clamp(min=1e-4)
                group = heads // kv
                s_k = ratio.view(kv, group).amin(dim=1).sqrt()
                s_q = (ratio / s_k.repeat_interleave(group)).clamp(max=1.0)
                _scale(src.q_weight, s_q, hd)
                _scale(src.k_weight, s_k, hd)
                if src.q_bias is not None:
                    _scale(src.q_bias, s_q, hd)
                if src.k_bias is not None:
                    _scale(src.k_bias, s_k, hd)

    @staticmethod
    def _rows_now(mon: Any) -> list[int]:
        return sorted(mon._buffer.attn) if mon is not None else []

    # -- frames ----------------------------------------------------------------------------

    def before_frame(self, scalars: dict[str, Any], heads: dict[str, list[torch.Tensor]]
                     ) -> None:
        self._frame_rows()
        raw, self._raw_frame = self._raw_frame, {}
        for layer, m in raw.items():
            scalars[f"fuse.qk_norm.raw_max.{layer}"] = m.detach().float().amax()
        lam = self.layers
        if lam and self._rows:
            mon = self.fuses.monitor if self.fuses is not None else None
            attn = mon._buffer.attn if mon is not None else {}
            heads["fuse.qk_norm.lambda"] = [
                torch.full((attn[x].maximum.numel(),), lam.get(x, 0.0)) for x in self._rows]

    def after_frame(self, step: int, scalars: dict[str, float],
                    heads: dict[str, list[list[float]]]) -> None:
        raw = {}
        for key in [k for k in scalars if k.startswith("fuse.qk_norm.raw_max.")]:
            raw[int(key.rsplit(".", 1)[1])] = scalars.pop(key)
        if raw:
            scalars["fuse.qk_norm.raw_max"] = max(raw.values())
        p99 = self._p99(heads)
        lam = self.layers
        calm, back = [], []
        for layer in lam:
            if layer in self.annealing:
                p = p99.get(layer, math.nan)
                self._over[layer] = self._over.get(layer, 0) + 1 if p > self.limit else 0
                if self._over[layer] >= self.patience and self.engaged:  # not after undo
                    back.append(layer)
            elif layer in raw:
                self._calm[layer] = self._calm.get(layer, 0) + 1 if raw[layer] <= self.limit \
                    else 0
                if self._calm[layer] >= self.stable:
                    calm.append(layer)
        if back:
            self.insert(step, back, "annealing")
        if calm:
            self.start_anneal(step, calm, f"raw max <= {self.limit:g} for {self.stable} "
                              "samples")
        tripped = self._tripped(p99, lam)
        if tripped:
            if self.engaged:
                self.insert(step, tripped, f"p99 > {self.limit:g} for {self.patience} "
                            "samples")
            else:
                self._suggest(step, tripped, p99)
        lam = self.layers
        scalars["fuse.qk_norm.lambda"] = max(lam.values(), default=0.0)
        scalars["fuse.qk_norm.layers"] = float(len(lam))
        scalars["fuse.qk_norm.annealing"] = float(len(self.annealing))
        scalars["fuse.qk_norm.limit"] = self.limit
        scalars["fuse.qk_norm.steps_inserted"] = float(self.steps_inserted)
        scalars["fuse.qk_norm.steps_annealing"] = float(self.steps_annealing)
