"""A seventy-seventh held-out set, the second with weight decay on its AdamW runs (``split:
"fresh76"``), fixed before ``fresh75`` is read.

``fresh42``'s 64 shapes at seeds 980+ (each ``fresh42`` seed plus 560), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, with
every AdamW run's weight decay 0.1 on its matrices instead of 0 (``RunSpec.weight_decay``;
the LRs and schedules unchanged; the Adam, RMSprop and SGD runs only re-seeded;
``fresh58`` did the same on ``fresh41``'s shapes): decay pulls the weights, and with them
the attention and output logits, back while the run trains. It is the held-out set for the
change after the one ``fresh75`` holds out (``--split read75``: every run recorded through
``fresh75``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh76"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_decay
from scenario_specs_fresh42 import FRESH42

#: AdamW's weight decay in every such run of the set (0 in every set before but ``fresh58``)
DECAY = 0.1

FRESH76: list[Scenario] = on_decay(FRESH42, 42, 76, DECAY, seed_add=560)
