"""The recorded alert suite's sets and its split: which runs exist and which half or
held-out set each belongs to, fixed by the names and specs alone, never by results.

The first 124 runs (``scenario_specs.SCENARIOS``) are split once, before any rule was tuned
on them, into a tuning half and a held-out half (:func:`assign_splits`). Every held-out set
since (``scenario_specs_freshN.py`` and the probes) is its own split, named by its key in
:data:`HELD_OUT`, in the order the sets were fixed: a new set is one import and one entry
here. ``record_scenarios.py`` records them; ``bench_alerts.py`` replays them by split.
"""

from __future__ import annotations

import hashlib
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenario_specs import SCENARIOS, Scenario  # noqa: E402
from scenario_specs_fresh import FRESH  # noqa: E402
from scenario_specs_fresh2 import FRESH2  # noqa: E402
from scenario_specs_fresh3 import FRESH3  # noqa: E402
from scenario_specs_fresh4 import FRESH4  # noqa: E402
from scenario_specs_fresh5 import FRESH5  # noqa: E402
from scenario_specs_fresh6 import FRESH6  # noqa: E402
from scenario_specs_fresh7 import FRESH7  # noqa: E402
from scenario_specs_fresh8 import FRESH8  # noqa: E402
from scenario_specs_fresh9 import FRESH9  # noqa: E402
from scenario_specs_fresh10 import FRESH10  # noqa: E402
from scenario_specs_fresh11 import FRESH11  # noqa: E402
from scenario_specs_fresh12 import FRESH12  # noqa: E402
from scenario_specs_fresh13 import FRESH13  # noqa: E402
from scenario_specs_fresh14 import FRESH14  # noqa: E402
from scenario_specs_fresh15 import FRESH15  # noqa: E402
from scenario_specs_fresh16 import FRESH16  # noqa: E402
from scenario_specs_fresh17 import FRESH17  # noqa: E402
from scenario_specs_fresh18 import FRESH18  # noqa: E402
from scenario_specs_fresh19 import FRESH19  # noqa: E402
from scenario_specs_fresh20 import FRESH20  # noqa: E402
from scenario_specs_fresh21 import FRESH21  # noqa: E402
from scenario_specs_fresh22 import FRESH22  # noqa: E402
from scenario_specs_fresh23 import FRESH23  # noqa: E402
from scenario_specs_fresh24 import FRESH24  # noqa: E402
from scenario_specs_fresh25 import FRESH25  # noqa: E402
from scenario_specs_fresh26 import FRESH26  # noqa: E402
from scenario_specs_fresh27 import FRESH27  # noqa: E402
from scenario_specs_fresh28 import FRESH28  # noqa: E402
from scenario_specs_fresh29 import FRESH29  # noqa: E402
from scenario_specs_fresh30 import FRESH30  # noqa: E402
from scenario_specs_fresh31 import FRESH31  # noqa: E402
from scenario_specs_fresh32 import FRESH32  # noqa: E402
from scenario_specs_fresh33 import FRESH33  # noqa: E402
from scenario_specs_fresh34 import FRESH34  # noqa: E402
from scenario_specs_fresh35 import FRESH35  # noqa: E402
from scenario_specs_fresh36 import FRESH36  # noqa: E402
from scenario_specs_fresh37 import FRESH37  # noqa: E402
from scenario_specs_fresh38 import FRESH38  # noqa: E402
from scenario_specs_fresh39 import FRESH39  # noqa: E402
from scenario_specs_fresh40 import FRESH40  # noqa: E402
from scenario_specs_fresh41 import FRESH41  # noqa: E402
from scenario_specs_fresh42 import FRESH42  # noqa: E402
from scenario_specs_fresh43 import FRESH43  # noqa: E402
from scenario_specs_fresh44 import FRESH44  # noqa: E402
from scenario_specs_fresh45 import FRESH45  # noqa: E402
from scenario_specs_fresh46 import FRESH46  # noqa: E402
from scenario_specs_fresh47 import FRESH47  # noqa: E402
from scenario_specs_fresh48 import FRESH48  # noqa: E402
from scenario_specs_fresh49 import FRESH49  # noqa: E402
from scenario_specs_fresh50 import FRESH50  # noqa: E402
from scenario_specs_fresh51 import FRESH51  # noqa: E402
from scenario_specs_fresh52 import FRESH52  # noqa: E402
from scenario_specs_fresh53 import FRESH53  # noqa: E402
from scenario_specs_fresh54 import FRESH54  # noqa: E402
from scenario_specs_fresh55 import FRESH55  # noqa: E402
from scenario_specs_fresh56 import FRESH56  # noqa: E402
from scenario_specs_fresh57 import FRESH57  # noqa: E402
from scenario_specs_fresh58 import FRESH58  # noqa: E402
from scenario_specs_fresh59 import FRESH59  # noqa: E402
from scenario_specs_fresh60 import FRESH60  # noqa: E402
from scenario_specs_fresh61 import FRESH61  # noqa: E402
from scenario_specs_fresh62 import FRESH62  # noqa: E402
from scenario_specs_fresh63 import FRESH63  # noqa: E402
from scenario_specs_fresh64 import FRESH64  # noqa: E402
from scenario_specs_fresh65 import FRESH65  # noqa: E402
from scenario_specs_fresh66 import FRESH66  # noqa: E402
from scenario_specs_fresh67 import FRESH67  # noqa: E402
from scenario_specs_fresh68 import FRESH68  # noqa: E402
from scenario_specs_fresh69 import FRESH69  # noqa: E402
from scenario_specs_fresh70 import FRESH70  # noqa: E402
from scenario_specs_fresh71 import FRESH71  # noqa: E402
from scenario_specs_fresh72 import FRESH72  # noqa: E402
from scenario_specs_fresh73 import FRESH73  # noqa: E402
from scenario_specs_fresh74 import FRESH74  # noqa: E402
from scenario_specs_fresh75 import FRESH75  # noqa: E402
from scenario_specs_fresh76 import FRESH76  # noqa: E402
from scenario_specs_fresh77 import FRESH77  # noqa: E402
from scenario_specs_fresh78 import FRESH78  # noqa: E402
from scenario_specs_fresh79 import FRESH79  # noqa: E402
from scenario_specs_fresh80 import FRESH80  # noqa: E402
from scenario_specs_fresh81 import FRESH81  # noqa: E402
from scenario_specs_fresh82 import FRESH82  # noqa: E402
from scenario_specs_fresh83 import FRESH83  # noqa: E402
from scenario_specs_fresh84 import FRESH84  # noqa: E402
from scenario_specs_fresh85 import FRESH85  # noqa: E402
from scenario_specs_fresh86 import FRESH86  # noqa: E402
from scenario_specs_fresh87 import FRESH87  # noqa: E402
from scenario_specs_fresh88 import FRESH88  # noqa: E402
from scenario_specs_long1 import LONG1  # noqa: E402
from scenario_specs_long2 import LONG2  # noqa: E402
from scenario_specs_qkclip1 import QKCLIP1  # noqa: E402
from scenario_specs_qkclip2 import QKCLIP2  # noqa: E402
from scenario_specs_qkclip3 import QKCLIP3  # noqa: E402

