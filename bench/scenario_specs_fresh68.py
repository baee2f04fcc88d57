"""A sixty-ninth held-out set, the first whose Adam and AdamW runs use a larger epsilon
(``split: "fresh68"``), fixed before ``fresh67`` is read.

``fresh41``'s 64 shapes at seeds 900+ (each ``fresh41`` seed plus 490), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
every Adam and AdamW run's ``eps`` at 1e-5 instead of 1e-8 (``RunSpec.eps``; the SGD and
RMSprop runs only re-seeded; LRs, schedules and clipping unchanged), as some training
recipes set it for low-precision optimiser state: the update of a parameter whose gradient
is small is damped, so slow logit growth and the step after a spike both move differently.
It is the held-out set for the change after the one ``fresh67`` holds out (``--split
read67``: every run recorded through ``fresh67``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh68"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_optimizers
from scenario_specs_fresh41 import FRESH41

#: every Adam and AdamW run's epsilon (1e-8 in every set before)
EPS = 1e-5

FRESH68: list[Scenario] = on_optimizers(FRESH41, 41, 68, 490, ("adam", "adamw"),
                                        f"Adam eps {EPS:g}", eps=EPS)
