"""The ``collapse`` kind (``attn_wiped``): every head's max attention logit under a
share of its level with the loss up on the same frame, judged on every sampled frame.

An update that wipes the attention (a garbage batch under unclipped momentum SGD) leaves the
attention flat on the clean batches after it and the loss a nat or so up; a model that
shrugs the batch off has it back at once; garbage batches flatten a healthy model's
attention too, but their own loss is far up (or, once a model has learnt a repeated token,
down), so the rule asks the loss to be up by ``loss_up`` and at most ``loss_up_max``.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.detectors import KINDS
from logitwatch.server.alerts.rules import RuleError, RuleSpec
from logitwatch.wire import fuses_for
from tests.alert_frames import alerts_of, by_rule, frames_at
from tests.scenario_tools import BENCH, FILES, default_entry, load, over_defaults

_RNG = random.Random(11)
_NOISE = [_RNG.gauss(0.0, 0.1) for _ in range(1000)]
_HEAD = [[_RNG.uniform(0.8, 1.2) for _ in range(4)] for _ in range(2)]


def _on(**params: Any) -> list[RuleSpec]:
    """The defaults with ``attn_wiped``'s ``params`` updated (a change taken back)."""
    return [dataclasses.replace(r, params={**r.params, **params})
            if r.name == "attn_wiped" else r for r in DEFAULT_RULES]


def _run(flat_from: int | None, flat_to: int, flat: float, loss_up: float,
         loss_during: float = 3.0, adaptive: float | None = None
         ):  # type: ignore[no-untyped-def]
    """A 3-nat plateau with heads near 2.0; from ``flat_from`` to ``flat_to`` every head at
    ``flat`` of its level; ten garbage batches at 400-409 lift the loss by ``loss_during``
    nats (a negative one: a batch that is easy to predict), ``loss_up`` after them; the
    job's ``optim.adaptive`` on every frame unless None (not sent)."""
    def scalars(step: int) -> dict[str, float]:
        v = 3.0 + _NOISE[step]
        if 400 <= step < 410:
            v += loss_during
        elif step >= 410:
            v += loss_up
        out = {"loss": max(v, 0.01), "lr": 0.1, "grad.norm": 1.0}
        if adaptive is not None:
            out["optim.adaptive"] = adaptive
        return out

    def heads(step: int) -> dict[str, Any]:
        f = flat if flat_from is not None and flat_from <= step < flat_to else 1.0
        return {"attn.logit_max": [[2.0 * x * f * (1 + 0.05 * _NOISE[step]) for x in row]
                                   for row in _HEAD]}
    return scalars, heads