#: the held-out sets, each fixed and recorded after the one before it had been read, in the
#: order they were fixed: each is its own split, named by its key (a new set: one entry here)
HELD_OUT: dict[str, list[Scenario]] = {
    "fresh": FRESH, "fresh2": FRESH2, "fresh3": FRESH3, "fresh4": FRESH4, "fresh5": FRESH5,
    "fresh6": FRESH6, "fresh7": FRESH7, "fresh8": FRESH8, "fresh9": FRESH9, "fresh10": FRESH10,
    "fresh11": FRESH11, "fresh12": FRESH12, "fresh13": FRESH13, "fresh14": FRESH14,
    "fresh15": FRESH15, "fresh16": FRESH16, "fresh17": FRESH17, "fresh18": FRESH18,
    "fresh19": FRESH19, "fresh20": FRESH20, "fresh21": FRESH21,
    "fresh22": FRESH22, "fresh23": FRESH23, "fresh24": FRESH24,
    "fresh25": FRESH25, "fresh26": FRESH26, "fresh27": FRESH27,
    "fresh28": FRESH28, "fresh29": FRESH29, "fresh30": FRESH30, "fresh31": FRESH31,
    "fresh32": FRESH32, "fresh33": FRESH33,
    "fresh34": FRESH34, "fresh35": FRESH35, "fresh36": FRESH36,
    "fresh37": FRESH37, "fresh38": FRESH38, "fresh39": FRESH39,
    "fresh40": FRESH40, "fresh41": FRESH41,
    "fresh42": FRESH42, "fresh43": FRESH43, "fresh44": FRESH44,
    "fresh45": FRESH45, "fresh46": FRESH46, "fresh47": FRESH47,
    "fresh48": FRESH48, "fresh49": FRESH49, "fresh50": FRESH50, "fresh51": FRESH51,
    "fresh52": FRESH52, "long1": LONG1, "long2": LONG2, "fresh53": FRESH53,
    "fresh54": FRESH54, "fresh55": FRESH55,
    "fresh56": FRESH56, "fresh57": FRESH57, "fresh58": FRESH58,
    "fresh59": FRESH59, "fresh60": FRESH60, "fresh61": FRESH61,
    "fresh62": FRESH62, "fresh63": FRESH63, "fresh64": FRESH64,
    "fresh65": FRESH65, "fresh66": FRESH66, "fresh67": FRESH67,
    "fresh68": FRESH68, "fresh69": FRESH69,
    "fresh70": FRESH70, "fresh71": FRESH71, "fresh72": FRESH72,
    "fresh73": FRESH73, "fresh74": FRESH74,
    "fresh75": FRESH75, "fresh76": FRESH76, "fresh77": FRESH77,
    "fresh78": FRESH78, "fresh79": FRESH79, "qkclip1": QKCLIP1,
    "qkclip2": QKCLIP2, "fresh80": FRESH80, "fresh81": FRESH81,
    "qkclip3": QKCLIP3, "fresh82": FRESH82, "fresh83": FRESH83,
    "fresh84": FRESH84, "fresh85": FRESH85, "fresh86": FRESH86,
    "fresh87": FRESH87, "fresh88": FRESH88}
