"""A sixty-sixth held-out set, the first on larger batches (``split: "fresh65"``), fixed
before ``fresh63`` is read.

``fresh40``'s 64 shapes at seeds 850+ (each ``fresh40`` seed plus 450), on the corpus's
bytes in 2 layers of 4 heads as ``fresh40``, with batches of 24 sequences of 64 tokens
instead of 16 (``RunSpec.batch_size``; the LRs, schedules, clipping and optimizers
unchanged): each step's loss and gradient are quieter than in any set before, so the loss
margins the departure's escalation and the downgrade's ``start_rise`` tolerate are wider
than the noise they were set against, and the gradient norm sits lower under the same clip.
It is the held-out set for the change after the one ``fresh64`` holds out (``--split
read64``: every run recorded through ``fresh64``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh65"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_batch
from scenario_specs_fresh40 import FRESH40

#: sequences in every step's batch (16 in every set before, 8 in fresh54)
BATCH = 24

FRESH65: list[Scenario] = on_batch(FRESH40, 40, 65, BATCH, seed_add=450)
