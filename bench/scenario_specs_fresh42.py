"""A forty-third held-out set, fixed after ``fresh40`` was read once with round
thirty-one's defaults, before ``fresh41`` is read, so before any later rule change is replayed
(``split: "fresh42"``).

It is the held-out set for the change after the next (``--split read41``, every run recorded
through ``fresh41``). The forty-second set's (``fresh41``'s) shapes at seeds 420+, each
parameter that differs between ``fresh38`` and ``fresh41`` set halfway between its two values
(values written in exponent notation keep ``fresh41``'s). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh42"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH42: list[Scenario] = [
    # == diverging ==============================================================
    S("f42_attn_growth_s420", "fp16_growth", D, demo(seed=420, lr=0.158075),
      "fp16 scores, peak LR 0.158075"),
    S("f42_attn_growth_l4", "fp16_growth", D, demo(seed=421, lr=0.16198125, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.16198125"),
    S("f42_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.5240625, seed=420),
      "fp32 scores, peak LR 0.5240625"),
    S("f42_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.513625, seed=421, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.513625"),
    *[S(f"f42_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((420, 3.1175, 716), (421, 3.1995, 684), (422, 3.28075, 748), (423, 3.059375, 706))],
    *[S(f"f42_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=420, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 414, 220, 243.984375, {}), ("llama", 412, 228, 248.005, {}))],
    *[S(f"f42_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=420, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 409, 49.59875, {}), ("llama", 411, 49.1925, BF16))],
    *[S(f"f42_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=420, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.1604375, 521), ("gpt2", 3.0825, 520), ("llama", 3.18075, 526))],
    *[S(f"f42_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=420, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 413, 0.03140125, COS), ("postln", 414, 0.031604375, {}))],
    S("f42_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((416, 49.59375), (472, 1.0)), steps=850, seed=420),
      "QK-norm: the LR x50 for steps 416-472"),
    S("f42_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.790125, seed=420),
      "QK-norm, peak LR 0.790125"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f42_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 422, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 422, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 422, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 422, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 423, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 423, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 422, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 423, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 422, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 423, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f42_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=420, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 418, 0.29395625), ("gemma2", "upper", 408, 0.30395625),
                                ("gpt2", "random", 410, 0.29801875), ("postln", "random", 413, 0.23395625),
                                ("postln", "upper", 414, 0.24175), ("llama", "random", 410, 0.2876875))],
    *[S(f"f42_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=420, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 416), ("gemma2", "random", 413),
                            ("gpt2", "zeros", 411))],
    *[S(f"f42_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=420, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 410),)],
    *[S(f"f42_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=420, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 409), ("postln", "upper", 411))],
    *[S(f"f42_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=421, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 414, 10), ("llama", 414, 10), ("postln", 409, 11), ("gemma2", 413, 11),
                         ("postln", 414, 8))],
    S("f42_demo_plain", "plain", H, demo_qk(seed=420, steps=1000), "QK-norm"),
    *[S(f"f42_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=420, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 414, 32, {}),
                                   ("gemma2", "random", 409, 33, {}),
                                   ("postln", "random", 413, 32, {}),
                                   ("gpt2", "upper", 414, 33, BF16))],
    *[S(f"f42_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=420), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 409), ("postln", "upper", 412))],
    S("f42_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((419, 7e3), (507, 6e3)), seed=420),
      "gpt2: one-step gradient spikes x7e3, x6e3 at 419, 507, clipped at 1.0"),
    S("f42_gemma2_softcap_s420", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.181925, warmup=300, softcap=30.0, steps=800, seed=420),
      "gemma2: init std 0.1, peak LR 0.181925, scores capped at 30"),
    S("f42_qknorm_lr24_s420", "qknorm_high_lr_ok", H, demo_qk(lr=0.2440625, seed=420, steps=1000),
      "QK-norm, peak LR 0.2440625"),
    S("f42_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(318, 0.0033801875, 518), seed=420),
      "gemma2: the LM head grows 0.33801875%/step for steps 318-518, then stops"),
    S("f42_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=420),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f42_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=420), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f42_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=420),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f42_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=420),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("postln", 412, 5.6995, 53), ("gpt2", 411, 6.1995, 48),
                            ("llama", 410, 6.09875, 47))],
    S("f42_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.1323125, seed=420, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.1323125"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
