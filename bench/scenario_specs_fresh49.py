"""A fiftieth held-out set, the sixth on another vocabulary (``split: "fresh49"``), fixed
after ``fresh47`` was read, before ``fresh48`` is read and before any change chosen on
``--split read48``.

``fresh42``'s 64 shapes at seeds 520+ (each ``fresh42`` seed plus 100), everything else the
same, on a byte-level BPE of 1,536 tokens of the same corpus (``RunSpec.vocab``; ln 1536 =
7.3 nats at the start): a vocabulary between the ones read. It is the held-out set for the
change after the one ``fresh48`` holds out (``--split read48``: every run recorded through
``fresh48``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh49"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh42 import FRESH42

#: tokens of every run of the set
VOCAB = 1536

FRESH49: list[Scenario] = on_vocabulary(FRESH42, 42, 49, VOCAB, seed_add=100)
