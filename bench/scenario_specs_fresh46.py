"""A forty-seventh held-out set, the fourth on another vocabulary (``split: "fresh46"``), fixed
before ``fresh45`` (BPE 3,072) is read, so before any change that set may lead to.

``fresh41``'s 64 shapes at seeds 470+ (each ``fresh41`` seed plus 60), everything else the
same, on a byte-level BPE of 1,024 tokens of the same corpus (``RunSpec.vocab``; ln 1024 =
6.9 nats at the start): between the bytes and the smallest BPE read so far, so a change
chosen after reading ``fresh45`` is checked on a vocabulary no rule was read on. Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh46"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh41 import FRESH41

#: tokens of every run of the set
VOCAB = 1024

FRESH46: list[Scenario] = on_vocabulary(FRESH41, 41, 46, VOCAB, seed_add=60)
