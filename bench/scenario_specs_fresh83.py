"""An eighty-fourth held-out set, warm-ups of 150 steps on ``fresh41``'s shapes (``split:
"fresh83"``), fixed before ``fresh82`` is read.

``fresh41``'s 64 shapes at seeds 1180+ (each ``fresh41`` seed plus 770), with every run that
warms up over the usual 100 steps warming up over 150 instead (``RunSpec.warmup``; the runs
whose warm-up is itself the injected ramp only re-seeded; ``fresh63`` went to 200 on
``fresh42``, ``fresh70`` to 50 on ``fresh40``): the LR climbs more slowly and reaches its
peak later, so warm-up spikes, clipping and the loss's descent come at other steps. It is
the held-out set for the change after the one ``fresh82`` holds out (``--split read82``:
every run recorded through ``fresh82``). Record with ``python bench/record_scenarios.py
$(python bench/record_scenarios.py --list | awk '$3=="fresh83"{print $1}')``. None of its
runs may be used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_warmup
from scenario_specs_fresh41 import FRESH41

#: the warm-up of every run that warms up over the usual 100 steps (100 in every set before,
#: 200 in fresh63, 50 in fresh70)
WARMUP = 150

FRESH83: list[Scenario] = on_warmup(FRESH41, 41, 83, WARMUP, seed_add=770)
