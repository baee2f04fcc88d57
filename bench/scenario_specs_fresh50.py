"""A fifty-first held-out set, the seventh on another vocabulary (``split: "fresh50"``),
fixed after ``fresh48`` was read (round thirty-five's held-out set), before ``fresh49`` is.

``fresh41``'s 64 shapes at seeds 530+ (each ``fresh41`` seed plus 120), everything else the
same, on a byte-level BPE of 2,560 tokens of the same corpus (``RunSpec.vocab``; ln 2560 =
7.8 nats at the start). It is the held-out set for the change after the one ``fresh49``
holds out (``--split read49``: every run recorded through ``fresh49``). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh50"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh41 import FRESH41

#: tokens of every run of the set
VOCAB = 2560

FRESH50: list[Scenario] = on_vocabulary(FRESH41, 41, 50, VOCAB, seed_add=120)
