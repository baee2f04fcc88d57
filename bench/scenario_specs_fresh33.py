"""A thirty-fourth held-out set, fixed before the change after round twenty-five was chosen and
before ``fresh32`` was replayed, so before any later rule change is chosen (``split: "fresh33"``).

It is the held-out set for a change chosen on every set read before it (``--split read32``,
every run recorded through ``fresh32``). The thirty-third set's shapes at seeds 330+ with
other learning rates, steps, garbage-stretch lengths and outlier steps: momentum-SGD runs
that take one garbage batch or a short stretch and heal, next to runs that blow up.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh33"{print $1}')``. None of its runs may be used to choose a rule, a threshold
or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH33: list[Scenario] = [
    # == diverging ==============================================================
    S("f33_attn_growth_s330", "fp16_growth", D, demo(seed=330, lr=0.13),
      "fp16 scores, peak LR 0.13"),
    S("f33_attn_growth_l4", "fp16_growth", D, demo(seed=331, lr=0.19, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.19"),
    S("f33_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.48, seed=330),
      "fp32 scores, peak LR 0.48"),
    S("f33_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.52, seed=331, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.52"),
    *[S(f"f33_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((330, 3.1, 720), (331, 3.2, 670), (332, 2.9, 740), (333, 3.6, 690))],
    *[S(f"f33_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=330, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 400, 240, 255.0, {}), ("llama", 420, 210, 240.0, {}))],
    *[S(f"f33_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=330, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 420, 47.0, {}), ("llama", 405, 52.0, BF16))],
    *[S(f"f33_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=330, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.0, 510), ("gpt2", 3.3, 540), ("llama", 3.1, 530))],
    *[S(f"f33_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=330, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 410, 0.033, {}), ("postln", 415, 0.030, COS))],
    S("f33_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((405, 55.0), (465, 1.0)), steps=850, seed=330),
      "QK-norm: the LR x55 for steps 405-465"),
    S("f33_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.9, seed=330),
      "QK-norm, peak LR 0.9"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f33_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 332, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 332, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 332, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 332, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 333, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 333, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 332, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 333, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 332, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 333, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f33_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=330, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 415, 0.29), ("gemma2", "upper", 405, 0.3),
                                ("gpt2", "random", 420, 0.28), ("postln", "random", 410, 0.23),
                                ("postln", "upper", 400, 0.25), ("llama", "random", 425, 0.3))],
    *[S(f"f33_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=330, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 410), ("gemma2", "random", 420),
                            ("gpt2", "zeros", 405))],
    *[S(f"f33_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=330, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420),)],
    *[S(f"f33_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=330, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 415), ("postln", "upper", 405))],
    *[S(f"f33_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=331, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 405, 11), ("llama", 415, 8), ("postln", 420, 9), ("gemma2", 410, 10),
                         ("postln", 400, 6))],
    S("f33_demo_plain", "plain", H, demo_qk(seed=330, steps=1000), "QK-norm"),
    *[S(f"f33_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=330, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 405, 32, {}),
                                   ("gemma2", "random", 415, 35, {}),
                                   ("postln", "random", 400, 30, {}),
                                   ("gpt2", "upper", 420, 33, BF16))],
    *[S(f"f33_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=330), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 425), ("postln", "upper", 405))],
    S("f33_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((410, 8e3), (540, 4e3)), seed=330),
      "gpt2: one-step gradient spikes x8e3, x4e3 at 410, 540, clipped at 1.0"),
    S("f33_gemma2_softcap_s330", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.16, warmup=300, softcap=30.0, steps=800, seed=330),
      "gemma2: init std 0.1, peak LR 0.16, scores capped at 30"),
    S("f33_qknorm_lr24_s330", "qknorm_high_lr_ok", H, demo_qk(lr=0.22, seed=330, steps=1000),
      "QK-norm, peak LR 0.22"),
    S("f33_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(340, 0.003, 540), seed=330),
      "gemma2: the LM head grows 0.3%/step for steps 340-540, then stops"),
    S("f33_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.2e-2, qk_clip=6.0, steps=800, seed=330),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f33_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=330), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f33_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=330),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f33_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=330),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("postln", 420, 5.5, 55), ("gpt2", 410, 6.0, 45),
                            ("llama", 400, 6.5, 50))],
    S("f33_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.11, seed=330, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.11"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
