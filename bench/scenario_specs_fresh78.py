"""A seventy-ninth held-out set, the first whose Llama and Gemma 2 models share one key/value
head (``split: "fresh78"``), fixed before ``fresh77`` is read.

``fresh41``'s 64 shapes at seeds 1000+ (each ``fresh41`` seed plus 590), on the corpus's
bytes in batches of 16 sequences of 64 tokens with 2 layers of 4 heads as ``fresh41``, with
every model that has 2 key/value heads (the HF Llama and Gemma 2 runs, grouped-query
attention) given 1 (``RunSpec.n_kv_head``: multi-query attention, every query head reading
the same keys; the widths, LRs and schedules unchanged; the other runs only re-seeded): the
four heads of a layer share one key projection, so their logits move together. It is the
held-out set for the change after the one ``fresh77`` holds out (``--split read77``: every
run recorded through ``fresh77``). Record with ``python bench/record_scenarios.py $(python
bench/record_scenarios.py --list | awk '$3=="fresh78"{print $1}')``. None of its runs may be
used to choose a rule, a threshold or a default.
"""

from __future__ import annotations

from scenario_specs import Scenario, on_field
from scenario_specs_fresh41 import FRESH41

#: key/value heads of every grouped-query model of the set (2 in every set before)
KV_HEADS = 1

FRESH78: list[Scenario] = on_field(FRESH41, 41, 78, 590, f"{KV_HEADS} key/value head",
                                   "n_kv_head", KV_HEADS, only=2)
