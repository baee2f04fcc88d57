"""A twenty-fourth held-out set, fixed before the twenty-third was replayed (``split:
"fresh23"``).

Fixed while round nineteen (a wide-dtype departure's loss rise does not count while the loss
wins back a bump) was being chosen on the tuning data (``--split read21``) and before that
change was replayed on the twenty-third set (``fresh22``); it is the held-out set for the
change after it. The earlier sets' shapes at seeds 230+ and other settings (learning rates,
families, garbage-stretch lengths), with more healthy runs whose float32 attention logits
leave their range around a recovered loss bump (garbage stretches and LR bumps under AdamW
and momentum SGD, in Llama, GPT-2 and post-LN), next to runs whose wide-dtype logits run away
while the loss is lost for good. Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh23"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH23: list[Scenario] = [
    # == diverging ==============================================================
    S("f23_attn_growth_s230", "fp16_growth", D, demo(seed=230, lr=0.15),
      "fp16 scores, peak LR 0.15"),
    S("f23_attn_growth_l4", "fp16_growth", D, demo(seed=231, lr=0.17, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.17"),
    S("f23_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.55, seed=230),
      "fp32 scores, peak LR 0.55"),
    S("f23_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.5, seed=231, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.5"),
    *[S(f"f23_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((230, 3.1, 720), (231, 2.8, 680), (232, 3.4, 700), (233, 2.5, 760))],
    *[S(f"f23_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=230, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gpt2", 420, 210, 260.0, {}), ("llama", 390, 240, 230.0, {}))],
    *[S(f"f23_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=230, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("llama", 410, 48.0, {}), ("gpt2", 430, 52.0, BF16))],
    *[S(f"f23_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=230, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("llama", 3.1, 520), ("gpt2", 3.4, 500), ("gemma2", 3.2, 540))],
    *[S(f"f23_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=230, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 400, 0.033, {}), ("gemma2", 420, 0.03, COS))],
    S("f23_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((430, 45.0), (490, 1.0)), steps=850, seed=230),
      "QK-norm: the LR x45 for steps 430-490"),
    S("f23_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.75, seed=230),
      "QK-norm, peak LR 0.75"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f23_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 230, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 230, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 230, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 230, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 231, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 231, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 230, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 231, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 230, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 231, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f23_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=230, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("postln", "random", 400, 0.22), ("gpt2", "random", 420, 0.3),
                                ("llama", "upper", 410, 0.35), ("gemma2", "zeros", 400, 0.25),
                                ("gpt2", "zeros", 390, 0.35), ("llama", "random", 430, 0.3))],
    *[S(f"f23_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=230, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 410), ("gemma2", "random", 400),
                            ("postln", "zeros", 420))],
    *[S(f"f23_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=230, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420),)],
    *[S(f"f23_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=230, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 410), ("postln", "upper", 400))],
    *[S(f"f23_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=231, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("llama", 400, 14), ("llama", 430, 8), ("gpt2", 420, 16), ("postln", 410, 4),
                         ("gemma2", 420, 11))],
    S("f23_demo_plain", "plain", H, demo_qk(seed=230, steps=1000), "QK-norm"),
    *[S(f"f23_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=230, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 400, 25, {}),
                                   ("gpt2", "random", 420, 35, {}),
                                   ("postln", "random", 410, 20, {}),
                                   ("llama", "upper", 390, 30, BF16))],
    *[S(f"f23_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=230), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420), ("postln", "upper", 400))],
    S("f23_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((420, 1e4), (560, 1e3)), seed=230),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    S("f23_gemma2_softcap_s230", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.15, warmup=260, softcap=28.0, steps=800, seed=230),
      "gemma2: init std 0.1, peak LR 0.15, scores capped at 28"),
    S("f23_qknorm_lr24_s230", "qknorm_high_lr_ok", H, demo_qk(lr=0.24, seed=230, steps=1000),
      "QK-norm, peak LR 0.24"),
    S("f23_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(310, 0.0036, 500), seed=230),
      "gemma2: the LM head grows 0.36%/step for steps 310-500, then stops"),
    S("f23_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.4e-2, qk_clip=5.5, steps=800, seed=230),
      "gpt2: QK-clip at tau 5.5 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f23_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=230), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f23_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=230),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f23_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=230),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("llama", 410, 6.0, 50), ("postln", 400, 8.0, 40),
                            ("gpt2", 420, 5.0, 60))],
    S("f23_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.09, seed=230, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.09"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
