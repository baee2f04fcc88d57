"""A probe of QK-clip that scales the biases too (``split: "qkclip1"``), fixed before it was
read, with round forty-four's rules and no change made for it.

Every QK-clip run recorded before clips W_q and W_k alone, leaving their biases: the logit's
magnitude moves into the bias path, the pathology ``q_bias_refuge`` / ``k_bias_refuge``
warn of (a warning that is meant, while the loss looks fine). The remedy, and what the
project's own QK-clip fuse does, scales each clipped head's q and k biases by the same
factor as its weights (``RunSpec.qk_clip_biases``): the weights still shrink, the logit has
no bias path left, and nothing is wrong. Twelve GPT-2 runs clip that way at four taus and
three peak LRs (healthy, nothing to warn of: a refuge warning there is a false alarm), and
four clip the weights alone at the taus and LRs of the suite's first QK-clip runs (the
refuge expected), all at seeds 1020+. Record with ``python bench/record_scenarios.py
$(python bench/record_scenarios.py --list | awk '$3=="qkclip1"{print $1}')``. None of its
runs may be used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, hf

H = "healthy"
#: the scaled runs' peak LRs, by the tag their names carry
LRS = {"lo": 3e-3, "mid": 1.3e-2, "hi": 3e-2}

QKCLIP1: list[Scenario] = [
    *[Scenario(f"q1_gpt2_qk_clip_scaled_t{tau:g}_{tag}", "qk_clip_scaled", H,
               hf("gpt2", init_std=0.05, lr=lr, qk_clip=tau, qk_clip_biases=True, steps=800,
                  seed=1020 + i),
               f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k and their biases "
               f"(peak LR {lr:g})")
      for i, (tau, tag, lr) in enumerate((t, tag, lr) for t in (4.0, 5.0, 6.0, 8.0)
                                         for tag, lr in LRS.items())],
    *[Scenario(f"q1_gpt2_qk_clip_s{i}", "qk_clip_bias", H,
               hf("gpt2", init_std=0.05, lr=lr, qk_clip=tau, steps=800, seed=1032 + i),
               f"gpt2: QK-clip at tau {tau:g} every step on W_q, W_k but not their biases "
               f"(peak LR {lr:g})", expect_alert="qk_bias_refuge")
      for i, (lr, tau) in enumerate(((1e-2, 5.0), (1e-2, 8.0), (3e-2, 5.0), (3e-3, 4.0)))],
]
