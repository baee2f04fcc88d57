"""An eightieth held-out set, the first whose clipped runs clip at 0.7 of the usual gradient
norm (``split: "fresh79"``), fixed before ``fresh78`` is read.

``fresh42``'s 64 shapes at seeds 1010+ (each ``fresh42`` seed plus 590), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, with
every clipped run's threshold at 0.7 of the usual (``RunSpec.max_norm`` 0.7 instead of 1.0;
the unclipped runs only re-seeded; the LRs, schedules and optimizers unchanged; ``fresh62``
halved it on ``fresh41``, ``fresh67`` doubled it on ``fresh42``): a gradient clipped now
would have passed before, so the rules that read the clip (the loss climbing at the clip, a
gradient just under it) meet it on more healthy steps. It is the held-out set for the change
after the one ``fresh78`` holds out (``--split read78``: every run recorded through
``fresh78``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh79"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_clip
from scenario_specs_fresh42 import FRESH42

#: every clipped run's threshold, times the usual (1.0 in every set before but fresh62's 0.5
#: and fresh67's 2.0)
CLIP_SCALE = 0.7

FRESH79: list[Scenario] = on_clip(FRESH42, 42, 79, CLIP_SCALE, seed_add=590)
