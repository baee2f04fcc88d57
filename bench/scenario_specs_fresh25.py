"""A twenty-sixth held-out set, fixed before any change after round twenty-one was chosen
(``split: "fresh25"``).

Fixed after the twenty-fifth set (``fresh24``) had been replayed with round twenty-one's rules;
it is the held-out set for the next change, chosen on the tuning data (``--split read24``, every
run recorded through ``fresh24``). The earlier sets' shapes at seeds 250+ and other settings
(learning rates, families, garbage-stretch lengths, outlier steps), with momentum-SGD runs that
take one garbage batch or a short stretch and heal, next to runs that blow up. Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh25"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH25: list[Scenario] = [
    # == diverging ==============================================================
    S("f25_attn_growth_s250", "fp16_growth", D, demo(seed=250, lr=0.14),
      "fp16 scores, peak LR 0.14"),
    S("f25_attn_growth_l4", "fp16_growth", D, demo(seed=251, lr=0.19, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.19"),
    S("f25_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.6, seed=250),
      "fp32 scores, peak LR 0.6"),
    S("f25_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.45, seed=251, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.45"),
    *[S(f"f25_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((250, 2.9, 700), (251, 3.2, 680), (252, 2.8, 760), (253, 3.5, 720))],
    *[S(f"f25_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=250, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gpt2", 410, 220, 250.0, {}), ("gemma2", 400, 240, 240.0, {}))],
    *[S(f"f25_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=250, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("postln", 410, 50.0, {}), ("gpt2", 400, 48.0, BF16))],
    *[S(f"f25_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=250, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gemma2", 3.1, 510), ("llama", 3.0, 540), ("gpt2", 3.3, 500))],
    *[S(f"f25_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=250, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gemma2", 400, 0.031, {}), ("llama", 420, 0.033, COS))],
    S("f25_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((420, 50.0), (480, 1.0)), steps=850, seed=250),
      "QK-norm: the LR x50 for steps 420-480"),
    S("f25_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.8, seed=250),
      "QK-norm, peak LR 0.8"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f25_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 250, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 250, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 250, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 250, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 251, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 251, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 250, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 251, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 250, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 251, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f25_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=250, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("gpt2", "zeros", 410, 0.3), ("llama", "upper", 400, 0.32),
                                ("postln", "zeros", 420, 0.22), ("gemma2", "random", 410, 0.3),
                                ("llama", "random", 430, 0.28), ("gpt2", "random", 400, 0.35))],
    *[S(f"f25_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=250, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 410), ("postln", "random", 400),
                            ("llama", "zeros", 420))],
    *[S(f"f25_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=250, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 410),)],
    *[S(f"f25_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=250, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420), ("gpt2", "upper", 400))],
    *[S(f"f25_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=251, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("llama", 400, 10), ("gpt2", 420, 5), ("gpt2", 410, 16), ("gemma2", 400, 13),
                         ("postln", 420, 7))],
    S("f25_demo_plain", "plain", H, demo_qk(seed=250, steps=1000), "QK-norm"),
    *[S(f"f25_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=250, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gpt2", "random", 410, 30, {}),
                                   ("llama", "random", 400, 40, {}),
                                   ("gemma2", "random", 420, 22, {}),
                                   ("postln", "upper", 400, 28, BF16))],
    *[S(f"f25_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=250), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 410), ("gemma2", "upper", 420))],
    S("f25_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((410, 1e4), (540, 1e3)), seed=250),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f25_gemma2_softcap_s250", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.16, warmup=280, softcap=30.0, steps=800, seed=250),
      "gemma2: init std 0.1, peak LR 0.16, scores capped at 30"),
    S("f25_qknorm_lr22_s250", "qknorm_high_lr_ok", H, demo_qk(lr=0.22, seed=250, steps=1000),
      "QK-norm, peak LR 0.22"),
    S("f25_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(320, 0.0034, 520), seed=250),
      "gemma2: the LM head grows 0.34%/step for steps 320-520, then stops"),
    S("f25_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=250),
      "gpt2: QK-clip at tau 6.0 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f25_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=250), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f25_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=250),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f25_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=250),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("gpt2", 400, 7.0, 45), ("llama", 420, 5.0, 60),
                            ("gemma2", 410, 6.0, 50))],
    S("f25_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.1, seed=250, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.1"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
