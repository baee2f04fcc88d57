"""A sixty-second held-out set, the first whose weights start at half the scale (``split:
"fresh61"``), fixed before ``fresh60`` was read.

``fresh42``'s 64 shapes at seeds 780+ (each ``fresh42`` seed plus 360), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, with
every run's initial weight scale halved (``RunSpec.init_std``: 0.01 for the HF and post-LN
models, 0.05 for the demo's; the LRs, schedules and optimizers unchanged): attention and
output logits start smaller and settle on a lower early baseline, against which the rules
that read a departure from the run's own range judge their growth. It is the held-out set
for the change after the one ``fresh60`` holds out (``--split read60``: every run recorded
through ``fresh60``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh61"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_init
from scenario_specs_fresh42 import FRESH42

#: each run's initial weight scale, times this (1 in every set before)
INIT_SCALE = 0.5

FRESH61: list[Scenario] = on_init(FRESH42, 42, 61, INIT_SCALE, seed_add=360)
