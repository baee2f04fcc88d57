"""A forty-fifth held-out set, the second on another vocabulary (``split: "fresh44"``), fixed
before ``fresh43`` (the first, BPE 2,048) is read, so before any change that set may lead to.

``fresh41``'s 64 shapes at seeds 440+ (each ``fresh41`` seed plus 30), everything else the
same, on a byte-level BPE of 4,096 tokens of the same corpus (``RunSpec.vocab``; ln 4096 =
8.3 nats at the start): farther from the bytes every rule was tuned on than ``fresh43``, so a
change chosen after reading ``fresh43`` is checked on a vocabulary it was not read on.
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh44"{print $1}')``. None of its runs may be used to choose a rule, a
threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh41 import FRESH41

#: tokens of every run of the set
VOCAB = 4096

FRESH44: list[Scenario] = on_vocabulary(FRESH41, 41, 44, VOCAB, seed_add=30)
