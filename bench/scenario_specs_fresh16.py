"""A seventeenth held-out set, fixed after round fourteen's set was replayed (``split:
"fresh16"``).

Round fourteen was chosen on ``--split read14`` and replayed once on the sixteenth set
(``fresh15``), which is read now: every set before this one is tuning data
(``--split read15``). These runs are the held-out set for the change after round fourteen:
the earlier sets' shapes at seeds 160+ and other settings, with more single garbage batches
under unclipped SGD at several learning rates (some runs heal, some never come back:
labelled as seen), more QK-norm LR ramps whose loss may run away before the gradient
leads, and garbage batches under unclipped adaptive optimisers. Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh16"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH16: list[Scenario] = [
    # == diverging ==============================================================
    S("f16_attn_growth_s160", "fp16_growth", D, demo(seed=160, lr=0.15),
      "fp16 scores, peak LR 0.15"),
    S("f16_attn_growth_l4", "fp16_growth", D, demo(seed=161, lr=0.165, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.165"),
    S("f16_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.6, seed=160),
      "fp32 scores, peak LR 0.6"),
    *[S(f"f16_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((160, 2.6, 800), (161, 3.0, 700), (162, 3.3, 650), (163, 2.9, 750))],
    *[S(f"f16_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=160, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gpt2", 410, 230, 250.0, {}), ("postln", 380, 200, 260.0, BF16))],
    *[S(f"f16_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=160, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 430, 60.0, {}), ("postln", 400, 50.0, BF16))],
    *[S(f"f16_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=160, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.0, 500), ("llama", 3.4, 520), ("postln", 3.5, 480))],
    *[S(f"f16_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=160, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("llama", 400, 0.035, {}), ("postln", 430, 0.03, COS))],
    S("f16_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((440, 50.0), (500, 1.0)), steps=850, seed=160),
      "QK-norm: the LR x50 for steps 440-500"),
    S("f16_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.7, seed=160),
      "QK-norm, peak LR 0.7"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f16_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gpt2", "cosine", 160, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 160, "RMSprop 1e-3", RMS),
          ("llama", "adam_unclipped", 160, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("gemma2", "sgd", 160, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("llama", "sgd", 161, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("gpt2", "sgd_warm", 160, "momentum SGD warming up to 0.9 over 150 steps, no "
           "clipping", {"lr": 0.9, "warmup": 150, **SGD}),
          ("llama", "sgd_warm", 161, "momentum SGD warming up to 1.0 over 200 steps, no "
           "clipping", {"lr": 1.0, "warmup": 200, **SGD}))],
    *[S(f"f16_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=160, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("gpt2", "random", 400, 0.3), ("llama", "random", 420, 0.25),
                                ("postln", "upper", 380, 0.3), ("gemma2", "zeros", 430, 0.3),
                                ("gpt2", "upper", 360, 0.4), ("llama", "zeros", 450, 0.35),
                                ("postln", "random", 410, 0.2), ("gemma2", "random", 390, 0.4))],
    *[S(f"f16_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=160, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 400), ("gpt2", "upper", 390),
                            ("gemma2", "zeros", 420))],
    *[S(f"f16_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=160, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "random", 410), ("gemma2", "upper", 380))],
    *[S(f"f16_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=160, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420), ("gpt2", "zeros", 400))],
    *[S(f"f16_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.3, seed=161, **SGD),
        f"{fam}: momentum SGD 0.3, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 400, 15), ("postln", 380, 25))],
    S("f16_demo_plain", "plain", H, demo_qk(seed=160, steps=1000), "QK-norm"),
    *[S(f"f16_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=160, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 410, 30, {}),
                                   ("gemma2", "zeros", 390, 35, BF16))],
    *[S(f"f16_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=160), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "upper", 420), ("postln", "random", 400))],
    S("f16_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((370, 1e3), (530, 1e4)), seed=160),
      "gpt2: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    S("f16_gemma2_softcap_s160", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.13, warmup=300, softcap=30.0, steps=800, seed=160),
      "gemma2: init std 0.1, peak LR 0.13, scores capped at 30"),
    S("f16_qknorm_lr22_s160", "qknorm_high_lr_ok", H, demo_qk(lr=0.22, seed=160, steps=1000),
      "QK-norm, peak LR 0.22"),
    S("f16_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(320, 0.003, 570), seed=160),
      "gemma2: the LM head grows 0.3%/step for steps 320-570, then stops"),
    S("f16_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=160),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f16_gpt2_early_transient", "early_transient", H,
      hf("gpt2", lr=0.012, warmup=1, seed=160), "gpt2: LR 0.012 from step 0, no warm-up"),
    S("f16_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.25, seed=160),
      "post-LN: clip at 0.25: clipped on most steps late in training"),
    S("f16_gpt2_lr_bump", "lr_bump", H, hf("gpt2", lr_steps=((410, 8.0), (460, 1.0)), seed=160),
      "gpt2: LR x8 for steps 410-460, then back"),
    S("f16_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.12, seed=160, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.12"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
