"""QK-clip: per head, after the optimizer step, scale W_q and W_k (and their biases) of
the heads whose measured max attention logit passed ``tau``.

For a head ``h`` with max logit ``m_h > tau`` (the pre-softmax, pre-soft-cap logit
``q·k·scale`` over the valid pairs of that step's forward, the monitor's
``attn.logit_max``), the logit factor is ``r_h = tau / m_h``. Without GQA both
projections of the head are scaled by ``sqrt(r_h)``: rows (``nn.Linear``,
``in_proj_weight``) or columns (GPT-2's ``Conv1D``) of the weight, and the same entries of
the bias, so ``q`` and ``k`` each scale by ``sqrt(r_h)`` and every logit of the head by
``r_h``: on the same input the next max is exactly ``tau``. Scaling the weights alone
would leave ``q = W_q x + b_q`` partly unscaled: the logit returns through the bias path
(``biases=False`` exists to show it, see ``bench/bench_fuses.py``).

Under GQA a key head is shared by ``g`` query heads (query head ``h`` reads key head
``h // g``): the key head follows the largest of its query heads (``s_k = sqrt(min r)``)
and each clipped query head then takes ``s_q = min(1, r_h / s_k)``, so every head's logits
scale by at most ``r_h`` and no projection ever grows.

A non-finite max: NaN does nothing; ``inf`` (an overflowed score) scales by the floor
``min_scale`` per projection. Everything happens on the device (a ``where`` and an
in-place multiply per projection, factors of exactly 1 for heads under ``tau``): no
host-device sync beyond the sampled frame's one transfer, which carries what the clip did
since the previous frame: ``fuse.qk_clip.factor`` (layers x heads, the product of the
factors), ``fuse.qk_clip.heads`` (head-steps clipped) and ``fuse.qk_clip.steps`` (steps
with a clip). While acting, every ``every`` steps (default every step) the heads' max
logits are measured: on the monitor's sampled steps from its statistics, on the others by
a max-only capture (``measure="max"``, the default: ``hooks/_maxlogit.py``, the per-head
max and nothing else, no frame, no read-back); ``measure="full"`` samples those steps
instead (the whole catalog and a frame each, ``bench/README.md``).

**Calm** (``_calm.py``): while acting, once ``calm_steps`` consecutive measured steps had
every head's max below ``calm * tau``, only one measuring step in ``calm_every`` is
measured; the first measured max at or above ``calm * tau`` goes back to every step. The
decision is on the host without a sync (CPU: read at once; an accelerator: a non-blocking
copy to pinned memory, read once its event completed; until then, every step). The clip
itself is unchanged: it acts on every measured step whose max passed tau.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from logitwatch.wire import FUSE_RULES

from .._qk import Part, QKSource
from ._base import Fuse, multi_rank
from ._calm import Calm, check

__all__ = ["QKClip"]

#: Alerts this fuse addresses (rules on the attention logits, and the bias refuge, which
#: QK-clip with biases avoids).
RULE_PREFIXES = tuple(r.rstrip("*") for r in FUSE_RULES["qk_clip"])
#: A head within this fraction of tau is left alone (a head clipped to tau measures tau
#: again, give or take rounding).
TOLERANCE = 1e-4
#: Clipped heads named in one event at most.
EVENT_HEADS = 16


def _count(part: Part, hd: int) -> int:
    return part.get().shape[part.axis] // hd


def _scale(part: Part, per_head: torch.Tensor, hd: int) -> None:
    """Multiply the head slices of ``part`` by ``per_head`` (in place, no autograd)."""
    t = part.get()
    s = per_head.to(device=t.device, dtype=t.dtype).repeat_interleave(hd)
    if t.dim() == 1:
        t.mul_(s)
    elif part.axis == 0:
        t.mul_(s.unsqueeze(1))
    else:
        t.mul_(s.unsqueeze(0))


class QKClip(Fuse):
    """Per-head QK-clip (see the module docstring).

    Args:
        tau: The max logit a head may keep (default 100).
        mode: ``"off"``, ``"suggest"`` (default) or ``"auto"``.
        biases: Scale the q/k biases with their weights (default; False only to compare:
            the bias then takes the logit over).
        every: While acting, measure and clip every this many steps (default 1).
        min_scale: Floor of one projection's factor in one step (default 0.1: logits at
            most 100x smaller per step; an overflowed, infinite max takes it).
        measure: How acting steps outside the monitor's samples are measured: ``"max"``
            (default: the per-head max only, no frame) or ``"full"`` (sampled: the whole
            catalog and a frame every step).
        calm: While acting, a measured max below ``calm * tau`` everywhere is calm
            (default 0.5).
        calm_steps: After this many consecutive calm measured steps (default 20)...
        calm_every: ...measure one measuring step in this many (default 4) until a measured
            max reaches ``calm * tau``; 1: every one (no calm schedule).
    """

    name = "qk_clip"

    def __init__(self, tau: float = 100.0, *, mode: str = "suggest", biases: bool = True,
                 every: int = 1, min_scale: float = 0.1, measure: str = "max",
                 calm: float = 0.5, calm_steps: int = 20, calm_every: int = 4) -> None:
        super().__init__(mode)
        if not (isinstance(tau, (int, float)) and not isinstance(tau, bool)
                and math.isfinite(tau) and tau > 0):
            raise ValueError(f"QKClip: tau must be a finite number > 0, got {tau!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"QKClip: every must be an int >= 1, got {every!r}")
        if not (isinstance(min_scale, (int, float)) and 0 < min_scale <= 1):
            raise ValueError(f"QKClip: min_scale must be in (0, 1], got {min_scale!r}")
        if measure not in ("max", "full"):
            raise ValueError(f"QKClip: measure must be 'max' or 'full', got {measure!r}")
        check(calm, calm_steps, calm_every)
        self.measure = measure
        self.calm = float(calm)
        self.calm_steps = calm_steps
        self.calm_every = calm_every
        self._calm = Calm(self.calm * float(tau), calm_steps, calm_every)
        self.tau = float(tau)
        self.biases = bool(biases)
        self.every = every
        self.min_scale = float(min_scale)
        self.clipped_heads = 0  # head-steps clipped so far
        self._cum: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per layer: q, k
        self._frame: dict[str, Any] = {}  # what happened since the last frame (device)
        self._idle_samples = 0
        self._last_suggest: int | None = None

    def describe(self) -> str:
        what = "W_q, W_k and their biases" if self.biases else "W_q and W_k (not biases)"
        return (f"QK-clip: after each step, heads whose max logit passed tau={self.tau:g} "
                f"get {what} scaled by sqrt(tau/max)")

    def matches(self, alert: Mapping[str, Any]) -> bool:
        rule = str(alert.get("rule", ""))
        return rule.startswith(RULE_PREFIXES)

    def bind(self, fuses: Any) -> None:
        super().bind(fuses)
        mon = fuses.monitor
        if mon is None:
            return
        if multi_rank() or getattr(mon, "_shard", None) is not None:
            self.cannot(0, "several ranks (DDP/FSDP): each rank measures its own batch, and "
                        "clipping replicas differently would desynchronise them")

    # -- the step --------------------------------------------------------------------------

    def step_end(self, step: int, sampled: bool) -> None:
        mon = self.fuses.monitor if self.fuses is not None else None
        if mon is None:
            return
        if self.fuses is None or not self.fuses.stale:  # restored weights: not theirs
            self._measured(step, sampled, mon)
        if not self.engaged or self.unavailable is not None:
            return
        self._calm.poll()  # accelerator readings whose copies completed (no sync)
        if (step + 1) % self.every == 0 and not self._calm.skip():
            if self.measure == "max":  # the next step's max logits, unless it is sampled
                mon.request_max(below=self.tau)
            else:
                mon.request_sample()

    @property
    def calm_now(self) -> bool:
        """Whether the calm schedule measures one step in ``calm_every`` now."""
        return self.engaged and self._calm.calm and self._calm.on

    def _measured(self, step: int, sampled: bool, mon: Any) -> None:
        """This step's measured maxima, if any: the calm schedule's reading, the clip."""
        if sampled and "attention" in mon.disabled:
            self.cannot(step, "the monitor's attention capture is off (it failed)")
            return
        if sampled:
            maxima = {layer: st.maximum for layer, st in mon._buffer.attn.items()}
        else:
            maxima = dict(getattr(mon, "maxima", {}) or {})
            if not maxima:
                return
        if not maxima:
            self._idle_samples += 1
            if self._idle_samples >= 3:
                self.cannot(step, "no attention call was measured in three sampled "
                            "training forwards (docs/HOOKS.md says which are captured)")
            return
        self._idle_samples = 0
        if self.engaged:
            self._calm.measured([maxima[layer] for layer in sorted(maxima)])
        sources: list[QKSource] = list(mon._qk or [])
        layers = sorted(maxima)
        if len(sources) != len(layers):
            self.cannot(step, f"{len(layers)} attention layers measured but q/k projections "
                        f"found for {len(sources)} (the attach log line says which; "
                        f"attach(qk_layout=...) maps fused ones)")
            return
        factors, hits = [], []
        with torch.no_grad():
            for row, (layer, src) in enumerate(zip(layers, sources, strict=True)):
                out = self._layer(step, row, src, maxima[layer])
                if out is None:
                    return
                factors.append(out[0])
                hits.append(out[1])
        self._accumulate(factors, torch.stack(hits).sum().float())

    def _accumulate(self, factors: list[torch.Tensor], hit: torch.Tensor) -> None:
        """Add one measured step to what the next frame says (device tensors only)."""
        acc = self._frame
        if not acc or len(acc["factors"]) != len(factors):
            acc = self._frame = {"factors": factors, "hits": hit,
                                 "steps": (hit > 0).float(), "engaged": self.engaged,
                                 "min": torch.stack([f.min() for f in factors]).min()}
            return
        acc["factors"] = [a * f for a, f in zip(acc["factors"], factors, strict=True)]
        acc["hits"] = acc["hits"] + hit
        acc["steps"] = acc["steps"] + (hit > 0).float()
        acc["min"] = torch.minimum(acc["min"], torch.stack([f.min() for f in factors]).min())
        acc["engaged"] = self.engaged

    def _layer(self, step: int, row: int, src: QKSource, maxes: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One layer: ``(per-head logit factor (H,), heads clipped)``; applied if acting."""
        hd = src.head_dim
        heads, kv = _count(src.q_weight, hd), _count(src.k_weight, hd)
        if maxes.numel() != heads or heads % kv:
            self.cannot(step, f"layer {row}: {maxes.numel()} heads measured, the q/k "
                        f"projections have {heads}/{kv} heads")
            return None
        m = maxes.detach().float()
        m = torch.where(torch.isnan(m), torch.zeros_like(m), m)  # NaN: no action
        floor = self.min_scale * self.min_scale
        ratio = (self.tau / m.clamp(min=self.tau)).clamp(min=floor)  # inf -> floor
        ratio = torch.where(ratio > 1 - TOLERANCE, torch.ones_like(ratio), ratio)
        group = heads // kv
        s_k = ratio.view(kv, group).amin(dim=1).sqrt()
        s_q = (ratio / s_k.repeat_interleave(group)).clamp(max=1.0)
        factor = s_q * s_k.repeat_interleave(group)
        if self.engaged:
            _scale(src.q_weight, s_q, hd)
            _scale(src.k_weight, s_k, hd)
            if self.biases:
                if src.q_bias is not None:
                    _scale(src.q_bias, s_q, hd)
                if src.k_bias is not None:
                    _scale(src.k_bias, s_k, hd)
            cq, ck = self._cum.get(row, (torch.ones_like(s_q), torch.ones_like(s_k)))
            self._cum[row] = (cq * s_q, ck * s_k)
        return factor, (ratio < 1).sum()

    # -- frames ----------------------------------------------------------------------------

    def before_frame(self, scalars: dict[str, Any], heads: dict[str, list[torch.Tensor]]
                     ) -> None:
        acc, self._frame = self._frame, {}
        if acc:
            heads["fuse.qk_clip.factor"] = acc["factors"]
            if acc["engaged"]:
                scalars["fuse.qk_clip.heads"] = acc["hits"]
                scalars["fuse.qk_clip.steps"] = acc["steps"]
            else:
                scalars["fuse.qk_clip.suggested"] = acc["hits"]
            scalars["fuse.qk_clip.factor_min"] = acc["min"]

    def after_frame(self, step: int, scalars: dict[str, float],
                    heads: dict[str, list[list[float]]]) -> None:
        scalars["fuse.qk_clip.tau"] = self.tau
        scalars["fuse.qk_clip.calm"] = 1.0 if self.calm_now else 0.0
        n = int(scalars.get("fuse.qk_clip.heads", 0.0) or 0)
        would = int(scalars.get("fuse.qk_clip.suggested", 0.0) or 0)
        named = _clipped(heads.get("fuse.qk_clip.factor"))
        if n > 0:
            self.clipped_heads += n
            self.record(step, "clip", heads=n, steps=int(scalars.get(
                "fuse.qk_clip.steps", 1.0) or 1), clipped=named,
                factor_min=scalars.get("fuse.qk_clip.factor_min"), biases=self.biases)
            if self.fuses is not None:
                self.fuses.trigger("lr_backoff", step, "qk_clip")
        elif would > 0 and (self._last_suggest is None or step - self._last_suggest >= 100):
            first = self._last_suggest is None
            self._last_suggest = step
            self.record(step, "suggest", heads=would, clipped=named, does=self.describe())
            if first:
                from ._base import log

                log.info("logitwatch: fuse qk_clip (suggest) would clip %d heads at step %d "
                         "(max logit past tau=%g); apply: mon.fuses.apply('qk_clip') or the "
                         "collector's control {'fuses': {'qk_clip': 'apply'}}", would, step,
                         self.tau)
            if self.fuses is not None:
                self.fuses.trigger("lr_backoff", step, "qk_clip")

    # -- undo ------------------------------------------------------------------------------

    def weight_state(self) -> Any:
        """The factors applied so far per layer (what :meth:`undo` divides by), copied."""
        if not self._cum:
            return None
        return {row: (cq.clone(), ck.clone()) for row, (cq, ck) in self._cum.items()}

    def load_weight_state(self, state: Any) -> None:
        """A rollback put the weights back: the factors they carry are the snapshot's."""
        self._cum = {int(row): (cq.clone(), ck.clone())
                     for row, (cq, ck) in (state or {}).items()}

    def undo(self, step: int, by: str) -> None:
        """Scale every clipped head back by the inverse of the factors applied so far (the
        optimizer's updates since then stay), and go back to suggesting."""
        mon = self.fuses.monitor if self.fuses is not None else None
        sources = list(mon._qk or []) if mon is not None else []
        with torch.no_grad():
            for row, (cq, ck) in self._cum.items():
                if row >= len(sources):
                    continue
                src = sources[row]
                inv_q, inv_k = 1.0 / cq, 1.0 / ck
                _scale(src.q_weight, inv_q, src.head_dim)
                _scale(src.k_weight, inv_k, src.head_dim)
                if self.biases:
                    if src.q_bias is not None:
                        _scale(src.q_bias, inv_q, src.head_dim)
                    if src.k_bias is not None:
                        _scale(src.k_bias, inv_k, src.head_dim)
        self._cum.clear()
        self._calm.reset()
        super().undo(step, by)


def _clipped(rows: list[list[float]] | None) -> list[list[float]]:
    """``[layer, head, factor]`` of the clipped heads (at most :data:`EVENT_HEADS`)."""
    out: list[list[float]] = []
    for layer, row in enumerate(rows or []):
        for head, f in enumerate(row):
            if isinstance(f, float) and f < 1.0 and len(out) < EVENT_HEADS:
                out.append([layer, head, round(f, 6)])
    return out
