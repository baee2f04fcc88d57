"""A twenty-second held-out set, fixed after the twenty-first was replayed (``split:
"fresh21"``).

The twenty-first set (``fresh20``) was replayed once with round seventeen's rules and the
hooks' new delivery (the spike watch's burst, the history flush); it is read now: every set
before this one is tuning data (``--split read20``). These runs are the held-out set for the
next change: the earlier sets' shapes at seeds 210+ and other settings
(other learning rates, families and garbage-stretch lengths), again with single garbage
batches and short garbage stretches under unclipped SGD (some runs heal, some never come
back: labelled as seen), QK-norm LR ramps, garbage batches under unclipped adaptive
optimisers, and healthy runs under unclipped adaptive optimisers at higher learning rates
(early gradient spikes). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh21"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH21: list[Scenario] = [
    # == diverging ==============================================================
    S("f21_attn_growth_s210", "fp16_growth", D, demo(seed=210, lr=0.15),
      "fp16 scores, peak LR 0.14"),
    S("f21_attn_growth_l4", "fp16_growth", D, demo(seed=211, lr=0.17, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.18"),
    S("f21_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.7, seed=210),
      "fp32 scores, peak LR 0.7"),
    *[S(f"f21_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((210, 3.2, 700), (211, 2.8, 660), (212, 3.5, 760), (213, 2.9, 740))],
    *[S(f"f21_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=210, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gemma2", 420, 210, 260.0, {}), ("gpt2", 390, 240, 230.0, BF16))],
    *[S(f"f21_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=210, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("llama", 410, 48.0, {}), ("gpt2", 430, 56.0, BF16))],
    *[S(f"f21_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=210, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.0, 520), ("postln", 3.4, 500), ("gemma2", 3.1, 540))],
    *[S(f"f21_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=210, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gemma2", 410, 0.032, {}), ("gpt2", 400, 0.031, COS))],
    S("f21_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((450, 46.0), (510, 1.0)), steps=850, seed=210),
      "QK-norm: the LR x46 for steps 450-510"),
    S("f21_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.9, seed=210),
      "QK-norm, peak LR 0.9"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f21_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gemma2", "cosine", 210, "AdamW 3e-3, cosine decay", COS),
          ("gpt2", "rmsprop", 210, "RMSprop 1e-3", RMS),
          ("llama", "adam_unclipped", 210, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("gpt2", "rms_unclipped_hi", 210, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("postln", "rms_unclipped_hi", 211, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("llama", "adam_unclipped_hi", 211, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gemma2", "sgd", 210, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("postln", "sgd", 211, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("llama", "sgd_warm", 210, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("gpt2", "sgd_warm", 211, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f21_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=210, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("gemma2", "random", 400, 0.3), ("llama", "random", 420, 0.35),
                                ("gpt2", "upper", 390, 0.3), ("postln", "zeros", 410, 0.3),
                                ("gemma2", "upper", 430, 0.3), ("llama", "zeros", 380, 0.3),
                                ("gpt2", "random", 370, 0.25), ("postln", "random", 400, 0.2))],
    *[S(f"f21_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=210, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 410), ("gpt2", "zeros", 400),
                            ("gemma2", "upper", 420), ("gpt2", "random", 380))],
    *[S(f"f21_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=210, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 400), ("gpt2", "upper", 420))],
    *[S(f"f21_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=210, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "upper", 410), ("gemma2", "random", 390))],
    *[S(f"f21_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=211, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("llama", 400, 8), ("postln", 410, 4), ("gemma2", 390, 14), ("gpt2", 420, 3))],
    S("f21_demo_plain", "plain", H, demo_qk(seed=210, steps=1000), "QK-norm"),
    *[S(f"f21_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=210, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gemma2", "random", 400, 35, {}),
                                   ("gpt2", "zeros", 410, 30, BF16))],
    *[S(f"f21_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=210), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "upper", 410), ("llama", "random", 430))],
    S("f21_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((410, 1e4), (540, 1e3)), seed=210),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f21_gemma2_softcap_s210", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.15, warmup=260, softcap=28.0, steps=800, seed=210),
      "gemma2: init std 0.1, peak LR 0.15, scores capped at 28"),
    S("f21_qknorm_lr26_s210", "qknorm_high_lr_ok", H, demo_qk(lr=0.26, seed=210, steps=1000),
      "QK-norm, peak LR 0.26"),
    S("f21_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(320, 0.0033, 540), seed=210),
      "gemma2: the LM head grows 0.33%/step for steps 320-540, then stops"),
    S("f21_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.2e-2, qk_clip=6.0, steps=800, seed=210),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f21_llama_early_transient", "early_transient", H,
      hf("llama", lr=0.012, warmup=1, seed=210), "llama: LR 0.012 from step 0, no warm-up"),
    S("f21_gemma2_late_clipping", "late_clipping", H, hf("gemma2", max_norm=0.25, seed=210),
      "gemma2: clip at 0.25: clipped on most steps late in training"),
    S("f21_postln_lr_bump", "lr_bump", H, hf("postln", lr_steps=((420, 4.0), (480, 1.0)), seed=210),
      "post-LN: LR x4 for steps 420-480, then back"),
    S("f21_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.11, seed=210, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.11"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
