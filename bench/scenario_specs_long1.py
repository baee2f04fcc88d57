"""A probe of long runs (``split: "long1"``), fixed before it was read, with round
thirty-five's rules and no change made for it.

Every other recorded run is 600-1,200 steps long; a user's run is tens of thousands. These
four train 4,000 steps with what long runs do and short ones do not: a cosine decay to a
tenth of the peak LR, weight decay 0.1, the loss flattening for thousands of steps (the
loss rules' best-so-far levels age that long), and a late event: a bad-data bump at step
2,500 that heals (healthy) or a second warm-up to x300 from step 3,000 (diverging). Record
with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="long1"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from typing import Any

from scenario_specs import BF16, Scenario, hf

D, H = "diverging", "healthy"
#: a long run's schedule: 300 warm-up steps, cosine to 0.1 x peak at step 4,000, AdamW with
#: weight decay 0.1, clip 1.0
LONG: dict[str, Any] = {"lr": 3e-3, "warmup": 300, "min_lr_ratio": 0.1, "weight_decay": 0.1,
                        "steps": 4000}

LONG1: list[Scenario] = [
    Scenario("long_gpt2_cosine", "plain", H, hf("gpt2", seed=600, **LONG),
             "gpt2: 4,000 steps, cosine to 0.1x, weight decay 0.1"),
    Scenario("long_postln_cosine", "plain", H, hf("postln", seed=601, **LONG),
             "post-LN: 4,000 steps, cosine to 0.1x, weight decay 0.1"),
    Scenario("long_llama_bf16_bad_data", "bad_data", H,
             hf("llama", seed=602, bad_data=((2500, 2535, "random"),), **BF16, **LONG),
             "llama bf16: 4,000 steps, cosine; 35 steps of random bytes from step 2,500"),
    Scenario("long_gpt2_rewarm", "lr_rewarm", D,
             hf("gpt2", seed=603, rewarm=(3000, 300, 300.0), **LONG),
             "gpt2: 4,000 steps, cosine; a second warm-up to x300 over 300 steps from 3,000"),
]
