"""Pool several held-out reads: the per-set summaries of ``bench_alerts.py --json`` outputs
summed per detector and sampling interval (caught, healthy runs paged, healthy runs with
nothing to warn of paged), with the verdict against every peer at once on the pooled counts.

One set of 64 runs holds about 21 divergences and 42 healthy runs: "at most one healthy run
in 28" is 0 or 1 a set, and one run more or less turns a set's verdict. Sets read with the
same rules, none of them used to choose those rules, pool into a figure with room to tell.

    python bench/bench_alerts.py --split fresh74 --intervals 1,10,25,40,50 --json f74.json
    ...
    python bench/pool_reads.py f69.json f70.json ... f77.json

With no files it pools ``bench/reads/*.json``, the summaries of the held-out reads kept in
the repository (``bench_alerts.py --summary``). Reads made with different rules (their
``rules`` fingerprints differ) are not pooled.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench_alerts import not_beaten, rules_fingerprint

#: the held-out reads' summaries kept in the repository
READS = Path(__file__).resolve().parent / "reads"

#: the detector under test (its other row, "on arrival", is pooled too)
OURS = "logitwatch"


def _pair(s: str) -> tuple[int, int]:
    a, b = s.split("/")
    return int(a), int(b)


def pool(outputs: list[dict[str, Any]]) -> dict[tuple[str, int], list[int]]:
    """``{(detector, interval): [caught, diverging, healthy paged, healthy, nothing-to-warn
    paged, nothing to warn of]}`` summed over every set and interval of ``outputs`` (each a
    ``bench_alerts.py --json`` document)."""
    tot: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0] * 6)
    for doc in outputs:
        for key, rows in doc["summary"].items():
            interval = int(key.rsplit("@", 1)[1])
            for s in rows:
                t = tot[(s["detector"], interval)]
                for i, field in enumerate(("recall", "healthy_paged", "unwanted_paged")):
                    a, b = _pair(s.get(field) or "0/0")
                    t[2 * i] += a
                    t[2 * i + 1] += b
    return dict(tot)


def better_than_all(tot: dict[tuple[str, int], list[int]], interval: int,
                    paged_at: int) -> list[str]:
    """The peers the detector under test is not strictly better than at once at
    ``interval`` (``bench_alerts.not_beaten`` on the pooled counts; ``paged_at`` 2: every
    healthy run, 4: those with nothing to warn of)."""
    rows = [{"detector": d, "recall": f"{t[0]}/{t[1]}", "healthy_paged": f"{t[2]}/{t[3]}",
             "unwanted_paged": f"{t[4]}/{t[5]}"}
            for (d, k), t in sorted(tot.items(), key=lambda kv: kv[0][0] != OURS)
            if k == interval]
    return not_beaten(rows, {2: "healthy_paged", 4: "unwanted_paged"}[paged_at])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outputs", type=Path, nargs="*",
                    help="bench_alerts.py --json or --summary outputs (default: every file "
                    "in bench/reads)")
    a = ap.parse_args(argv)
    paths = a.outputs or sorted(READS.glob("*.json"))
    if not paths:
        ap.error(f"no reads given and none in {READS}: run bench_alerts.py --summary")
    docs = []
    for p in paths:
        try:
            doc = json.loads(p.read_text())
            if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict):
                raise ValueError("no summaries in it")
        except (OSError, ValueError) as e:
            ap.error(f"{p}: not a bench_alerts.py --json output ({e})")
        docs.append(doc)
    made_with = {p.name: d["rules"] for p, d in zip(paths, docs, strict=True) if d.get("rules")}
    if len(set(made_with.values())) > 1:
        ap.error("these reads were made with different rules, which do not pool: "
                 + ", ".join(f"{n} {r}" for n, r in made_with.items()))
    tot = pool(docs)
    sets = sorted({k.rsplit("@", 1)[0] for d in docs for k in d["summary"]})
    print(f"{len(sets)} sets pooled: {', '.join(sets)}")
    if made_with:
        fp = next(iter(made_with.values()))
        print(f"rules {fp}" + (" (the defaults now)" if fp == rules_fingerprint()
                               else " (not the defaults now)"))
    print(f"{'detector':34s} {'@':>3s}  caught     healthy paged  nothing to warn of, paged")
    for (det, k), t in sorted(tot.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{det:34s} {k:>3d}  {t[0]:>4d}/{t[1]:<4d}  {t[2]:>4d}/{t[3]:<4d}     "
              f"{t[4]:>4d}/{t[5]:<4d}")
    for k in sorted({k for _, k in tot}):
        if (OURS, k) not in tot:
            continue
        verdicts = []
        for at, what in ((2, "every healthy run"), (4, "nothing to warn of")):
            not_better = better_than_all(tot, k, at)
            verdicts.append(f"{what}: " + ("better than every peer" if not not_better
                                           else "not better than " + ", ".join(not_better)))
        print(f"@{k}: " + " | ".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
