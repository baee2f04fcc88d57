"""A forty-ninth held-out set, on the corpus's bytes again (``split: "fresh48"``), fixed
after every earlier set was read (``fresh47`` with round thirty-four's defaults), before any
later change is chosen.

``fresh41``'s 64 shapes at seeds 500+ (each ``fresh41`` seed plus 90), everything else the
same (vocabulary 256: the bytes every rule was first chosen on). It is the held-out set for
the next change (``--split read47``: every run recorded through ``fresh47``). Record with
``python bench/record_scenarios.py $(python bench/record_scenarios.py --list | awk
'$3=="fresh48"{print $1}')``. None of its runs may be used to choose a rule, a threshold or
a default.
"""

from __future__ import annotations

import re
from dataclasses import replace

from scenario_specs import Scenario
from scenario_specs_fresh41 import FRESH41

FRESH48: list[Scenario] = [
    replace(s, name=re.sub(r"_s41(\d)$", r"_s50\1", s.name.replace("f41_", "f48_", 1)),
            spec=replace(s.spec, seed=s.spec.seed + 90))
    for s in FRESH41]
