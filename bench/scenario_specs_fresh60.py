"""A sixty-first held-out set, the first whose models are twice as wide (``split:
"fresh60"``), fixed before ``fresh58`` was read.

``fresh41``'s 64 shapes at seeds 760+ (each ``fresh41`` seed plus 350), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
a residual width of 128 instead of 64 (``RunSpec.d_model``; the heads as many, so each is 32
wide instead of 16; the LRs, schedules and optimizers unchanged): a wider head sums more
products into each query-key logit, and a wider output head more into each output logit,
so both sets of logits grow differently at the same LR. It is the held-out set for the
change after the one ``fresh59`` holds out (``--split read59``: every run recorded through
``fresh59``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh60"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_width
from scenario_specs_fresh41 import FRESH41

#: the residual width of every run of the set (64 in every set before but the 4-layer demos)
WIDTH = 128

FRESH60: list[Scenario] = on_width(FRESH41, 41, 60, WIDTH, seed_add=350)
