"""A seventy-eighth held-out set, the first whose SGD runs carry momentum 0.8 (``split:
"fresh77"``), fixed before ``fresh76`` is read.

``fresh40``'s 64 shapes at seeds 990+ (each ``fresh40`` seed plus 590), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh40``, with
every SGD run's momentum lowered from 0.9 to 0.8 (``RunSpec.momentum``; the other runs only
re-seeded; the LRs, schedules and clipping unchanged; ``fresh64`` raised it to 0.95 on
``fresh41``): an SGD step carries less of the steps before it, so the effective step is
half as long, a warm-up reaches its instability later and a bad batch's kick fades sooner.
It is the held-out set for the change after the one ``fresh76`` holds out (``--split
read76``: every run recorded through ``fresh76``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh77"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_optimizers
from scenario_specs_fresh40 import FRESH40

#: every SGD run's momentum (0.9 in every set before but ``fresh64``'s 0.95)
MOMENTUM = 0.8

FRESH77: list[Scenario] = on_optimizers(FRESH40, 40, 77, 590, ("sgd",),
                                        f"SGD momentum {MOMENTUM}", momentum=MOMENTUM)
