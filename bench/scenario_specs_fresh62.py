"""A sixty-third held-out set, the first whose clipped runs clip at half the gradient norm
(``split: "fresh62"``), fixed before ``fresh61`` is read.

``fresh41``'s 64 shapes at seeds 800+ (each ``fresh41`` seed plus 390), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
every clipped run's threshold halved (``RunSpec.max_norm``: 0.5 instead of 1.0; the
unclipped runs only re-seeded; the LRs, schedules and optimizers unchanged): more steps are
clipped, on healthy runs too, so the rules that read the clip flag (the loss climbing at
the clip, a gradient just under the clip) meet it more often. It is the held-out set for
the change after the one ``fresh61`` holds out (``--split read61``: every run recorded
through ``fresh61``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh62"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_clip
from scenario_specs_fresh41 import FRESH41

#: each clipped run's gradient-norm threshold, times this (1 in every set before)
CLIP_SCALE = 0.5

FRESH62: list[Scenario] = on_clip(FRESH41, 41, 62, CLIP_SCALE, seed_add=390)
