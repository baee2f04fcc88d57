"""An eighty-second held-out set, the first on batches of 12 sequences (``split:
"fresh81"``), fixed before ``fresh80`` is read.

``fresh42``'s 64 shapes at seeds 1070+ (each ``fresh42`` seed plus 650), on the corpus's
bytes in sequences of 64 tokens with 2 layers of 4 heads as ``fresh42``, in batches of 12
sequences instead of 16 (``RunSpec.batch_size``; the LRs, schedules, optimizers and clipping
unchanged; ``fresh54`` went to 8 on ``fresh41``, ``fresh65`` to 24 on ``fresh40``): each
step sees three quarters of the tokens, so the loss and the gradient norm are noisier from
batch to batch, which the loss and gradient rules must not page, while the injected
instabilities are the same. It is the held-out set for the change after the one ``fresh80``
holds out (``--split read80``: every run recorded through ``fresh80``). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh81"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_batch
from scenario_specs_fresh42 import FRESH42

#: sequences a batch of every run (16 in every set before but fresh54's 8 and fresh65's 24)
BATCH = 12

FRESH81: list[Scenario] = on_batch(FRESH42, 42, 81, BATCH, seed_add=650)
