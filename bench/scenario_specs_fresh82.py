"""An eighty-third held-out set, the first at a width under 64 (``split: "fresh82"``), fixed
after ``fresh81`` was read and before any change was chosen on it.

``fresh40``'s 64 shapes at seeds 1110+ (each ``fresh40`` seed plus 710), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh40``, with
every model of width 64 at width 48 (``RunSpec.d_model``; the heads as many, so each head 12
wide instead of 16; the LRs and schedules unchanged; the width-128 demo shape unchanged;
``fresh60`` went to 128 on ``fresh41``, ``fresh74`` to 96 on ``fresh42``): a narrower
residual stream and narrower heads, whose logits and norms sit at other levels. It is the
held-out set for the change chosen on ``--split read81`` (every run recorded through
``fresh81`` and ``qkclip3``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh82"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_width
from scenario_specs_fresh40 import FRESH40

#: the residual width of every model that is 64 wide in ``fresh40``
WIDTH = 48

FRESH82: list[Scenario] = on_width(FRESH40, 40, 82, WIDTH, seed_add=710, only=64)
