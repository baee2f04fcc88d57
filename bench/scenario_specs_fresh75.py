"""A seventy-sixth held-out set, the first with Adam's second moment averaged over 50 steps
(``split: "fresh75"``), fixed before ``fresh74`` is read.

``fresh40``'s 64 shapes at seeds 970+ (each ``fresh40`` seed plus 570), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh40``, with
every Adam and AdamW run's betas (0.9, 0.98) instead of (0.9, 0.95) (``RunSpec.betas``, as
many encoder and fine-tuning recipes set them; the LRs and schedules unchanged; the RMSprop
and SGD runs only re-seeded; ``fresh59`` went to 0.999 on ``fresh42``): the second moment
lags a rise in the gradient a little longer, so a burst moves the weights a little further
before the update shrinks. It is the held-out set for the change after the one ``fresh74``
holds out (``--split read74``: every run recorded through ``fresh74``). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh75"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_betas
from scenario_specs_fresh40 import FRESH40

#: Adam's and AdamW's betas in every such run of the set ((0.9, 0.95) in every set before)
BETAS = (0.9, 0.98)

FRESH75: list[Scenario] = on_betas(FRESH40, 40, 75, BETAS, seed_add=570)
