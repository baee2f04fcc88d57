"""A nineteenth held-out set, fixed after round sixteen's set was replayed (``split:
"fresh18"``).

Round sixteen was chosen on ``--split read16`` and replayed once on the eighteenth set
(``fresh17``), which is read now: every set before this one is tuning data
(``--split read17``). These runs are the held-out set for the change after round sixteen:
the earlier sets' shapes at seeds 180+ and other settings (other learning rates, families
and garbage-stretch lengths), again with single garbage batches and short garbage stretches
under unclipped SGD (some runs heal, some never come back: labelled as seen), QK-norm LR
ramps, and garbage batches under unclipped adaptive optimisers. Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh18"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH18: list[Scenario] = [
    # == diverging ==============================================================
    S("f18_attn_growth_s180", "fp16_growth", D, demo(seed=180, lr=0.13),
      "fp16 scores, peak LR 0.13"),
    S("f18_attn_growth_l4", "fp16_growth", D, demo(seed=181, lr=0.16, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.16"),
    S("f18_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.6, seed=180),
      "fp32 scores, peak LR 0.6"),
    *[S(f"f18_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((180, 2.9, 740), (181, 3.3, 650), (182, 2.6, 800), (183, 3.0, 700))],
    *[S(f"f18_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=180, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gpt2", 410, 230, 250.0, {}), ("llama", 400, 200, 260.0, BF16))],
    *[S(f"f18_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=180, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 410, 50.0, {}), ("postln", 400, 40.0, BF16))],
    *[S(f"f18_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=180, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("llama", 3.1, 520), ("gpt2", 3.4, 500), ("gemma2", 3.0, 480))],
    *[S(f"f18_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=180, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("llama", 400, 0.03, {}), ("postln", 420, 0.034, COS))],
    S("f18_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((450, 45.0), (510, 1.0)), steps=850, seed=180),
      "QK-norm: the LR x45 for steps 450-510"),
    S("f18_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.8, seed=180),
      "QK-norm, peak LR 0.8"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f18_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 180, "AdamW 3e-3, cosine decay", COS),
          ("gemma2", "rmsprop", 180, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 180, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("postln", "sgd", 180, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("gpt2", "sgd", 181, "momentum SGD 0.45, no clipping", {"lr": 0.45, **SGD}),
          ("llama", "sgd_warm", 180, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("gemma2", "sgd_warm", 181, "momentum SGD warming up to 1.0 over 200 steps, no "
           "clipping", {"lr": 1.0, "warmup": 200, **SGD}))],
    *[S(f"f18_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=180, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "random", 410, 0.35), ("gemma2", "random", 390, 0.3),
                                ("gpt2", "upper", 420, 0.25), ("postln", "zeros", 380, 0.35),
                                ("llama", "zeros", 370, 0.4), ("gemma2", "upper", 430, 0.45),
                                ("gpt2", "zeros", 400, 0.3), ("postln", "upper", 410, 0.3))],
    *[S(f"f18_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=180, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420), ("gemma2", "upper", 390),
                            ("gpt2", "zeros", 410))],
    *[S(f"f18_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=180, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "random", 410), ("gemma2", "upper", 400))],
    *[S(f"f18_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=180, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 400), ("gpt2", "zeros", 420))],
    *[S(f"f18_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=181, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 400, 12), ("llama", 420, 4), ("postln", 390, 16), ("gemma2", 410, 8))],
    S("f18_demo_plain", "plain", H, demo_qk(seed=180, steps=1000), "QK-norm"),
    *[S(f"f18_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=180, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 390, 35, {}),
                                   ("gemma2", "zeros", 410, 30, BF16))],
    *[S(f"f18_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=180), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "upper", 410), ("llama", "random", 420))],
    S("f18_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((400, 1e4), (550, 1e3)), seed=180),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f18_gemma2_softcap_s180", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.14, warmup=280, softcap=25.0, steps=800, seed=180),
      "gemma2: init std 0.1, peak LR 0.14, scores capped at 25"),
    S("f18_qknorm_lr24_s180", "qknorm_high_lr_ok", H, demo_qk(lr=0.24, seed=180, steps=1000),
      "QK-norm, peak LR 0.24"),
    S("f18_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(300, 0.0035, 520), seed=180),
      "gemma2: the LM head grows 0.35%/step for steps 300-520, then stops"),
    S("f18_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=5.0, steps=800, seed=180),
      "gpt2: QK-clip at tau 5 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f18_gpt2_early_transient", "early_transient", H,
      hf("gpt2", lr=0.015, warmup=1, seed=180), "gpt2: LR 0.015 from step 0, no warm-up"),
    S("f18_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.2, seed=180),
      "post-LN: clip at 0.2: clipped on most steps late in training"),
    S("f18_gpt2_lr_bump", "lr_bump", H, hf("gpt2", lr_steps=((420, 5.0), (480, 1.0)), seed=180),
      "gpt2: LR x5 for steps 420-480, then back"),
    S("f18_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.1, seed=180, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.1"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