ALL: list[Scenario] = [*SCENARIOS, *(s for runs in HELD_OUT.values() for s in runs)]
BY_NAME = {s.name: s for s in ALL}


# -- the split ----------------------------------------------------------------------------


def _hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def assign_splits(scenarios: list[Scenario]) -> dict[str, str]:
    """``{name: "tune" | "holdout"}``, fixed by the names and specs alone, never by results.

    Stratified by (mechanism group, family): within each stratum the scenarios are ordered
    by the SHA-256 of their name and dealt alternately to the two halves; the stratum's
    first card goes to the half that has received fewer so far (ties: tune), so strata of
    odd size do not all favour one half.
    """
    strata: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in scenarios:
        strata[(s.group, s.spec.family)].append(s.name)
    out: dict[str, str] = {}
    counts = {"tune": 0, "holdout": 0}
    for key in sorted(strata):
        names = sorted(strata[key], key=_hash)
        first = "tune" if counts["tune"] <= counts["holdout"] else "holdout"
        second = "holdout" if first == "tune" else "tune"
        for j, name in enumerate(names):
            half = first if j % 2 == 0 else second
            out[name] = half
            counts[half] += 1
    return out


SPLITS = assign_splits(SCENARIOS)
SPLITS.update({s.name: split for split, runs in HELD_OUT.items() for s in runs})
SPLIT_NAMES = ("tune", "holdout", *HELD_OUT)
