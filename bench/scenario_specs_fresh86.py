"""An eighty-seventh held-out set, Adam's second moment averaged over 100 steps on
``fresh41``'s shapes (``split: "fresh86"``), fixed before ``fresh85`` is read.

``fresh41``'s 64 shapes at seeds 1230+ (each ``fresh41`` seed plus 820), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
every Adam and AdamW run's betas (0.9, 0.99) instead of (0.9, 0.95) (``RunSpec.betas``; the
LRs and schedules unchanged; the RMSprop and SGD runs only re-seeded; ``fresh59`` went to
0.999 on ``fresh42``, ``fresh75`` to 0.98 on ``fresh40``): the second moment lags a rise in
the gradient longer, so a burst moves the weights further before the update shrinks. It is
the held-out set for the change after the one ``fresh85`` holds out (``--split read85``:
every run recorded through ``fresh85``). Record with ``python bench/record_scenarios.py
$(python bench/record_scenarios.py --list | awk '$3=="fresh86"{print $1}')``. None of its
runs may be used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_betas
from scenario_specs_fresh41 import FRESH41

#: Adam's and AdamW's betas in every such run of the set ((0.9, 0.95) in every set before
#: but ``fresh59`` and ``fresh75``)
BETAS = (0.9, 0.99)

FRESH86: list[Scenario] = on_betas(FRESH41, 41, 86, BETAS, seed_add=820)
