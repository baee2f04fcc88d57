"""A fourth held-out set, fixed before round four (``split: "fresh3"``).

The third set (``scenario_specs_fresh2.FRESH2``) was replayed after round three and read:
from then on it is tuning data too. These runs are the held-out set for every change made
after that reading. Same mechanisms, seeds 30+, new settings: LM-head drift at other rates
and under cosine decays on every family (the one miss of round three, at wide intervals),
warm-ups ramping to other peaks over other lengths, LR jumps and re-warms at other steps,
SGD blow-ups with other warm-ups, bad data of other kinds and lengths, QK-norm healthy at
peak LR 0.2-0.3 with other seeds, soft-capped Gemma 2 at other caps. Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh3"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH3: list[Scenario] = [
    # == diverging =================================================================================
    S("f3_attn_growth_s30", "fp16_growth", D, demo(seed=30, lr=0.22), "fp16 scores, peak LR 0.22"),
    S("f3_attn_growth_l4", "fp16_growth", D, demo(seed=31, lr=0.12, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.12"),
    S("f3_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.45, seed=30, **BF16), "bf16 autocast, peak LR 0.45"),
    *[S(f"f3_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((30, 1.4, 900), (31, 3.0, 1000))],
    *[S(f"f3_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=30, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("gemma2", 420, 200, 300.0, {}), ("llama", 380, 300, 200.0, BF16))],
    *[S(f"f3_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=30, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("postln", 430, 45.0, {}), ("llama", 470, 35.0, {}),
                             ("gpt2", 390, 50.0, BF16))],
    *[S(f"f3_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=30, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.0, 200), ("llama", 5.0, 500), ("postln", 4.0, 300))],
    *[S(f"f3_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=30, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("gpt2", 350, 0.04, COS), ("llama", 420, 0.045, COS),
                                ("postln", 380, 0.035, COS), ("gemma2", 400, 0.03, {}))],
    S("f3_demo_head_drift", "logz_drift", D,
      demo_qk(lr=0.01, warmup=100, head_drift=(450, 0.04, None), steps=900, seed=30, **COS),
      "QK-norm, cosine: the LM head grows 4%/step from step 450"),
    S("f3_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((480, 40.0), (540, 1.0)), steps=850, seed=30),
      "QK-norm: the LR x40 for steps 480-540"),
    S("f3_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.55, seed=30), "QK-norm, peak LR 0.55"),
    # == healthy ====================================================================================
    *[S(f"f3_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("gemma2", "cosine", 30, "AdamW 3e-3, cosine decay", COS),
          ("llama", "rmsprop", 30, "RMSprop 1e-3", RMS),
          ("gpt2", "bf16", 31, "AdamW 3e-3, bf16", BF16),
          ("postln", "sgd", 30, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}))],
    S("f3_demo_plain", "plain", H, demo_qk(seed=30, steps=1000, **COS), "QK-norm, cosine"),
    *[S(f"f3_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=30, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("postln", "zeros", 400, 35, {}), ("gemma2", "random", 380, 25, {}),
                                   ("llama", "upper", 420, 40, BF16), ("gpt2", "shuffle", 360, 30, {}))],
    *[S(f"f3_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=30), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("gpt2", "zeros", 440), ("postln", "random", 410))],
    S("f3_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((280, 1e3), (520, 1e4)), seed=30),
      "gpt2: one-step gradient spikes x1e3, x1e4, clipped at 1.0"),
    *[S(f"f3_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((30, 0.15, 25.0), (31, 0.1, 60.0))],
    *[S(f"f3_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((30, 0.3), (31, 0.2))],
    *[S(f"f3_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(300, rate, 550), seed=30, **COS),
        f"{fam}, cosine: the LM head grows {100 * rate:g}%/step for steps 300-550, then stops")
      for fam, rate in (("llama", 0.003), ("gemma2", 0.0025))],
    S("f3_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1e-2, qk_clip=5.0, steps=800, seed=30),
      "gpt2: QK-clip at tau 5 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f3_postln_early_transient", "early_transient", H, hf("postln", lr=0.015, warmup=1, seed=30),
      "post-LN: LR 0.015 from step 0, no warm-up"),
    S("f3_llama_late_clipping", "late_clipping", H, hf("llama", max_norm=0.25, seed=30),
      "llama: clip at 0.25: clipped on most steps late in training"),
    S("f3_gemma2_lr_bump", "lr_bump", H, hf("gemma2", lr_steps=((400, 10.0), (440, 1.0)), seed=30),
      "gemma2: LR x10 for steps 400-440, then back"),
    S("f3_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.08, seed=30),
      "no QK-norm, fp32 scores, peak LR 0.08"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
