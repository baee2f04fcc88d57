"""A fifty-eighth held-out set, the first with narrower heads (``split: "fresh57"``), fixed
before ``fresh56`` was read.

``fresh42``'s 64 shapes at seeds 700+ (each ``fresh42`` seed plus 280), on the corpus's
bytes in batches of 16 sequences of 64 tokens as ``fresh42``, with 8 attention heads per
layer instead of 4 (``RunSpec.n_head``; the width, LRs and schedules unchanged, so each head
is 8 wide instead of 16; the 4-layer demo shapes keep their 8): twice the per-head series a
frame carries, each head's scores from half the dimensions. It is the held-out set for the
change after the one ``fresh56`` holds out (``--split read56``: every run recorded through
``fresh56``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh57"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_heads
from scenario_specs_fresh42 import FRESH42

#: attention heads per layer in every model of the set (4 in every set before, but the
#: 4-layer demo shapes' 8)
HEADS = 8

FRESH57: list[Scenario] = on_heads(FRESH42, 42, 57, HEADS, seed_add=280)
