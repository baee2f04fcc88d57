"""A sixty-seventh held-out set, the first whose runs decay their learning rate (``split:
"fresh66"``), fixed before ``fresh64`` is read.

``fresh41``'s 64 shapes at seeds 870+ (each ``fresh41`` seed plus 460), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
every run that holds its learning rate constant after the warm-up (``RunSpec.min_lr_ratio``
1.0: 62 of the 64) decaying it on a cosine to 10 % of its peak at its last step instead, as
most training schedules do (the two that already decay, the injections, optimizers and
clipping unchanged): late in a run the LR, the gradient's share that is clipped and the
loss's noise are all lower than in any set before, and an injection at step ~410 lands on
an LR already down by a third to a half. It is the held-out set for the change after the one
``fresh65`` holds out (``--split read65``: every run recorded through ``fresh65``). Record
with ``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh66"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, per_run
from scenario_specs_fresh41 import FRESH41

#: the share of its peak LR every constant-LR run decays to at its last step
MIN_LR_RATIO = 0.1

FRESH66: list[Scenario] = per_run(FRESH41, 41, 66, 460, lambda s: None
                                  if s.spec.min_lr_ratio != 1.0 else
                                  (f"cosine decay to {MIN_LR_RATIO:g} of the peak",
                                   {"min_lr_ratio": MIN_LR_RATIO}))
