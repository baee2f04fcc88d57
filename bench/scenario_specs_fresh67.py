"""A sixty-eighth held-out set, the first whose clipped runs clip at twice the gradient norm
(``split: "fresh67"``), fixed before ``fresh66`` is read.

``fresh42``'s 64 shapes at seeds 890+ (each ``fresh42`` seed plus 470), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, with
every clipped run's threshold doubled (``RunSpec.max_norm`` 2.0 instead of 1.0; the
unclipped runs only re-seeded; the LRs, schedules and optimizers unchanged): fewer steps
are clipped, so the rules that read the clip (the loss climbing at the clip, its share of
the last steps) see less of it, and more of each gradient spike goes into the weights. It
is the held-out set for the change after the one ``fresh66`` holds out (``--split
read66``: every run recorded through ``fresh66``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh67"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_clip
from scenario_specs_fresh42 import FRESH42

#: every clipped run's threshold, times the usual (1.0 in every set before, 0.5 in fresh62)
CLIP_SCALE = 2.0

FRESH67: list[Scenario] = on_clip(FRESH42, 42, 67, CLIP_SCALE, seed_add=470)
