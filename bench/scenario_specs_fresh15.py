"""A sixteenth held-out set, fixed after round thirteen's set was replayed (``split:
"fresh15"``).

Round thirteen was chosen on ``--split read13`` and replayed once on the fifteenth set
(``fresh15``), which is read now. These runs are the held-out set for the change after
round thirteen: the earlier sets' shapes at seeds 150+ and other settings, with more single
garbage batches under unclipped adaptive optimisers (RMSprop with and without momentum,
Adam) beside the same under unclipped SGD, where some runs heal and some never come back
(labelled as seen), and stretches of bad data. Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh15"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH15: list[Scenario] = [
    # == diverging ==============================================================
    S("f15_attn_growth_s150", "fp16_growth", D, demo(seed=150, lr=0.155),
      "fp16 scores, peak LR 0.155"),
    S("f15_attn_growth_l4", "fp16_growth", D, demo(seed=151, lr=0.16, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.16"),
    S("f15_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.55, seed=150),
      "fp32 scores, peak LR 0.55"),
    *[S(f"f15_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((150, 2.7, 800), (151, 3.1, 700))],
    *[S(f"f15_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=150, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("llama", 400, 220, 240.0, {}), ("gemma2", 390, 210, 270.0, BF16))],
    *[S(f"f15_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=150, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gpt2", 440, 60.0, {}), ("llama", 410, 55.0, BF16))],
    *[S(f"f15_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=150, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.2, 480), ("gemma2", 3.4, 500), ("llama", 3.6, 540),
                          ("postln", 3.3, 450))],
    *[S(f"f15_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=150, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gemma2", 410, 0.035, {}), ("gpt2", 420, 0.03, COS))],
    S("f15_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((460, 45.0), (520, 1.0)), steps=850, seed=150),
      "QK-norm: the LR x45 for steps 460-520"),
    S("f15_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.65, seed=150),
      "QK-norm, peak LR 0.65"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f15_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 150, "AdamW 3e-3, cosine decay", COS),
          ("gpt2", "rmsprop", 150, "RMSprop 1e-3", RMS),
          ("gemma2", "adam_unclipped", 150, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "sgd", 150, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gpt2", "sgd", 151, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("postln", "sgd_warm", 150, "momentum SGD warming up to 0.9 over 150 steps, no "
           "clipping", {"lr": 0.9, "warmup": 150, **SGD}),
          ("gemma2", "sgd_warm", 151, "momentum SGD warming up to 1.0 over 200 steps, no "
           "clipping", {"lr": 1.0, "warmup": 200, **SGD}))],
    *[S(f"f15_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=150, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("postln", "random", 390, 0.3), ("gpt2", "zeros", 410, 0.3),
                                ("gemma2", "upper", 370, 0.35), ("llama", "zeros", 440, 0.3),
                                ("postln", "zeros", 360, 0.25), ("gpt2", "random", 450, 0.35))],
    *[S(f"f15_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=150, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("postln", "random", 410), ("gemma2", "random", 380),
                            ("gpt2", "zeros", 420), ("llama", "shuffle", 400))],
    *[S(f"f15_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=150, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 390), ("llama", "zeros", 430))],
    *[S(f"f15_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=150, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "random", 400), ("gemma2", "zeros", 380),
                            ("postln", "upper", 420))],
    *[S(f"f15_{fam}_sgd_bad_data", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.3, seed=151, **SGD),
        f"{fam}: momentum SGD 0.3, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("llama", 390, 20), ("gemma2", 410, 12))],
    S("f15_demo_plain", "plain", H, demo_qk(seed=150, steps=1000), "QK-norm"),
    *[S(f"f15_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=150, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gpt2", "random", 400, 35, {}),
                                   ("llama", "zeros", 380, 30, BF16),
                                   ("postln", "shuffle", 420, 30, {}))],
    *[S(f"f15_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=150), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 430), ("gpt2", "zeros", 390))],
    S("f15_llama_grad_spikes_clipped", "grad_blip", H,
      hf("llama", grad_spikes=((370, 1e3), (530, 1e4)), seed=150),
      "llama: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    S("f15_gemma2_softcap_s150", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.13, warmup=300, softcap=30.0, steps=800, seed=150),
      "gemma2: init std 0.1, peak LR 0.13, scores capped at 30"),
    S("f15_qknorm_lr22_s150", "qknorm_high_lr_ok", H, demo_qk(lr=0.22, seed=150, steps=1000),
      "QK-norm, peak LR 0.22"),
    S("f15_llama_logz_slow", "logz_drift_slow", H,
      hf("llama", head_drift=(320, 0.003, 570), seed=150),
      "llama: the LM head grows 0.3%/step for steps 320-570, then stops"),
    S("f15_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=150),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f15_gpt2_early_transient", "early_transient", H,
      hf("gpt2", lr=0.012, warmup=1, seed=150), "gpt2: LR 0.012 from step 0, no warm-up"),
    S("f15_postln_late_clipping", "late_clipping", H, hf("postln", max_norm=0.25, seed=150),
      "post-LN: clip at 0.25: clipped on most steps late in training"),
    S("f15_llama_lr_bump", "lr_bump", H, hf("llama", lr_steps=((410, 8.0), (460, 1.0)), seed=150),
      "llama: LR x8 for steps 410-460, then back"),
    S("f15_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.11, seed=150, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.11"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
