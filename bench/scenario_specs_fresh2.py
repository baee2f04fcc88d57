"""A third held-out set, fixed before the third round of rule changes (``split: "fresh2"``).

The second held-out set (``scenario_specs_fresh.FRESH``) was replayed after round two and
its misses (first warm-ups ramping the LR too far under QK-norm, an SGD blow-up paged two
steps late, zero-byte batches that broke a GPT-2 for good) were studied: from then on it
is tuning data too. These runs are the held-out set for every change made after that
reading: the same mechanisms with new seeds (20+) and new settings (other peak LRs, ramp
lengths, jump steps and factors, bad-data lengths, clip thresholds, cap values, a 4-layer
demo model). This file was committed before any rule was changed in round three, and none
of its runs is used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, G, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH2: list[Scenario] = [
    # == diverging =================================================================================
    *[S(f"f2_attn_growth_s{s}", "fp16_growth", D, demo(seed=s, **kw),
        f"fp16 scores, no QK-norm, peak LR {kw.get('lr', 0.2):g}")
      for s, kw in ((20, {}), (21, {"lr": 0.25}))],
    S("f2_attn_growth_l4", "fp16_growth", D, demo(seed=20, lr=0.15, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.15"),
    S("f2_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.5, seed=20),
      "fp32 scores, no QK-norm, peak LR 0.5"),
    S("f2_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.35, seed=21, **BF16), "bf16 autocast, peak LR 0.35"),
    *[S(f"f2_lr_ramp_s{s}", "lr_rewarm", D,
        demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((20, 1.2, 1000), (21, 1.8, 800), (22, 2.5, 1000))],
    S("f2_llama_rewarm", "lr_rewarm", D, hf("llama", rewarm=(450, 250, 250.0), steps=850,
                                            seed=20),
      "llama: a second warm-up to x250 over 250 steps from step 450"),
    S("f2_postln_rewarm", "lr_rewarm", D, hf("postln", rewarm=(400, 200, 300.0), steps=800,
                                             seed=20),
      "post-LN: a second warm-up to x300 over 200 steps from step 400"),
    S("f2_gpt2_rewarm_bf16", "lr_rewarm", D,
      hf("gpt2", rewarm=(350, 300, 250.0), steps=800, seed=20, **BF16),
      "gpt2 bf16: a second warm-up to x250 over 300 steps from step 350"),
    *[S(f"f2_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=20, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gpt2", 420, 60.0, {}), ("llama", 380, 40.0, {}),
                             ("postln", 500, 50.0, BF16), ("gemma2", 450, 50.0, RMS))],
    S("f2_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((520, 60.0), (560, 1.0)), steps=850, seed=20),
      "QK-norm: the LR x60 for steps 520-560"),
    *[S(f"f2_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=20, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("llama", 4.0, 300), ("postln", 3.0, 500), ("gpt2", 2.5, 300),
                          ("gemma2", 3.0, 400))],
    *[S(f"f2_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=20, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("postln", 320, 0.03, {}), ("gpt2", 400, 0.035, COS))],
    S("f2_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.6, seed=20),
      "QK-norm, peak LR 0.6"),
    # == degraded (meant) ===========================================================================
    S("f2_fp32_growth", "wide_growth_slow", G, demo(attn_dtype="float32", lr=0.25, seed=20),
      "fp32 scores, no QK-norm, peak LR 0.25"),
    S("f2_gemma2_wide_lr02", "wide_growth_slow", G,
      hf("gemma2", init_std=0.1, lr=0.2, warmup=500, softcap=None, steps=900, seed=20),
      "gemma2 without soft-cap: init std 0.1, peak LR 0.2"),
    # == healthy ====================================================================================
    *[S(f"f2_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "adamw", 20, "AdamW 3e-3", {}),
          ("gpt2", "cosine", 20, "AdamW 3e-3, cosine decay", COS),
          ("postln", "adam", 21, "Adam 3e-3, L2 decay 0.01", {"optimizer": "adam",
                                                            "weight_decay": 0.01}),
          ("gemma2", "bf16", 20, "AdamW 3e-3, bf16", BF16),
          ("gpt2", "sgd", 20, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("postln", "rmsprop", 20, "RMSprop 1e-3", RMS),
          ("llama", "eager_cos", 21, "AdamW 5e-3, eager, cosine", {"attn_impl": "eager",
                                                                   "lr": 5e-3, **COS}))],
    S("f2_demo_plain", "plain", H, demo_qk(seed=20, steps=1000), "QK-norm, peak LR 0.2"),
    S("f2_demo_plain_l4", "plain", H, demo_qk(seed=21, lr=0.1, steps=900, **L4),
      "4 layers, QK-norm, peak LR 0.1"),
    *[S(f"f2_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=20, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gpt2", "random", 380, 35, {}), ("llama", "zeros", 400, 25, {}),
                                   ("postln", "upper", 350, 40, {}),
                                   ("gemma2", "shuffle", 420, 30, BF16))],
    *[S(f"f2_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=20, **kw),
        f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at, kw in (("llama", "random", 420, {}), ("gemma2", "zeros", 350, {}))],
    S("f2_demo_outlier_zeros", "outlier_batch", H,
      demo_qk(lr=0.02, warmup=100, bad_data=((450, 451, "zeros"),), steps=850, seed=20),
      "QK-norm: one batch of zero bytes at step 450"),
    *[S(f"f2_{fam}_grad_blips", "grad_blip", H,
        hf(fam, grad_blips=tuple((at, f) for at, f in zip(range(220, 660, 40),
                                                          (0.93, 0.99, 0.9, 0.96, 0.98, 0.92,
                                                           0.95, 0.97, 0.91, 0.99, 0.94),
                                                          strict=False)),
           seed=20), f"{fam}: the gradient norm pushed to 0.9-0.99 x max_norm every 40 steps")
      for fam in ("postln", "gemma2")],
    S("f2_llama_grad_spikes_clipped", "grad_blip", H,
      hf("llama", grad_spikes=((300, 1e3), (450, 1e4), (600, 1e2)), seed=20),
      "llama: one-step gradient spikes x1e3, x1e4, x1e2, clipped at 1.0"),
    *[S(f"f2_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s, **kw),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap, kw in ((20, 0.12, 20.0, {}), (21, 0.2, 40.0, {}))],
    *[S(f"f2_qknorm_lr{int(lr * 100):02d}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((20, 0.3), (21, 0.25))],
    *[S(f"f2_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(250, rate, 550), seed=20),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps 250-550, then stops")
      for fam, rate in (("postln", 0.002), ("gpt2", 0.003))],
    S("f2_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.2e-2, qk_clip=4.0, steps=800, seed=20),
      "gpt2: QK-clip at tau 4 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    *[S(f"f2_{fam}_early_transient", "early_transient", H,
        hf(fam, lr=lr, warmup=1, seed=20, **kw), f"{fam}: LR {lr:g} from step 0, no warm-up")
      for fam, lr, kw in (("gpt2", 0.02, BF16), ("gemma2", 0.02, {}), ("llama", 0.03, {}))],
    *[S(f"f2_{fam}_late_clipping", "late_clipping", H, hf(fam, max_norm=mn, seed=20),
        f"{fam}: clip at {mn:g}: clipped on most steps late in training")
      for fam, mn in (("postln", 0.35), ("gemma2", 0.3))],
    S("f2_llama_lr_bump", "lr_bump", H, hf("llama", lr_steps=((380, 8.0), (420, 1.0)), seed=20),
      "llama: LR x8 for steps 380-420, then back"),
    S("f2_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.12, seed=20),
      "no QK-norm, fp32 scores, peak LR 0.12"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
