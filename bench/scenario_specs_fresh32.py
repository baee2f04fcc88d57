"""A thirty-third held-out set, fixed before round twenty-five was chosen and before ``fresh31``
was replayed, so before any later rule change is chosen (``split: "fresh32"``).

It is the held-out set for a change chosen on every set read before it (``--split read31``,
every run recorded through ``fresh31``). The thirty-second set's shapes at seeds 320+ with
other learning rates, steps, garbage-stretch lengths and outlier steps: momentum-SGD runs
that take one garbage batch or a short stretch and heal, next to runs that blow up.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh32"{print $1}')``. None of its runs may be used to choose a rule, a threshold
or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH32: list[Scenario] = [
    # == diverging ==============================================================
    S("f32_attn_growth_s320", "fp16_growth", D, demo(seed=320, lr=0.15),
      "fp16 scores, peak LR 0.15"),
    S("f32_attn_growth_l4", "fp16_growth", D, demo(seed=321, lr=0.17, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.17"),
    S("f32_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.55, seed=320),
      "fp32 scores, peak LR 0.55"),
    S("f32_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.45, seed=321, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.45"),
    *[S(f"f32_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((320, 3.3, 710), (321, 3.0, 680), (322, 2.8, 760), (323, 3.4, 700))],
    *[S(f"f32_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=320, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 425, 230, 250.0, {}), ("llama", 415, 220, 245.0, {}))],
    *[S(f"f32_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=320, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 415, 50.0, {}), ("llama", 410, 48.0, BF16))],
    *[S(f"f32_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=320, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.2, 530), ("gpt2", 3.2, 510), ("llama", 3.3, 520))],
    *[S(f"f32_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=320, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 405, 0.031, COS), ("postln", 420, 0.032, {}))],
    S("f32_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((410, 52.0), (475, 1.0)), steps=850, seed=320),
      "QK-norm: the LR x52 for steps 410-475"),
    S("f32_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.85, seed=320),
      "QK-norm, peak LR 0.85"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f32_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 322, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 322, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 322, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 322, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 323, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 323, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 322, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 323, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 322, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 323, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f32_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=320, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 410, 0.3), ("gemma2", "upper", 425, 0.28),
                                ("gpt2", "random", 415, 0.29), ("postln", "random", 405, 0.24),
                                ("postln", "upper", 420, 0.23), ("llama", "random", 410, 0.28))],
    *[S(f"f32_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=320, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420), ("gemma2", "random", 405),
                            ("gpt2", "zeros", 425))],
    *[S(f"f32_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=320, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 405),)],
    *[S(f"f32_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=320, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 405), ("postln", "upper", 425))],
    *[S(f"f32_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=321, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 410, 9), ("llama", 420, 10), ("postln", 410, 7), ("gemma2", 400, 12),
                         ("postln", 425, 8))],
    S("f32_demo_plain", "plain", H, demo_qk(seed=320, steps=1000), "QK-norm"),
    *[S(f"f32_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=320, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 420, 34, {}),
                                   ("gemma2", "random", 405, 31, {}),
                                   ("postln", "random", 415, 33, {}),
                                   ("gpt2", "upper", 400, 30, BF16))],
    *[S(f"f32_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=320), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 410), ("postln", "upper", 420))],
    S("f32_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((420, 5e3), (530, 1e4)), seed=320),
      "gpt2: one-step gradient spikes x5e3, x1e4 at 420, 530, clipped at 1.0"),
    S("f32_gemma2_softcap_s320", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.17, warmup=300, softcap=30.0, steps=800, seed=320),
      "gemma2: init std 0.1, peak LR 0.17, scores capped at 30"),
    S("f32_qknorm_lr24_s320", "qknorm_high_lr_ok", H, demo_qk(lr=0.24, seed=320, steps=1000),
      "QK-norm, peak LR 0.24"),
    S("f32_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(330, 0.0032, 530), seed=320),
      "gemma2: the LM head grows 0.32%/step for steps 330-530, then stops"),
    S("f32_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.2e-2, qk_clip=6.0, steps=800, seed=320),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f32_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=320), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f32_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=320),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f32_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=320),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("postln", 410, 6.0, 50), ("gpt2", 400, 6.5, 55),
                            ("llama", 420, 5.5, 45))],
    S("f32_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.12, seed=320, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.12"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
