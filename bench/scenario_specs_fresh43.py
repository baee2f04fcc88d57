"""A forty-fourth held-out set, and the first with another vocabulary (``split:
"fresh43"``), fixed before ``fresh41`` is read, so before any later rule change is replayed.

Every set before it trains on the corpus's bytes (vocabulary 256: a fresh model's loss
starts at ln 256 = 5.5 nats, and every nat threshold and gradient scale of the rules was
chosen on such runs). This one is ``fresh42``'s 64 shapes at seeds 430+ (each ``fresh42``
seed plus 10), everything else the same, on a byte-level BPE of 2,048 tokens of the same
corpus (``RunSpec.vocab``; ln 2048 = 7.6 nats at the start, a wider LM head, rarer tokens):
a shift the rules were never tuned on. Record with ``python bench/record_scenarios.py
$(python bench/record_scenarios.py --list | awk '$3=="fresh43"{print $1}')``. None of its
runs may be used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_vocabulary
from scenario_specs_fresh42 import FRESH42

#: tokens of every run of the set
VOCAB = 2048

FRESH43: list[Scenario] = on_vocabulary(FRESH42, 42, 43, VOCAB, seed_add=10)
