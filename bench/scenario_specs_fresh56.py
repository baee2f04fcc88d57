"""A fifty-seventh held-out set, the first on deeper models (``split: "fresh56"``), fixed
before ``fresh55`` was read.

``fresh41``'s 64 shapes at seeds 660+ (each ``fresh41`` seed plus 250), on the corpus's
bytes in batches of 16 sequences of 64 tokens as ``fresh41``, with 4 transformer blocks
instead of 2 (``RunSpec.n_layer``; the widths, LRs and schedules unchanged; the 4-layer demo
shapes stay at 4): twice the heads per model, twice the layers a gradient crosses. It is the
held-out set for the change after the one ``fresh55`` holds out (``--split read55``: every
run recorded through ``fresh55``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh56"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_depth
from scenario_specs_fresh41 import FRESH41

#: transformer blocks in every model of the set (2 in every set before, but the 4-layer demo)
LAYERS = 4

FRESH56: list[Scenario] = on_depth(FRESH41, 41, 56, LAYERS, seed_add=250)
