"""A twentieth held-out set, fixed after round seventeen's set was replayed (``split:
"fresh19"``).

Round seventeen was chosen on ``--split read17`` and replayed once on the nineteenth set
(``fresh18``), which is read now: every set before this one is tuning data
(``--split read18``). These runs are the held-out set for the change after round
seventeen: the earlier sets' shapes at seeds 190+ and other settings (other learning rates,
families and garbage-stretch lengths), again with single garbage batches and short garbage
stretches under unclipped SGD (some runs heal, some never come back: labelled as seen),
QK-norm LR ramps, garbage batches under unclipped adaptive optimisers, and healthy runs under
unclipped adaptive optimisers at higher learning rates (early gradient spikes). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh19"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH19: list[Scenario] = [
    # == diverging ==============================================================
    S("f19_attn_growth_s190", "fp16_growth", D, demo(seed=190, lr=0.15),
      "fp16 scores, peak LR 0.15"),
    S("f19_attn_growth_l4", "fp16_growth", D, demo(seed=191, lr=0.15, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.15"),
    S("f19_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.5, seed=190),
      "fp32 scores, peak LR 0.5"),
    *[S(f"f19_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((190, 3.2, 660), (191, 2.8, 760), (192, 3.5, 600), (193, 2.5, 820))],
    *[S(f"f19_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=190, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gemma2", 390, 240, 230.0, {}), ("gpt2", 420, 200, 280.0, BF16))],
    *[S(f"f19_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=190, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("llama", 400, 48.0, {}), ("gpt2", 430, 42.0, BF16))],
    *[S(f"f19_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=190, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.2, 500), ("llama", 3.3, 540), ("gpt2", 3.1, 470))],
    *[S(f"f19_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=190, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gemma2", 410, 0.031, {}), ("gpt2", 400, 0.029, COS))],
    S("f19_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((470, 35.0), (530, 1.0)), steps=850, seed=190),
      "QK-norm: the LR x35 for steps 470-530"),
    S("f19_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.7, seed=190),
      "QK-norm, peak LR 0.7"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f19_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gemma2", "cosine", 190, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 190, "RMSprop 1e-3", RMS),
          ("llama", "adam_unclipped", 190, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("gpt2", "rms_unclipped_hi", 190, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "adam_unclipped_hi", 191, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 190, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 191, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("postln", "sgd_warm", 190, "momentum SGD warming up to 0.7 over 150 steps, no "
           "clipping", {"lr": 0.7, "warmup": 150, **SGD}),
          ("gpt2", "sgd_warm", 191, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f19_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=190, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("gpt2", "random", 400, 0.4), ("postln", "random", 420, 0.3),
                                ("gemma2", "zeros", 410, 0.35), ("llama", "upper", 390, 0.3),
                                ("gpt2", "upper", 380, 0.35), ("postln", "zeros", 430, 0.25),
                                ("gemma2", "random", 370, 0.4), ("llama", "zeros", 420, 0.45))],
    *[S(f"f19_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=190, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "zeros", 400), ("llama", "upper", 410),
                            ("gemma2", "random", 430))],
    *[S(f"f19_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=190, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "upper", 390), ("llama", "zeros", 420))],
    *[S(f"f19_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=190, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "random", 410), ("gemma2", "zeros", 400))],
    *[S(f"f19_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=191, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("llama", 390, 14), ("gemma2", 420, 5), ("gpt2", 410, 9), ("postln", 400, 3))],
    S("f19_demo_plain", "plain", H, demo_qk(seed=190, steps=1000), "QK-norm"),
    *[S(f"f19_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=190, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gemma2", "random", 400, 30, {}),
                                   ("gpt2", "zeros", 390, 35, BF16))],
    *[S(f"f19_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=190), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 400), ("postln", "upper", 430))],
    S("f19_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((410, 1e4), (540, 1e3)), seed=190),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f19_gemma2_softcap_s190", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.14, warmup=280, softcap=25.0, steps=800, seed=190),
      "gemma2: init std 0.1, peak LR 0.14, scores capped at 25"),
    S("f19_qknorm_lr24_s190", "qknorm_high_lr_ok", H, demo_qk(lr=0.24, seed=190, steps=1000),
      "QK-norm, peak LR 0.24"),
    S("f19_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(300, 0.0035, 520), seed=190),
      "gemma2: the LM head grows 0.35%/step for steps 300-520, then stops"),
    S("f19_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=5.0, steps=800, seed=190),
      "gpt2: QK-clip at tau 5 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f19_gpt2_early_transient", "early_transient", H,
      hf("gpt2", lr=0.015, warmup=1, seed=190), "gpt2: LR 0.015 from step 0, no warm-up"),
    S("f19_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.2, seed=190),
      "post-LN: clip at 0.2: clipped on most steps late in training"),
    S("f19_gpt2_lr_bump", "lr_bump", H, hf("gpt2", lr_steps=((410, 5.5), (470, 1.0)), seed=190),
      "gpt2: LR x5.5 for steps 410-470, then back"),
    S("f19_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.12, seed=190, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.12"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
