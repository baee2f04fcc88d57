"""A fifty-third held-out set, the ninth on another vocabulary (``split: "fresh52"``),
fixed before ``fresh50`` was read (``fresh50`` then replayed once with round thirty-five's
rules, no change made).

``fresh41``'s 64 shapes at seeds 570+ (each ``fresh41`` seed plus 160), everything else the
same, on a byte-level BPE of 768 tokens of the same corpus (``RunSpec.vocab``; ln 768 = 6.6
nats at the start), smaller than any vocabulary read before. It is the held-out set for the
change after the one ``fresh51`` holds out (``--split read51``: every run recorded through
``fresh51``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh52"{print $1}')``. None of its runs may
be used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh41 import FRESH41

#: tokens of every run of the set
VOCAB = 768

FRESH52: list[Scenario] = on_vocabulary(FRESH41, 41, 52, VOCAB, seed_add=160)
