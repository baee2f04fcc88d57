"""A forty-sixth held-out set, the third on another vocabulary (``split: "fresh45"``), fixed
after ``fresh42`` and ``fresh44`` were read once with round thirty-two's defaults, before any
later rule change is chosen.

``fresh42``'s 64 shapes at seeds 450+ (each ``fresh42`` seed plus 30), everything else the
same, on a byte-level BPE of 3,072 tokens of the same corpus (``RunSpec.vocab``; ln 3072 =
8.0 nats at the start), between the two vocabularies read so far. It is the held-out set for
the next change (``--split read44``: every run recorded through ``fresh44``). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh45"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh42 import FRESH42

#: tokens of every run of the set
VOCAB = 3072

FRESH45: list[Scenario] = on_vocabulary(FRESH42, 42, 45, VOCAB, seed_add=30)
