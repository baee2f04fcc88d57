"""A third probe of QK-clip that scales the biases too (``split: "qkclip3"``), fixed after
``qkclip2`` and ``fresh80`` were read and before any rule was changed on them: the held-out
set of that change.

``qkclip2``, read once with round forty-five, left one of its 12 runs whose clip scales the
biases with the weights paged by ``q_bias_refuge`` (tau 3: early in training the bias grew
from zero faster than the clip shrank it, and the breach held past 30 steps). A change chosen
on ``--split read80`` (both probes with it) is read once here: sixteen GPT-2 runs whose clip
scales the biases, at taus at and under qkclip2's smallest (2, 2.5 and 3), twelve at peak
LRs 5e-3 and 1e-2 from an init scale no probe had (0.035) or from the suite's 0.05 with
AdamW's weight decay 0.1 on the matrices (which shrinks W_q and W_k while the biases are not
decayed), and four at peak LR 2e-2 from the smallest inits (0.01 and 0.02: a small W_q makes
a bias a larger share of it; added after the twelve were recorded, before any change was
chosen), all 1,000 steps instead of 800; and four that clip the weights alone (the refuge
expected) at taus 2 to 3.5, all at seeds 1090+. Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="qkclip3"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import Scenario, hf

H = "healthy"
STEPS = 1000
#: the scaled runs' peak LRs, by the tags their names carry
LRS = {"lo": 5e-3, "mid": 1e-2}
#: the scaled runs' init scale and weight decay, by the tags their names carry
INITS: dict[str, dict[str, Any]] = {"i35": {"init_std": 0.035},
                                    "wd": {"init_std": 0.05, "weight_decay": 0.1}}


def _tag(tau: float) -> str:
    """A tau as its name carries it (no dot in a run's name: 2.5 is ``2p5``)."""
    return f"{tau:g}".replace(".", "p")


QKCLIP3: list[Scenario] = [
    *[Scenario(f"q3_gpt2_qk_clip_scaled_t{_tag(tau)}_{lt}_{it}", "qk_clip_scaled", H,
               hf("gpt2", lr=lr, qk_clip=tau, qk_clip_biases=True, steps=STEPS,
                  seed=1090 + i, **init),
               f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k and their biases "
               f"(peak LR {lr:g}, {', '.join(f'{k} {v:g}' for k, v in init.items())})")
      for i, (tau, lt, lr, it, init) in enumerate(
          (t, lt, lr, it, init) for t in (2.0, 2.5, 3.0) for lt, lr in LRS.items()
          for it, init in INITS.items())],
    # the smallest inits (a small W_q makes a bias a larger share of it), added before any
    # change was chosen
    *[Scenario(f"q3_gpt2_qk_clip_scaled_t{tau:g}_hi_i{init * 1000:g}", "qk_clip_scaled", H,
               hf("gpt2", init_std=init, lr=2e-2, qk_clip=tau, qk_clip_biases=True,
                  steps=STEPS, seed=1106 + i),
               f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k and their biases "
               f"(peak LR 0.02, init std {init:g})")
      for i, (tau, init) in enumerate(((2.0, 0.01), (3.0, 0.01), (2.0, 0.02), (3.0, 0.02)))],
    *[Scenario(f"q3_gpt2_qk_clip_s{i}", "qk_clip_bias", H,
               hf("gpt2", init_std=init, lr=lr, qk_clip=tau, steps=STEPS, seed=1102 + i),
               f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k but not their biases "
               f"(peak LR {lr:g}, init std {init:g})", expect_alert="qk_bias_refuge")
      for i, (tau, lr, init) in enumerate(((2.0, 5e-3, 0.035), (2.5, 1e-2, 0.05),
                                          (3.0, 1e-2, 0.035), (3.5, 5e-3, 0.05)))],
]
