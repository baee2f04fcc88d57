"""A sixtieth held-out set, the first with Adam's second moment averaged over 1,000 steps
(``split: "fresh59"``), fixed before ``fresh58`` was read.

``fresh42``'s 64 shapes at seeds 740+ (each ``fresh42`` seed plus 320), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, with
every Adam and AdamW run's betas (0.9, 0.999) instead of (0.9, 0.95) (``RunSpec.betas``;
the LRs and schedules unchanged; the RMSprop and SGD runs only re-seeded): PyTorch's
default, under which the second moment lags a sudden rise in the gradient longer, so an
update after a quiet stretch can be larger. It is the held-out set for the change after the
one ``fresh58`` holds out (``--split read58``: every run recorded through ``fresh58``).
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh59"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_betas
from scenario_specs_fresh42 import FRESH42

#: Adam's and AdamW's betas in every such run of the set ((0.9, 0.95) in every set before)
BETAS = (0.9, 0.999)

FRESH59: list[Scenario] = on_betas(FRESH42, 42, 59, BETAS, seed_add=320)
