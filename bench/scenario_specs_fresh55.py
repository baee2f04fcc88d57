"""A fifty-sixth held-out set, the first on longer sequences (``split: "fresh55"``), fixed
before ``fresh54`` was read.

``fresh42``'s 64 shapes at seeds 640+ (each ``fresh42`` seed plus 220), on the corpus's
bytes, with sequences of 128 tokens instead of 64 in batches of 8 instead of 16
(``RunSpec.seq_len``, ``RunSpec.batch_size``; the LRs and schedules unchanged): each step
sees the same 1,024 tokens as the sets before ``fresh54``, but every query attends over
twice as many keys, so the attention logits' maxima and percentiles, the entropy and the
loss's level are those of a longer context. It is the held-out set for the change after the
one ``fresh54`` holds out (``--split read54``: every run recorded through ``fresh54``).
Record with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list |
awk '$3=="fresh55"{print $1}')``. None of its runs may be used to choose a rule, a threshold
or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_context
from scenario_specs_fresh42 import FRESH42

#: tokens in every sequence (64 in every set before)
SEQ_LEN = 128
#: sequences in every step's batch: SEQ_LEN x BATCH = 1,024 tokens a step, as before fresh54
BATCH = 8

FRESH55: list[Scenario] = on_context(FRESH42, 42, 55, SEQ_LEN, BATCH, seed_add=220)
