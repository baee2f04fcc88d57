"""A sixty-fourth held-out set, the first whose runs warm up over twice the steps (``split:
"fresh63"``), fixed before ``fresh61`` is read.

``fresh42``'s 64 shapes at seeds 820+ (each ``fresh42`` seed plus 400), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, with
every run that warms up over the usual 100 steps warming up over 200 (``RunSpec.warmup``;
the runs whose warm-up is itself the injected ramp, and the peak LRs, schedules and
optimizers, unchanged): the early growth of the logits and of the gradient norm, which the
rules must not page, stretches over more steps, and the injections that land in the first
200 steps start from a lower LR. It is the held-out set for the change after the one
``fresh62`` holds out (``--split read62``: every run recorded through ``fresh62``). Record
with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh63"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_warmup
from scenario_specs_fresh42 import FRESH42

#: the warm-up of every run that warms up over the usual 100 steps (100 in every set before)
WARMUP = 200

FRESH63: list[Scenario] = on_warmup(FRESH42, 42, 63, WARMUP, seed_add=400)
