"""A thirty-eighth held-out set, fixed after ``fresh35`` was replayed with round
twenty-eight's defaults, before ``fresh36`` is read, so before any later rule change is
replayed (``split: "fresh37"``).

It is the held-out set for a change chosen on every set read before it (``--split read36``,
every run recorded through ``fresh36``). The thirty-seventh set's shapes at seeds 370+, each
varied parameter (learning rates, steps, garbage-stretch lengths, outlier steps, LR factors)
halfway between its values in ``fresh35`` and ``fresh36``. Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh37"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH37: list[Scenario] = [
    # == diverging ==============================================================
    S("f37_attn_growth_s370", "fp16_growth", D, demo(seed=370, lr=0.155),
      "fp16 scores, peak LR 0.155"),
    S("f37_attn_growth_l4", "fp16_growth", D, demo(seed=371, lr=0.165, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.165"),
    S("f37_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.52, seed=370),
      "fp32 scores, peak LR 0.52"),
    S("f37_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.52, seed=371, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.52"),
    *[S(f"f37_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((370, 3.1, 715), (371, 3.25, 685), (372, 3.25, 750), (373, 3.1, 705))],
    *[S(f"f37_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=370, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 412, 222, 245.0, {}), ("llama", 412, 228, 247.5, {}))],
    *[S(f"f37_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=370, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 410, 49.5, {}), ("llama", 410, 49.5, BF16))],
    *[S(f"f37_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=370, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.15, 520), ("gpt2", 3.1, 522), ("llama", 3.15, 525))],
    *[S(f"f37_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=370, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 412, 0.0315, COS), ("postln", 415, 0.0315, {}))],
    S("f37_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((415, 50.0), (472, 1.0)), steps=850, seed=370),
      "QK-norm: the LR x50 for steps 415-472"),
    S("f37_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.80, seed=370),
      "QK-norm, peak LR 0.80"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f37_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 372, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 372, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 372, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 372, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 373, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 373, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 372, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 373, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 372, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 373, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f37_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=370, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 418, 0.295), ("gemma2", "upper", 408, 0.305),
                                ("gpt2", "random", 412, 0.295), ("postln", "random", 412, 0.235),
                                ("postln", "upper", 412, 0.24), ("llama", "random", 412, 0.29))],
    *[S(f"f37_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=370, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 415), ("gemma2", "random", 415),
                            ("gpt2", "zeros", 410))],
    *[S(f"f37_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=370, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 412),)],
    *[S(f"f37_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=370, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 410), ("postln", "upper", 410))],
    *[S(f"f37_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=371, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 412, 10), ("llama", 415, 10), ("postln", 410, 11), ("gemma2", 412, 11),
                         ("postln", 412, 8))],
    S("f37_demo_plain", "plain", H, demo_qk(seed=370, steps=1000), "QK-norm"),
    *[S(f"f37_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=370, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 412, 32, {}),
                                   ("gemma2", "random", 410, 32, {}),
                                   ("postln", "random", 412, 33, {}),
                                   ("gpt2", "upper", 415, 33, BF16))],
    *[S(f"f37_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=370), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 410), ("postln", "upper", 410))],
    S("f37_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((420, 7e3), (508, 6e3)), seed=370),
      "gpt2: one-step gradient spikes x7e3, x6e3 at 420, 508, clipped at 1.0"),
    S("f37_gemma2_softcap_s370", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.185, warmup=300, softcap=30.0, steps=800, seed=370),
      "gemma2: init std 0.1, peak LR 0.185, scores capped at 30"),
    S("f37_qknorm_lr24_s370", "qknorm_high_lr_ok", H, demo_qk(lr=0.24, seed=370, steps=1000),
      "QK-norm, peak LR 0.24"),
    S("f37_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(320, 0.00335, 520), seed=370),
      "gemma2: the LM head grows 0.335%/step for steps 320-520, then stops"),
    S("f37_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=370),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f37_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=370), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f37_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=370),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f37_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=370),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("postln", 412, 5.75, 52), ("gpt2", 410, 6.25, 48),
                            ("llama", 412, 6.0, 48))],
    S("f37_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.13, seed=370, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.13"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
