"""The held-out set of the change ``long1`` prompted (``split: "long2"``): long runs again,
fixed and recorded before that change was chosen, and read once after it.

``long1`` showed a gap: a second warm-up begun late, from an LR the cosine had already
decayed to a quarter of its peak, ramps x25 in 50 steps without a tenfold step between two
steps and diverges before it is ten times the settled peak, so neither the LR rules nor
the loss-ramp rules (an LR climbing at most 4x over 50 steps) page it before it diverges.
These six runs, 4,000 steps each with ``long1``'s schedule (300 warm-up steps, cosine to
0.1x, weight decay 0.1, clip 1.0), hold out whatever is chosen for it: two late ramps to
x200-x300 on other families and steps, two late re-warms only back to about the peak
(what continued training does: the hard negatives of such a change), a late step bump x8
for 50 steps from the decayed LR, and a plain Gemma-2 run. Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="long2"{print $1}')``. None of its runs may be used to choose a rule, a threshold or a
default.
"""

from __future__ import annotations

from scenario_specs import BF16, Scenario, hf
from scenario_specs_long1 import LONG

D, H = "diverging", "healthy"

LONG2: list[Scenario] = [
    Scenario("long2_llama_rewarm", "lr_rewarm", D,
             hf("llama", seed=610, rewarm=(2500, 300, 300.0), **LONG),
             "llama: 4,000 steps, cosine; a second warm-up to x300 over 300 steps from 2,500"),
    Scenario("long2_postln_rewarm", "lr_rewarm", D,
             hf("postln", seed=611, rewarm=(3500, 200, 200.0), **LONG),
             "post-LN: 4,000 steps, cosine; a second warm-up to x200 over 200 steps from "
             "3,500"),
    Scenario("long2_gpt2_rewarm_peak", "lr_rewarm", H,
             hf("gpt2", seed=612, rewarm=(3000, 200, 4.0), **LONG),
             "gpt2: 4,000 steps, cosine; re-warmed x4 (about the peak) over 200 steps from "
             "3,000"),
    Scenario("long2_llama_rewarm_peak", "lr_rewarm", H,
             hf("llama", seed=613, rewarm=(2500, 100, 3.0), **BF16, **LONG),
             "llama bf16: 4,000 steps, cosine; re-warmed x3 (about the peak) over 100 steps "
             "from 2,500"),
    Scenario("long2_gpt2_lr_bump", "lr_bump", H,
             hf("gpt2", seed=614, lr_steps=((3000, 8.0), (3050, 1.0)), **LONG),
             "gpt2: 4,000 steps, cosine; the LR x8 for steps 3,000-3,050, then back"),
    Scenario("long2_gemma2_cosine", "plain", H, hf("gemma2", seed=615, **LONG),
             "gemma2: 4,000 steps, cosine to 0.1x, weight decay 0.1"),
]
