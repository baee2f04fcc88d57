"""A seventieth held-out set, the first whose weights start at a larger scale (``split:
"fresh69"``), fixed after ``fresh68`` was read and before any change is chosen on it.

``fresh40``'s 64 shapes at seeds 910+ (each ``fresh40`` seed plus 510), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh40``, with
each run's initial weight scale (``RunSpec.init_std``) times 1.5 (``fresh61`` halved it;
the LRs, schedules, optimizers and clipping unchanged): the attention and output logits
start larger and the first hundred steps move further. It is the held-out set for the change
after round forty-three (``--split read68``: every run recorded through ``fresh68``). Record
with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh69"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_init
from scenario_specs_fresh40 import FRESH40

#: every run's initial weight scale, times its usual (0.5 in fresh61)
INIT_SCALE = 1.5

FRESH69: list[Scenario] = on_init(FRESH40, 40, 69, INIT_SCALE, seed_add=510)
