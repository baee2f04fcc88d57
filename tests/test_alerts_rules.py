"""Alert rules as pure state machines: table-driven over (series, rule, [(t, state)])."""

from __future__ import annotations

import math
import re

import pytest

from logitwatch.server.alerts.defaults import DEFAULT_RULES, load_rules_file
from logitwatch.server.alerts.rules import (
    KINDS,
    Downgrade,
    FrameView,
    Memory,
    RuleError,
    RuleSpec,
    State,
    Track,
    kendall_tau,
    remedies_for,
    theil_sen,
)

NAN, INF = math.nan, math.inf
I, P, F, R = State.INACTIVE, State.PENDING, State.FIRING, State.RESOLVED  # noqa: E741


def run_states(rule: RuleSpec, values: list[float], *, step: int = 10,
               extra: list[dict[str, float]] | None = None) -> list[State]:
    """Feed ``values`` (one per sample, ``step`` apart) to ``rule``; the state after each."""
    kind = KINDS[rule.kind]
    mem, track, out = Memory(), Track(), []
    for i, v in enumerate(values):
        scalars = {rule.metric: v, **((extra or [{}] * len(values))[i])}
        verdict = kind.detect(rule, mem, i * step, v, FrameView(scalars, {}), (None, None))
        if verdict is not None:
            track.advance(rule, i * step, verdict)
        if not (kind.hold_breaches and verdict is not None and verdict.breach):
            mem.push(i * step, v)
        else:
            mem.seen += 1
            mem.last = (i * step, v)
        out.append(track.state)
    return out


def rule(kind: str, metric: str = "x", **kw: object) -> RuleSpec:
    params = kw.pop("params", {})
    return RuleSpec(f"t_{kind}", kind, metric, params=params, **kw)  # type: ignore[arg-type]


