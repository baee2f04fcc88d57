"""Soft-cap: ``cap·tanh(s/cap)`` on the attention scores of the layers whose logits stay
too high (Gemma-2's logit soft-capping, put in by the job while it trains).

* **Trigger**: as the temporary QK-norm: a layer's sampled ``attn.logit_p99`` (largest over
  its heads) past ``limit`` (default: ``cap``) on ``patience`` consecutive sampled steps;
  ``auto`` caps that layer (event ``cap``), ``suggest`` says so and ``apply`` caps the layers
  it named. A capped layer stays capped until undo, which removes every cap at once (event
  ``removed``): a cap is not a change of the weights, only of the scores' top.
* **Paths** (``_rewrite.py``): HF eager attention: the score tensor itself (the call is
  rebuilt as ``eager_attention_forward``, the cap after the model's own soft-cap). SDPA and
  ``nn.MultiheadAttention`` do not expose their scores: a capped call is computed explicitly
  (float32 scores ``B x H x T x S`` held whole, GQA, masks, SDPA's dropout), the memory and
  time of an unfused attention for those layers only. ``record_attention``: unavailable
  (the kernel is the caller's; said once, the other layers are capped).
* The monitor measures the capped layers with the cap: ``attn.logit_max``/``p99`` stay the
  pre-cap logits (the trigger keeps seeing what grows); ``fuse.soft_cap.logit_max`` (layers
  x heads, every layer) is the max logit the softmax receives, ``cap·tanh(max/cap)`` on the
  capped layers (tanh is increasing), at most ``cap`` (``attn.capped_logit_max`` too, when
  every layer of the frame is capped).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._base import Fuse
from ._rewrite import LayerFuse

__all__ = ["SoftCap"]


class SoftCap(LayerFuse, Fuse):
    """Per-layer logit soft-cap (see the module docstring).

    Args:
        cap: The cap ``c`` of ``c·tanh(s/c)`` (default 50, Gemma-2's).
        limit: The p99 logit past which a layer trips (default: ``cap``).
        patience: Consecutive sampled steps past ``limit`` that trip a layer (default 3).
        mode: ``"off"``, ``"suggest"`` (default) or ``"auto"``.
    """

    name = "soft_cap"

    def __init__(self, cap: float = 50.0, *, limit: float | None = None, patience: int = 3,
                 mode: str = "suggest") -> None:
        super().__init__(mode)
        for what, v in (("cap", cap), ("limit", cap if limit is None else limit)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) and v > 0):
                raise ValueError(f"SoftCap: {what} must be a finite number > 0, got {v!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"SoftCap: patience must be an int >= 1, got {patience!r}")
        self.cap = float(cap)
        self.limit = float(cap if limit is None else limit)
        self.patience = patience
        self._init_layers()
        self.steps_capped = 0  # steps with a capped layer

    def describe(self) -> str:
        return (f"soft-cap: on layers whose attention p99 stays past {self.limit:g}, scores "
                f"s become {self.cap:g}·tanh(s/{self.cap:g}) (explicit attention on SDPA)")

    def bind(self, fuses: Any) -> None:
        super().bind(fuses)
        self._bind_rewrite(fuses)

    @property
    def layers(self) -> dict[int, float]:
        """The cap per capped layer."""
        return dict(self.rewrite.caps) if self.rewrite is not None else {}

    def cap_layers(self, step: int, layers: list[int], reason: str) -> None:
        """Cap ``layers`` now."""
        if self.rewrite is None or not layers:
            return
        for layer in layers:
            self.rewrite.caps[layer] = self.cap
            self._over[layer] = 0
        self.record(step, "cap", layers=sorted(layers), cap=self.cap, reason=reason)

    def apply(self, step: int, by: str) -> None:
        """A person applies it: cap the layers last suggested, then act as ``auto``."""
        super().apply(step, by)
        layers = sorted(x for x in self._suggested if x not in self.layers)
        if layers:
            self.cap_layers(step, layers, f"applied by {by}")

    def undo(self, step: int, by: str) -> None:
        """Remove every cap at once and go back to suggesting."""
        if self.rewrite is not None and self.rewrite.caps:
            layers = sorted(self.rewrite.caps)
            self.rewrite.caps.clear()
            self.record(step, "removed", layers=layers)
        super().undo(step, by)

    def step_end(self, step: int, sampled: bool) -> None:
        if self.rewrite is not None and self.rewrite.caps:
            self.steps_capped += 1

    def before_frame(self, scalars: dict[str, Any], heads: dict[str, list[torch.Tensor]]
                     ) -> None:
        self._frame_rows()

    def after_frame(self, step: int, scalars: dict[str, float],
                    heads: dict[str, list[list[float]]]) -> None:
        p99 = self._p99(heads)
        tripped = self._tripped(p99, self.layers)
        if tripped:
            if self.engaged:
                self.cap_layers(step, tripped, f"p99 > {self.limit:g} for {self.patience} "
                                "samples")
            else:
                self._suggest(step, tripped, p99)
        caps = self.layers
        maxes = heads.get("attn.logit_max")
        if caps and maxes and len(maxes) == len(self._rows):  # what the softmax receives
            heads["fuse.soft_cap.logit_max"] = [
                [caps[x] * math.tanh(m / caps[x]) if x in caps and not math.isnan(m) else m
                 for m in row] for x, row in zip(self._rows, maxes, strict=True)]
        scalars["fuse.soft_cap.layers"] = float(len(self.layers))
        scalars["fuse.soft_cap.cap"] = self.cap
        scalars["fuse.soft_cap.steps_capped"] = float(self.steps_capped)
