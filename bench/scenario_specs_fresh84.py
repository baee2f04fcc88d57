"""An eighty-fifth held-out set, fewer, wider heads on ``fresh40``'s shapes (``split:
"fresh84"``), fixed before ``fresh83`` is read.

``fresh40``'s 64 shapes at seeds 1190+ (each ``fresh40`` seed plus 790), on the corpus's
bytes in batches of 16 sequences of 64 tokens as ``fresh40``, with 2 attention heads per
layer instead of 4 (``RunSpec.n_head``; the width, LRs and schedules unchanged, so each head
is 32 wide instead of 16; GQA's 2 key/value heads become one per query head; the 4-layer
demo shapes keep their 8; ``fresh72`` went to 2 on ``fresh41``, ``fresh57`` to 8 on
``fresh42``): half the per-head series a frame carries, each head's scores from twice the
dimensions. It is the held-out set for the change after the one ``fresh83`` holds out
(``--split read83``: every run recorded through ``fresh83``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh84"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_heads
from scenario_specs_fresh40 import FRESH40

#: attention heads per layer of every model that has 4 in ``fresh40``
HEADS = 2

FRESH84: list[Scenario] = on_heads(FRESH40, 40, 84, HEADS, seed_add=790, only=4)