FLAT = [5.0] * 10
CASES = [
    # (id, rule, series, [(sample index, expected state)])
    ("threshold-above", rule("threshold", params={"value": 10.0}),
     [1, 2, 11, 12, 3, 4, 5, 6], [(1, I), (2, F), (4, F), (6, R)]),
    ("threshold-for-2", rule("threshold", params={"value": 10.0}, for_samples=2),
     [1, 11, 1, 11, 12, 1], [(1, P), (2, I), (3, P), (4, F)]),
    ("threshold-below", rule("threshold", params={"value": 1.0, "op": "<"}),
     [2, 2, 0.5], [(1, I), (2, F)]),
    ("nonfinite", rule("nonfinite"), [1, 2, NAN, 3], [(1, I), (2, F)]),
    ("nonfinite-inf", rule("nonfinite"), [1, INF], [(1, F)]),
    ("departure-fires-on-4x", rule("departure", params={"factor": 4.0, "floor": 0.0},
                                   keep_firing_for=0),
     [*FLAT, 21, 5, 5, 5], [(9, I), (10, F), (13, R)]),
    # the kind's default hold, 100 steps: clear from step 110, resolved at step 210
    ("departure-default-hold", rule("departure", params={"factor": 4.0, "floor": 0.0}),
     [*FLAT, 21, *[5] * 12], [(10, F), (13, F), (20, F), (21, R)]),
    # a breach within the hold continues the alert; its hold restarts from the next clear
    ("threshold-hold-rebreach", rule("threshold", params={"value": 10.0}, keep_firing_for=50),
     [1, 11, 1, 1, 11, 1, 1, 1, 1, 1, 1, 1], [(1, F), (3, F), (4, F), (9, F), (10, R)]),
    ("departure-below-floor", rule("departure", params={"factor": 4.0, "floor": 30.0}),
     [*FLAT, 21, 25], [(10, I), (11, I)]),
    ("departure-nodata-early", rule("departure", params={"factor": 2.0, "floor": 0.0}),
     [5, 50, 500], [(2, I)]),  # under min_history: not judged
    ("departure-nonfinite", rule("departure"), [*FLAT, NAN], [(10, F)]),
    ("departure-ceiling", rule("departure", params={"ceiling": 8.0, "floor": 0.0}),
     [*FLAT, 9], [(10, F)]),
    # an additive margin (log-scale series such as log Z): baseline 5 + 1 = 6, not 4 x 5
    ("departure-margin", rule("departure", params={"margin": 1.0, "floor": 0.0},
                              keep_firing_for=0),
     [*FLAT, 5.9, 6.5, 5, 5, 5], [(10, I), (11, F), (14, R)]),
    ("departure-margin-floor", rule("departure", params={"margin": 1.0, "floor": 7.0}),
     [*FLAT, 6.5], [(10, I)]),
    ("baseline-early", rule("baseline", params={"first_steps": 50, "factor": 3.0}),
     [2, 2, 2, 2, 2, 3, 4, 5, 7, 8], [(7, I), (8, F)]),
    ("baseline-below", rule("baseline", params={"first_steps": 30, "min_samples": 3,
                                              "factor": 0.5, "below": True}),
     [4, 4, 4, 3, 1.5], [(3, I), (4, F)]),
    ("trend-p99-8-12-18", rule("trend", params={"window": 30, "min_samples": 4,
                                                    "min_ratio": 2.0}),
     [8, 8.1, 7.9, 8, 8, 12, 18, 27], [(4, I), (5, I), (6, F)]),
    ("trend-noisy-flat", rule("trend", params={"window": 50}),
     [8, 9, 8, 9, 8, 9, 8, 9, 8, 9], [(9, I)]),
    ("forecast-fp16", rule("forecast", params={"window": 30, "min_samples": 4,
                                               "horizon": 50.0, "critical": 1000.0}),
     [10, 20, 40, 80, 160, 320], [(2, I), (3, F)]),
    ("forecast-flat-high", rule("forecast", params={"window": 30, "min_samples": 4,
                                                    "horizon": 500.0}),
     [3e4] * 8, [(7, I)]),  # high but flat: never on course to cross
    ("forecast-crossed", rule("forecast", params={"window": 30, "min_samples": 4}),
     [1, 2, 1, 70000],
     [(3, F)]),
    ("spike-robust-z", rule("spike", params={"z": 6.0, "min_scale": 0.01},
                            keep_firing_for=0),
     [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 9.0, 1.0, 1.0, 1.0],
     [(6, I), (7, F), (10, R)]),
    ("spike-small-bump", rule("spike", params={"z": 6.0, "min_scale": 0.5}),
     [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 2.0], [(7, I)]),
    ("lr-jump", rule("lr_jump", "lr", params={"factor": 2.0}, keep_firing_for=0),
     [0.01, 0.011, 0.012, 0.6, 0.6, 0.6, 0.6], [(2, I), (3, F), (6, R)]),
    ("lr-warmup-ramp", rule("lr_jump", "lr", params={"factor": 2.0}),
     [0.001 * (i + 1) for i in range(2, 30)], [(27, I)]),
    ("entropy-collapse", rule("entropy_collapse", params={"first_steps": 30, "min_samples": 3,
                                                          "fraction": 0.25}),
     [3.0, 3.0, 3.0, 2.5, 0.5], [(3, I), (4, F)]),
    ("clip-rate-rising", rule("clip_rate", params={"window": 30, "rate": 0.9, "rise": 0.5}),
     [0, 0, 0, 0, 0, 0, 1, 1, 1], [(7, I), (8, F)]),
    ("clip-rate-always-high", rule("clip_rate", params={"window": 30, "rate": 0.9, "rise": 0.5}),
     [1] * 10, [(9, I)]),  # clipping on most steps from the start (a healthy run) is no news
    ("first-loss-ok", rule("first_loss", params={"vocab": 256}), [5.6, 9.0], [(0, I), (1, I)]),
    ("first-loss-far", rule("first_loss", params={"vocab": 256}), [12.0], [(0, F)]),
    ("first-loss-nan", rule("first_loss"), [NAN], [(0, F)]),
]


