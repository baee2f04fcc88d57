"""Rules in steps, on recorded runs, when the interval changes during the run: the hooks'
overhead budget widens or narrows it as the measured cost moves (``hooks.sample_every``),
so a job's frames come 10, then 37, then 50 steps apart. Each run is paged as at a fixed
interval (docs/ALERTS.md, *Evidence*: every interval from 1 to 50).
"""

from __future__ import annotations

import pytest

from tests.scenario_tools import BENCH, FILES, load

DIVERGING = ("f30_attn_growth_l4", "f30_postln_rewarm", "f30_llama_lr_jump",
             "f30_postln_sgd_blowup", "f30_qknorm_high_lr", "f30_gpt2_head_drift",
             "f30_qknorm_lr_spike", "f30_fp32_high_lr", "f30_lr_ramp_s300")
HEALTHY = ("f30_postln_bad_data_random", "f30_gemma2_softcap_s300",
           "f30_llama_sgd_outlier_random", "f30_gpt2_rms_outlier_zeros")


def widening(step: int) -> int:
    """10 steps between samples until step 150, 37 until 400, then 50."""
    return 10 if step < 150 else 37 if step < 400 else 50


def narrowing(step: int) -> int:
    """50 steps between samples until step 300, then 24."""
    return 50 if step < 300 else 24


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
@pytest.mark.parametrize("interval", [widening, narrowing], ids=lambda f: f.__name__)
def test_an_interval_that_changes_during_the_run_pages_as_a_fixed_one(interval) -> None:
    """Every diverging run paged (from step 50) no later than its divergence, each healthy
    hard negative (bad data, a soft-capped run, one garbage batch under SGD and RMSprop) not
    paged, the QK-clip refuge paged by its own rule; and the frames say the interval in
    effect when they were sampled."""
    ba = load("bench_alerts")
    sf = load("scenario_frames")
    for name in (*DIVERGING, *HEALTHY, "f30_gpt2_qk_clip"):
        header, frames = sf.read_run(BENCH / "scenarios" / f"{name}.jsonl.gz")
        derived = sf.derive(frames, interval, history=True)
        sampled = [f for f in derived if f.get("heads")]
        pairs = list(zip(sampled, sampled[1:], strict=False))
        # the next sample comes the interval in effect after the last one (or sooner: the
        # step after an LR jump or a spike), and a run that lasts through every phase has a
        # gap of each phase's interval
        assert all(b["step"] - a["step"] <= interval(a["step"]) for a, b in pairs), name
        if frames[-1]["step"] >= 600:
            assert {interval(s) for s in range(600)} <= {
                b["step"] - a["step"] for a, b in pairs}, name
        # a flush or closing frame (no heads) says the interval of the sample before it
        last = None
        for f in derived:
            if f.get("heads"):
                last = f["step"]
            elif last is not None:
                assert f["scalars"]["hooks.sample_every"] == float(interval(last)), (name, f)
        assert all(f["scalars"].get("hooks.sample_every") in (None, float(interval(f["step"])))
                   for f in sampled), name
        row = ba.logitwatch_row(header, derived)
        paged = row["logitwatch"]["from50"]
        if name in DIVERGING:
            assert header["label"] == "diverging"
            assert paged is not None and paged <= header["divergence_step"], (name, row)
        elif name in HEALTHY:
            assert header["label"] == "healthy" and paged is None, (name, row)
        else:
            assert paged is not None and set(row["logitwatch_rules"]) <= {
                "q_bias_refuge", "k_bias_refuge"}, row
