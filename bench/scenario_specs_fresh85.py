"""An eighty-sixth held-out set, shorter sequences on ``fresh41``'s shapes (``split:
"fresh85"``), fixed before ``fresh84`` is read.

``fresh41``'s 64 shapes at seeds 1210+ (each ``fresh41`` seed plus 800), on the corpus's
bytes, with sequences of 48 tokens instead of 64 in batches of 20 instead of 16
(``RunSpec.seq_len``, ``RunSpec.batch_size``; the LRs and schedules unchanged; ``fresh73``
went to 32 in batches of 32 on ``fresh40``, ``fresh55`` to 128 in batches of 8 on
``fresh42``): 960 tokens a step instead of 1,024, every query attending over three quarters
as many keys. It is the held-out set for the change after the one ``fresh84`` holds out
(``--split read84``: every run recorded through ``fresh84``). Record with ``python
bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh85"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_context
from scenario_specs_fresh41 import FRESH41

#: the sequence length and batch size of every run of the set
SEQ_LEN, BATCH = 48, 20

FRESH85: list[Scenario] = on_context(FRESH41, 41, 85, SEQ_LEN, BATCH, seed_add=800)
