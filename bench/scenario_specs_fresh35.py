"""A thirty-sixth held-out set, fixed after round twenty-seven was chosen and ``fresh33`` was
replayed with it, before ``fresh34`` was read, so before any later rule change is chosen
(``split: "fresh35"``).

It is the held-out set for a change chosen on every set read before it (``--split read34``,
every run recorded through ``fresh34``). The thirty-fifth set's shapes at seeds 350+ with
other learning rates, steps, garbage-stretch lengths and outlier steps: momentum-SGD runs
that take one garbage batch or a short stretch and heal, next to runs that blow up.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh35"{print $1}')``. None of its runs may be used to choose a rule, a threshold
or a default.
"""


from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH35: list[Scenario] = [
    # == diverging ==============================================================
    S("f35_attn_growth_s350", "fp16_growth", D, demo(seed=350, lr=0.14),
      "fp16 scores, peak LR 0.14"),
    S("f35_attn_growth_l4", "fp16_growth", D, demo(seed=351, lr=0.18, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.18"),
    S("f35_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.50, seed=350),
      "fp32 scores, peak LR 0.5"),
    S("f35_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.55, seed=351, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.55"),
    *[S(f"f35_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((350, 3.0, 710), (351, 3.5, 690), (352, 3.1, 760), (353, 3.3, 700))],
    *[S(f"f35_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=350, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 405, 230, 250.0, {}), ("llama", 415, 225, 245.0, {}))],
    *[S(f"f35_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=350, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 415, 49.0, {}), ("llama", 405, 51.0, BF16))],
    *[S(f"f35_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=350, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.1, 515), ("gpt2", 3.2, 530), ("llama", 3.0, 520))],
    *[S(f"f35_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=350, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 410, 0.032, {}), ("postln", 420, 0.031, COS))],
    S("f35_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((410, 52.0), (468, 1.0)), steps=850, seed=350),
      "QK-norm: the LR x52 for steps 410-468"),
    S("f35_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.85, seed=350),
      "QK-norm, peak LR 0.85"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f35_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 352, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 352, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 352, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 352, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 353, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 353, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 352, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 353, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 352, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 353, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f35_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=350, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 415, 0.3), ("gemma2", "upper", 405, 0.31),
                                ("gpt2", "random", 420, 0.28), ("postln", "random", 410, 0.24),
                                ("postln", "upper", 405, 0.23), ("llama", "random", 420, 0.3))],
    *[S(f"f35_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=350, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 410), ("gemma2", "random", 425),
                            ("gpt2", "zeros", 405))],
    *[S(f"f35_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=350, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420),)],
    *[S(f"f35_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=350, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 415), ("postln", "upper", 405))],
    *[S(f"f35_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=351, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 405, 11), ("llama", 420, 9), ("postln", 415, 12), ("gemma2", 410, 10),
                         ("postln", 405, 8))],
    S("f35_demo_plain", "plain", H, demo_qk(seed=350, steps=1000), "QK-norm"),
    *[S(f"f35_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=350, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 405, 33, {}),
                                   ("gemma2", "random", 415, 30, {}),
                                   ("postln", "random", 410, 35, {}),
                                   ("gpt2", "upper", 420, 32, BF16))],
    *[S(f"f35_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=350), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 415), ("postln", "upper", 400))],
    S("f35_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((425, 8e3), (510, 5e3)), seed=350),
      "gpt2: one-step gradient spikes x8e3, x5e3 at 425, 510, clipped at 1.0"),
    S("f35_gemma2_softcap_s350", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.2, warmup=300, softcap=30.0, steps=800, seed=350),
      "gemma2: init std 0.1, peak LR 0.2, scores capped at 30"),
    S("f35_qknorm_lr24_s350", "qknorm_high_lr_ok", H, demo_qk(lr=0.22, seed=350, steps=1000),
      "QK-norm, peak LR 0.22"),
    S("f35_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(330, 0.0032, 530), seed=350),
      "gemma2: the LM head grows 0.32%/step for steps 330-530, then stops"),
    S("f35_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.1e-2, qk_clip=6.0, steps=800, seed=350),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f35_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=350), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f35_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=350),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f35_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=350),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("postln", 415, 6.0, 50), ("gpt2", 405, 6.5, 45),
                            ("llama", 420, 5.5, 50))],
    S("f35_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.12, seed=350, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.12"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
