"""A fifth held-out set, fixed before round five (``split: "fresh4"``).

The fourth set (``scenario_specs_fresh3.FRESH3``) was replayed after round four and read:
from then on it is tuning data too. These runs are the held-out set for every change made
after that reading. Same mechanisms, seeds 40+, new settings: SGD blow-ups with short and
long warm-ups (a miss of round four: paged a step after divergence), warm-ups ramping to
other peaks (the other miss: bumps of loss that each recover, then divergence), LM-head
drift at other rates and starts, slow log-Z drift at other rates (healthy; paged at
interval 50 in round four), bad data of other kinds and lengths on other families, QK-norm
healthy at other peaks, soft-caps, QK-clip, LR bumps, late clipping and early transients.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh4"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH4: list[Scenario] = [
    # == diverging ==============================================================
    S("f4_attn_growth_s40", "fp16_growth", D, demo(seed=40, lr=0.18),
      "fp16 scores, peak LR 0.18"),
    S("f4_attn_growth_l4", "fp16_growth", D, demo(seed=41, lr=0.15, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.15"),
    S("f4_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.5, seed=40, **BF16), "bf16 autocast, peak LR 0.5"),
    *[S(f"f4_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((40, 2.0, 800), (41, 4.0, 1000), (42, 1.6, 600))],
    *[S(f"f4_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=40, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gpt2", 400, 250, 250.0, {}),
                                ("postln", 360, 200, 150.0, BF16))],
    *[S(f"f4_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=40, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 410, 40.0, {}), ("postln", 450, 60.0, BF16))],
    *[S(f"f4_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=40, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 4.0, 150), ("gemma2", 3.0, 250), ("llama", 4.0, 400),
                          ("postln", 5.0, 200))],
    *[S(f"f4_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=40, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 420, 0.03, {}), ("llama", 380, 0.05, COS),
                                ("postln", 400, 0.04, {}), ("gemma2", 360, 0.035, COS))],
    S("f4_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((450, 50.0), (500, 1.0)), steps=850, seed=40),
      "QK-norm: the LR x50 for steps 450-500"),
    S("f4_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.6, seed=40),
      "QK-norm, peak LR 0.6"),
    # == healthy ================================================================
    *[S(f"f4_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw),
        f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 40, "AdamW 3e-3, cosine decay", COS),
          ("gemma2", "rmsprop", 40, "RMSprop 1e-3", RMS),
          ("postln", "bf16", 41, "AdamW 3e-3, bf16", BF16),
          ("gpt2", "sgd", 40, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}))],
    S("f4_demo_plain", "plain", H, demo_qk(seed=40, steps=1000), "QK-norm"),
    *[S(f"f4_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=40, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gpt2", "zeros", 380, 30, {}),
                                   ("llama", "zeros", 410, 45, {}),
                                   ("postln", "random", 350, 40, {}),
                                   ("gemma2", "upper", 430, 30, BF16))],
    *[S(f"f4_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=40),
        f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "zeros", 460), ("gemma2", "random", 390))],
    S("f4_postln_grad_spikes_clipped", "grad_blip", H,
      hf("postln", grad_spikes=((300, 1e4), (480, 1e3)), seed=40),
      "post-LN: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    *[S(f"f4_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((40, 0.12, 40.0), (41, 0.2, 30.0))],
    *[S(f"f4_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((40, 0.25), (41, 0.15))],
    *[S(f"f4_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(at, rate, at + n), seed=40, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps {at}-{at + n}, then stops")
      for fam, at, rate, n, kw in (("gpt2", 300, 0.0025, 300, {}),
                                   ("postln", 250, 0.003, 250, COS),
                                   ("llama", 350, 0.002, 300, {}))],
    S("f4_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.5e-2, qk_clip=8.0, steps=800, seed=40),
      "gpt2: QK-clip at tau 8 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f4_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.012, warmup=1, seed=40), "gemma2: LR 0.012 from step 0, no warm-up"),
    S("f4_gpt2_late_clipping", "late_clipping", H, hf("gpt2", max_norm=0.3, seed=40),
      "gpt2: clip at 0.3: clipped on most steps late in training"),
    S("f4_llama_lr_bump", "lr_bump", H, hf("llama", lr_steps=((380, 8.0), (420, 1.0)), seed=40),
      "llama: LR x8 for steps 380-420, then back"),
    S("f4_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.06, seed=40),
      "no QK-norm, fp32 scores, peak LR 0.06"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
