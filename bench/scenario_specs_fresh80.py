"""An eighty-first held-out set, the first whose weights start at 0.75 of the usual scale
(``split: "fresh80"``), fixed before ``fresh79`` is read.

``fresh41``'s 64 shapes at seeds 1060+ (each ``fresh41`` seed plus 650), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
each run's initial weight scale (``RunSpec.init_std``) times 0.75 (``fresh61`` halved it on
``fresh42``'s shapes, ``fresh69`` raised it 1.5x on ``fresh40``'s; the LRs, schedules,
optimizers and clipping unchanged): the attention and output logits start smaller and a
zero-init bias is a larger share of a smaller projection. It is the held-out set for the
change after the one ``fresh79`` holds out (``--split read79``: every run recorded through
``fresh79``, and ``qkclip1`` and ``qkclip2``, fixed after it). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh80"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_init
from scenario_specs_fresh41 import FRESH41

#: every run's initial weight scale, times its usual (0.5 in fresh61, 1.5 in fresh69)
INIT_SCALE = 0.75

FRESH80: list[Scenario] = on_init(FRESH41, 41, 80, INIT_SCALE, seed_add=650)
