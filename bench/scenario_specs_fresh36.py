"""A thirty-seventh held-out set, fixed after round twenty-eight was chosen and ``fresh34``
was replayed with it, before ``fresh35`` was read, so before any later rule change is chosen
(``split: "fresh36"``).

It is the held-out set for a change chosen on every set read before it (``--split read35``,
every run recorded through ``fresh35``). The thirty-sixth set's shapes at seeds 360+ with
other learning rates, steps, garbage-stretch lengths and outlier steps: momentum-SGD runs
that take one garbage batch or a short stretch and heal, next to runs that blow up.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh36"{print $1}')``. None of its runs may be used to choose a rule, a threshold
or a default.
"""



from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak
RMS_UNCLIPPED: dict[str, Any] = {**RMS, "max_norm": None}
ADAM_UNCLIPPED: dict[str, Any] = {"optimizer": "adam", "max_norm": None}

FRESH36: list[Scenario] = [
    # == diverging ==============================================================
    S("f36_attn_growth_s360", "fp16_growth", D, demo(seed=360, lr=0.17),
      "fp16 scores, peak LR 0.17"),
    S("f36_attn_growth_l4", "fp16_growth", D, demo(seed=361, lr=0.15, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.15"),
    S("f36_fp32_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.54, seed=360),
      "fp32 scores, peak LR 0.54"),
    S("f36_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.49, seed=361, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.49"),
    *[S(f"f36_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((360, 3.2, 720), (361, 3.0, 680), (362, 3.4, 740), (363, 2.9, 710))],
    *[S(f"f36_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=360, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("postln", 420, 215, 240.0, {}), ("llama", 410, 230, 250.0, {}))],
    *[S(f"f36_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=360, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gemma2", 405, 50.0, {}), ("llama", 415, 48.0, BF16))],
    *[S(f"f36_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=360, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("postln", 3.2, 525), ("gpt2", 3.0, 515), ("llama", 3.3, 530))],
    *[S(f"f36_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=360, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 415, 0.031, COS), ("postln", 410, 0.032, {}))],
    S("f36_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((420, 48.0), (475, 1.0)), steps=850, seed=360),
      "QK-norm: the LR x48 for steps 420-475"),
    S("f36_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.75, seed=360),
      "QK-norm, peak LR 0.75"),
    # == healthy (some single garbage batches may turn out to diverge: labelled as seen) ==
    *[S(f"f36_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 362, "AdamW 3e-3, cosine decay", COS),
          ("postln", "rmsprop", 362, "RMSprop 1e-3", RMS),
          ("gpt2", "adam_unclipped", 362, "Adam 3e-3, no clipping", ADAM_UNCLIPPED),
          ("llama", "rms_unclipped_hi", 362, "RMSprop 2e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 2e-3}),
          ("gemma2", "rms_unclipped_hi", 363, "RMSprop 1.5e-3, no clipping",
           {**RMS_UNCLIPPED, "lr": 1.5e-3}),
          ("postln", "adam_unclipped_hi", 363, "Adam 6e-3, no clipping",
           {**ADAM_UNCLIPPED, "lr": 6e-3}),
          ("gpt2", "sgd", 362, "momentum SGD 0.4, no clipping", {"lr": 0.4, **SGD}),
          ("llama", "sgd", 363, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "sgd_warm", 362, "momentum SGD warming up to 0.8 over 150 steps, no "
           "clipping", {"lr": 0.8, "warmup": 150, **SGD}),
          ("postln", "sgd_warm", 363, "momentum SGD warming up to 0.9 over 200 steps, no "
           "clipping", {"lr": 0.9, "warmup": 200, **SGD}))],
    *[S(f"f36_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=360, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("llama", "zeros", 420, 0.29), ("gemma2", "upper", 410, 0.3),
                                ("gpt2", "random", 405, 0.31), ("postln", "random", 415, 0.23),
                                ("postln", "upper", 420, 0.25), ("llama", "random", 405, 0.28))],
    *[S(f"f36_{fam}_rms_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=360, **RMS_UNCLIPPED),
        f"{fam}: RMSprop 1e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 420), ("gemma2", "random", 405),
                            ("gpt2", "zeros", 415))],
    *[S(f"f36_{fam}_rmsmom_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=360, **{**RMS_UNCLIPPED, "momentum": 0.9,
                                                             "lr": 3e-4}),
        f"{fam}: RMSprop 3e-4 with momentum 0.9, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 405),)],
    *[S(f"f36_{fam}_adam_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=360, **ADAM_UNCLIPPED),
        f"{fam}: Adam 3e-3, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at in (("gemma2", "random", 405), ("postln", "upper", 415))],
    *[S(f"f36_{fam}_sgd_bad_data_{n}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, "random"),), lr=0.25, seed=361, **SGD),
        f"{fam}: momentum SGD 0.25, no clipping, {n} steps of 'random' batches from step {at}")
      for fam, at, n in (("gpt2", 420, 9), ("llama", 410, 11), ("postln", 405, 10), ("gemma2", 415, 12),
                         ("postln", 420, 7))],
    S("f36_demo_plain", "plain", H, demo_qk(seed=360, steps=1000), "QK-norm"),
    *[S(f"f36_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=360, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("llama", "random", 420, 30, {}),
                                   ("gemma2", "random", 405, 35, {}),
                                   ("postln", "random", 415, 31, {}),
                                   ("gpt2", "upper", 410, 34, BF16))],
    *[S(f"f36_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=360), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "random", 405), ("postln", "upper", 420))],
    S("f36_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((415, 7e3), (505, 6e3)), seed=360),
      "gpt2: one-step gradient spikes x7e3, x6e3 at 415, 505, clipped at 1.0"),
    S("f36_gemma2_softcap_s360", "softcap", H,
      hf("gemma2", init_std=0.1, lr=0.17, warmup=300, softcap=30.0, steps=800, seed=360),
      "gemma2: init std 0.1, peak LR 0.17, scores capped at 30"),
    S("f36_qknorm_lr24_s360", "qknorm_high_lr_ok", H, demo_qk(lr=0.26, seed=360, steps=1000),
      "QK-norm, peak LR 0.26"),
    S("f36_gemma2_logz_slow", "logz_drift_slow", H,
      hf("gemma2", head_drift=(310, 0.0035, 510), seed=360),
      "gemma2: the LM head grows 0.35%/step for steps 310-510, then stops"),
    S("f36_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.3e-2, qk_clip=6.0, steps=800, seed=360),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f36_gemma2_early_transient", "early_transient", H,
      hf("gemma2", lr=0.01, warmup=1, seed=360), "gemma2: LR 0.01 from step 0, no warm-up"),
    S("f36_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=360),
      "llama: clip at 0.25: clipped on most steps late in training"),
    *[S(f"f36_{fam}_lr_bump", "lr_bump", H,
        hf(fam, lr_steps=((at, f), (at + n, 1.0)), seed=360),
        f"{fam}: LR x{f:g} for steps {at}-{at + n}, then back")
      for fam, at, f, n in (("postln", 410, 5.5, 55), ("gpt2", 415, 6.0, 50),
                            ("llama", 405, 6.5, 45))],
    S("f36_bf16_mid_lr", "wide_flat", H,
      demo(attn_dtype="float32", lr=0.14, seed=360, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.14"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
