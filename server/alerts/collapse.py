"""The ``collapse`` rule kind: a series falling under a share of its own level while the
loss is up: the attention wiped by an update.

An update large enough to wreck a model (a garbage batch under unclipped momentum SGD, whose
step goes into the weights whole) can flatten every head's attention at once: the max
attention logit over all heads falls from its level to a small fraction of it, and stays
there on the clean batches that follow, while the loss sits nats above its level. A model
that shrugs the batch off has its attention back on the first clean batch. A batch of one
repeated token flattens the attention of a healthy model too, but its loss falls (it is easy
to predict), so the loss must be up on the very frame the collapse is judged on.

A sample breaches when it is under ``fraction`` x the median of the rule's own samples over
the ``window`` steps that end ``lag`` steps before it (that level at least ``floor``, and
``min_history`` steps of samples before the window's end), and the frame's ``loss_metric``
is at least ``loss_up`` over the median of the losses seen with this rule's calm samples
over the same window, and with ``loss_up_max`` at most that many (a garbage batch's own loss
is far up, its tokens unlike the model's data; a model it wiped reads its clean batches a nat
or two up once the batches are clean again). Breaching samples are kept out of the memory
(the kind holds its breaches), so a collapse that lasts does not become its own level.

With ``plain_only``, the rule judges only a job whose optimizer is a plain one (the job's
``optim.adaptive`` = 0, e.g. SGD; a job that does not say is judged): Adam's and RMSprop's
step is normalised by the gradient's running RMS, so no one batch's update goes into the
weights whole, and a long garbage stretch that such a job fits flattens the attention for
a few clean batches while it heals.
Pure, as every detector (:mod:`.detectors`, which registers this kind).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median
from typing import TYPE_CHECKING

from logitwatch.server.alerts.series import Memory, window
from logitwatch.server.alerts.tracks import FrameView, Verdict

if TYPE_CHECKING:
    from logitwatch.server.alerts.spec import RuleSpec

__all__ = ["COLLAPSE_KEEP", "collapse"]

#: samples (and losses) a collapse cell keeps: its window and lag at one sample a step
#: (100 + 20 by default), with room; the kind's ``keep``
COLLAPSE_KEEP = 256


def collapse(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
             cell: tuple[int | None, int | None]) -> Verdict | None:
    """One sample of a series judged for a collapse under its level with the loss up."""
    # every sampled frame carries optim.adaptive, and this kind judges only those: nothing
    # to remember (loss_jump keeps it because it also judges each step's history)
    if r.param("plain_only") and fv.get("optim.adaptive") == 1.0:
        return None  # an adaptive optimizer's job: not this rule's (the docstring)
    loss = fv.get(str(r.param("loss_metric")))
    loss = loss if loss is not None and math.isfinite(loss) else None
    losses: deque[tuple[int, float]] = m.extra.setdefault(
        "losses", deque(maxlen=COLLAPSE_KEEP))
    lag, span = int(r.param("lag")), int(r.param("window"))
    past = window(m, step, lag, span, int(r.param("min_samples")))
    first = m.first_step
    if (not math.isfinite(v) or len(past) < int(r.param("min_samples")) or first is None
            or first > step - lag - int(r.param("min_history"))):
        if loss is not None:
            losses.append((step, loss))
        return None
    level = median(x for _, x in past)
    limit = float(r.param("fraction")) * level
    loss_level = up = None
    breach = level >= float(r.param("floor")) and v < limit
    if breach:  # the loss's level only where the logits fell (most frames stop above)
        before = [x for s, x in losses if step - lag - span <= s < step - lag]
        loss_level = median(before) if before else None
        up = None if loss is None or loss_level is None else loss - loss_level
        cap = r.param("loss_up_max")
        breach = (up is not None and up >= float(r.param("loss_up"))
                  and (cap is None or up <= float(cap)))
    if not breach and loss is not None:
        losses.append((step, loss))
    return Verdict(breach, v, {"value": v, "baseline": level, "limit": limit,
                               "ratio": v / level if level else None, "loss": loss,
                               "loss_level": loss_level, "loss_up": up},
                   baseline=level, limit=limit)
