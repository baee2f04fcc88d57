"""A fifty-fourth held-out set, the tenth on another vocabulary (``split: "fresh53"``),
fixed before ``fresh52`` was read (``fresh52`` then replayed once with round thirty-six's
rules, no change made).

``fresh42``'s 64 shapes at seeds 580+ (each ``fresh42`` seed plus 180), everything else the
same, on a byte-level BPE of 8,192 tokens of the same corpus (``RunSpec.vocab``; ln 8192 =
9.0 nats at the start), larger than any vocabulary read before. It is the held-out set for
the change after round thirty-six (``--split read52``: every run recorded through
``fresh52``, with the long sets). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh53"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh42 import FRESH42

#: tokens of every run of the set
VOCAB = 8192

FRESH53: list[Scenario] = on_vocabulary(FRESH42, 42, 53, VOCAB, seed_add=180)
