"""An eighty-ninth held-out set, initial weights at 1.25x the scale on ``fresh42``'s shapes
(``split: "fresh88"``), fixed before ``fresh87`` is read.

``fresh42``'s 64 shapes at seeds 1270+ (each ``fresh42`` seed plus 850), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, with
each run's initial weight scale (``RunSpec.init_std``) times 1.25 (``fresh69`` went to 1.5
on ``fresh40``, ``fresh61`` to 0.5 on ``fresh42``, ``fresh80`` to 0.75 on ``fresh41``; the
LRs, schedules, optimizers and clipping unchanged): the attention and output logits start
larger and the first hundred steps move further. It is the held-out set for the change after
the one ``fresh87`` holds out (``--split read87``: every run recorded through ``fresh87``).
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh88"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_init
from scenario_specs_fresh42 import FRESH42

#: every run's initial weight scale, times its usual
INIT_SCALE = 1.25

FRESH88: list[Scenario] = on_init(FRESH42, 42, 88, INIT_SCALE, seed_add=850)
