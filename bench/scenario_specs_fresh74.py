"""A seventy-fifth held-out set, the first at a width between (``split: "fresh74"``), fixed
before ``fresh73`` is read.

``fresh42``'s 64 shapes at seeds 960+ (each ``fresh42`` seed plus 540), on the corpus's
bytes in batches of 16 sequences of 64 tokens as ``fresh42``, with every model of width 64
at width 96 (``RunSpec.d_model``; the heads as many, so each head 24 wide instead of 16; the
LRs and schedules unchanged; the width-128 demo shape unchanged; ``fresh60`` went to 128 on
``fresh41``). It is the held-out set for the change after the one ``fresh73`` holds out
(``--split read73``: every run recorded through ``fresh73``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh74"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_width
from scenario_specs_fresh42 import FRESH42

#: the residual width of every model that is 64 wide in ``fresh42``
WIDTH = 96

FRESH74: list[Scenario] = on_width(FRESH42, 42, 74, WIDTH, seed_add=540, only=64)
