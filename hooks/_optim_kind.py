"""Whether the job's optimizer bounds a single gradient's update (``optim.adaptive``).

An adaptive optimizer (Adam, RMSprop, Adagrad and their kin) divides each parameter's step
by a running root mean square of its gradients: one garbage batch's huge gradient raises
the denominator with the numerator, so its update stays within a few learning rates, as a
clipped one does. Plain SGD applies ``lr * g``: the kick goes into the weights whole. The
alert rules weigh a kick's aftermath by which of the two the job runs (docs/ALERTS.md).
Judged once at attach from the class names in the optimizer's MRO: a subclass counts as its
base, a wrapper (ZeroRedundancyOptimizer, LightningOptimizer) as the optimizer it wraps; an
optimizer of neither family sends nothing (the rules then weigh a kick as under SGD).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ADAPTIVE", "PLAIN", "adaptive", "adaptive_by_name"]

#: optimizers whose per-parameter step is normalised by a running RMS (or a sign / an
#: orthogonalisation: as bounded)
ADAPTIVE = frozenset({
    "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam", "Adagrad", "Adadelta",
    "RMSprop", "Adafactor", "Lion", "Muon", "LAMB", "Lamb", "AdamW8bit", "Adam8bit",
    "PagedAdamW", "PagedAdamW8bit",
})
#: optimizers that apply the gradient as it is (times the learning rate)
PLAIN = frozenset({"SGD", "ASGD"})


def adaptive_by_name(names: Any) -> float | None:
    """1.0 when one of the class ``names`` (most derived first) is an adaptive optimizer,
    0.0 when one is plain SGD, None when neither (unknown)."""
    for name in names:
        if name in ADAPTIVE:
            return 1.0
        if name in PLAIN:
            return 0.0
    return None


#: where a wrapping optimizer keeps the one that does the update: ZeroRedundancyOptimizer
#: (``optim``), Lightning's LightningOptimizer (``_optimizer``), accelerate's and DeepSpeed's
#: wrappers (``optimizer``)
_INNER = ("optim", "_optimizer", "optimizer")


def adaptive(optimizer: Any, _depth: int = 0) -> float | None:
    """``optim.adaptive`` for ``optimizer`` (see the module docstring); None for None or
    an optimizer of neither family. A wrapper of unknown class is judged by the optimizer it
    wraps. Never raises: whatever goes wrong leaves the kind unknown."""
    if optimizer is None or _depth > 4:
        return None
    try:
        kind = adaptive_by_name(c.__name__ for c in type(optimizer).__mro__)
        if kind is not None:
            return kind
        for attr in _INNER:
            inner = getattr(optimizer, attr, None)
            if inner is not None and inner is not optimizer and hasattr(inner, "step"):
                return adaptive(inner, _depth + 1)
    except Exception:  # an exotic wrapper's property may raise: unknown, never an error
        return None
    return None
