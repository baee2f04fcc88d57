"""A twenty-third held-out set, fixed after the twenty-second was replayed (``split:
"fresh22"``).

The twenty-second set (``fresh21``) was replayed once with round eighteen's rules and the
hooks' new delivery; it is read now: every set before this one is tuning data (``--split
read21``). These runs are the held-out set for the next change: the earlier sets' shapes at
seeds 220+ and other settings (other learning rates, families and garbage-stretch lengths),
single garbage batches and short garbage stretches under unclipped SGD (some heal, some
never come back: labelled as seen), QK-norm LR ramps, garbage batches under unclipped
adaptive optimisers, and healthy runs under unclipped adaptive optimisers at higher learning
rates. Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py
--list | awk '$3=="fresh22"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH22: list[Scenario] = [
    # == diverging ==============================================================
    S("f22_attn_growth_s220", "fp16_growth", D, demo(seed=220, lr=0.16),
      "fp16 scores, peak LR 0.14"),
    S("f22_attn_growth_l4", "fp16_growth", D, demo(seed=221, lr=0.19, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.18"),
    S("f22_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.6, seed=220),
      "fp32 scores, peak LR 0.6"),
    *[S(f"f22_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((220, 3.3, 690), (221, 2.6, 700), (222, 3.0, 750), (223, 3.6, 650))],
    *[S(f"f22_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=220, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 410, 220, 250.0, {}), ("llama", 400, 230, 240.0, BF16))],
    *[S(f"f22_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=220, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 420, 50.0, {}), ("postln", 400, 46.0, BF16))],
    *[S(f"f22_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=220, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("llama", 3.3, 500), ("gpt2", 3.2, 530), ("postln", 3.0, 520))],
    *[S(f"f22_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=220, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("llama", 400, 0.031, {}), ("postln", 410, 0.034, COS))],
    S("f22_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((440, 40.0), (500, 1.0)), steps=850, seed=220),
      "QK-norm: the LR x40 for steps 440-500"),
    S("f22_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.8, seed=220),
      "QK-norm, peak LR 0.8"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f22_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 220, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 220, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 220, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 220, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 221, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 221, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 220, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 221, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 220, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 221, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f22_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=220, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("postln", "random", 410, 0.25), ("gpt2", "random", 400, 0.35),
                                ("llama", "upper", 420, 0.3), ("gemma2", "zeros", 390, 0.3),
                                ("postln", "upper", 380, 0.2), ("gpt2", "zeros", 430, 0.3),
                                ("llama", "random", 400, 0.25), ("gemma2", "random", 370, 0.3))],
    *[S(f"f22_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=220, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 400), ("postln", "random", 410),
                            ("llama", "zeros", 390), ("gpt2", "upper", 420))],
    *[S(f"f22_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=220, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "upper", 410), ("gpt2", "random", 400))],
    *[S(f"f22_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=220, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "upper", 400), ("gpt2", "random", 420))],
    *[S(f"f22_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=221, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 410, 12), ("postln", 400, 6), ("llama", 420, 3), ("gemma2", 400, 9))],
    S("f22_demo_plain", "plain", H, demo_qk(seed=220, steps=1000), "QK-norm"),
    *[S(f"f22_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=220, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 410, 30, {}),
                                   ("postln", "zeros", 400, 35, BF16))],
    *[S(f"f22_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=220), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 420), ("gpt2", "upper", 400))],
    S("f22_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((400, 1e4), (550, 1e3)), seed=220),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f22_gemma2_softcap_s220", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.16, warmup=270, softcap=26.0, steps=800, seed=220),
      "gemma2: init std 0.1, peak LR 0.16, scores capped at 26"),
    S("f22_qknorm_lr22_s220", "qknorm_high_lr_ok", H, demo_qk(lr=0.22, seed=220, steps=1000),
      "QK-norm, peak LR 0.22"),
    S("f22_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(310, 0.0036, 500), seed=220),
      "gemma2: the LM head grows 0.36%/step for steps 310-500, then stops"),
    S("f22_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.4e-2, qk_clip=5.5, steps=800, seed=220),
      "gpt2: QK-clip at tau 5.5 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f22_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=220), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f22_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=220),
      "llama: clip at 0.25: clipped on most steps late in training"),
    S("f22_llama_lr_bump", "lr_bump", H, hf("llama", lr_steps=((410, 4.5), (470, 1.0)), seed=220),
      "llama: LR x4.5 for steps 410-470, then back"),
    S("f22_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.09, seed=220, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.09"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
