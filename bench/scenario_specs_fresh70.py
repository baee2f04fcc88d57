"""A seventy-first held-out set, the first whose runs warm up over half the steps (``split:
"fresh70"``), fixed before ``fresh69`` is read.

``fresh40``'s 64 shapes at seeds 920+ (each ``fresh40`` seed plus 520), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh40``, with
every run that warms up over the usual 100 steps warming up over 50 (``RunSpec.warmup``;
``fresh63`` doubled it; the runs whose warm-up is itself the injected ramp, and the peak
LRs, schedules and optimizers, unchanged): the peak LR arrives while the logits and the
gradient norm are still in their early transient, which the rules must not page, and the
injections land on a run that has spent longer at its peak. It is the held-out set for the
change after the one ``fresh69`` holds out (``--split read69``: every run recorded through
``fresh69``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh70"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_warmup
from scenario_specs_fresh40 import FRESH40

#: the warm-up of every run that warms up over the usual 100 steps (100 in every set before,
#: 200 in fresh63)
WARMUP = 50

FRESH70: list[Scenario] = on_warmup(FRESH40, 40, 70, WARMUP, seed_add=520)
