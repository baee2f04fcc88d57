"""A twelfth held-out set, fixed after the eleventh was replayed with round nine's rules
(``split: "fresh11"``).

The tenth and eleventh sets are read (``--split read10``: every set before this one). These
runs are the held-out set for the next change: the earlier sets' shapes at seeds 110+ and
other settings, with unclipped SGD runs meeting one garbage batch (some survive it, some may
not) beside unclipped SGD blowing up, and bad-data stretches under unclipped SGD. Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh11"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH11: list[Scenario] = [
    # == diverging ==============================================================
    S("f11_attn_growth_s110", "fp16_growth", D, demo(seed=110, lr=0.155),
      "fp16 scores, peak LR 0.155"),
    S("f11_attn_growth_l4", "fp16_growth", D, demo(seed=111, lr=0.15, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.15"),
    S("f11_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.55, seed=110, **BF16), "bf16 autocast, peak LR 0.55"),
    *[S(f"f11_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((110, 2.6, 850), (111, 2.2, 650), (112, 3.0, 950))],
    *[S(f"f11_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=110, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gpt2", 410, 210, 270.0, {}), ("postln", 380, 190, 240.0, BF16))],
    *[S(f"f11_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=110, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 420, 55.0, {}), ("postln", 440, 50.0, {}))],
    *[S(f"f11_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=110, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.4, 480), ("gemma2", 3.1, 460), ("llama", 3.6, 620),
                          ("postln", 3.2, 420))],
    *[S(f"f11_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=110, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("llama", 400, 0.035, {}), ("postln", 420, 0.03, COS),
                                ("gpt2", 410, 0.04, {}))],
    S("f11_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((470, 38.0), (530, 1.0)), steps=850, seed=110),
      "QK-norm: the LR x38 for steps 470-530"),
    S("f11_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.62, seed=110),
      "QK-norm, peak LR 0.62"),
    # == healthy ================================================================
    *[S(f"f11_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("postln", "cosine", 110, "AdamW 3e-3, cosine decay", COS),
          ("gemma2", "rmsprop", 110, "RMSprop 1e-3", RMS),
          ("llama", "bf16", 111, "AdamW 3e-3, bf16", BF16),
          ("gemma2", "sgd", 110, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gpt2", "sgd", 111, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("llama", "sgd", 112, "momentum SGD 0.25, no clipping", {"lr": 0.25, **SGD}))],
    *[S(f"f11_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=110, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "upper", 360, 0.3), ("gemma2", "random", 420, 0.25),
                                ("postln", "zeros", 380, 0.25), ("gpt2", "random", 340, 0.3),
                                ("llama", "shuffle", 440, 0.3), ("gemma2", "zeros", 400, 0.3))],
    *[S(f"f11_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.3, seed=111, **SGD),
        f"{fam}: momentum SGD 0.3, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 390, 15), ("postln", 370, 25))],
    S("f11_demo_plain", "plain", H, demo_qk(seed=110, steps=1000), "QK-norm"),
    *[S(f"f11_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=110, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 390, 30, {}),
                                   ("gpt2", "upper", 400, 35, BF16),
                                   ("postln", "shuffle", 370, 40, {}))],
    *[S(f"f11_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=110), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "zeros", 430), ("gpt2", "random", 460))],
    S("f11_llama_grad_spikes_clipped", "grad_blip", H,
      hf("llama", grad_spikes=((350, 1e3), (510, 1e4)), seed=110),
      "llama: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    *[S(f"f11_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((110, 0.15, 30.0), (111, 0.12, 40.0))],
    *[S(f"f11_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((110, 0.23), (111, 0.19))],
    *[S(f"f11_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(at, rate, at + n), seed=110, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps {at}-{at + n}, then stops")
      for fam, at, rate, n, kw in (("postln", 320, 0.003, 250, COS),
                                   ("llama", 300, 0.003, 260, {}))],
    S("f11_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=110),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f11_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.012, warmup=1, seed=110), "gemma2: LR 0.012 from step 0, no warm-up"),
    S("f11_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.25, seed=110),
      "post-LN: clip at 0.25: clipped on most steps late in training"),
    S("f11_llama_lr_bump", "lr_bump", H, hf("llama", lr_steps=((390, 8.0), (440, 1.0)), seed=110),
      "llama: LR x8 for steps 390-440, then back"),
    S("f11_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.11, seed=110),
      "no QK-norm, fp32 scores, peak LR 0.11"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
