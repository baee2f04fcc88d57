"""A fifty-ninth held-out set, the first with weight decay on its AdamW runs (``split:
"fresh58"``), fixed before ``fresh57`` was read.

``fresh41``'s 64 shapes at seeds 720+ (each ``fresh41`` seed plus 310), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
every AdamW run's weight decay 0.1 on its matrices instead of 0 (``RunSpec.weight_decay``;
the LRs and schedules unchanged; the Adam, RMSprop and SGD runs only re-seeded): decay pulls
the weights, and with them the attention and output logits, back while the run trains, as
most transformer training does. It is the held-out set for the change after the one
``fresh57`` holds out (``--split read57``: every run recorded through ``fresh57``). Record
with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh58"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_decay
from scenario_specs_fresh41 import FRESH41

#: AdamW's weight decay in every AdamW run of the set (0 in every set before but a few)
DECAY = 0.1

FRESH58: list[Scenario] = on_decay(FRESH41, 41, 58, DECAY, seed_add=310)
