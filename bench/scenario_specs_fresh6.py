"""A seventh held-out set, fixed before round seven (``split: "fresh6"``).

The sixth set (``scenario_specs_fresh6.FRESH6``) was replayed after round six and read:
from then on it is tuning data too. These runs are the held-out set for every change made
after that reading. The sixth set's shapes with seeds 60+ (new random draws of every run:
warm-ups ramping too far, SGD blow-ups diverging after step 50, fp32/bf16 growth, LM-head and
slow log-Z drift, unclipped healthy SGD, bad data, outliers, blips, caps, QK-norm at high LR,
QK-clip). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh6"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH6: list[Scenario] = [
    # == diverging ==============================================================
    S("f6_attn_growth_s60", "fp16_growth", D, demo(seed=60, lr=0.2), "fp16 scores, peak LR 0.2"),
    S("f6_attn_growth_l4", "fp16_growth", D, demo(seed=61, lr=0.13, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.13"),
    S("f6_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.4, seed=60, **BF16), "bf16 autocast, peak LR 0.4"),
    *[S(f"f6_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((60, 2.5, 1200), (61, 1.8, 500), (62, 3.5, 900))],
    *[S(f"f6_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=60, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("llama", 400, 220, 250.0, {}), ("gemma2", 380, 260, 200.0, BF16))],
    *[S(f"f6_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=60, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gpt2", 440, 40.0, {}), ("llama", 400, 55.0, BF16))],
    *[S(f"f6_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=60, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.0, 400), ("gemma2", 4.0, 400), ("llama", 3.0, 600),
                          ("postln", 3.0, 500))],
    *[S(f"f6_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=60, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 380, 0.045, COS), ("llama", 440, 0.03, {}),
                                ("postln", 420, 0.05, COS))],
    S("f6_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((500, 45.0), (560, 1.0)), steps=850, seed=60),
      "QK-norm: the LR x45 for steps 500-560"),
    S("f6_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.5, seed=60), "QK-norm, peak LR 0.5"),
    # == healthy ================================================================
    *[S(f"f6_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("postln", "cosine", 60, "AdamW 3e-3, cosine decay", COS),
          ("gpt2", "rmsprop", 60, "RMSprop 1e-3", RMS),
          ("llama", "bf16", 61, "AdamW 3e-3, bf16", BF16),
          ("gemma2", "sgd", 60, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("llama", "sgd", 61, "momentum SGD 0.25, no clipping", {"lr": 0.25, **SGD}),
          ("gpt2", "sgd", 62, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}))],
    S("f6_demo_plain", "plain", H, demo_qk(seed=60, steps=1000, **COS), "QK-norm, cosine"),
    *[S(f"f6_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=60, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gemma2", "zeros", 420, 35, {}),
                                   ("postln", "shuffle", 380, 30, {}),
                                   ("gpt2", "random", 400, 40, BF16))],
    *[S(f"f6_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=60), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "zeros", 430), ("llama", "random", 400))],
    S("f6_llama_grad_spikes_clipped", "grad_blip", H,
      hf("llama", grad_spikes=((260, 1e4), (500, 1e3)), seed=60),
      "llama: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    *[S(f"f6_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((60, 0.18, 35.0), (61, 0.12, 50.0))],
    *[S(f"f6_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((60, 0.28), (61, 0.22))],
    *[S(f"f6_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(at, rate, at + n), seed=60, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps {at}-{at + n}, then stops")
      for fam, at, rate, n, kw in (("gemma2", 280, 0.003, 280, {}),
                                   ("gpt2", 320, 0.0035, 200, COS))],
    S("f6_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.2e-2, qk_clip=6.0, steps=800, seed=60),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f6_llama_early_transient", "early_transient", H, hf("llama", lr=0.012, warmup=1, seed=60),
      "llama: LR 0.012 from step 0, no warm-up"),
    S("f6_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.3, seed=60),
      "post-LN: clip at 0.3: clipped on most steps late in training"),
    S("f6_gpt2_lr_bump", "lr_bump", H, hf("gpt2", lr_steps=((420, 9.0), (460, 1.0)), seed=60),
      "gpt2: LR x9 for steps 420-460, then back"),
    S("f6_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.07, seed=60),
      "no QK-norm, fp32 scores, peak LR 0.07"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
