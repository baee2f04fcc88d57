"""The ``collapse`` kind (``attn_wiped``): every head's max attention logit under a
share of its level with the loss up on the same frame, judged on every sampled frame.

An update that wipes the attention (a garbage batch under unclipped momentum SGD) leaves the
attention flat on the clean batches after it and the loss nats up; a model that shrugs the
batch off has it back at once; a batch of one repeated token flattens a healthy model's
attention too, but its loss falls.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.rules import RuleError, RuleSpec
from logitwatch.wire import fuses_for
from tests.alert_frames import alerts_of, by_rule, frames_at

_RNG = random.Random(11)
_NOISE = [_RNG.gauss(0.0, 0.1) for _ in range(1000)]
_HEAD = [[_RNG.uniform(0.8, 1.2) for _ in range(4)] for _ in range(2)]


def _on(**params: Any) -> list[RuleSpec]:
    """The defaults with ``attn_wiped`` switched on (``params`` over its own)."""
    return [dataclasses.replace(r, enabled=True, params={**r.params, **params})
            if r.name == "attn_wiped" else r for r in DEFAULT_RULES]


def _run(flat_from: int | None, flat_to: int, flat: float, loss_up: float,
         loss_during: float = 3.0):  # type: ignore[no-untyped-def]
    """A 3-nat plateau with heads near 2.0; from ``flat_from`` to ``flat_to`` every head at
    ``flat`` of its level; ten garbage batches at 400-409 lift the loss by ``loss_during``
    nats (a negative one: a batch that is easy to predict), ``loss_up`` after them."""
    def scalars(step: int) -> dict[str, float]:
        v = 3.0 + _NOISE[step]
        if 400 <= step < 410:
            v += loss_during
        elif step >= 410:
            v += loss_up
        return {"loss": max(v, 0.01), "lr": 0.1, "grad.norm": 1.0}

    def heads(step: int) -> dict[str, Any]:
        f = flat if flat_from is not None and flat_from <= step < flat_to else 1.0
        return {"attn.logit_max": [[2.0 * x * f * (1 + 0.05 * _NOISE[step]) for x in row]
                                   for row in _HEAD]}
    return scalars, heads


@pytest.mark.parametrize("k", [1, 10])
def test_attention_wiped_with_the_loss_up_pages_on_the_frame(k: int) -> None:
    """Flat from step 403 for good, the loss 2 nats up after the garbage: paged on the first
    sampled frame at or after 403, not at the end of the engine's 10-step fold."""
    scalars, heads = _run(403, 10**6, 0.02, loss_up=2.0)
    frames = frames_at(k, 700, scalars, heads)
    (a,) = by_rule(alerts_of(frames, rules=_on()), "attn_wiped")
    first = next(f["step"] for f in frames if f["step"] >= 403)
    assert a.fired_step == first and a.paged_step == first and a.severity == "critical"
    assert a.evidence["ratio"] < 0.05 and a.evidence["loss_up"] > 1.5
    assert any("checkpoint" in r for r in a.remedies)
    # what acts on it inside the job: a rollback past the batches, not a QK fuse
    assert fuses_for("attn_wiped") == ["rollback"]
    # off by default
    assert by_rule(alerts_of(frames), "attn_wiped") == []


def test_a_dip_a_healthy_model_shrugs_off_and_a_flat_batch_with_the_loss_down_do_not_page(
        ) -> None:
    """The heads at 0.4x their level through the garbage (a healthy model's dip), back on
    the first clean batch; and flat (0.01x) on batches whose loss falls 2.9 nats (one
    repeated token): neither pages."""
    scalars, heads = _run(400, 410, 0.4, loss_up=0.0)
    assert by_rule(alerts_of(frames_at(1, 700, scalars, heads), rules=_on()),
                   "attn_wiped") == []
    scalars, heads = _run(400, 410, 0.01, loss_up=0.0, loss_during=-2.9)
    assert by_rule(alerts_of(frames_at(1, 700, scalars, heads), rules=_on()),
                   "attn_wiped") == []
    # the same flat batches with the loss up do page (what the gate keeps out is the loss)
    scalars, heads = _run(400, 410, 0.01, loss_up=0.0, loss_during=3.0)
    (a,) = by_rule(alerts_of(frames_at(1, 700, scalars, heads), rules=_on()),
                   "attn_wiped")
    assert a.fired_step == 400


def test_a_collapse_needs_a_level_and_the_kind_judges_over_all_heads() -> None:
    """Logits that never grew (level under ``floor``) are not judged; a collapse rule per
    head is refused with what to set."""
    scalars, heads = _run(403, 10**6, 0.02, loss_up=2.0)
    assert by_rule(alerts_of(frames_at(1, 700, scalars, heads), rules=_on(floor=5.0)),
                   "attn_wiped") == []
    with pytest.raises(RuleError, match="over: max"):
        RuleSpec("c", "collapse", "attn.logit_max")


def test_a_departure_below_takes_a_factor_under_one_or_a_margin() -> None:
    RuleSpec("x", "departure", "attn.logit_max", over="max",
             params={"below": True, "factor": 0.5, "floor": None})
    for params in ({"below": True, "factor": 2.0, "floor": None},
                   {"below": True, "factor": 0.5}):
        with pytest.raises(RuleError, match="factor between 0 and 1"):
            RuleSpec("x", "departure", "attn.logit_max", over="max", params=params)
