"""An eighteenth held-out set, fixed after round fifteen's set was replayed (``split:
"fresh17"``).

Round fifteen was chosen on ``--split read15`` and replayed once on the seventeenth set
(``fresh16``), which is read now: every set before this one is tuning data
(``--split read16``). These runs are the held-out set for the change after round fifteen:
the earlier sets' shapes at seeds 170+ and other settings, with more single garbage batches
and short garbage stretches under unclipped SGD at several learning rates (some runs heal,
some never come back: labelled as seen), more QK-norm LR ramps, and garbage batches under
unclipped adaptive optimisers. Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh17"{print $1}')``. None of its runs may
be used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH17: list[Scenario] = [
    # == diverging ==============================================================
    S("f17_attn_growth_s170", "fp16_growth", D, demo(seed=170, lr=0.14),
      "fp16 scores, peak LR 0.14"),
    S("f17_attn_growth_l4", "fp16_growth", D, demo(seed=171, lr=0.17, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.17"),
    S("f17_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.55, seed=170),
      "fp32 scores, peak LR 0.55"),
    *[S(f"f17_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((170, 2.7, 780), (171, 3.1, 680), (172, 3.4, 620), (173, 2.8, 720))],
    *[S(f"f17_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=170, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("llama", 400, 220, 240.0, {}), ("gemma2", 420, 210, 270.0, BF16))],
    *[S(f"f17_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=170, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gpt2", 420, 55.0, {}), ("llama", 390, 45.0, BF16))],
    *[S(f"f17_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=170, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gemma2", 3.2, 500), ("gpt2", 3.3, 540), ("postln", 3.0, 460))],
    *[S(f"f17_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=170, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 410, 0.032, {}), ("gemma2", 420, 0.03, COS))],
    S("f17_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((460, 40.0), (520, 1.0)), steps=850, seed=170),
      "QK-norm: the LR x40 for steps 460-520"),
    S("f17_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.75, seed=170),
      "QK-norm, peak LR 0.75"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f17_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gpt2", "cosine", 170, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 170, "RMSprop 1e-3", RMS),
          ("llama", "adam_unclipped", 170, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("gemma2", "sgd", 170, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("llama", "sgd", 171, "momentum SGD 0.45, no clipping", {"lr": 0.45, **SGD}),
          ("gpt2", "sgd_warm", 170, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("llama", "sgd_warm", 171, "momentum SGD warming up to 1.0 over 200 steps, no "
           "clipping", {"lr": 1.0, "warmup": 200, **SGD}))],
    *[S(f"f17_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=170, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("gpt2", "random", 420, 0.35), ("llama", "random", 400, 0.3),
                                ("postln", "upper", 430, 0.25), ("gemma2", "zeros", 380, 0.35),
                                ("gpt2", "zeros", 370, 0.45), ("llama", "upper", 440, 0.4),
                                ("postln", "zeros", 390, 0.3), ("gemma2", "upper", 410, 0.3))],
    *[S(f"f17_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=170, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 410), ("postln", "upper", 380),
                            ("llama", "zeros", 430))],
    *[S(f"f17_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=170, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "upper", 400), ("gpt2", "random", 420))],
    *[S(f"f17_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=170, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 390), ("postln", "zeros", 410))],
    *[S(f"f17_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=171, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("llama", 410, 10), ("gemma2", 390, 20), ("postln", 420, 6))],
    S("f17_demo_plain", "plain", H, demo_qk(seed=170, steps=1000), "QK-norm"),
    *[S(f"f17_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=170, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gpt2", "random", 380, 40, {}),
                                   ("postln", "zeros", 420, 25, BF16))],
    *[S(f"f17_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=170), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "upper", 400), ("gpt2", "random", 430))],
    S("f17_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((390, 1e4), (560, 1e3)), seed=170),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f17_gemma2_softcap_s170", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.14, warmup=280, softcap=25.0, steps=800, seed=170),
      "gemma2: init std 0.1, peak LR 0.14, scores capped at 25"),
    S("f17_qknorm_lr24_s170", "qknorm_high_lr_ok", H, demo_qk(lr=0.24, seed=170, steps=1000),
      "QK-norm, peak LR 0.24"),
    S("f17_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(300, 0.0035, 520), seed=170),
      "gemma2: the LM head grows 0.35%/step for steps 300-520, then stops"),
    S("f17_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=5.0, steps=800, seed=170),
      "gpt2: QK-clip at tau 5 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f17_gpt2_early_transient", "early_transient", H,
      hf("gpt2", lr=0.015, warmup=1, seed=170), "gpt2: LR 0.015 from step 0, no warm-up"),
    S("f17_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.2, seed=170),
      "post-LN: clip at 0.2: clipped on most steps late in training"),
    S("f17_gpt2_lr_bump", "lr_bump", H, hf("gpt2", lr_steps=((430, 6.0), (490, 1.0)), seed=170),
      "gpt2: LR x6 for steps 430-490, then back"),
    S("f17_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.11, seed=170, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.11"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
