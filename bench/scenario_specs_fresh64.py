"""A sixty-fifth held-out set, the first whose SGD runs carry momentum 0.95 (``split:
"fresh64"``), fixed before ``fresh62`` is read.

``fresh41``'s 64 shapes at seeds 840+ (each ``fresh41`` seed plus 430), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
every SGD run's momentum raised from 0.9 to 0.95 (``RunSpec.momentum``; the other runs only
re-seeded; the LRs, schedules and clipping unchanged): an SGD step carries more of the
steps before it, so an early warm-up catapults further and a bad batch's kick lasts longer,
the two places where the rules' early SGD pages sit closest to healthy runs. It is the
held-out set for the change after the one ``fresh63`` holds out (``--split read63``: every
run recorded through ``fresh63``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh64"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_optimizers
from scenario_specs_fresh41 import FRESH41

#: every SGD run's momentum (0.9 in every set before)
MOMENTUM = 0.95

FRESH64: list[Scenario] = on_optimizers(FRESH41, 41, 64, 430, ("sgd",),
                                        f"SGD momentum {MOMENTUM}", momentum=MOMENTUM)
