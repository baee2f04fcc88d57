"""A twenty-fifth held-out set, fixed before any change after round twenty was chosen (``split:
"fresh24"``).

Fixed after the twenty-fourth set (``fresh23``) had been replayed with round twenty's rules,
before the next change is chosen on the tuning data (``--split all``, every run recorded
through ``fresh23``); it is the held-out set for that change. The earlier sets' shapes at seeds
240+ and other settings (learning rates, families, garbage-stretch lengths, outlier steps),
with more healthy runs whose momentum-SGD loss takes a garbage stretch or a single garbage
batch and heals, next to runs that blow up, ramp the LR under QK-norm, or drift the LM head.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh24"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH24: list[Scenario] = [
    # == diverging ==============================================================
    S("f24_attn_growth_s240", "fp16_growth", D, demo(seed=240, lr=0.16),
      "fp16 scores, peak LR 0.16"),
    S("f24_attn_growth_l4", "fp16_growth", D, demo(seed=241, lr=0.19, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.19"),
    S("f24_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.6, seed=240),
      "fp32 scores, peak LR 0.6"),
    S("f24_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.45, seed=241, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.45"),
    *[S(f"f24_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((240, 3.0, 740), (241, 2.7, 660), (242, 3.3, 720), (243, 2.6, 780))],
    *[S(f"f24_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=240, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("llama", 400, 220, 250.0, {}), ("postln", 410, 230, 240.0, {}))],
    *[S(f"f24_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=240, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gpt2", 420, 50.0, {}), ("llama", 400, 46.0, BF16))],
    *[S(f"f24_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=240, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("llama", 3.3, 500), ("gpt2", 3.2, 530), ("postln", 3.0, 520))],
    *[S(f"f24_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=240, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("llama", 410, 0.032, {}), ("gpt2", 420, 0.03, COS))],
    S("f24_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((420, 50.0), (480, 1.0)), steps=850, seed=240),
      "QK-norm: the LR x50 for steps 420-480"),
    S("f24_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.8, seed=240),
      "QK-norm, peak LR 0.8"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f24_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 240, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 240, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 240, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 240, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 241, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 241, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 240, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 241, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 240, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 241, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f24_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=240, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("postln", "random", 410, 0.25), ("gpt2", "random", 400, 0.32),
                                ("llama", "zeros", 420, 0.3), ("gemma2", "upper", 410, 0.28),
                                ("gpt2", "upper", 430, 0.3), ("llama", "random", 400, 0.35))],
    *[S(f"f24_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=240, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 410), ("postln", "random", 400),
                            ("llama", "zeros", 420))],
    *[S(f"f24_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=240, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 410),)],
    *[S(f"f24_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=240, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420), ("gpt2", "upper", 400))],
    *[S(f"f24_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=241, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 400, 12), ("llama", 420, 6), ("postln", 400, 15), ("gemma2", 410, 9),
                         ("llama", 410, 18))],
    S("f24_demo_plain", "plain", H, demo_qk(seed=240, steps=1000), "QK-norm"),
    *[S(f"f24_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=240, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gpt2", "random", 410, 30, {}),
                                   ("llama", "random", 400, 40, {}),
                                   ("gemma2", "random", 420, 22, {}),
                                   ("postln", "upper", 400, 28, BF16))],
    *[S(f"f24_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=240), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 410), ("gemma2", "upper", 420))],
    S("f24_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((410, 1e4), (540, 1e3)), seed=240),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f24_gemma2_softcap_s240", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.16, warmup=280, softcap=30.0, steps=800, seed=240),
      "gemma2: init std 0.1, peak LR 0.16, scores capped at 30"),
    S("f24_qknorm_lr22_s240", "qknorm_high_lr_ok", H, demo_qk(lr=0.22, seed=240, steps=1000),
      "QK-norm, peak LR 0.22"),
    S("f24_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(320, 0.0034, 520), seed=240),
      "gemma2: the LM head grows 0.34%/step for steps 320-520, then stops"),
    S("f24_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=240),
      "gpt2: QK-clip at tau 6.0 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f24_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=240), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f24_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=240),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f24_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=240),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("gpt2", 400, 7.0, 45), ("llama", 420, 5.0, 60),
                            ("gemma2", 410, 6.0, 50))],
    S("f24_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.1, seed=240, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.1"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
