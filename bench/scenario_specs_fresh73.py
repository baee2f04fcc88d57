"""A seventy-fourth held-out set, the first on shorter sequences (``split: "fresh73"``), fixed
before ``fresh72`` is read.

``fresh40``'s 64 shapes at seeds 950+ (each ``fresh40`` seed plus 550), on the corpus's
bytes, with sequences of 32 tokens instead of 64 in batches of 32 instead of 16
(``RunSpec.seq_len``, ``RunSpec.batch_size``; the LRs and schedules unchanged; ``fresh55``
went to 128 in batches of 8): each step sees the same 1,024 tokens, but every query attends
over half as many keys, so the attention logits' maxima, the entropy and the loss's level
are those of a shorter context, and the batch noise of the loss is lower. It is the held-out
set for the change after the one ``fresh72`` holds out (``--split read72``: every run
recorded through ``fresh72``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh73"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_context
from scenario_specs_fresh40 import FRESH40

#: tokens a sequence (64 in every set before, but 128 in fresh55) and sequences a batch
SEQ_LEN, BATCH = 32, 32

FRESH73: list[Scenario] = on_context(FRESH40, 40, 73, SEQ_LEN, BATCH, seed_add=550)
