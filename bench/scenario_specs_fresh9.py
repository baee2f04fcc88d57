"""A tenth held-out set, fixed before round nine (``split: "fresh9"``).

The ninth set (``scenario_specs_fresh8.FRESH8``) was replayed once with round eight's rules
and read: from then on it is tuning data too (``--split read8`` with every set before it).
These runs are the held-out set for every change made after that reading. The ninth's
shapes at seeds 90+ and other settings, with more unclipped SGD runs meeting one garbage
batch (the ninth set's unexpected pages) and unclipped SGD blowing up. Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh9"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH9: list[Scenario] = [
    # == diverging ==============================================================
    S("f9_attn_growth_s90", "fp16_growth", D, demo(seed=90, lr=0.17), "fp16 scores, peak LR 0.17"),
    S("f9_attn_growth_l4", "fp16_growth", D, demo(seed=91, lr=0.13, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.13"),
    S("f9_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.5, seed=90, **BF16), "bf16 autocast, peak LR 0.5"),
    *[S(f"f9_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((90, 2.8, 900), (91, 1.8, 500), (92, 3.2, 1000))],
    *[S(f"f9_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=90, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 400, 220, 250.0, {}), ("gpt2", 380, 180, 280.0, BF16))],
    *[S(f"f9_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=90, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 440, 60.0, {}), ("postln", 420, 40.0, {}))],
    *[S(f"f9_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=90, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.5, 500), ("gemma2", 3.0, 450), ("llama", 4.0, 650),
                          ("postln", 3.0, 400))],
    *[S(f"f9_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=90, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gemma2", 400, 0.035, COS), ("gpt2", 420, 0.04, {}),
                                ("llama", 380, 0.03, COS))],
    S("f9_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((480, 35.0), (540, 1.0)), steps=850, seed=90),
      "QK-norm: the LR x35 for steps 480-540"),
    S("f9_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.6, seed=90), "QK-norm, peak LR 0.6"),
    # == healthy ================================================================
    *[S(f"f9_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gemma2", "cosine", 90, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 90, "RMSprop 1e-3", RMS),
          ("gpt2", "bf16", 91, "AdamW 3e-3, bf16", BF16),
          ("postln", "sgd", 90, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("gemma2", "sgd", 91, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("llama", "sgd", 92, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}))],
    *[S(f"f9_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=90, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "upper", 380, 0.3), ("gpt2", "random", 330, 0.3),
                                ("postln", "zeros", 400, 0.3), ("gemma2", "random", 360, 0.25))],
    S("f9_gemma2_sgd_bad_data", "bad_data", H,
      hf("gemma2", bad_data=((400, 425, "random"),), lr=0.25, seed=91, **SGD),
      "gemma2: momentum SGD 0.25, no clipping, 25 steps of 'random' batches from step 400"),
    S("f9_demo_plain", "plain", H, demo_qk(seed=90, steps=1000), "QK-norm"),
    *[S(f"f9_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=90, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "zeros", 400, 30, {}),
                                   ("gemma2", "shuffle", 370, 35, BF16),
                                   ("postln", "random", 420, 40, {}))],
    *[S(f"f9_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=90), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "zeros", 440), ("gemma2", "random", 430))],
    S("f9_gemma2_grad_spikes_clipped", "grad_blip", H,
      hf("gemma2", grad_spikes=((340, 1e4), (520, 1e3)), seed=90),
      "gemma2: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    *[S(f"f9_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((90, 0.15, 40.0), (91, 0.13, 30.0))],
    *[S(f"f9_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((90, 0.24), (91, 0.2))],
    *[S(f"f9_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(at, rate, at + n), seed=90, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps {at}-{at + n}, then stops")
      for fam, at, rate, n, kw in (("llama", 320, 0.003, 250, COS),
                                   ("postln", 300, 0.003, 260, {}))],
    S("f9_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.2e-2, qk_clip=6.0, steps=800, seed=90),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f9_gpt2_early_transient", "early_transient", H, hf("gpt2", lr=0.012, warmup=1, seed=90),
      "gpt2: LR 0.012 from step 0, no warm-up"),
    S("f9_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=90),
      "llama: clip at 0.25: clipped on most steps late in training"),
    S("f9_postln_lr_bump", "lr_bump", H, hf("postln", lr_steps=((380, 8.0), (430, 1.0)), seed=90),
      "post-LN: LR x8 for steps 380-430, then back"),
    S("f9_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.1, seed=90),
      "no QK-norm, fp32 scores, peak LR 0.1"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
