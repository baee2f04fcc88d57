"""A ninth held-out set, fixed before round eight (``split: "fresh8"``).

The eighth set (``scenario_specs_fresh7.FRESH7``) was replayed once with round seven's rules
and read: from then on it is tuning data too (``--split read7`` with every set before it).
These runs are the held-out set for every change made after that reading. Same mechanisms,
seeds 80+, other settings; more of round seven's hard negatives: unclipped SGD runs that
meet a bad batch or a lone outlier (one step of gradient and loss spiking together, then
back), besides unclipped SGD blowing up, warm-ups ramping too far, LM-head and slow log-Z
drift, fp16/bf16 growth, re-warms and jumps, bad data, blips, caps, QK-norm at high LR,
QK-clip. Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py
--list | awk '$3=="fresh8"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH8: list[Scenario] = [
    # == diverging ==============================================================
    S("f8_attn_growth_s80", "fp16_growth", D, demo(seed=80, lr=0.15), "fp16 scores, peak LR 0.15"),
    S("f8_attn_growth_l4", "fp16_growth", D, demo(seed=81, lr=0.13, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.13"),
    S("f8_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.5, seed=80, **BF16), "bf16 autocast, peak LR 0.5"),
    *[S(f"f8_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((80, 2.5, 800), (81, 2.0, 600), (82, 4.0, 1200))],
    *[S(f"f8_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=80, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 400, 220, 250.0, {}), ("gpt2", 380, 180, 280.0, BF16))],
    *[S(f"f8_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=80, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 440, 60.0, {}), ("postln", 420, 40.0, {}))],
    *[S(f"f8_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=80, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.0, 420), ("gemma2", 3.5, 500), ("llama", 3.5, 600),
                          ("postln", 4.0, 450))],
    *[S(f"f8_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=80, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gemma2", 400, 0.035, COS), ("gpt2", 420, 0.04, {}),
                                ("llama", 380, 0.03, COS))],
    S("f8_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((480, 35.0), (540, 1.0)), steps=850, seed=80),
      "QK-norm: the LR x35 for steps 480-540"),
    S("f8_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.6, seed=80), "QK-norm, peak LR 0.6"),
    # == healthy ================================================================
    *[S(f"f8_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gemma2", "cosine", 80, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 80, "RMSprop 1e-3", RMS),
          ("gpt2", "bf16", 81, "AdamW 3e-3, bf16", BF16),
          ("postln", "sgd", 80, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("gemma2", "sgd", 81, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("llama", "sgd", 82, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}))],
    *[S(f"f8_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=80, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "random", 350, 0.3), ("gpt2", "upper", 300, 0.3),
                                ("postln", "random", 420, 0.3))],
    S("f8_gemma2_sgd_bad_data", "bad_data", H,
      hf("gemma2", bad_data=((380, 410, "shuffle"),), lr=0.25, seed=81, **SGD),
      "gemma2: momentum SGD 0.25, no clipping, 30 steps of 'shuffle' batches from step 380"),
    S("f8_demo_plain", "plain", H, demo_qk(seed=80, steps=1000), "QK-norm"),
    *[S(f"f8_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=80, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "zeros", 400, 30, {}),
                                   ("gemma2", "shuffle", 370, 35, BF16),
                                   ("postln", "random", 420, 40, {}))],
    *[S(f"f8_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=80), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "zeros", 440), ("gemma2", "random", 430))],
    S("f8_gemma2_grad_spikes_clipped", "grad_blip", H,
      hf("gemma2", grad_spikes=((340, 1e4), (520, 1e3)), seed=80),
      "gemma2: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    *[S(f"f8_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((80, 0.15, 40.0), (81, 0.13, 30.0))],
    *[S(f"f8_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((80, 0.24), (81, 0.2))],
    *[S(f"f8_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(at, rate, at + n), seed=80, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps {at}-{at + n}, then stops")
      for fam, at, rate, n, kw in (("llama", 320, 0.003, 250, COS),
                                   ("postln", 300, 0.003, 260, {}))],
    S("f8_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.2e-2, qk_clip=6.0, steps=800, seed=80),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f8_gpt2_early_transient", "early_transient", H, hf("gpt2", lr=0.012, warmup=1, seed=80),
      "gpt2: LR 0.012 from step 0, no warm-up"),
    S("f8_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=80),
      "llama: clip at 0.25: clipped on most steps late in training"),
    S("f8_postln_lr_bump", "lr_bump", H, hf("postln", lr_steps=((380, 8.0), (430, 1.0)), seed=80),
      "post-LN: LR x8 for steps 380-430, then back"),
    S("f8_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.1, seed=80),
      "no QK-norm, fp32 scores, peak LR 0.1"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
