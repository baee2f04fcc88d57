"""A second probe of QK-clip that scales the biases too (``split: "qkclip2"``), fixed after
``qkclip1`` was read and before any rule was changed on it: the held-out set of that change.

``qkclip1``, read once with round forty-four, found ``q_bias_refuge`` warning on 5 of its 12
runs whose clip scales the biases with the weights (nothing to warn of there). A change chosen
on ``qkclip1`` (with every QK-clip run of ``--split read78``) is read once here: twelve GPT-2
runs whose clip scales the biases, at taus and peak LRs no run recorded before has (taus 3, 7
and 10; LRs 5e-3 and 2e-2), from the suite's init scale (0.05) and HF GPT-2's (0.02); and
four that clip the weights alone (the refuge expected), all at seeds 1040+. Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="qkclip2"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, hf

H = "healthy"
#: the scaled runs' peak LRs and init scales, by the tags their names carry
LRS = {"lo": 5e-3, "hi": 2e-2}
INITS = {"i2": 0.02, "i5": 0.05}

QKCLIP2: list[Scenario] = [
    *[Scenario(f"q2_gpt2_qk_clip_scaled_t{tau:g}_{lt}_{it}", "qk_clip_scaled", H,
               hf("gpt2", init_std=init, lr=lr, qk_clip=tau, qk_clip_biases=True, steps=800,
                  seed=1040 + i),
               f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k and their biases "
               f"(peak LR {lr:g}, init std {init:g})")
      for i, (tau, lt, lr, it, init) in enumerate(
          (t, lt, lr, it, init) for t in (3.0, 7.0, 10.0) for lt, lr in LRS.items()
          for it, init in INITS.items())],
    *[Scenario(f"q2_gpt2_qk_clip_s{i}", "qk_clip_bias", H,
               hf("gpt2", init_std=init, lr=lr, qk_clip=tau, steps=800, seed=1052 + i),
               f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k but not their biases "
               f"(peak LR {lr:g}, init std {init:g})", expect_alert="qk_bias_refuge")
      for i, (tau, lr, init) in enumerate(((3.0, 5e-3, 0.02), (7.0, 2e-2, 0.05),
                                          (10.0, 2e-2, 0.02), (5.0, 1.3e-2, 0.05)))],
]