@pytest.mark.parametrize(("spec", "series", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_rule_table(spec: RuleSpec, series: list[float],
                    expected: list[tuple[int, State]]) -> None:
    states = run_states(spec, [float(x) for x in series])
    for t, want in expected:
        assert states[t] is want, f"sample {t}: {states[t].value} != {want.value}; {states}"


def _track(rule_: RuleSpec, series: list[float]) -> list[tuple[int, str, bool]]:
    """(step, state, reopened) of every transition of a threshold-like series."""
    tr, out = Track(), []
    for i, v in enumerate(series):
        t = tr.advance(rule_, i * 10, KINDS[rule_.kind].detect(
            rule_, Memory(), i * 10, v, FrameView({}, {}), (None, None)))
        if t is not None:
            out.append((t.step, t.state.value, t.reopened))
    return out


def test_hold_one_episode_one_alert() -> None:
    r = rule("threshold", params={"value": 10.0}, keep_firing_for=50)
    # breach, clear 20 steps, breach: one episode (a reopened transition, no second firing)
    assert _track(r, [1, 11, 1, 1, 11, 1, 1, 1, 1, 1, 1]) == [
        (10, "firing", False), (40, "firing", True), (100, "resolved", False)]
    # clear for the whole hold (50 steps from step 20): resolved, and the next breach is a
    # second episode
    assert _track(r, [1, 11, 1, 1, 1, 1, 1, 1, 11]) == [
        (10, "firing", False), (70, "resolved", False), (80, "firing", False)]
    # resolve_after still bounds it from below: 3 calm samples even with no hold
    r0 = rule("threshold", params={"value": 10.0}, keep_firing_for=0)
    assert _track(r0, [11, 1, 1, 1]) == [(0, "firing", False), (30, "resolved", False)]


def test_hold_defaults_per_kind() -> None:
    assert rule("threshold").hold == 0 and rule("first_loss").hold == 0
    assert rule("nonfinite").hold == 0 and rule("loss_jump").hold == 0
    assert rule("trend").hold == 200 and rule("forecast").hold == 200
    assert rule("departure").hold == 100 and rule("spike").hold == 100
    assert rule("departure", keep_firing_for=7).hold == 7
    with pytest.raises(RuleError, match="keep_firing_for must be an int >= 0"):
        rule("departure", keep_firing_for=-1)


def test_downgrade_spec_round_trip_and_errors() -> None:
    dep = next(r for r in DEFAULT_RULES if r.name == "attn_logit_departure")
    assert dep.downgrade is not None and dep.downgrade.to == "info"
    assert dep.downgrade.metric == "attn.dtype_max" and dep.downgrade.above == 65504.0
    d = dep.to_dict()
    assert d["downgrade"]["loss_rise"] == 0.25 and RuleSpec.from_dict(d) == dep
    r = RuleSpec.from_dict({"name": "x", "kind": "departure", "metric": "m",
                            "downgrade": {"to": "info", "loss_rise": None}})
    assert isinstance(r.downgrade, Downgrade) and r.downgrade.loss_rise is None
    for bad, msg in [({"to": "loud"}, "downgrade.to must be one of"),
                     ({"color": 1}, "downgrade: unknown fields ['color']"),
                     ({"loss_rise": -1}, "downgrade.loss_rise must be a positive"),
                     ({"recover_span": 60}, "downgrade.recover_span must be null or an int in "
                      "2..loss_window/2 (50), got 60"),
                     ({"recover_span": 20, "loss_rise": None}, "recover_span needs loss_rise"),
                     ({"recover_share": 1.5}, "downgrade.recover_share must be a number in"),
                     ({"lr_climb": 0}, "downgrade.lr_climb must be a positive share"),
                     ({"lr_climb": True}, "downgrade.lr_climb must be a positive share"),
                     ({"start_rise": -0.25, "recover_span": 20},
                      "downgrade.start_rise must be a number of nats above -loss_rise"),
                     ({"start_rise": "0", "recover_span": 20},
                      "downgrade.start_rise must be a number of nats above -loss_rise"),
                     ({"start_rise": 0.1}, "start_rise needs recover_span"),
                     ("info", "downgrade must be a mapping")]:
        with pytest.raises(RuleError, match=re.escape(msg)):
            RuleSpec.from_dict({"name": "x", "kind": "departure", "metric": "m",
                                "downgrade": bad})


def test_loss_jump_says_what_happened() -> None:
    r = rule("loss_jump", "loss", params={"z": 6.0, "min_jump": 0.5})
    mem, fv_rows = Memory(), []
    losses = [2.5, 2.49, 2.48, 2.5, 2.47, 2.46, 2.45, 6.0]
    lrs = [0.01] * 7 + [0.5]
    grads = [0.5] * 7 + [40.0]
    verdict = None
    for i, (loss, lr, g) in enumerate(zip(losses, lrs, grads, strict=True)):
        fv = FrameView({"loss": loss, "lr": lr, "grad.norm": g}, {})
        fv_rows.append(fv)
        verdict = KINDS["loss_jump"].detect(r, mem, i * 10, loss, fv, (None, None))
        mem.push(i * 10, loss)
    assert verdict is not None and verdict.breach
    causes = " ".join(verdict.evidence["causes"])
    assert "learning rate changed from 0.01 to 0.5" in causes
    assert "gradient norm jumped to 40" in causes


def test_ratio_bias_refuge() -> None:
    r = rule("ratio", "qk.q_weight_norm", params={"other": "qk.q_bias_norm", "window": 3,
                                                 "min_change": 0.2})
    mem, track = Memory(), Track()
    weights = [10, 9, 8, 7, 6]
    biases = [1, 1.2, 1.4, 1.6, 1.8]
    states = []
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        fv = FrameView({}, {"qk.q_weight_norm": [[w]], "qk.q_bias_norm": [[b]]})
        v = KINDS["ratio"].detect(r, mem, i, float(w), fv, (0, 0))
        if v is not None:
            track.advance(r, i, v)
        states.append(track.state)
    assert states[2] is I and states[3] is F  # weights -30 %, biases +60 % over 3 steps


def _refuge_states(weights: list[float], biases: list[float], logits: list[float],
                   n_kv: int = 1) -> list[State]:
    """The default q (n_kv 1: one query head per key head) or k bias-refuge rule over
    samples 50 steps apart of one head (its query group's logits: ``logits`` per head)."""
    name = "q_bias_refuge" if n_kv == 1 else "k_bias_refuge"
    r = next(x for x in DEFAULT_RULES if x.name == name)
    w_key, b_key = str(r.metric), str(r.param("other"))
    mem, track, states = Memory(), Track(), []
    for i, (w, b, lg) in enumerate(zip(weights, biases, logits, strict=True)):
        heads = {w_key: [[w] * n_kv], b_key: [[b] * n_kv],
                 "attn.logit_max": [[lg] * (2 * n_kv)]}
        v = KINDS["ratio"].detect(r, mem, i * 50, float(w), FrameView({}, heads), (0, 0))
        if v is not None:
            track.advance(r, i * 50, v)
        states.append(track.state)
    return states


def test_bias_refuge_needs_the_logit_to_move_into_the_bias() -> None:
    shrink = [2.0, 1.8, 1.5, 1.3, 1.1]  # W_q's norm falls 30-40 % per 100 steps
    grow = [0.3, 0.45, 0.6, 0.8, 1.0]  # the bias doubles: a material share of q
    # QK-clip's refuge: the logit holds at its cap while the weight shrinks
    assert F in _refuge_states(shrink, grow, [6.0] * 5)
    # the same head under a key/value group (GQA: two query heads per key head)
    assert F in _refuge_states(shrink, grow, [6.0] * 5, n_kv=2)
    # weights shrunk by training (weight decay, an early transient): the logit goes with them
    assert F not in _refuge_states(shrink, grow, [6.0, 4.0, 2.5, 1.8, 1.2])
    # a near-uniform head (max logit < 1) has no logit to hide
    assert F not in _refuge_states(shrink, grow, [0.05] * 5)
    # a bias that is a rounding error of the projection (< half the weight) carries nothing
    assert F not in _refuge_states(shrink, [0.01, 0.02, 0.04, 0.08, 0.16], [6.0] * 5)


def test_a_bias_refuge_needs_the_bias_at_half_the_weights_norm() -> None:
    """Round forty-six: a clip that scales the biases too lets a zero-init bias outgrow it
    for a while, W_q falling a fifth per 100 steps while its bias rises by half and more,
    the bias a quarter to a third of the weight's norm over 100 steps (round forty-five's
    30-step hold paged that); a refuge's bias keeps climbing past half the weight's norm,
    which pages on the sample it does."""
    shrink = [2.0, 1.8, 1.55, 1.4, 1.2]  # 22-23 % down per 100 steps
    grow = [0.25, 0.3, 0.4, 0.5, 0.75]  # 60-87 % up per 100 steps: share 0.26, 0.36, 0.63
    assert F not in _refuge_states(shrink[:4], grow[:4], [3.0] * 4)
    assert _refuge_states(shrink, grow, [3.0] * 5)[-1] is F


def test_no_data_series_does_not_evaluate() -> None:
    r = rule("departure", "final.hidden_rms")
    assert KINDS["departure"].detect(r, Memory(), 0, 1.0, FrameView({}, {}), (None, None)) \
        is None


def test_trend_records_where_it_left_its_range() -> None:
    r = rule("trend", params={"window": 30, "min_samples": 4, "min_ratio": 2.0})
    states = run_states(r, [8, 8, 8, 8, 12, 18, 27, 40])
    assert F in states


def test_robust_stats() -> None:
    assert theil_sen([0, 1, 2, 3, 4], [0, 2, 4, 6, 100]) == 2.0
    assert kendall_tau([1, 2, 3, 4]) == 1.0 and kendall_tau([4, 3, 2, 1]) == -1.0


def test_step_median_weighs_each_sample_by_the_steps_it_stands_for() -> None:
    from statistics import median

    from logitwatch.server.alerts.detectors import step_median

    # one sample a step: the plain median, odd and even
    pts = [(s, float(v)) for s, v in enumerate([5, 1, 4, 2, 3])]
    assert step_median(pts, 5) == median([5, 1, 4, 2, 3]) == 3
    assert step_median(pts[:4], 4) == median([5, 1, 4, 2]) == 3.0
    # every 40 steps, with a burst of four samples in 21 steps (the steps after a loss
    # spike): the plain median is the burst's value, the step median the run's level
    burst = [(360, 1.33), (400, 0.0), (401, 0.0), (411, 0.0), (421, 0.0), (461, 1.34),
             (501, 1.35)]
    assert median(v for _, v in burst) == 0.0
    assert step_median(burst, 531) == 1.33
    with pytest.raises(ValueError):
        step_median([], 0)


@pytest.mark.parametrize(("d", "msg"), [
    ({"name": "x", "kind": "nope", "metric": "m"}, "kind 'nope' is not one of"),
    ({"name": "x", "kind": "spike", "metric": "m", "params": {"zz": 1}}, "unknown params"),
    ({"name": "x y", "kind": "spike", "metric": "m"}, "use letters"),
    ({"name": "x", "kind": "spike", "metric": "m", "for_samples": 0}, "for_samples"),
    ({"name": "x", "kind": "spike", "metric": "m", "severity": "loud"}, "severity"),
    ({"name": "x", "kind": "spike", "metric": "m", "bogus": 1}, "unknown fields"),
    ({"kind": "spike", "metric": "m"}, "name (a string) is required"),
    # parameter values follow their default's type, so a rule cannot fail later at ingest
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"factor": "x"}},
     "param factor must be a number, got 'x'"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"margin": "abc"}},
     "param margin must be a number or null"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"window": 0}},
     "param window must be an integer >= 1"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"lag": 2.5}},
     "param lag must be an integer >= 0"),
    ({"name": "x", "kind": "trend", "metric": "m", "params": {"min_samples": 2}},
     "param min_samples must be an integer >= 3"),
    ({"name": "x", "kind": "spike", "metric": "m", "params": {"only_unclipped": 1}},
     "param only_unclipped must be true or false"),
    ({"name": "x", "kind": "threshold", "metric": "m", "params": {"op": ">="}},
     "param op must be '<' or '>'"),
    ({"name": "x", "kind": "loss_jump", "metric": "m", "params": {"noise": "mad"}},
     "param noise must be 'level' or 'diff'"),
    ({"name": "x", "kind": "level_rise", "metric": "m", "params": {"while_rising": 3}},
     "param while_rising must be a metric name or null"),
    ({"name": "x", "kind": "level_rise", "metric": "m", "params": {"also_rate": 75}},
     "param also_rate must be a share from 0 to 1 or null"),
    ({"name": "x", "kind": "level_rise", "metric": "m", "params": {"noise_margin": -2}},
     "param noise_margin must be a finite number >= 0 or null"),
    ({"name": "x", "kind": "level_rise", "metric": "m",
      "params": {"noise_margin": float("inf")}},
     "param noise_margin must be a finite number >= 0 or null"),
    ({"name": "x", "kind": "level_rise", "metric": "m", "params": {"noise_window": 2}},
     "param noise_window must be an integer >= 3"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"climb_window": 0}},
     "param climb_window must be an integer >= 1"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"climb": -0.5}},
     "param climb must be a finite number >= 0 or null"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"slow_margin": "far"}},
     "param slow_margin must be a finite number >= 0 or null"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"fast_margin": -1.5}},
     "param fast_margin must be a finite number >= 0 or null"),
    ({"name": "x", "kind": "departure", "metric": "m",
      "params": {"fast_climb": float("inf")}},
     "param fast_climb must be a finite number >= 0 or null"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"fast_not_falling": 1}},
     "param fast_not_falling must be a metric name or null"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"fast_for": 0}},
     "param fast_for must be an integer >= 1"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"fast_tolerance": -0.1}},
     "param fast_tolerance must be a finite number >= 0 or null"),
    ({"name": "x", "kind": "ratio", "metric": "m", "params": {"other": 3}},
     "param other must be a non-empty string"),
    ({"name": "x", "kind": "departure", "metric": "m", "params": {"floor": float("nan")}},
     "param floor must be a number"),
    ({"name": "x", "kind": "spike", "metric": "m", "params": {"z": True}},
     "param z must be a number"),
    ({"name": "x", "kind": "level_rise", "metric": "m", "params": {"climbs": 0}},
     "param climbs must be an integer >= 1"),
    ({"name": "x", "kind": "level_rise", "metric": "m", "params": {"climb_factor": "fast"}},
     "param climb_factor must be a number or null"),
    ({"name": "x", "kind": "level_rise", "metric": "m", "params": {"low_window": 2.5}},
     "param low_window must be an integer >= 0"),
])
def test_bad_rules_say_what_is_wrong(d: dict[str, object], msg: str) -> None:
    with pytest.raises(RuleError, match=re.escape(msg)):
        RuleSpec.from_dict(d)


