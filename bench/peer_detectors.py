"""The peer detectors the alert bench replays beside logitwatch: each as its project's code
has it, on the loss (and, where the tool watches it, the gradient norm or the max attention
logit) of a recorded run at every step, yielding the steps it would alarm at.

* ``megatron``: Megatron-LM's check, a value over 10x the largest of the first 100 (or
  non-finite);
* ``olmo``: OLMo-core's spike check, over the mean + 6 standard deviations of the last 128;
* ``kill_loss_spike``: llm-foundry's ``KillLossSpike``, over 2x the 100-step mean for more
  than 4 steps in a row;
* ``lightning``: Lightning's ``SpikeDetection`` with its defaults (checked against the real
  class in tests/test_bench_peers.py);
* ``fixed_logit``: a fixed threshold on the max attention logit (100).

:func:`peers` gives each peer's first alarm on a run (``first``) and first at step >= 50
(``from50``, what the bench counts).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator
from typing import Any

from logitwatch.wire import decode_float

START = 50  # alarms before this step do not count as catching a divergence
Series = list[tuple[int, float]]


def _num(v: Any) -> float:
    if v is None:
        return math.nan
    try:
        return decode_float(v)
    except ValueError:
        return float(v)



def megatron(s: Series) -> Iterator[int]:
    first: list[float] = []
    for step, v in s:
        if not math.isfinite(v):
            yield step
        elif len(first) < 100:
            first.append(v)
        elif v > 10 * max(first):
            yield step


def olmo(s: Series, window: int = 128, sigmas: float = 6.0) -> Iterator[int]:
    hist: list[float] = []
    for step, v in s:
        if len(hist) >= window:
            w = hist[-window:]
            mu = statistics.fmean(w)
            sd = math.sqrt(statistics.fmean([(x - mu) ** 2 for x in w]))
            if math.isfinite(v) and v > mu + sigmas * sd:
                yield step
        if math.isfinite(v):
            hist.append(v)


def kill_loss_spike(s: Series, window: int = 100, mult: float = 2.0,
                    patience: int = 4) -> Iterator[int]:
    hist: list[float] = []
    streak = 0
    for step, v in s:
        if len(hist) >= window:
            mean = statistics.fmean(hist[-window:])
            streak = streak + 1 if math.isfinite(v) and v > mult * mean else 0
            if streak > patience:
                yield step
        if math.isfinite(v):
            hist.append(v)


def lightning(s: Series, window: int = 10, rtol: float = 2.0, warmup: int = 1
              ) -> Iterator[int]:
    """Lightning's ``SpikeDetection`` with its defaults: a spike is a non-finite loss, or
    one above the last good loss with ``|loss - mean| >= rtol * |mean|`` (mean of the last
    ``window`` good losses); spikes do not enter the mean; the first one ends training."""
    hist: list[float] = []
    last = 0.0
    for i, (step, v) in enumerate(s):
        if i >= warmup:
            mean = statistics.fmean(hist[-window:]) if hist else math.nan
            if not math.isfinite(v) or (v - last > 0 and abs(v - mean) >= abs(rtol * mean)):
                yield step
                return  # TrainingSpikeException: the run stops
        if math.isfinite(v):
            hist.append(v)
            last = v


def fixed_logit(s: Series, tau: float = 100.0) -> Iterator[int]:
    return (step for step, v in s if math.isfinite(v) and v > tau)


def _firsts(*streams: Iterable[int]) -> dict[str, int | None]:
    """The first trigger of any of ``streams`` at any step, and the first at >= START."""
    steps = sorted(x for s in streams for x in _head(s))
    return {"first": steps[0] if steps else None,
            "from50": next((x for x in steps if x >= START), None)}


def _head(stream: Iterable[int]) -> list[int]:
    """The first trigger, and the first at or after START (all a summary needs)."""
    out: list[int] = []
    for x in stream:
        if not out:
            out.append(x)
        if x >= START:
            out.append(x)
            break
    return out


def _max_logit(frames: list[dict[str, Any]]) -> Series:
    out = []
    for f in frames:
        m = f["heads"].get("attn.logit_max")
        if m:
            vals = [_num(x) for row in m for x in row]
            out.append((f["step"], max(vals) if all(math.isfinite(x) for x in vals)
                        else math.nan))
    return out


PEERS = ("Megatron-LM 10x max(first 100)", "OLMo-core mean+6sd/128",
         "llm-foundry KillLossSpike", "Lightning SpikeDetection", "fixed max-logit > 100")


def peers(header: dict[str, Any], frames: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each peer's first trigger (``first``) and first at step >= 50 (``from50``)."""
    losses = [(i, _num(x)) for i, x in enumerate(header["losses"])]
    grad = [(i, _num(x)) for i, x in enumerate(header.get("grad_norms") or [])]
    return {
        PEERS[0]: _firsts(megatron(losses), megatron(grad)),
        PEERS[1]: _firsts(olmo(losses), olmo(grad)),
        PEERS[2]: _firsts(kill_loss_spike(losses)),
        PEERS[3]: _firsts(lightning(losses)),
        PEERS[4]: _firsts(fixed_logit(_max_logit(frames))),
    }
