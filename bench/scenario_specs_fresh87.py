"""An eighty-eighth held-out set, three-block models on ``fresh40``'s shapes (``split:
"fresh87"``), fixed before ``fresh86`` is read.

``fresh40``'s 64 shapes at seeds 1240+ (each ``fresh40`` seed plus 840), on the corpus's
bytes in batches of 16 sequences of 64 tokens as ``fresh40``, with every 2-block model given
3 blocks (``RunSpec.n_layer``; the widths, LRs and schedules unchanged; the 4-block demo
shapes stay at 4; ``fresh71`` did the same on ``fresh42``, ``fresh56`` went to 4 on
``fresh41``): one layer more of heads to watch and for a gradient to cross. It is the
held-out set for the change after the one ``fresh86`` holds out (``--split read86``: every
run recorded through ``fresh86``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh87"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_depth
from scenario_specs_fresh40 import FRESH40

#: transformer blocks of every model that has 2 in ``fresh40``
LAYERS = 3

FRESH87: list[Scenario] = on_depth(FRESH40, 40, 87, LAYERS, seed_add=840, only=2)
