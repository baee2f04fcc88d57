"""An eleventh held-out set, fixed before round nine's rules were replayed on the tenth
(``split: "fresh10"``).

The tenth set (``scenario_specs_fresh9.FRESH9``) is replayed once with round nine's rules
and read: from then on it is tuning data too (``--split read9`` with every set before it).
These runs are the held-out set for every change made after that reading: the earlier sets'
shapes at seeds 100+ and other settings, again with unclipped SGD runs meeting one garbage
batch out of the blue (several kinds, steps and learning rates) beside unclipped SGD blowing
up. Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list
| awk '$3=="fresh10"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, DEMO, L4, RMS, SGD, D, H, S, Scenario, demo, demo_qk, hf

COS: dict[str, Any] = {"min_lr_ratio": 0.1}  # cosine decay to 10% of the peak

FRESH10: list[Scenario] = [
    # == diverging ==============================================================
    S("f10_attn_growth_s100", "fp16_growth", D, demo(seed=100, lr=0.16),
      "fp16 scores, peak LR 0.16"),
    S("f10_attn_growth_l4", "fp16_growth", D, demo(seed=101, lr=0.14, **L4),
      "4 layers, fp16 scores, no QK-norm, peak LR 0.14"),
    S("f10_bf16_high_lr", "wide_growth", D,
      demo(attn_dtype="float32", lr=0.45, seed=100, **BF16), "bf16 autocast, peak LR 0.45"),
    *[S(f"f10_lr_ramp_s{s}", "lr_rewarm", D, demo_qk(lr=lr, warmup=wu, steps=wu, seed=s),
        f"QK-norm, the LR warms up to {lr:g} over {wu} steps")
      for s, lr, wu in ((100, 2.5, 800), (101, 2.0, 600), (102, 3.5, 1000))],
    *[S(f"f10_{fam}_rewarm", "lr_rewarm", D,
        hf(fam, rewarm=(at, n, f), steps=850, seed=100, **kw),
        f"{fam}: a second warm-up to x{f:g} over {n} steps from step {at}")
      for fam, at, n, f, kw in (("llama", 420, 200, 260.0, {}), ("gemma2", 390, 200, 300.0, BF16))],
    *[S(f"f10_{fam}_lr_jump", "lr_jump", D, hf(fam, lr_steps=((at, f),), seed=100, **kw),
        f"{fam}: the LR jumps x{f:g} at step {at}")
      for fam, at, f, kw in (("gpt2", 430, 50.0, {}), ("llama", 410, 45.0, {}))],
    *[S(f"f10_{fam}_sgd_blowup", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=wu, steps=800, seed=100, **SGD),
        f"{fam}: momentum SGD warming up to LR {lr:g} over {wu} steps, no clipping")
      for fam, lr, wu in (("gpt2", 3.2, 450), ("gemma2", 3.3, 500), ("llama", 3.8, 600),
                          ("postln", 3.4, 450))],
    *[S(f"f10_{fam}_head_drift", "logz_drift", D,
        hf(fam, head_drift=(at, rate, None), steps=800, seed=100, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step {at}")
      for fam, at, rate, kw in (("postln", 410, 0.035, {}), ("gpt2", 390, 0.03, COS),
                                ("gemma2", 430, 0.04, {}))],
    S("f10_qknorm_lr_spike", "qknorm_lr_spike", D,
      demo_qk(lr=0.02, warmup=100, lr_steps=((460, 40.0), (520, 1.0)), steps=850, seed=100),
      "QK-norm: the LR x40 for steps 460-520"),
    S("f10_qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.65, seed=100),
      "QK-norm, peak LR 0.65"),
    # == healthy ================================================================
    *[S(f"f10_{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, seed=s, **kw), f"{fam}: {what}")
      for fam, tag, s, what, kw in (
          ("llama", "cosine", 100, "AdamW 3e-3, cosine decay", COS),
          ("gpt2", "rmsprop", 100, "RMSprop 1e-3", RMS),
          ("postln", "bf16", 101, "AdamW 3e-3, bf16", BF16),
          ("gpt2", "sgd", 100, "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("llama", "sgd", 101, "momentum SGD 0.35, no clipping", {"lr": 0.35, **SGD}),
          ("postln", "sgd", 102, "momentum SGD 0.25, no clipping", {"lr": 0.25, **SGD}))],
    *[S(f"f10_{fam}_sgd_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), lr=lr, seed=100, **SGD),
        f"{fam}: momentum SGD {lr:g}, no clipping, one '{kind}' batch at step {at}")
      for fam, kind, at, lr in (("gemma2", "upper", 350, 0.3), ("llama", "random", 410, 0.3),
                                ("gpt2", "zeros", 370, 0.35), ("postln", "random", 330, 0.25),
                                ("gpt2", "shuffle", 450, 0.3))],
    S("f10_llama_sgd_bad_data", "bad_data", H,
      hf("llama", bad_data=((380, 400, "random"),), lr=0.3, seed=101, **SGD),
      "llama: momentum SGD 0.3, no clipping, 20 steps of 'random' batches from step 380"),
    S("f10_demo_plain", "plain", H, demo_qk(seed=100, steps=1000), "QK-norm"),
    *[S(f"f10_{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((at, at + n, kind),), seed=100, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step {at}, then clean data")
      for fam, kind, at, n, kw in (("gpt2", "random", 380, 35, {}),
                                   ("postln", "upper", 410, 30, BF16),
                                   ("gemma2", "zeros", 360, 40, {}))],
    *[S(f"f10_{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=100), f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at in (("llama", "zeros", 420), ("postln", "random", 450))],
    S("f10_gpt2_grad_spikes_clipped", "grad_blip", H,
      hf("gpt2", grad_spikes=((360, 1e4), (500, 1e3)), seed=100),
      "gpt2: one-step gradient spikes x1e4, x1e3, clipped at 1.0"),
    *[S(f"f10_gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}")
      for s, lr, cap in ((100, 0.14, 35.0), (101, 0.16, 45.0))],
    *[S(f"f10_qknorm_lr{int(lr * 100):02d}_s{s}", "qknorm_high_lr_ok", H,
        demo_qk(lr=lr, seed=s, steps=1000), f"QK-norm, peak LR {lr:g}")
      for s, lr in ((100, 0.22), (101, 0.18))],
    *[S(f"f10_{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(at, rate, at + n), seed=100, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps {at}-{at + n}, then stops")
      for fam, at, rate, n, kw in (("gemma2", 310, 0.003, 240, COS),
                                   ("gpt2", 330, 0.003, 250, {}))],
    S("f10_gpt2_qk_clip", "qk_clip_bias", H,
      hf("gpt2", init_std=0.05, lr=1.1e-2, qk_clip=6.0, steps=800, seed=100),
      "gpt2: QK-clip at tau 6 every step on W_q, W_k but not their biases",
      expect_alert="qk_bias_refuge"),
    S("f10_llama_early_transient", "early_transient", H,
      hf("llama", lr=0.012, warmup=1, seed=100), "llama: LR 0.012 from step 0, no warm-up"),
    S("f10_gemma2_late_clipping", "late_clipping", H, hf("gemma2", max_norm=0.25, seed=100),
      "gemma2: clip at 0.25: clipped on most steps late in training"),
    S("f10_gpt2_lr_bump", "lr_bump", H, hf("gpt2", lr_steps=((400, 8.0), (450, 1.0)), seed=100),
      "gpt2: LR x8 for steps 400-450, then back"),
    S("f10_fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.09, seed=100),
      "no QK-norm, fp32 scores, peak LR 0.09"),
]

assert DEMO.steps == 1200  # the demo settings these runs lean on