@pytest.mark.parametrize("k", [1, 10])
def test_attention_wiped_with_the_loss_up_pages_on_the_first_clean_frame(
        k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flat from step 403 for good, the loss 3 nats up on the garbage (400-409) and 1 nat up
    after it: paged on the first sampled frame after the garbage (410), not on the garbage's
    own frames, and not at the end of the engine's 10-step fold."""
    scalars, heads = _run(403, 10**6, 0.02, loss_up=1.0)
    frames = frames_at(k, 700, scalars, heads)
    (a,) = by_rule(alerts_of(frames), "attn_wiped")
    assert a.fired_step == 410 and a.paged_step == 410 and a.severity == "critical"
    assert a.evidence["ratio"] < 0.05 and 0.5 < a.evidence["loss_up"] < 1.25
    assert any("checkpoint" in r for r in a.remedies)
    # what acts on it inside the job: a rollback past the batches, not a QK fuse
    assert fuses_for("attn_wiped") == ["rollback"]
    # judged on the fold (as the other per-head rules), the fall shows ~10 steps later at 1
    if k == 1:
        kind = KINDS["collapse"]
        monkeypatch.setitem(KINDS, "collapse", dataclasses.replace(kind, every_frame=False))
        (late,) = by_rule(alerts_of(frames), "attn_wiped")
        assert late.fired_step >= 411, late.fired_step


def test_a_dip_a_healthy_model_shrugs_off_and_garbage_batches_do_not_page() -> None:
    """The heads at 0.4x their level through the garbage (a healthy model's dip), back on
    the first clean batch; flat (0.01x) on garbage batches whose own loss is 3 nats up; flat
    on batches whose loss falls 2.9 nats (a repeated token, learnt): none pages."""
    for flat, during in ((0.4, 3.0), (0.01, 3.0), (0.01, -2.9)):
        scalars, heads = _run(400, 410, flat, loss_up=0.0, loss_during=during)
        assert by_rule(alerts_of(frames_at(1, 700, scalars, heads)), "attn_wiped") == [], (
            flat, during)
    # without the cap the garbage's own frames page (what loss_up_max keeps out)
    scalars, heads = _run(400, 410, 0.01, loss_up=0.0, loss_during=3.0)
    (a,) = by_rule(alerts_of(frames_at(1, 700, scalars, heads), rules=_on(loss_up_max=None)),
                   "attn_wiped")
    assert a.fired_step == 400


@pytest.mark.parametrize("k", [1, 10])
def test_attention_wiped_under_an_adaptive_optimizer_is_not_judged(k: int) -> None:
    """Round forty-eight: ``attn_wiped`` judges a plain optimizer's job (``optim.adaptive``
    = 0, SGD) and one that does not say; under Adam or RMSprop (= 1) no one batch's update
    goes into the weights whole, and the same fall with the loss up does not page
    (``plain_only``; taken back, it does)."""
    pages = {}
    for adaptive in (None, 0.0, 1.0):
        scalars, heads = _run(403, 10**6, 0.02, loss_up=1.0, adaptive=adaptive)
        pages[adaptive] = [a.fired_step for a in by_rule(
            alerts_of(frames_at(k, 700, scalars, heads)), "attn_wiped")]
    assert pages == {None: [410], 0.0: [410], 1.0: []}, pages
    scalars, heads = _run(403, 10**6, 0.02, loss_up=1.0, adaptive=1.0)
    (a,) = by_rule(alerts_of(frames_at(k, 700, scalars, heads), rules=_on(plain_only=False)),
                   "attn_wiped")
    assert a.fired_step == 410
    assert next(r for r in DEFAULT_RULES if r.name == "attn_wiped").params["plain_only"]
    with pytest.raises(RuleError, match="plain_only.*true or false"):
        RuleSpec("c", "collapse", "attn.logit_max", over="max", params={"plain_only": 1})


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_garbage_stretch_under_adamw_no_longer_pages_as_a_wiped_attention(
        tmp_path: Path) -> None:
    """Round forty-eight on recorded runs: ``f83_postln_bad_data_random`` (32 random
    batches from step 413 under clipped AdamW; the attention flat on the first clean
    batches, back within 15 steps; healthy) paged at 449 at interval 1 by ``attn_wiped``,
    and pages nothing now; ``f59_qknorm_high_lr`` (AdamW, diverging at 475), whose first
    page it was at 178, is paged at 195 by ``loss_ramp``."""
    ba = load("bench_alerts")
    before = over_defaults(tmp_path, {**default_entry("attn_wiped"),
                                      "params": {**default_entry("attn_wiped")["params"],
                                                 "plain_only": False}})
    healed = str(BENCH / "scenarios" / "f83_postln_bad_data_random.jsonl.gz")
    row = ba.bench_one(healed, 1)
    assert row["label"] == "healthy" and row["logitwatch"]["first"] is None, row
    old = ba.bench_one(healed, 1, rules=before)
    assert old["logitwatch"]["first"] == 449 and old["logitwatch_rules"] == ["attn_wiped"]
    diverging = str(BENCH / "scenarios" / "f59_qknorm_high_lr.jsonl.gz")
    row = ba.bench_one(diverging, 1)
    assert row["divergence_step"] == 475 and row["logitwatch"]["from50"] == 195
    assert ba.bench_one(diverging, 1, rules=before)["logitwatch"]["from50"] == 178


def test_a_collapse_needs_a_level_and_the_kind_judges_over_all_heads() -> None:
    """Logits that never grew (level under ``floor``) are not judged; a collapse rule per
    head is refused with what to set."""
    scalars, heads = _run(403, 10**6, 0.02, loss_up=1.0)
    assert by_rule(alerts_of(frames_at(1, 700, scalars, heads), rules=_on(floor=5.0)),
                   "attn_wiped") == []
    with pytest.raises(RuleError, match="over: max"):
        RuleSpec("c", "collapse", "attn.logit_max")


def test_a_departure_below_takes_a_margin_not_a_factor() -> None:
    """A fall under a share of the level is the collapse kind's; a departure judged
    downwards reads a margin in the series' units."""
    for params in ({"below": True, "factor": 2.0, "floor": None},
                   {"below": True, "factor": 0.5}, {"below": True, "factor": 0.5, "floor": None}):
        with pytest.raises(RuleError, match="below .* needs margin"):
            RuleSpec("x", "departure", "attn.logit_max", over="max", params=params)
