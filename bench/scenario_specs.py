"""The scenarios of the alert suite: what each run is meant to show, and its spec.

Each :class:`Scenario` names a mechanism ``group`` (the split is stratified by group and
family; the bench's composition table counts by them), the outcome it was meant to have
(``expect``; the recorded label is measured on the loss, see ``record_scenarios.label``)
and the :class:`~scenario_models.RunSpec` that trains it. Diverging mechanisms: attention-
logit growth to the float16 overflow, slow wide-dtype (fp32/bf16) growth that diverges, LR
re-warm ramps and jumps, an LR spike under QK-norm, SGD blow-ups, output-logit (log Z)
drift, QK-norm at too high a peak LR. Healthy hard negatives (what made earlier defaults cry
wolf): bad-data bumps and single corrupt batches that recover, gradient blips under the
clip and clipped one-step spikes, soft-capped attention with huge raw logits, QK-norm at
high LR, slow log-Z drift that stops, QK-clip with biases (a real pathology while the loss
looks fine: ``expect_alert``), early transients at high LR, clipping on most steps late,
plain runs of every family and optimizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from scenario_models import RunSpec


@dataclass(frozen=True)
class Scenario:
    """One recorded run."""

    name: str
    group: str
    expect: str  # diverging | degraded | healthy: what it was meant to be
    spec: RunSpec
    mechanism: str
    expect_alert: str | None = None  # a rule (or rule family) that should fire on it


#: The demo's unstable setting (``logitwatch.demo.train.SETTINGS``): init std 0.1, AdamW
#: (0.9, 0.95), clip 1.0, a 1000-step warm-up to a very high peak LR 0.2, fp16 scores.
DEMO = RunSpec(family="demo", init_std=0.1, lr=0.2, warmup=1000, attn_dtype="float16",
               steps=1200)
#: The demo's healthy setting: the same with QK-norm.
DEMO_QK = replace(DEMO, qk_norm=True)
#: A 4-layer demo model (d_model 128, 8 heads of 16): less stable at the same LR.
L4: dict[str, Any] = {"n_layer": 4, "d_model": 128, "n_head": 8}


def demo(**kw: Any) -> RunSpec:
    return replace(DEMO, **kw)


def demo_qk(**kw: Any) -> RunSpec:
    return replace(DEMO_QK, **kw)


def hf(family: str, **kw: Any) -> RunSpec:
    """A tiny HF/post-LN model (d_model 64, 2 layers, 4 heads; GQA with 2 key/value heads
    for Llama (SDPA) and Gemma 2 (eager, attention soft-capped at 50)), AdamW at 3e-3 after a
    100-step warm-up, clip 1.0, 700 steps, unless ``kw`` says otherwise."""
    base: dict[str, Any] = {"family": family, "lr": 3e-3, "warmup": 100, "steps": 700}
    if family in ("llama", "gemma2"):
        base["n_kv_head"] = 2
    if family == "llama":
        base["attn_impl"] = "sdpa"
    if family == "gemma2":
        base["softcap"] = 50.0
    return RunSpec(**{**base, **kw})


def as_set(runs: list[Scenario], old: int, new: int, seed_add: int, note: str,
           **spec: Any) -> list[Scenario]:
    """``runs`` (the set ``fresh{old}``) as the set ``fresh{new}``: the same shapes, each seed
    plus ``seed_add``, with ``spec``'s fields changed and ``note`` added to each mechanism;
    names ``f{old}_...`` become ``f{new}_...`` and a trailing seed tag ``_s{old}N`` becomes
    ``_s{new}N``."""
    out = []
    for s in runs:
        name = re.sub(rf"_s{old}(\d)$", rf"_s{new}\1", s.name.replace(f"f{old}_", f"f{new}_", 1))
        out.append(replace(s, name=name, spec=replace(s.spec, seed=s.spec.seed + seed_add, **spec),
                           mechanism=f"{s.mechanism}; {note}"))
    return out


def on_vocabulary(runs: list[Scenario], old: int, new: int, vocab: int,
                  seed_add: int) -> list[Scenario]:
    """:func:`as_set` trained on a byte-level BPE of ``vocab`` tokens (``RunSpec.vocab``)."""
    return as_set(runs, old, new, seed_add, f"BPE vocabulary {vocab}", vocab=vocab)


def on_batch(runs: list[Scenario], old: int, new: int, batch_size: int,
             seed_add: int) -> list[Scenario]:
    """:func:`as_set` trained on batches of ``batch_size`` sequences (``RunSpec.batch_size``;
    the LRs and schedules unchanged)."""
    return as_set(runs, old, new, seed_add, f"batches of {batch_size}", batch_size=batch_size)


def on_depth(runs: list[Scenario], old: int, new: int, n_layer: int,
             seed_add: int, only: int | None = None) -> list[Scenario]:
    """:func:`as_set` with ``n_layer`` transformer blocks (``RunSpec.n_layer``; widths, LRs and
    schedules unchanged); with ``only``, on the runs with that many blocks alone
    (:func:`on_field`)."""
    return on_field(runs, old, new, seed_add, f"{n_layer} layers", "n_layer", n_layer, only)


def on_heads(runs: list[Scenario], old: int, new: int, n_head: int,
             seed_add: int, only: int | None = None) -> list[Scenario]:
    """:func:`as_set` with ``n_head`` attention heads per layer (``RunSpec.n_head``; the model
    width unchanged, so each head narrower; GQA's key/value heads and the LRs unchanged);
    with ``only``, on the runs with that many heads alone (:func:`on_field`)."""
    return on_field(runs, old, new, seed_add, f"{n_head} heads", "n_head", n_head, only)


def on_width(runs: list[Scenario], old: int, new: int, d_model: int,
             seed_add: int, only: int | None = None) -> list[Scenario]:
    """:func:`as_set` with residual width ``d_model`` (``RunSpec.d_model``; the heads as many,
    so each head wider; LRs and schedules unchanged); with ``only``, on the runs of that
    width alone (:func:`on_field`)."""
    return on_field(runs, old, new, seed_add, f"width {d_model}", "d_model", d_model, only)


def on_field(runs: list[Scenario], old: int, new: int, seed_add: int, note: str, field: str,
             value: Any, only: Any = None) -> list[Scenario]:
    """:func:`as_set` with ``RunSpec.<field>`` set to ``value`` (and ``note`` added) on every
    run, or with ``only`` on the runs whose field is ``only`` (the usual shape), the others
    only re-seeded (:func:`per_run`): a demo shape of its own stays as it is."""
    if only is None:
        return as_set(runs, old, new, seed_add, note, **{field: value})
    return per_run(runs, old, new, seed_add, lambda s: None if getattr(s.spec, field) != only
                   else (note, {field: value}))


def per_run(runs: list[Scenario], old: int, new: int, seed_add: int,
            change: Callable[[Scenario], tuple[str, dict[str, Any]] | None]
            ) -> list[Scenario]:
    """:func:`as_set` run by run: ``change(s)`` gives the note and the fields to change on
    run ``s``, or None to leave it as it is but re-seeded."""
    out = []
    for s in runs:
        note, fields = change(s) or ("re-seeded", {})
        out.append(as_set([s], old, new, seed_add, note, **fields)[0])
    return out


def on_init(runs: list[Scenario], old: int, new: int, scale: float,
            seed_add: int) -> list[Scenario]:
    """:func:`as_set` with each run's initial weight scale (``RunSpec.init_std``) times
    ``scale``: its logits start smaller (or larger) and grow from there."""
    return per_run(runs, old, new, seed_add, lambda s: (
        f"init std x{scale:g}", {"init_std": s.spec.init_std * scale}))


def on_clip(runs: list[Scenario], old: int, new: int, scale: float,
            seed_add: int) -> list[Scenario]:
    """:func:`as_set` with each clipped run's gradient-norm threshold (``RunSpec.max_norm``)
    times ``scale``; the unclipped runs (``max_norm`` None) only re-seeded."""
    return per_run(runs, old, new, seed_add, lambda s: None if s.spec.max_norm is None else (
        f"clip x{scale:g}", {"max_norm": s.spec.max_norm * scale}))


def on_warmup(runs: list[Scenario], old: int, new: int, warmup: int, seed_add: int,
              default: int = 100) -> list[Scenario]:
    """:func:`as_set` with every run that warms up over ``default`` steps (``RunSpec.warmup``)
    warming up over ``warmup`` instead; the runs whose warm-up is itself the injected ramp
    (any other length) only re-seeded."""
    return per_run(runs, old, new, seed_add, lambda s: None if s.spec.warmup != default else (
        f"warm-up {warmup} steps", {"warmup": warmup}))


def on_optimizers(runs: list[Scenario], old: int, new: int, seed_add: int,
                  optimizers: tuple[str, ...], note: str, **spec: Any) -> list[Scenario]:
    """:func:`as_set` with ``spec``'s fields changed (and ``note`` added) on the runs of
    ``optimizers`` (``RunSpec.optimizer``) only; the other runs only re-seeded."""
    return per_run(runs, old, new, seed_add,
                   lambda s: (note, spec) if s.spec.optimizer in optimizers else None)


def on_betas(runs: list[Scenario], old: int, new: int, betas: tuple[float, float],
             seed_add: int) -> list[Scenario]:
    """:func:`on_optimizers` with every Adam and AdamW run's ``betas`` set to ``betas``."""
    return on_optimizers(runs, old, new, seed_add, ("adam", "adamw"), f"Adam betas {betas}",
                         betas=betas)


def on_decay(runs: list[Scenario], old: int, new: int, weight_decay: float,
             seed_add: int) -> list[Scenario]:
    """:func:`on_optimizers` with every AdamW run's ``weight_decay`` (on its matrices) set to
    ``weight_decay``, as most transformer training sets it (the other optimizers' decay is
    an L2 term in the gradient: left at 0)."""
    return on_optimizers(runs, old, new, seed_add, ("adamw",),
                         f"AdamW weight decay {weight_decay}", weight_decay=weight_decay)


def on_context(runs: list[Scenario], old: int, new: int, seq_len: int, batch_size: int,
               seed_add: int) -> list[Scenario]:
    """:func:`as_set` trained on sequences of ``seq_len`` tokens in batches of ``batch_size``
    (``RunSpec.seq_len``, ``RunSpec.batch_size``; the LRs and schedules unchanged)."""
    return as_set(runs, old, new, seed_add,
                  f"sequences of {seq_len} tokens, batches of {batch_size}",
                  seq_len=seq_len, batch_size=batch_size)


S = Scenario
D, H, G = "diverging", "healthy", "degraded"
SGD: dict[str, Any] = {"optimizer": "sgd", "max_norm": None}
RMS: dict[str, Any] = {"optimizer": "rmsprop", "momentum": 0.0, "lr": 1e-3}
BF16: dict[str, Any] = {"autocast": "bfloat16"}

SCENARIOS: list[Scenario] = [
    # == diverging ===========================================================================
    # -- attention-logit growth to the float16 overflow (the demo's unstable setting) --------
    *[S(f"attn_growth_s{s}", "fp16_growth", D, demo(seed=s),
        "fp16 scores, no QK-norm, peak LR 0.2: max logits grow past 65504, NaN")
      for s in range(4)],
    S("l4_attn_growth", "fp16_growth", D, demo(**L4),
      "4 layers d 128: fp16 scores, no QK-norm, peak LR 0.2"),
    # -- slow wide-dtype growth that diverges (no overflow possible) -------------------------
    *[S(f"fp32_high_lr_s{s}" if s else "fp32_high_lr", "wide_growth", D,
        demo(attn_dtype="float32", lr=0.4, seed=s),
        "fp32 scores, no QK-norm, peak LR 0.4: logits grow, the loss climbs slowly")
      for s in range(3)],
    *[S(f"bf16_high_lr_s{s}" if s else "bf16_high_lr", "wide_growth", D,
        demo(attn_dtype="float32", lr=0.4, seed=s, **BF16),
        "bf16 autocast, no QK-norm, peak LR 0.4: logits grow, the loss climbs slowly")
      for s in range(3)],
    S("l4_bf16_high_lr", "wide_growth", D, demo(attn_dtype="float32", lr=0.4, **L4, **BF16),
      "4 layers d 128: bf16 autocast, no QK-norm, peak LR 0.4"),
    # -- LR ramps: a (second) warm-up to a too-high LR -------------------------------------
    S("lr_ramp", "lr_rewarm", D, demo_qk(lr=1.5, warmup=1000, steps=1000),
      "QK-norm, the LR warms up to 1.5 over 1000 steps"),
    *[S(f"{fam}_rewarm_s{s}", "lr_rewarm", D,
        hf(fam, rewarm=(400, 300, 300.0), steps=800, seed=s, **kw),
        f"{fam}: trained at 3e-3, then a second warm-up to x300 over 300 steps from step 400")
      for fam, s, kw in (("llama", 0, {}), ("llama", 1, BF16), ("gpt2", 0, {"optimizer": "adam"}),
                         ("gpt2", 1, {}), ("postln", 0, {}), ("gemma2", 0, {}))],
    *[S(f"{fam}_rewarm_rms", "lr_rewarm", D, hf(fam, rewarm=(400, 300, 300.0), steps=800, **RMS),
        f"{fam}: RMSprop at 1e-3, then a second warm-up to x300 over 300 steps from step 400")
      for fam in ("postln", "gpt2")],
    # -- LR jumps -------------------------------------------------------------------------------
    S("lr_jump", "lr_jump", D, demo_qk(lr=0.01, warmup=100, lr_steps=((500, 50.0),), steps=800),
      "QK-norm: the LR jumps x50 at step 500"),
    *[S(f"{fam}_lr_jump_s{s}", "lr_jump", D,
        hf(fam, lr_steps=((400, f),), seed=s, **kw),
        f"{fam}: the LR jumps x{f:g} at step 400")
      for fam, s, f, kw in (("gpt2", 0, 50.0, {}), ("gpt2", 1, 50.0, BF16),
                            ("llama", 0, 50.0, {}), ("llama", 1, 20.0, {"optimizer": "adam"}),
                            ("llama", 2, 30.0, RMS),
                            ("postln", 0, 30.0, {}), ("postln", 1, 50.0, BF16),
                            ("gemma2", 0, 50.0, {}))],
    # -- an LR spike under QK-norm: x30-x60 for 50 steps, the run does not come back --------
    *[S(f"qknorm_lr_spike_s{s}", "qknorm_lr_spike", D,
        demo_qk(lr=0.02, warmup=100, lr_steps=((500, f), (550, 1.0)), steps=800, seed=s),
        f"QK-norm: the LR x{f:g} for steps 500-550")
      for s, f in ((0, 30.0), (1, 60.0), (2, 40.0))],
    # -- SGD blow-ups: momentum SGD without clipping, the gradient norm explodes -------------
    S("grad_spike_sgd", "sgd_blowup", D,
      demo_qk(lr=1.0, warmup=100, eps=1.0, max_norm=None, grad_spikes=((600, 1e4),),
              steps=800),
      "SGD-like AdamW (eps 1), no clipping: a gradient spike x1e4 at step 600"),
    *[S(f"{fam}_sgd_blowup_s{s}", "sgd_blowup", D,
        hf(fam, lr=lr, warmup=500, steps=800, seed=s, **SGD, **kw),
        f"{fam}: momentum SGD warming up to LR {lr:g}, no clipping")
      for fam, s, lr, kw in (("llama", 0, 3.0, {}), ("llama", 1, 3.0, BF16),
                             ("postln", 0, 2.0, {}), ("postln", 1, 2.0, {}),
                             ("gpt2", 0, 1.5, {}), ("gpt2", 1, 1.5, BF16))],
    # -- output-logit (log Z) drift that diverges: the LM head grows 3% a step ---------------
    S("head_drift", "logz_drift", D,
      demo_qk(lr=0.01, warmup=100, head_drift=(300, 0.03, None), steps=900),
      "QK-norm: the LM head grows 3%/step from step 300"),
    *[S(f"{fam}_head_drift_s{s}", "logz_drift", D,
        hf(fam, head_drift=(300, rate, None), steps=800, seed=s, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step from step 300")
      for fam, s, rate, kw in (("llama", 0, 0.03, {}), ("llama", 1, 0.02, BF16),
                               ("gpt2", 0, 0.03, {}), ("postln", 0, 0.03, {}),
                               ("postln", 1, 0.02, BF16))],
    # -- QK-norm at too high a peak LR: diverges late ----------------------------------------
    S("qknorm_high_lr", "qknorm_high_lr", D, demo_qk(lr=0.5, seed=2),
      "QK-norm does not save peak LR 0.5: diverges late"),
    *[S(f"qknorm_high_lr_s{s}", "qknorm_high_lr", D, demo_qk(lr=0.5, seed=s),
        "QK-norm, peak LR 0.5") for s in (0, 1)],
    S("l4_qknorm_lr02", "qknorm_high_lr", D, demo_qk(**L4),
      "4 layers d 128: QK-norm, peak LR 0.2 (the larger model does not survive it)"),
    # == degraded (meant): wide-dtype growth that gives ground back without diverging =========
    *[S(f"fp32_growth_s{s}" if s else "fp32_growth", "wide_growth_slow", G,
        demo(attn_dtype="float32", seed=s), "fp32 scores, no QK-norm, peak LR 0.2")
      for s in (0, 1)],
    *[S(f"bf16_growth_s{s}" if s else "bf16_growth", "wide_growth_slow", G,
        demo(attn_dtype="float32", seed=s, **BF16), "bf16 autocast, no QK-norm, peak LR 0.2")
      for s in (0, 2)],
    *[S(f"{fam}_wide_lr03", "wide_growth_slow", G,
        hf(fam, init_std=0.1, lr=0.3, warmup=600, steps=900, **kw),
        f"{fam}: init std 0.1, peak LR 0.3: the loss drifts back up")
      for fam, kw in (("gpt2", {}), ("llama", {}), ("postln", BF16))],
    # == healthy ==============================================================================
    # -- plain runs of every family and optimizer ------------------------------------------
    *[S(f"healthy_s{s}", "plain", H, demo_qk(seed=s, steps=1000), "QK-norm, peak LR 0.2")
      for s in (0, 1)],
    S("lowlr_noqk", "plain", H, demo(lr=0.01, warmup=200, steps=1000),
      "no QK-norm, fp16 scores, low LR 0.01"),
    *[S(f"{fam}_plain_{tag}", "plain", H, hf(fam, steps=600, **kw), f"{fam}: {what}")
      for fam, tag, what, kw in (
          ("gpt2", "adamw", "AdamW 3e-3", {}),
          ("gpt2", "adam", "Adam 3e-3, L2 decay 0.01", {"optimizer": "adam",
                                                        "weight_decay": 0.01}),
          ("gpt2", "sgd", "momentum SGD to LR 1.0, no clipping",
           {"lr": 1.0, "warmup": 500, **SGD}),
          ("llama", "adamw", "AdamW 3e-3", {}),
          ("llama", "bf16", "AdamW 1e-2, bf16 autocast, eager", {"lr": 1e-2, "attn_impl": "eager",
                                                                 **BF16}),
          ("llama", "rmsprop", "RMSprop 1e-3", RMS),
          ("llama", "sgd", "momentum SGD 0.5, no clipping", {"lr": 0.5, **SGD}),
          ("llama", "mqa", "AdamW 3e-3, one key/value head", {"n_kv_head": 1}),
          ("gpt2", "rmsprop", "RMSprop 1e-3", RMS),
          ("postln", "bf16", "AdamW 3e-3, bf16 autocast", BF16),
          ("postln", "adamw", "AdamW 3e-3", {}),
          ("postln", "sgd", "momentum SGD 0.3, no clipping", {"lr": 0.3, **SGD}),
          ("gemma2", "adamw", "AdamW 1e-2", {"lr": 1e-2}),
          ("gemma2", "bf16", "AdamW 3e-3, bf16 autocast", BF16))],
    # -- bad data: 30-40 steps of corrupted batches, then the loss comes back ---------------
    *[S(f"{fam}_bad_data_{kind}", "bad_data", H,
        hf(fam, bad_data=((400, 400 + n, kind),), seed=s, **kw),
        f"{fam}: {n} steps of '{kind}' batches from step 400, then clean data")
      for fam, kind, n, s, kw in (
          ("llama", "random", 35, 0, {}), ("llama", "zeros", 30, 1, BF16),
          ("gpt2", "random", 40, 0, {}), ("gpt2", "shuffle", 35, 1, {}),
          ("postln", "random", 30, 0, {}), ("postln", "upper", 40, 1, {}),
          ("gemma2", "random", 35, 0, {}), ("gemma2", "shuffle", 30, 1, {}))],
    S("demo_bad_data_random", "bad_data", H,
      demo_qk(lr=0.02, warmup=100, bad_data=((500, 535, "random"),), steps=900),
      "QK-norm: 35 steps of random bytes from step 500"),
    # -- single corrupt batches -----------------------------------------------------------------
    *[S(f"{fam}_outlier_{kind}", "outlier_batch", H,
        hf(fam, bad_data=((at, at + 1, kind),), seed=s, **kw),
        f"{fam}: one '{kind}' batch at step {at}")
      for fam, kind, at, s, kw in (
          ("gpt2", "zeros", 400, 0, {}), ("llama", "zeros", 450, 0, {}),
          ("llama", "random", 350, 1, RMS), ("postln", "zeros", 400, 0, {}),
          ("gemma2", "zeros", 420, 0, {}))],
    S("demo_outlier_zeros", "outlier_batch", H,
      demo_qk(lr=0.02, warmup=100, bad_data=((600, 601, "zeros"),), steps=900),
      "QK-norm: one batch of zero bytes at step 600"),
    # -- gradient blips under the clip, and one-step spikes the clip bounds -----------------
    *[S(f"{fam}_grad_blips", "grad_blip", H,
        hf(fam, grad_blips=tuple((at, f) for at, f in zip(range(250, 700, 60),
                                                          (0.9, 0.95, 0.99, 0.93, 0.97, 0.91,
                                                           0.98, 0.96), strict=False)),
           seed=s, **kw),
        f"{fam}: the gradient norm pushed to 0.9-0.99 x max_norm every 60 steps")
      for fam, s, kw in (("llama", 0, {}), ("gpt2", 0, {}), ("postln", 1, BF16),
                         ("gemma2", 0, {}))],
    S("grad_spike_clipped", "grad_blip", H,
      demo_qk(lr=0.02, warmup=100, grad_spikes=((600, 1e4),), steps=900),
      "QK-norm: a gradient spike x1e4 at step 600, clipped at 1.0"),
    *[S(f"{fam}_grad_spikes_clipped", "grad_blip", H,
        hf(fam, grad_spikes=((300, 1e3), (450, 1e4), (600, 3e2)), **kw),
        f"{fam}: one-step gradient spikes x300-x1e4 at steps 300, 450, 600, clipped at 1.0")
      for fam, kw in (("llama", {}), ("gpt2", {"optimizer": "adam"}))],
    # -- soft-capped attention with huge raw logits (Gemma 2, cap c*tanh(x/c)) ---------------
    *[S(f"gemma2_softcap_s{s}", "softcap", H,
        hf("gemma2", init_std=0.1, lr=lr, warmup=300, softcap=cap, steps=800, seed=s, **kw),
        f"gemma2: init std 0.1, peak LR {lr:g}, scores capped at {cap:g}: raw logits run far "
        "past the cap")
      for s, lr, cap, kw in ((0, 0.1, 50.0, {}), (1, 0.1, 20.0, {}), (2, 0.3, 30.0, BF16),
                             (3, 0.2, 50.0, {}))],
    # -- QK-norm at a high LR that stays healthy ---------------------------------------------
    S("qknorm_lr03", "qknorm_high_lr_ok", H, demo_qk(lr=0.3, seed=2, steps=1000),
      "QK-norm, peak LR 0.3"),
    *[S(f"qknorm_lr03_s{s}", "qknorm_high_lr_ok", H, demo_qk(lr=0.3, seed=s, steps=1000),
        "QK-norm, peak LR 0.3") for s in (3, 4)],
    S("l4_qknorm_lr01", "qknorm_high_lr_ok", H, demo_qk(lr=0.1, steps=800, **L4),
      "4 layers d 128: QK-norm, peak LR 0.1"),
    # -- slow log-Z drift that stops (the output logits scale up 0.2-0.4%/step for a while) --
    *[S(f"{fam}_logz_slow", "logz_drift_slow", H,
        hf(fam, head_drift=(250, rate, 550), seed=s, **kw),
        f"{fam}: the LM head grows {100 * rate:g}%/step for steps 250-550, then stops")
      for fam, rate, s, kw in (("llama", 0.002, 0, {}), ("gpt2", 0.003, 0, {}),
                               ("postln", 0.002, 1, {}))],
    S("demo_logz_slow", "logz_drift_slow", H,
      demo_qk(lr=0.01, warmup=100, head_drift=(300, 0.002, 650), steps=900),
      "QK-norm: the LM head grows 0.2%/step for steps 300-650, then stops"),
    # -- QK-clip with biases: the weights shrink, the unclipped biases grow ----------------------
    *[S(f"gpt2_qk_clip_s{s}", "qk_clip_bias", H,
        hf("gpt2", init_std=0.05, lr=lr, qk_clip=tau, steps=800, seed=s),
        f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k but not their biases "
        f"(peak LR {lr:g})", expect_alert="qk_bias_refuge")
      for s, lr, tau in ((0, 1e-2, 5.0), (1, 1e-2, 8.0), (2, 3e-2, 5.0), (3, 3e-3, 4.0))],
    # -- early transients at a high LR without warm-up that settle --------------------------
    *[S(f"{fam}_early_transient", "early_transient", H, hf(fam, lr=lr, warmup=1, **kw),
        f"{fam}: LR {lr:g} from step 0, no warm-up")
      for fam, lr, kw in (("llama", 0.02, {}), ("gpt2", 0.03, {}), ("postln", 0.01, BF16))],
    # -- late clipping on most steps -----------------------------------------------------------
    *[S(f"{fam}_late_clipping", "late_clipping", H, hf(fam, max_norm=mn, **kw),
        f"{fam}: clip at {mn:g}: clipped on most steps late in training")
      for fam, mn, kw in (("llama", 0.5, {}), ("gpt2", 0.5, {}), ("postln", 0.3, {}),
                          ("gemma2", 0.3, {}))],
    # -- an LR bump that recovers -----------------------------------------------------------
    S("benign_bump", "lr_bump", H,
      demo_qk(lr=0.02, warmup=100, lr_steps=((500, 8.0), (540, 1.0)), steps=900),
      "QK-norm: LR x8 for steps 500-540, then back: a bump that recovers"),
    S("llama_lr_bump", "lr_bump", H, hf("llama", lr_steps=((400, 10.0), (430, 1.0))),
      "llama: LR x10 for steps 400-430, then back"),
    # -- wide-dtype attention with high but flat logits ----------------------------------------
    S("fp32_high_flat", "wide_flat", H, demo(attn_dtype="float32", lr=0.03, warmup=200,
                                             steps=1000),
      "no QK-norm, fp32 scores, moderate LR: logits high, flat"),
    S("fp32_mid_lr", "wide_flat", H, demo(attn_dtype="float32", lr=0.1),
      "no QK-norm, fp32 scores, peak LR 0.1"),
    S("bf16_mid_lr_s1", "wide_flat", H, demo(attn_dtype="float32", lr=0.1, seed=1, **BF16),
      "no QK-norm, bf16 autocast, peak LR 0.1"),
]