def test_good_params_of_every_type_are_taken() -> None:
    r = RuleSpec.from_dict({"name": "x", "kind": "departure", "metric": "m",
                            "params": {"factor": 4, "floor": 0.5, "margin": None,
                                       "ceiling": 1e30, "window": 30, "lag": 0}})
    assert r.param("factor") == 4 and r.param("margin") is None
    assert RuleSpec.from_dict({"name": "y", "kind": "first_loss", "metric": "loss",
                               "params": {"vocab": 50257}}).param("vocab") == 50257


def test_defaults_round_trip_and_remedies() -> None:
    names = [r.name for r in DEFAULT_RULES]
    assert len(names) == len(set(names))
    for r in DEFAULT_RULES:
        assert RuleSpec.from_dict(r.to_dict()) == r
    attn = " ".join(remedies_for("attn.logit_max", "departure"))
    assert "QK-norm" in attn and "tau" in attn and "biases" in attn and "checkpoint" in attn
    assert "z-loss" in " ".join(remedies_for("final.logz", "departure"))


def test_yaml_rules_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "rules.yaml"
    p.write_text("rules:\n  - name: attn_logit_rising\n    kind: departure\n"
                 "    metric: attn.logit_max\n    enabled: false\n"
                 "  - name: big_loss\n    kind: threshold\n    metric: loss\n"
                 "    params: {value: 8}\n")
    rules = load_rules_file(p)
    assert [r.name for r in rules] == ["attn_logit_rising", "big_loss"]
    assert not rules[0].enabled and rules[1].param("value") == 8
    p.write_text("rules:\n  - name: bad\n    kind: threshold\n")
    with pytest.raises(RuleError, match=r"rules\[0\]: rule 'bad': metric"):
        load_rules_file(p)


def test_a_bias_refuge_needs_the_bias_to_rise_by_min_rise() -> None:
    """Round forty-two: q's bias must rise 45 % over the window (``min_rise``), k's 20 %
    (``min_change``, its rise when ``min_rise`` is unset). W_q falls 24 % and its bias rises
    25 % with the logit up (an LR bump under Adam moving every weight): no q refuge; k's
    rule, with the same numbers, fires."""
    shrink = [2.0, 1.8, 1.55, 1.3, 1.1]  # 22-29 % down per 100 steps
    grow = [0.8, 0.9, 1.0, 1.12, 1.25]  # 24-25 % up per 100 steps
    assert F not in _refuge_states(shrink, grow, [3.0, 3.5, 4.0, 5.0, 5.7])
    assert F in _refuge_states(shrink, grow, [3.0, 3.5, 4.0, 5.0, 5.7], n_kv=2)
