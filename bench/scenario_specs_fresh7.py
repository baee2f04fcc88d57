"""An eighth held-out set, fixed before round seven (``split: "fresh7"``).

The seventh set (``scenario_specs_fresh6.FRESH6``) was replayed with round six's rules and
read: from then on it is tuning data too (``--split read6`` with every set before it). These
runs are the held-out set for every change made after that reading. Same mechanisms, seeds
70+, other settings: unclipped SGD, healthy with warm-up spikes and blowing up after step 50
(round six's open question), warm-ups ramping too far at other peaks and lengths, LM-head and
slow log-Z drift at other rates (the other open question, at wide intervals), fp16/bf16
growth, re-warms and jumps, bad data, outliers, blips, caps, QK-norm at high LR, QK-clip.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh7"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH7: list[Scenario] = [
    # == diverging ==============================================================
    S("f7_attn_growth_s70", "fp16_growth", D, demo(seed=70, lr=0.16), "fp16 scores, peak LR 0.16"),
    S("f7_attn_growth_l4", "fp16_growth", D, demo(seed=71, lr=0.14, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.14"),
    S("f7_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.55, seed=70, **BF16), "bf16 autocast, peak LR 0.55"),
    *[S(f"f7_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((70, 2.2, 700), (71, 3.0, 1100), (72, 1.5, 400))],
    *[S(f"f7_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=70, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 420, 240, 220.0, {}), ("gpt2", 360, 200, 300.0, BF16))],
    *[S(f"f7_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=70, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 460, 50.0, {}), ("postln", 410, 45.0, {}))],
    *[S(f"f7_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=70, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.5, 450), ("gemma2", 3.0, 500), ("llama", 4.0, 550),
                          ("postln", 3.5, 400))],
    *[S(f"f7_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=70, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gemma2", 420, 0.04, COS), ("gpt2", 400, 0.035, {}),
                                ("llama", 360, 0.04, COS))],
    S("f7_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((470, 40.0), (530, 1.0)), steps=850, seed=70),
      "QK-norm: the LR x40 for steps 470-530"),
    S("f7_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.65, seed=70), "QK-norm, peak LR 0.65"),
    # == healthy ================================================================
    *[S(f"f7_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gemma2", "cosine", 70, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 70, "RMSprop 1e-3", RMS),
          ("gpt2", "bf16", 71, "AdamW 3e-3, bf16", BF16),
          ("postln", "sgd", 70, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd", 71, "momentum SGD 0.25, no clipping", {"lr": 0.25, **SGD}),
          ("llama", "sgd", 72, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}))],
    S("f7_demo_plain", "plain", H, demo_qk(seed=70, steps=1000), "QK-norm"),
    *[S(f"f7_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=70, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "shuffle", 390, 35, {}),
                                   ("gemma2", "zeros", 360, 30, BF16),
                                   ("postln", "upper", 430, 40, {}))],
    *[S(f"f7_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=70), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 420), ("gemma2", "zeros", 450))],
    S("f7_gemma2_grad_spikes_clipped", "grad_blip", H,
      hf("gemma2", grad_spikes=((320, 1e3), (540, 1e4)), seed=70),
      "gemma2: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    *[S(f"f7_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((70, 0.14, 45.0), (71, 0.16, 28.0))],
    *[S(f"f7_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((70, 0.26), (71, 0.18))],
    *[S(f"f7_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(at, rate, at + n), seed=70, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps {at}-{at + n}, then stops")
      for fam, at, rate, n, kw in (("llama", 300, 0.0035, 220, COS),
                                   ("postln", 280, 0.0025, 300, {}))],
    S("f7_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.0e-2, qk_clip=7.0, steps=800, seed=70),
      "gpt2: QK-clip at tau 7 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f7_gpt2_early_transient", "early_transient", H, hf("gpt2", lr=0.014, warmup=1, seed=70),
      "gpt2: LR 0.014 from step 0, no warm-up"),
    S("f7_gemma2_late_clipping", "late_clipping", H, hf("gemma2", max_norm=0.25, seed=70),
      "gemma2: clip at 0.25: clipped on most steps late in training"),
    S("f7_postln_lr_bump", "lr_bump", H, hf("postln", lr_steps=((400, 10.0), (440, 1.0)), seed=70),
      "post-LN: LR x10 for steps 400-440, then back"),
    S("f7_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.09, seed=70),
      "no QK-norm, fp32 scores, peak LR 0.09"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
