"""A fortieth held-out set, fixed after ``fresh37`` was read once with round twenty-nine's
unchanged defaults, before ``fresh38`` is read, so before any later rule change is replayed
(``split: "fresh39"``).

It is the held-out set for the change after the next (``--split read38``, every run recorded
through ``fresh38``). The thirty-ninth set's (``fresh38``'s) shapes at seeds 390+, each
parameter that differs between ``fresh35`` and ``fresh38`` set halfway between its two
values, except three written in exponent notation that kept ``fresh38``'s (the QK-clip
run's LR and the two gradient spikes' sizes; noticed after it was recorded). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh39"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH39: list[Scenario] = [
    # == diverging ==============================================================
    S("f39_attn_growth_s390", "fp16_growth", D, demo(seed=390, lr=0.1494),
      "fp16 scores, peak LR 0.1494"),
    S("f39_attn_growth_l4", "fp16_growth", D, demo(seed=391, lr=0.17065, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.17065"),
    S("f39_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.5125, seed=390),
      "fp32 scores, peak LR 0.5125"),
    S("f39_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.531, seed=391, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.531"),
    *[S(f"f39_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((390, 3.06, 713), (391, 3.344, 687), (392, 3.194, 754), (393, 3.175, 703))],
    *[S(f"f39_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=390, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 410, 225, 246.875, {}), ("llama", 414, 226, 246.56, {}))],
    *[S(f"f39_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=390, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 412, 49.31, {}), ("llama", 408, 50.06, BF16))],
    *[S(f"f39_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=390, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.1315, 518), ("gpt2", 3.14, 525), ("llama", 3.094, 523))],
    *[S(f"f39_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=390, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 412, 0.03169, COS), ("postln", 417, 0.031315, {}))],
    S("f39_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((413, 50.75), (470, 1.0)), steps=850, seed=390),
      "QK-norm: the LR x50 for steps 413-470"),
    S("f39_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.819, seed=390),
      "QK-norm, peak LR 0.819"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f39_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 392, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 392, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 392, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 392, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 393, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 393, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 392, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 393, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 392, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 393, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f39_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=390, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 416, 0.29685), ("gemma2", "upper", 406, 0.30685),
                                ("gpt2", "random", 415, 0.28935), ("postln", "random", 412, 0.23685),
                                ("postln", "upper", 410, 0.236), ("llama", "random", 415, 0.2935))],
    *[S(f"f39_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=390, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 413), ("gemma2", "random", 418),
                            ("gpt2", "zeros", 408))],
    *[S(f"f39_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=390, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 415),)],
    *[S(f"f39_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=390, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 412), ("postln", "upper", 408))],
    *[S(f"f39_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=391, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 410, 10), ("llama", 417, 10), ("postln", 412, 12), ("gemma2", 412, 10),
                         ("postln", 410, 8))],
    S("f39_demo_plain", "plain", H, demo_qk(seed=390, steps=1000), "QK-norm"),
    *[S(f"f39_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=390, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 410, 32, {}),
                                   ("gemma2", "random", 412, 32, {}),
                                   ("postln", "random", 412, 34, {}),
                                   ("gpt2", "upper", 417, 32, BF16))],
    *[S(f"f39_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=390), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 412), ("postln", "upper", 406))],
    S("f39_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((422, 7e3), (508, 6e3)), seed=390),
      "gpt2: one-step gradient spikes x7e3, x6e3 at 422, 508, clipped at 1.0"),
    S("f39_gemma2_softcap_s390", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.1906, warmup=300, softcap=30.0, steps=800, seed=390),
      "gemma2: init std 0.1, peak LR 0.1906, scores capped at 30"),
    S("f39_qknorm_lr24_s390", "qknorm_high_lr_ok", H, demo_qk(lr=0.2325, seed=390, steps=1000),
      "QK-norm, peak LR 0.2325"),
    S("f39_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(324, 0.0032935, 524), seed=390),
      "gemma2: the LM head grows 0.32935%/step for steps 324-524, then stops"),
    S("f39_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=390),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f39_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=390), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f39_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=390),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f39_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=390),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("postln", 414, 5.844, 52), ("gpt2", 408, 6.344, 46),
                            ("llama", 415, 5.81, 48))],
    S("f39_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.1265, seed=390, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.1265"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
