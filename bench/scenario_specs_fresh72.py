"""A seventy-third held-out set, the first with wider, fewer heads (``split: "fresh72"``),
fixed before ``fresh71`` is read.

``fresh41``'s 64 shapes at seeds 940+ (each ``fresh41`` seed plus 530), on the corpus's
bytes in batches of 16 sequences of 64 tokens as ``fresh41``, with 2 attention heads per
layer instead of 4 (``RunSpec.n_head``; the width, LRs and schedules unchanged, so each head
is 32 wide instead of 16; GQA's 2 key/value heads become one per query head; the 4-layer
demo shapes keep their 8; ``fresh57`` went to 8 on ``fresh42``): half the per-head series a
frame carries, each head's scores from twice the dimensions. It is the held-out set for the
change after the one ``fresh71`` holds out (``--split read71``: every run recorded through
``fresh71``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh72"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_heads
from scenario_specs_fresh41 import FRESH41

#: attention heads per layer of every model that has 4 in ``fresh41``
HEADS = 2

FRESH72: list[Scenario] = on_heads(FRESH41, 41, 72, HEADS, seed_add=530, only=4)
