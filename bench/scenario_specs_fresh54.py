"""A fifty-fifth held-out set, the first on smaller batches (``split: "fresh54"``), fixed
before ``fresh53`` was read.

``fresh41``'s 64 shapes at seeds 620+ (each ``fresh41`` seed plus 210), on the corpus's
bytes as ``fresh41``, with batches of 8 sequences instead of 16 (``RunSpec.batch_size``; the
LRs and schedules unchanged): each step's loss and gradient are noisier than in any set
before, which is what the loss margins and the gradient's spike scale are judged against.
It is the held-out set for the change after the one ``fresh53`` holds out (``--split
read53``: every run recorded through ``fresh53``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh54"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_batch
from scenario_specs_fresh41 import FRESH41

#: sequences in every step's batch (16 in every set before)
BATCH = 8

FRESH54: list[Scenario] = on_batch(FRESH41, 41, 54, BATCH, seed_add=210)
