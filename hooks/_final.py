"""Final-layer signals: RMS of the hidden state entering the LM head, and the output
logits' mean log-sum-exp (log Z) and max.

The LM head is found once at attach time (:func:`find_output_head`); a forward hook on it
does nothing unless the monitor is capturing a sampled forward. Statistics are pooled
over every position of the batch (padding included: the head runs on all of them), in
float32 on the device, the logits in row chunks within the memory budget.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._logits import CPU_BLOCK_ELEMENTS, workspace

__all__ = ["STEP_ROWS", "FinalStats", "find_output_head", "final_stats", "step_final",
           "vocab_size"]

#: Positions whose log Z an unsampled step estimates (evenly spaced over the batch).
STEP_ROWS = 64
#: Logits an unsampled step's log Z reduces at once (4 Mi values, 16 MiB in float32, with
#: as much again for ``logsumexp``'s temporaries): at a 256k vocabulary 64 positions are 64
#: MiB of float32, taken in chunks of 16; at 64k and below, one chunk.
STEP_ELEMENTS = 1 << 22

_HEAD_NAMES = ("lm_head", "head", "output", "embed_out", "out_head")


def find_output_head(model: nn.Module) -> nn.Module | None:
    """The module that maps the last hidden state to vocabulary logits, or None.

    HF ``get_output_embeddings()`` first; else a ``Linear`` named ``lm_head``/``head``/
    ``output``/``embed_out``/``out_head`` (the last such in module order); else the last
    ``Linear`` whose ``out_features`` equals the first ``Embedding``'s vocabulary.
    """
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        try:
            head = getter()
        except Exception:
            head = None
        if isinstance(head, nn.Module):
            return head
    named = [m for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] in _HEAD_NAMES and isinstance(m, nn.Linear)]
    if named:
        return named[-1]
    emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if emb is None:
        return None
    linears = [m for m in model.modules()
               if isinstance(m, nn.Linear) and m.out_features == emb.num_embeddings]
    return linears[-1] if linears else None


def vocab_size(head: nn.Module | None, model: nn.Module) -> int | None:
    """Vocabulary size from the head's output features or ``model.config.vocab_size``."""
    out = getattr(head, "out_features", None)
    if isinstance(out, int) and out > 1:
        return out
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) and size > 1 else None


class FinalStats:
    """Accumulators over the sampled forwards of one step (device tensors)."""

    def __init__(self, hidden: torch.Tensor, logits: torch.Tensor, budget: int) -> None:
        with torch.no_grad():
            h = hidden.detach()
            self.sq_sum = torch.linalg.vector_norm(h, dtype=torch.float32).double().square()
            self.n_hidden = float(h.numel())
            lg = logits.detach()
            v = lg.shape[-1]
            rows = lg.reshape(-1, v)
            n = rows.shape[0]
            dev = lg.device
            f32 = torch.float32
            chunk = max(1, budget // (4 * 3 * max(1, v)))
            if dev.type == "cpu":  # cache-sized chunks, as the attention statistics
                chunk = min(chunk, max(1, CPU_BLOCK_ELEMENTS // max(1, v)))
            chunk = min(chunk, max(1, n))
            ws = workspace(dev)
            # per row: the max logit and the largest softmax probability, written by each
            # chunk's reductions into slices (three operations a chunk), reduced once:
            # log-sum-exp = max - log(largest p). The softmax kernel is several times
            # faster than exp() of a shifted copy on CPU (bench/README.md, Hooks); its
            # output goes to a reused scratch buffer (no fresh pages per call)
            top = ws.get("final_top", (n,), f32, dev)
            p_max = ws.get("final_pmax", (n,), f32, dev)
            for r0 in range(0, n, chunk):
                r1 = min(n, r0 + chunk)
                part = rows[r0:r1]
                if part.dtype != f32:
                    part = ws.get("final_in", part.shape, f32, dev, chunk * v).copy_(part)
                torch.amax(part, dim=-1, out=top[r0:r1])
                p = torch.softmax(part, dim=-1, out=ws.get("final", part.shape, f32, dev,
                                                           chunk * v))
                torch.amax(p, dim=-1, out=p_max[r0:r1])
            if n:
                self.lse_sum = (top.sum(dtype=torch.float64)
                                - p_max.log_().sum(dtype=torch.float64))
                self.logit_max = top.amax()
            else:
                self.lse_sum = torch.zeros((), dtype=torch.float64, device=dev)
                self.logit_max = torch.full((), -math.inf, device=dev)
            self.n_rows = float(n)

    def merge(self, other: FinalStats) -> None:
        self.sq_sum = self.sq_sum + other.sq_sum
        self.n_hidden += other.n_hidden
        self.lse_sum = self.lse_sum + other.lse_sum
        self.n_rows += other.n_rows
        self.logit_max = torch.maximum(self.logit_max, other.logit_max)

    def metrics(self) -> dict[str, torch.Tensor]:
        return {
            "final.hidden_rms": (self.sq_sum / max(1.0, self.n_hidden)).sqrt().float(),
            "final.logz": (self.lse_sum / max(1.0, self.n_rows)).float(),
            "final.logit_max": self.logit_max,
        }


def final_stats(hidden: torch.Tensor, logits: torch.Tensor, budget: int) -> FinalStats:
    """Reduce one LM-head call (``hidden (..., d)`` in, ``logits (..., V)`` out)."""
    return FinalStats(hidden, logits, budget)


def step_final(hidden: torch.Tensor, logits: torch.Tensor,
               rows: int = STEP_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """An unsampled step's ``(log Z, mean square of the hidden state)``, as 0-d float32
    tensors on the device, never read here (no sync). The history takes the square root
    once the step's calls are pooled, as a sampled step pools them.

    log Z is the mean log-sum-exp of at most ``rows`` positions evenly spaced over the batch
    (a sampled step pools every position; on the alert bench's models the estimate is off
    by 0.08-0.17 nat (standard deviation, no bias) against a rule judging a nat on the
    series' 100-step median: docs/ALERTS.md, *Every-step log Z*): ``rows x V``
    logits, a few MiB at a 50k vocabulary, where pooling them all would read the whole
    ``(batch x seq) x V`` tensor every step, in chunks of at most :data:`STEP_ELEMENTS`
    logits (a 256k vocabulary would otherwise make a 64 MiB float32 copy and as much in
    temporaries on every step). The hidden state is read whole (``d`` wide, as cheap as one
    elementwise op).
    """
    with torch.no_grad():
        lg = logits.detach()
        flat = lg.reshape(-1, lg.shape[-1])
        n = flat.shape[0]
        if n > rows:  # an odd stride, off the first position: positions of every phase of
            stride = n // rows | 1  # a sequence, not the same ones of each (its first token's
            flat = flat[stride // 2::stride][:rows]  # log Z differs)
        chunk = max(1, STEP_ELEMENTS // max(1, flat.shape[-1]))
        if flat.shape[0] <= chunk:
            logz = torch.logsumexp(flat.float(), dim=-1).mean()
        else:  # a large vocabulary: bounded temporaries, a few more operations
            logz = torch.cat([torch.logsumexp(flat[r:r + chunk].float(), dim=-1)
                              for r in range(0, flat.shape[0], chunk)]).mean()
        h = hidden.detach()
        square = torch.linalg.vector_norm(h, dtype=torch.float32).square() / max(1, h.numel())
    return logz, square
