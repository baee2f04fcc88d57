"""A seventy-second held-out set, the first on three-block models (``split: "fresh71"``),
fixed before ``fresh70`` is read.

``fresh42``'s 64 shapes at seeds 930+ (each ``fresh42`` seed plus 510), on the corpus's
bytes in batches of 16 sequences of 64 tokens as ``fresh42``, with every 2-block model given
3 blocks (``RunSpec.n_layer``; the widths, LRs and schedules unchanged; the 4-block demo
shapes stay at 4; ``fresh56`` went to 4 on ``fresh41``): one layer more of heads to watch
and for a gradient to cross. It is the held-out set for the change after the one ``fresh70``
holds out (``--split read70``: every run recorded through ``fresh70``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh71"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_depth
from scenario_specs_fresh42 import FRESH42

#: transformer blocks of every model that has 2 in ``fresh42``
LAYERS = 3

FRESH71: list[Scenario] = on_depth(FRESH42, 42, 71, LAYERS, seed_add=510, only=2)
