"""The alert rules' changes, each on the recorded runs it was chosen for: a rule file over the
defaults, and each round's change against the rules before it (the change taken back through
a rules file), at the intervals it was measured at (docs/ALERTS_EVIDENCE.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.scenario_tools import BENCH, FILES, default_entry, load, over_defaults


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_the_bench_replays_a_rules_file_over_the_defaults(tmp_path: Path) -> None:
    """``--rules``: a change measured, or taken back, as ``serve`` would apply it. Round
    twenty taken back (``at_once_adaptive_above: null``) pages the held-out run it was read
    on (one garbage batch under unclipped Adam) at once again; the defaults do not."""
    ba = load("bench_alerts")
    path = str(BENCH / "scenarios" / "f22_gpt2_adam_outlier_random.jsonl.gz")
    jump = default_entry("loss_jump")
    jump["page"]["at_once_adaptive_above"] = None
    assert ba.bench_one(path, 1)["logitwatch"]["from50"] is None
    assert ba.bench_one(path, 1, rules=over_defaults(tmp_path, jump))["logitwatch"][
        "from50"] == 420
    with pytest.raises(SystemExit):
        ba.main(["--split", "fresh22", "--rules", str(tmp_path / "missing.yaml")])


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_healed_sgd_garbage_batch_pages_only_under_the_damage_test(tmp_path: Path) -> None:
    """Round twenty-one on recorded runs. ``f23_llama_sgd_bad_data_8`` (eight garbage
    batches under unclipped momentum SGD, healed) paged at 431 on its aftershock under round
    ten's damage test; the defaults leave it shown. ``f18_postln_sgd_outlier_zeros`` (one
    zero-byte batch at 380, then a blow-up from 384) still pages, once it blows up."""
    ba = load("bench_alerts")
    damage = [dict(r, page={**r["page"], "aftershock_above": 12.0})
              for r in (default_entry("loss_jump"), default_entry("grad_blowup"))]
    round20 = over_defaults(tmp_path, *damage)
    healed = str(BENCH / "scenarios" / "f23_llama_sgd_bad_data_8.jsonl.gz")
    assert ba.bench_one(healed, 1)["logitwatch"]["from50"] is None
    assert ba.bench_one(healed, 1, rules=round20)["logitwatch"]["from50"] == 431
    wrecked = str(BENCH / "scenarios" / "f18_postln_sgd_outlier_zeros.jsonl.gz")
    assert ba.bench_one(wrecked, 1, rules=round20)["logitwatch"]["from50"] == 381
    assert ba.bench_one(wrecked, 1)["logitwatch"]["from50"] == 385


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_an_sgd_blow_up_that_climbs_in_its_first_steps_pages_by_its_divergence(
        tmp_path: Path) -> None:
    """Round twenty-two on recorded runs: two unclipped momentum-SGD blow-ups of the
    twenty-seventh set, the loss a nat up on the first step, up on the second, 11-13 nats up
    on the third (the divergence), paged there by the climb; with ``climb_above`` taken back
    they paged one and two steps late (the precursor leaves a run's first three steps out)."""
    ba = load("bench_alerts")
    back = [dict(r, page={**r["page"], "climb_above": None})
            for r in (default_entry("loss_jump"), default_entry("grad_blowup"))]
    round21 = over_defaults(tmp_path, *back)
    for name, now, before in (("f26_gpt2_sgd_blowup", 261, 263),
                              ("f26_postln_sgd_blowup", 236, 238)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        row = ba.bench_one(path, 1)
        assert row["logitwatch"]["from50"] == now <= row["divergence_step"], (name, row)
        assert ba.bench_one(path, 1, rules=round21)["logitwatch"]["from50"] == before, name


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_an_sgd_warm_up_pages_on_its_logits_not_its_blow_up(tmp_path: Path) -> None:
    """Round twenty-four on recorded runs: momentum-SGD Llama runs warming up grow a head's
    float32 logits past 4x their range well before they blow up; with the LR still climbing
    20 % a hundred steps the departure pages when it fires, at interval 1 and 10 (at 40 the
    departure itself fires later on these runs); without ``lr_climb`` (round twenty-three)
    it stayed info and the gradient and loss paged 2-4 steps before the divergence."""
    ba = load("bench_alerts")
    dep = default_entry("attn_logit_departure")
    dep["downgrade"]["lr_climb"] = None
    round23 = over_defaults(tmp_path, dep)
    for name, before in (("llama_sgd_blowup_s1", 373), ("f24_llama_sgd_blowup", 339)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        for k in (1, 10):
            row = ba.bench_one(path, k)
            assert row["divergence_step"] - row["logitwatch"]["from50"] >= 50, (name, k, row)
            assert row["logitwatch_rules"] == ["attn_logit_departure"], (name, k, row)
        old = ba.bench_one(path, 1, rules=round23)
        assert old["logitwatch"]["from50"] == before, (name, old)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_garbage_stretch_that_left_the_run_worse_is_not_reported_recovered() -> None:
    """Round twenty-five on recorded runs: twenty garbage batches left an unclipped post-LN
    SGD run 0.6 nat worse for good, just under the jump detector's limit; the jump alert
    used to resolve at step 431 as "Recovered" and never page. Now it pages 100 steps after
    the jump, saying the loss did not recover. A garbage batch a Llama run shrugs off still
    resolves as recovered, once the loss's level is back."""
    from logitwatch.server.alerts.replay import replay

    frames_mod = load("scenario_frames")
    for name, pages in (("f13_postln_sgd_bad_data", True), ("f30_llama_outlier_random", False)):
        _, frames = frames_mod.read_run(BENCH / "scenarios" / f"{name}.jsonl.gz")
        jumps = [a for a in replay(frames_mod.derive(frames, 1), batch=64).alerts
                 if a.rule == "loss_jump"]
        assert jumps, name
        a = jumps[0]
        if pages:
            assert a.paged_step == a.started_step + 100 == 480, (name, a.evidence)
            assert a.evidence["escalated_because"].startswith("it did not recover"), name
            assert not a.evidence.get("recovered")
        else:
            assert a.paged_step is None and a.evidence.get("recovered") is True, name
            assert "back within" in a.message


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_soft_capped_run_is_judged_on_what_its_softmax_receives(tmp_path: Path) -> None:
    """Round twenty-nine on recorded runs: under a soft-cap the departure reads the capped
    scores. A healthy Gemma-2 run whose raw logits ran 7x past their range behind a cap of 30
    gets no alert at all (round twenty-eight showed an info departure); a Gemma-2 re-warm that
    diverges is paged at the same step as before, by the LR rule, at intervals 1 and 50."""
    ba = load("bench_alerts")
    dep = default_entry("attn_logit_departure")
    dep["params"].pop("capped_metric")
    round28 = over_defaults(tmp_path, dep)
    healthy = str(BENCH / "scenarios" / "f30_gemma2_softcap_s300.jsonl.gz")
    rewarm = str(BENCH / "scenarios" / "f12_gemma2_rewarm.jsonl.gz")
    for k in (1, 50):
        row = ba.bench_one(healthy, k)
        assert row["label"] == "healthy" and row["rules_fired"] == [], (k, row)
        before = ba.bench_one(healthy, k, rules=round28)
        assert before["rules_fired"] == ["attn_logit_departure"], (k, before)
        assert before["logitwatch"]["from50"] is None, (k, before)  # info, never paged
        row = ba.bench_one(rewarm, k)
        assert row["logitwatch"]["from50"] == 397 < row["divergence_step"], (k, row)
        assert "attn_logit_departure" not in row["rules_fired"], (k, row)
        assert ba.bench_one(rewarm, k, rules=round28)["logitwatch"]["from50"] == 397, k


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_one_garbage_batchs_aftershocks_do_not_page_as_repeats(tmp_path: Path) -> None:
    """Round thirty on recorded tuning runs, at intervals 1 and 50: one garbage batch under
    unclipped momentum SGD kicks a post-LN run's loss 5.4 nats up, then smaller jumps follow
    while the weights heal. ``f37_`` and ``f38_postln_sgd_outlier_random`` healed; their
    third jump within 20 steps paged them (430, 423), and the defaults, which count no
    aftershock (``page.repeats_aftershock``), leave them shown. ``f21_`` had the same kick
    and stayed 0.5-0.7 nat worse for good: paged at 410 before, by its divergence (429), not
    now, the trade the round made (docs/ALERTS.md)."""
    ba = load("bench_alerts")
    jump = default_entry("loss_jump")
    assert jump["page"]["repeats_aftershock"] == 0.5
    jump["page"]["repeats_aftershock"] = None
    round29 = over_defaults(tmp_path, jump)
    for k in (1, 50):
        for name, step in (("f37_postln_sgd_outlier_random", 430),
                           ("f38_postln_sgd_outlier_random", 423),
                           ("f21_postln_sgd_outlier_random", 410)):
            path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
            assert ba.bench_one(path, k)["logitwatch"]["from50"] is None, (name, k)
            assert ba.bench_one(path, k, rules=round29)["logitwatch"]["from50"] == step, (name, k)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_an_unclipped_gradient_in_its_first_50_steps_is_no_blowup(tmp_path: Path) -> None:
    """Round thirty-one on recorded tuning runs, at intervals 1 and 50: healthy unclipped
    SGD runs whose gradient norm left its first steps' range (the weights leaving their init,
    a warm-up climbing) got a ``grad_blowup`` alert there, their only one; judged from step 50
    of the series on (``min_history``), they get none. ``f3_postln_sgd_blowup``, which blows
    up at 51, is still paged by its divergence, a step later than before."""
    ba = load("bench_alerts")
    blowup = default_entry("grad_blowup")
    assert blowup["params"]["min_history"] == 50
    blowup["params"]["min_history"] = 0
    round30 = over_defaults(tmp_path, blowup)
    for k in (1, 50):
        for name, step in (("f14_postln_plain_sgd_warm", 9), ("f26_llama_plain_sgd", 8),
                           ("f33_gemma2_plain_sgd_warm", 28)):
            path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
            assert ba.bench_one(path, k)["any_alert"] is None, (name, k)
            before = ba.bench_one(path, k, rules=round30)
            assert before["any_alert"] == step and before["rules_fired"] == ["grad_blowup"], \
                (name, k, before["any_alert"], before["rules_fired"])
        path = str(BENCH / "scenarios" / "f3_postln_sgd_blowup.jsonl.gz")
        assert ba.bench_one(path, k)["logitwatch"]["from50"] == 51, k
        assert ba.bench_one(path, k, rules=round30)["logitwatch"]["from50"] == 50, k


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_gradient_level_rise_alone_is_shown_not_paged(tmp_path: Path) -> None:
    """Round thirty-two, chosen on ``--split read41`` and ``fresh43`` (a BPE of 2,048
    tokens), at intervals 1 and 50: two healthy QK-norm warm-ups on that vocabulary raise
    the gradient norm's level 6x while the loss stays flat, and ``grad_norm_ramp`` /
    ``grad_norm_rising`` paged them; shown (info), they page nothing. A byte-level QK-norm
    run at too high an LR, which ``grad_norm_ramp`` paged first, is paged by
    ``loss_clip_ramp`` (with ``loss_grad_ramp``) 59 steps before its divergence (607)."""
    ba = load("bench_alerts")
    round31 = over_defaults(tmp_path, *(dict(default_entry(n), severity="warning")
                                        for n in ("grad_norm_rising", "grad_norm_ramp")))
    for k in (1, 50):
        for name, step in (("f43_demo_plain", 704), ("f43_qknorm_lr24_s430", 711)):
            path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
            now = ba.bench_one(path, k)
            assert now["logitwatch"]["from50"] is None, (name, k, now["rules_paged"])
            assert {"grad_norm_ramp", "grad_norm_rising"} <= set(now["rules_fired"]), name
            assert ba.bench_one(path, k, rules=round31)["logitwatch"]["from50"] == step, \
                (name, k)
    path = str(BENCH / "scenarios" / "f41_qknorm_high_lr.jsonl.gz")
    row = ba.bench_one(path, 1)
    assert {"loss_clip_ramp", "loss_grad_ramp"} <= set(row["logitwatch_rules"]), row
    assert row["logitwatch"]["from50"] == 548 and row["divergence_step"] == 607, row
    assert ba.bench_one(path, 1, rules=round31)["logitwatch"]["from50"] == 463


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_noisy_vocabularys_loss_wander_is_no_ramp(tmp_path: Path) -> None:
    """Round thirty-three, chosen on ``--split read44``, at intervals 1 and 50: a healthy
    QK-norm warm-up on a 4,096-token BPE, whose loss wanders 0.17 nat a step, touched 0.314
    nat over its lowest level at the clip at step 627 and ``loss_clip_ramp`` /
    ``loss_grad_ramp`` paged it; the margin is now at least twice that noise, and nothing
    pages. A warm-up on the same vocabulary that ramps too far (divergence 135) is still
    paged ahead of it, at 130 instead of 105."""
    ba = load("bench_alerts")
    fixed = over_defaults(tmp_path, *(
        dict(default_entry(n), params=dict(default_entry(n)["params"], noise_margin=None))
        for n in ("loss_clip_ramp", "loss_grad_ramp")))
    _quiet_now_paged_before(ba, fixed, ("f44_demo_plain", 627),
                            ("f44_lr_ramp_s441", 135, 130, 105), "loss_clip_ramp")


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_slow_log_z_drift_that_stops_is_not_paged(tmp_path: Path) -> None:
    """Round thirty-four, chosen on ``--split read46``, at intervals 1 and 50: a healthy
    Gemma 2 on a 4,096-token BPE whose LM head grows 2x over 200 steps and stops takes log Z
    1.014 nat over its range, climbing 0.57 nat in 50 steps, and ``final_logz_departure``
    paged it at 445; a nat out now counts only while log Z climbs 0.7 in 50 steps (or at
    1.25 nat), and nothing pages. A head that runs away on the same vocabulary is paged
    where it was (470, and 460 since round thirty-five), ahead of its divergence (483)."""
    ba = load("bench_alerts")
    entry = default_entry("final_logz_departure")
    flat = over_defaults(tmp_path, dict(entry, params=dict(entry["params"], climb=None,
                                                           slow_margin=None,
                                                           fast_margin=None)))
    _quiet_now_paged_before(ba, flat, ("f44_gemma2_logz_slow", 445),
                            ("f44_gpt2_head_drift", 483, 460, 470), "final_logz_departure")


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_log_z_ramp_is_paged_on_its_short_level(tmp_path: Path) -> None:
    """Round thirty-five, chosen on ``--split read47``, at intervals 1 and 50: a post-LN LM
    head growing from step 414 takes log Z up 0.1 nat a step; its 100-step level crossed
    the limit only at 470, after the divergence (462 on 6,144 tokens, 468 on 3,072). Judged
    on its 20-step level while that climbs in both halves of 50 steps (the loss not
    falling) for 5 steps in a row, it is paged at 458 and 462, ahead of both."""
    ba = load("bench_alerts")
    entry = default_entry("final_logz_departure")
    before = over_defaults(tmp_path, dict(entry, params=dict(entry["params"],
                                                             fast_margin=None)))
    for name, divergence, now in (("f47_postln_head_drift", 462, 458),
                                  ("f45_postln_head_drift", 468, 462)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        for k in (1, 50):
            row = ba.bench_one(path, k)
            assert row["divergence_step"] == divergence, row
            assert row["logitwatch"]["from50"] == now, (name, k, row)
            assert "final_logz_departure" in row["logitwatch_rules"], (name, k, row)
            assert ba.bench_one(path, k, rules=before)["logitwatch"]["from50"] == 470, (name, k)


def _quiet_now_paged_before(ba: Any, before: Any, healthy: tuple[str, int],
                            diverging: tuple[str, int, int, int], rule: str) -> None:
    """At intervals 1 and 50: the ``healthy`` run (name, the step the rules ``before`` the
    round paged it) pages nothing now; the ``diverging`` one (name, its divergence, the
    step it pages now, the step it paged before) is paged by ``rule`` where it says."""
    name, was = healthy
    run, divergence, now, then = diverging
    quiet, paged = (str(BENCH / "scenarios" / f"{n}.jsonl.gz") for n in (name, run))
    for k in (1, 50):
        assert ba.bench_one(quiet, k)["logitwatch"]["from50"] is None, (name, k)
        assert ba.bench_one(quiet, k, rules=before)["logitwatch"]["from50"] == was, (name, k)
        row = ba.bench_one(paged, k)
        assert row["divergence_step"] == divergence, row
        assert row["logitwatch"]["from50"] == now and rule in row["logitwatch_rules"], (k, row)
        assert ba.bench_one(paged, k, rules=before)["logitwatch"]["from50"] == then, (run, k)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_log_z_falling_away_is_paged_and_a_garbage_dip_is_not(tmp_path: Path) -> None:
    """Round thirty-seven, chosen on ``--split read54``, at intervals 1 and 50: a post-LN LM
    head growing 3 %/step from step 414 on batches of 8 sinks every logit: log Z falls from
    5.9 to -32 and the run diverges at 566. Nothing paged it before 608; log Z falling 1.5
    nat out, running away on its 20-step level, pages it at 535. The upward rule's climb
    path mirrored would page it at 522, and a healthy SGD run whose garbage stretch dropped
    log Z at once at 464; the rule leaves that path out. (Without it, round thirty-eight's
    ``grad_norm_climb`` pages the run at 547; before both, nothing paged it before 608.)"""
    ba = load("bench_alerts")
    entry = default_entry("final_logz_fall")
    climbing = dict(default_entry("grad_norm_climb"), enabled=False)
    off = over_defaults(tmp_path, dict(entry, enabled=False), climbing)
    fall_off = over_defaults(tmp_path, dict(entry, enabled=False))
    climb = over_defaults(tmp_path, dict(entry, params=dict(entry["params"], margin=1.0,
                                                            climb=0.7, slow_margin=1.25)))
    _quiet_now_paged_before(ba, climb, ("f24_llama_sgd_bad_data_18", 464),
                            ("f54_postln_head_drift", 566, 535, 522), "final_logz_fall")
    path = str(BENCH / "scenarios" / "f54_postln_head_drift.jsonl.gz")
    for k in (1, 50):
        assert ba.bench_one(path, k, rules=off)["logitwatch"]["from50"] == 608, k
        row = ba.bench_one(path, k, rules=fall_off)
        assert row["logitwatch"]["from50"] == 547, (k, row)
        assert row["logitwatch_rules"] == ["grad_norm_climb"], (k, row)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_the_log_z_screen_measures_what_round_thirty_seven_was_chosen_on() -> None:
    """``bench/screen_logz.py`` on two recorded runs: the head drift whose log Z falls comes
    2 nat under its range by its divergence (1.5 at 558, 2 at 565); the healthy garbage stretch that
    falls furthest of all healthy runs stays under 1.25 on its 100-step level while its
    20-step level dips 3.9 nat (what the fast path's conditions must tell apart)."""
    sl = load("screen_logz")
    drift = sl.falls(BENCH / "scenarios" / "f54_postln_head_drift.jsonl.gz")
    assert drift["label"] == "diverging" and drift["down"] >= 2.0, drift
    assert drift["first"][1.5] == 558 and drift["first"][2.0] == 565, drift
    dip = sl.falls(BENCH / "scenarios" / "f24_llama_sgd_bad_data_18.jsonl.gz")
    assert dip["label"] == "healthy", dip
    assert 1.2 < dip["down"] < 1.25 and dip["down20"] > 3.5, dip


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_gradient_still_climbing_pages_a_head_drift_ahead_of_its_divergence(
        tmp_path: Path) -> None:
    """Round thirty-eight, chosen on ``--split read55``, at intervals 1 and 50: a post-LN LM
    head running away on sequences of 128 tokens, whose log Z wandered and fell unevenly,
    was paged only after its divergence (568), by ``grad_spike`` at 595; its gradient norm's
    level climbs 2.5x span after span and ``grad_norm_climb`` pages it at 542."""
    ba = load("bench_alerts")
    off = over_defaults(tmp_path, dict(default_entry("grad_norm_climb"), enabled=False))
    path = str(BENCH / "scenarios" / "f55_postln_head_drift.jsonl.gz")
    for k in (1, 50):
        now = ba.bench_one(path, k)
        assert now["logitwatch"]["from50"] == 542 < now["divergence_step"] == 568, (k, now)
        assert now["logitwatch_rules"] == ["grad_norm_climb"], now
        assert ba.bench_one(path, k, rules=off)["logitwatch"]["from50"] == 595, k


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_the_gradient_climb_screen_measures_what_round_thirty_eight_was_chosen_on() -> None:
    """``bench/screen_grad_climb.py`` on two recorded runs: the head drift meets the three
    conditions at 542, the step the engine pages it; the healthy run that comes closest of
    all on ``read55`` (an SGD catapult, then a garbage stretch) comes to 0.70 of them."""
    sc = load("screen_grad_climb")
    drift = sc.closeness(BENCH / "scenarios" / "f55_postln_head_drift.jsonl.gz")
    assert drift["label"] == "diverging" and drift["met"] == 542, drift
    near = sc.closeness(BENCH / "scenarios" / "f55_llama_sgd_bad_data_10.jsonl.gz")
    assert near["label"] == "healthy" and near["met"] is None, near
    assert 0.65 < near["best"] < 0.75, near


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_departure_after_another_causes_loss_rise_is_not_paged(tmp_path: Path) -> None:
    """Round forty, chosen on ``--split read60``, at interval 1, measured as it was chosen
    (``bench/rule_variants.py``: round thirty-nine's departure beside the defaults in one
    replay): an LR stepped x6 for 47 steps (``f60_llama_lr_bump``) and ten garbage batches
    under SGD (``f60_gpt2_sgd_bad_data_10``) raised the loss and then took a head's float32
    logits past their range; the loss healed from there. With ``start_rise`` 0 (round
    forty; -0.05 since round forty-one, a tolerance for the level's noise) the departure
    stays info (the loss's level no higher than when the logits left their range); judged
    from the run's best alone it paged both. A bf16 run at a high LR whose loss climbs with
    its logits is paged by the departure at the same step either way."""
    import yaml

    rv = load("rule_variants")
    entry = default_entry("attn_logit_departure")
    assert entry["downgrade"]["start_rise"] == -0.05
    path = tmp_path / "variants.yaml"
    path.write_text(yaml.safe_dump({"rules": [dict(
        entry, name="attn_logit_departure--r39",
        downgrade=dict(entry["downgrade"], start_rise=None))]}))
    base, variants, _ = rv.variants_of(path)
    assert (base, variants) == ("attn_logit_departure", ["attn_logit_departure--r39"])
    for name, then in (("f60_llama_lr_bump", 470), ("f60_gpt2_sgd_bad_data_10", 554),
                       ("f60_bf16_high_lr", 311)):
        row = rv.pages_of(name, 1, str(path))
        now = rv.first_page(row["pages"], base, base)
        old = rv.first_page(row["pages"], base, variants[0])
        assert old == then == row["pages"][variants[0]], (name, row)
        if row["label"] == "healthy":
            assert now is None, (name, row)
        else:
            assert now == then <= row["divergence_step"], (name, row)
            assert row["pages"][base] == then, (name, row)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"rules": [entry]}))
    with pytest.raises(ValueError, match="name every rule <default rule>--<tag>"):
        rv.variants_of(tmp_path / "bad.yaml")


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_bias_that_grows_with_an_lr_bump_is_no_refuge(tmp_path: Path) -> None:
    """Round forty-two, chosen on ``--split read64``, at interval 1 (``bench/rule_variants.py``
    with round forty-one's ``q_bias_refuge`` beside the defaults): two post-LN runs whose LR
    was bumped x5.7 for 53 steps under AdamW, with no QK-clip, had W_q fall 20-24 % while its
    bias rose 21-40 %, and the refuge paged them (``min_rise`` null: the bias's rise is
    ``min_change``, 0.2); the QK-clip runs whose bias rose least by the step it fired
    (``f46_``, ``f52_gpt2_qk_clip``: 49 % and 51 %) page under 0.45 (at the same step until
    round forty-five asked the breach to last 30 steps; since round forty-six, when the bias
    is half the weight's norm: 10 and 70 steps later)."""
    import yaml

    rv = load("rule_variants")
    entry = default_entry("q_bias_refuge")
    assert entry["params"]["min_rise"] == 0.45 and entry["params"]["share"] == 0.5
    assert not entry.get("for_steps")
    assert default_entry("k_bias_refuge")["params"].get("min_rise") is None
    path = tmp_path / "variants.yaml"
    path.write_text(yaml.safe_dump({"rules": [dict(
        entry, name="q_bias_refuge--r41", for_steps=0,
        params=dict(entry["params"], min_rise=None, share=0.25))]}))
    base, variants, _ = rv.variants_of(path)
    for name, then, now in (("f12_postln_lr_bump", 450, None), ("f64_postln_lr_bump", 530, None),
                            ("f46_gpt2_qk_clip", 380, 390), ("f52_gpt2_qk_clip", 260, 330)):
        row = rv.pages_of(name, 1, str(path))
        assert row["label"] == "healthy", (name, row)
        assert row["pages"][variants[0]] == then, (name, row)
        assert row["pages"].get(base) == now, (name, row)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_qk_clip_that_scales_the_biases_is_no_refuge() -> None:
    """Rounds forty-five and forty-six: a QK-clip that scales the q/k biases with the weights
    (as the project's fuse does) leaves no refuge, but early in training the bias grows from
    its zero init faster than the clip shrinks it: round forty-four's ``q_bias_refuge``
    paged 5 of ``qkclip1``'s 12 such runs at steps 180-300, round forty-five's (the breach
    held 30 steps) one of ``qkclip2``'s at tau 3, whose breach held 50 steps with the bias a
    third of the weight's norm. A refuge's bias only climbs past it: since round forty-six
    the bias must be half the weight's norm, and none of the scaled runs is paged at
    intervals 1 and 50, while every run whose clip leaves the biases is, by the refuge
    alone."""
    ba = load("bench_alerts")
    for name in ("q1_gpt2_qk_clip_scaled_t4_mid", "q1_gpt2_qk_clip_scaled_t6_hi",
                 "q2_gpt2_qk_clip_scaled_t3_lo_i5", "q1_gpt2_qk_clip_s0",
                 "q1_gpt2_qk_clip_s3", "q2_gpt2_qk_clip_s0"):
        for k in (1, 50):
            row = ba.bench_one(str(BENCH / "scenarios" / f"{name}.jsonl.gz"), k)
            assert row["label"] == "healthy", (name, k)
            if "scaled" in name:
                assert row["logitwatch"]["first"] is None, (name, k, row["rules_paged"])
            else:
                assert set(row["rules_paged"]) <= {"q_bias_refuge", "k_bias_refuge"} \
                    and row["logitwatch"]["first"] is not None, (name, k, row)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_page_during_a_loss_jump_held_at_info_is_sent() -> None:
    """``f66_lr_ramp_s660`` (a warm-up ramp that diverges at 132): the loss jumps at 114 and
    is held at ``info`` (it pages at 131); the loss climbing at the clip pages at 115. That
    page was stored inhibited by the info alert, so nobody heard of the run until 128; an
    inhibiting rule now inhibits only once it has paged, and the bench counts only the
    pages that were sent (``_paged_step``)."""
    ba = load("bench_alerts")
    row = ba.bench_one(str(BENCH / "scenarios" / "f66_lr_ramp_s660.jsonl.gz"), 1)
    assert row["logitwatch"]["from50"] == 115 and row["logitwatch_rules"] == ["loss_clip_ramp"]
    assert row["divergence_step"] == 132


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_garbage_stretch_that_wiped_the_attention_pages_before_the_divergence(
        tmp_path: Path) -> None:
    """Round forty-three on a recorded run: ``f60_postln_sgd_bad_data_11`` (eleven garbage
    batches from step 409 under unclipped momentum SGD; every head's max logit near 0 from
    412 on, the loss a nat up on the clean batches; dated diverging at 427) pages at 421,
    the second clean batch, at 1, 10 and 50 (``attn_wiped``); without the rule, at 509
    (``loss_jump``'s "did not recover"). The cost, named in the round: the one post-LN
    garbage stretch of its kind that healed (``f66_postln_sgd_bad_data_11``) pages too."""
    ba = load("bench_alerts")
    off = over_defaults(tmp_path, {**default_entry("attn_wiped"), "enabled": False})
    wrecked = str(BENCH / "scenarios" / "f60_postln_sgd_bad_data_11.jsonl.gz")
    for k in (1, 10, 50):
        row = ba.bench_one(wrecked, k)
        assert row["logitwatch"]["from50"] == 421 and row["logitwatch_rules"] == ["attn_wiped"]
    assert ba.bench_one(wrecked, 1, rules=off)["logitwatch"]["from50"] == 509
    healed = ba.bench_one(str(BENCH / "scenarios" / "f66_postln_sgd_bad_data_11.jsonl.gz"), 1)
    assert healed["label"] == "healthy" and healed["logitwatch_rules"] == ["attn_wiped"]
