"""Which query and key tokens are real: the model's 2-D ``attention_mask``.

A padding mask in the attention's own mask (HF's 4-D mask, ``key_padding_mask``) only
blocks padded *keys*: a padded query position still "sees" real keys, and its logits would
enter every statistic. The token-level mask says which positions are real, so the
statistics can leave the padded query rows out too.

:class:`PaddingMask` takes it from the monitored model's forward arguments (HF
convention: ``attention_mask`` of shape ``(batch, sequence)``, 1 = real token, 0 = padding;
by keyword, or by position where ``forward`` declares it). On a sampled forward it only
keeps a reference to the tensor; nothing is read or computed until an attention call of
that forward is measured, and non-sampled forwards never reach it (no sync, no work).
It applies to an attention call whose batch and query length (keys: key length) equal the
mask's; other calls (a different length, cross-attention to another sequence) are left as
they are. Encoder-decoder models (``config.is_encoder_decoder``) are skipped: their
``attention_mask`` is the encoder's only.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["PaddingMask", "mask_position"]

_NAME = "attention_mask"


def mask_position(model: torch.nn.Module) -> int | None:
    """Index of ``attention_mask`` among ``model.forward``'s positional arguments, or None
    (no such parameter, or not positional; a keyword is still found)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(positional):
        if p.name == _NAME:
            return i
    return None


class PaddingMask:
    """The current forward's 2-D padding mask (a reference), turned into real-token masks
    for the attention calls it matches. Training thread only."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = getattr(model, "config", None)
        self.enabled = not bool(getattr(config, "is_encoder_decoder", False))
        self._position = mask_position(model)
        self._raw: torch.Tensor | None = None
        self._real: torch.Tensor | None = None  # (B, L) bool, computed at first use
        self._done = False

    def capture(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> None:
        """Keep a reference to the forward's ``attention_mask`` (no value is read)."""
        if not self.enabled or self._raw is not None:
            return
        mask = kwargs.get(_NAME) if kwargs else None
        if mask is None and self._position is not None and len(args) > self._position:
            mask = args[self._position]
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            self._raw, self._real, self._done = mask, None, False

    def clear(self) -> None:
        """Forget the forward's mask (its end)."""
        self._raw, self._real, self._done = None, None, False

    def _tokens(self) -> torch.Tensor | None:
        if not self._done:
            self._done = True
            raw = self._raw
            if raw is not None:
                real = raw.detach()
                if real.is_floating_point():
                    # 1/0 (real/padded), or additive (0 real, a large negative padded): a
                    # mask with any negative value is additive; decided on the device (a
                    # device tensor, no sync)
                    real = torch.where((real < 0).any(), real > -1, real != 0)
                elif real.dtype != torch.bool:
                    real = real != 0
                # a CPU mask of real tokens only changes nothing: dropped, so that the
                # statistics keep their mask-free path (a read on the host, not a sync)
                if real.device.type == "cpu" and bool(real.all()):
                    real = None
                self._real = real
        return self._real

    def for_call(self, batch: int, queries: int, keys: int
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(query_valid, key_valid)`` for an attention call of these sizes: the mask
        where its ``(batch, length)`` matches, else None."""
        if self._raw is None:
            return None, None
        b, n = self._raw.shape
        if b != batch or (n != queries and n != keys):
            return None, None
        real = self._tokens()
        if real is None:
            return None, None
        return (real if n == queries else None), (real if n == keys else None)
