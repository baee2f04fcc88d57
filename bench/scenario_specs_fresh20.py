"""A twenty-first held-out set, fixed after the twentieth was replayed with round
seventeen's rules unchanged (``split: "fresh20"``).

Round seventeen was chosen on ``--split read17`` and replayed once on the nineteenth set
(``fresh18``) and, unchanged, on the twentieth (``fresh19``); both are read now: every set
before this one is tuning data (``--split read19``). These runs are the held-out set for the
change after round seventeen: the earlier sets' shapes at seeds 200+ and other settings
(other learning rates, families and garbage-stretch lengths), again with single garbage
batches and short garbage stretches under unclipped SGD (some runs heal, some never come
back: labelled as seen), QK-norm LR ramps, garbage batches under unclipped adaptive
optimisers, and healthy runs under unclipped adaptive optimisers at higher learning rates
(early gradient spikes). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh20"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH20: list[Scenario] = [
    # == diverging ==============================================================
    S("f20_attn_growth_s200", "fp16_growth", D, demo(seed=200, lr=0.14),
      "fp16 scores, peak LR 0.14"),
    S("f20_attn_growth_l4", "fp16_growth", D, demo(seed=201, lr=0.18, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.18"),
    S("f20_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.65, seed=200),
      "fp32 scores, peak LR 0.65"),
    *[S(f"f20_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((200, 3.0, 680), (201, 3.4, 640), (202, 2.7, 780), (203, 3.1, 720))],
    *[S(f"f20_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=200, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("llama", 410, 220, 250.0, {}), ("postln", 400, 230, 240.0, BF16))],
    *[S(f"f20_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=200, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("postln", 420, 52.0, {}), ("gemma2", 400, 44.0, BF16))],
    *[S(f"f20_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=200, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gemma2", 3.3, 510), ("postln", 3.1, 490), ("llama", 3.2, 530))],
    *[S(f"f20_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=200, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("postln", 400, 0.033, {}), ("llama", 420, 0.03, COS))],
    S("f20_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((460, 42.0), (520, 1.0)), steps=850, seed=200),
      "QK-norm: the LR x42 for steps 460-520"),
    S("f20_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.85, seed=200),
      "QK-norm, peak LR 0.85"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f20_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("postln", "cosine", 200, "AdamW 3e-3, cosine decay", COS),
          ("llama", "rmsprop", 200, "RMSprop 1e-3", RMS),
          ("gemma2", "adam_unclipped", 200, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 200, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gpt2", "adam_unclipped_hi", 201, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("llama", "sgd", 200, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("gemma2", "sgd", 201, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("gpt2", "sgd_warm", 200, "momentum SGD warming up to 0.7 over 150 steps, no "
           "clipping", {"lr": 0.7, "warmup": 150, **SGD}),
          ("llama", "sgd_warm", 201, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f20_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=200, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "random", 390, 0.3), ("gemma2", "random", 410, 0.4),
                                ("postln", "upper", 400, 0.3), ("gpt2", "zeros", 420, 0.35),
                                ("llama", "upper", 430, 0.35), ("gemma2", "zeros", 380, 0.25),
                                ("postln", "random", 370, 0.25), ("gpt2", "random", 410, 0.3))],
    *[S(f"f20_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=200, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 420), ("postln", "zeros", 390),
                            ("llama", "upper", 400))],
    *[S(f"f20_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=200, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 410), ("postln", "upper", 400))],
    *[S(f"f20_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=200, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "upper", 390), ("llama", "random", 430))],
    *[S(f"f20_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=201, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gemma2", 400, 10), ("gpt2", 390, 6), ("llama", 410, 18), ("postln", 420, 2))],
    S("f20_demo_plain", "plain", H, demo_qk(seed=200, steps=1000), "QK-norm"),
    *[S(f"f20_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=200, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("postln", "random", 410, 30, {}),
                                   ("llama", "zeros", 400, 40, BF16))],
    *[S(f"f20_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=200), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "upper", 420), ("gpt2", "random", 400))],
    S("f20_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((395, 1e4), (560, 1e3)), seed=200),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f20_gemma2_softcap_s200", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.14, warmup=280, softcap=25.0, steps=800, seed=200),
      "gemma2: init std 0.1, peak LR 0.14, scores capped at 25"),
    S("f20_qknorm_lr24_s200", "qknorm_high_lr_ok", H, demo_qk(lr=0.24, seed=200, steps=1000),
      "QK-norm, peak LR 0.24"),
    S("f20_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(300, 0.0035, 520), seed=200),
      "gemma2: the LM head grows 0.35%/step for steps 300-520, then stops"),
    S("f20_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=5.0, steps=800, seed=200),
      "gpt2: QK-clip at tau 5 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f20_gpt2_early_transient", "early_transient", H,
      hf("gpt2", lr=0.015, warmup=1, seed=200), "gpt2: LR 0.015 from step 0, no warm-up"),
    S("f20_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.2, seed=200),
      "post-LN: clip at 0.2: clipped on most steps late in training"),
    S("f20_gpt2_lr_bump", "lr_bump", H, hf("gpt2", lr_steps=((430, 4.5), (490, 1.0)), seed=200),
      "gpt2: LR x4.5 for steps 430-490, then back"),
    S("f20_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.1, seed=200, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.1"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
