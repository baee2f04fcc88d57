"""A fifty-second held-out set, the eighth on another vocabulary (``split: "fresh51"``),
fixed after ``fresh49`` was read (with round thirty-five's rules, no change made), before
``fresh50`` is.

``fresh42``'s 64 shapes at seeds 560+ (each ``fresh42`` seed plus 140), everything else the
same, on a byte-level BPE of 5,120 tokens of the same corpus (``RunSpec.vocab``; ln 5120 =
8.5 nats at the start). It is the held-out set for the change after the one ``fresh50``
holds out (``--split read50``: every run recorded through ``fresh50``). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh51"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh42 import FRESH42

#: tokens of every run of the set
VOCAB = 5120

FRESH51: list[Scenario] = on_vocabulary(FRESH42, 42, 51, VOCAB, seed_add=140)
