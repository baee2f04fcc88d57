"""A fourteenth held-out set, fixed before the thirteenth was replayed with round eleven's
rules (``split: "fresh13"``).

Round eleven was chosen on ``--split read11`` (every set through the twelfth); the
thirteenth (``fresh12``) is its held-out reading, and these runs are the held-out set for the
change after it: the earlier sets' shapes at seeds 130+ and other settings, with unclipped
momentum SGD warming up too far (the blow-ups early in warm-up round eleven is about, and
warm-ups that bump and survive), single garbage batches under unclipped SGD and RMSprop, and
bad-data stretches under unclipped SGD. Record with ``python bench/record_scenarios.py
$(python bench/record_scenarios.py --list | awk '$3=="fresh13"{print $1}')``. None of its runs
may be used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}

FRESH13: list[Scenario] = [
    # == diverging ==============================================================
    S("f13_attn_growth_s130", "fp16_growth", D, demo(seed=130, lr=0.16),
      "fp16 scores, peak LR 0.16"),
    S("f13_attn_growth_l4", "fp16_growth", D, demo(seed=131, lr=0.17, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.17"),
    S("f13_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.5, seed=130),
      "fp32 scores, peak LR 0.5"),
    *[S(f"f13_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((130, 2.5, 750), (131, 2.9, 850))],
    *[S(f"f13_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=130, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 410, 200, 250.0, {}), ("gpt2", 380, 230, 260.0, BF16))],
    *[S(f"f13_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=130, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 430, 55.0, {}), ("postln", 420, 50.0, BF16))],
    *[S(f"f13_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=130, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.0, 440), ("gemma2", 3.5, 520), ("llama", 3.3, 560),
                          ("postln", 3.6, 470))],
    *[S(f"f13_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=130, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("llama", 420, 0.035, {}), ("postln", 400, 0.03, COS))],
    S("f13_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((450, 42.0), (510, 1.0)), steps=850, seed=130),
      "QK-norm: the LR x42 for steps 450-510"),
    S("f13_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.6, seed=130),
      "QK-norm, peak LR 0.6"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f13_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gpt2", "cosine", 130, "AdamW 3e-3, cosine decay", COS),
          ("llama", "rmsprop", 130, "RMSprop 1e-3", RMS),
          ("postln", "rmsprop_unclipped", 130, "RMSprop 1e-3, no clipping", RMS_UNCLIPPED),
          ("postln", "sgd", 130, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd", 131, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("llama", "sgd_warm", 130, "momentum SGD warming up to 0.9 over 150 steps, no "
           "clipping", {"lr": 0.9, "warmup": 150, **SGD}),
          ("gpt2", "sgd_warm", 131, "momentum SGD warming up to 1.0 over 200 steps, no "
           "clipping", {"lr": 1.0, "warmup": 200, **SGD}))],
    *[S(f"f13_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=130, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 390, 0.3), ("gemma2", "random", 350, 0.3),
                                ("postln", "zeros", 420, 0.35), ("gpt2", "upper", 370, 0.3),
                                ("llama", "shuffle", 430, 0.35), ("gpt2", "zeros", 450, 0.25),
                                ("postln", "random", 360, 0.25), ("gemma2", "zeros", 440, 0.35))],
    *[S(f"f13_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=130, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "random", 390), ("gemma2", "zeros", 420))],
    *[S(f"f13_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.3, seed=131, **SGD),
        f"{fam}: momentum SGD 0.3, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("postln", 380, 20), ("gpt2", 400, 15))],
    S("f13_demo_plain", "plain", H, demo_qk(seed=130, steps=1000), "QK-norm"),
    *[S(f"f13_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=130, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gemma2", "random", 380, 35, {}),
                                   ("postln", "zeros", 400, 30, BF16),
                                   ("llama", "upper", 420, 30, {}))],
    *[S(f"f13_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=130), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "random", 440), ("llama", "zeros", 400))],
    S("f13_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((360, 1e3), (520, 1e4)), seed=130),
      "gpt2: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    S("f13_gemma2_softcap_s130", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.14, warmup=300, softcap=35.0, steps=800, seed=130),
      "gemma2: init std 0.1, peak LR 0.14, scores capped at 35"),
    S("f13_qknorm_lr21_s130", "qknorm_high_lr_ok", H, demo_qk(lr=0.21, seed=130, steps=1000),
      "QK-norm, peak LR 0.21"),
    S("f13_gpt2_logz_slow", "logz_drift_slow", H,
      hf("gpt2", head_drift=(310, 0.003, 560), seed=130),
      "gpt2: the LM head grows 0.3%/step for steps 310-560, then stops"),
    S("f13_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.25e-2, qk_clip=6.0, steps=800, seed=130),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f13_llama_early_transient", "early_transient", H,
      hf("llama", lr=0.012, warmup=1, seed=130), "llama: LR 0.012 from step 0, no warm-up"),
    S("f13_gemma2_late_clipping", "late_clipping", H, hf("gemma2", max_norm=0.25, seed=130),
      "gemma2: clip at 0.25: clipped on most steps late in training"),
    S("f13_postln_lr_bump", "lr_bump", H, hf("postln", lr_steps=((400, 8.0), (450, 1.0)), seed=130),
      "post-LN: LR x8 for steps 400-450, then back"),
    S("f13_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.12, seed=130, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.12"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
