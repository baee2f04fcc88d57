"""A forty-eighth held-out set, the fifth on another vocabulary (``split: "fresh47"``), fixed
after ``fresh45`` and ``fresh46`` were read, before any change chosen on them.

``fresh42``'s 64 shapes at seeds 480+ (each ``fresh42`` seed plus 60), everything else the
same, on a byte-level BPE of 6,144 tokens of the same corpus (``RunSpec.vocab``; ln 6144 =
8.7 nats at the start): larger than any vocabulary read so far, where a threshold in nats
is furthest from where it was chosen. It is the held-out set for the next change (``--split
read46``: every run recorded through ``fresh46``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh47"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh42 import FRESH42

#: tokens of every run of the set
VOCAB = 6144

FRESH47: list[Scenario] = on_vocabulary(FRESH42, 42, 47, VOCAB, seed_add=60)
