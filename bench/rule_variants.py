"""Several variants of one default rule, judged in one replay per run and interval.

A rules YAML whose rules are named ``<default rule>--<tag>`` (``attn_logit_departure--s0``)
holds variants of that default rule. Each run is replayed once, at each interval, with the
defaults and every variant beside them (the variants fire and page under their own names,
so they do not meet each other's episodes); a variant's first page (from step 50) is then
the earliest page of every rule but the default and its variants, or the variant's own.
Against the default's, per interval it prints diverging runs caught by their divergence,
healthy and degraded runs paged, and the runs whose first page moved.

Cheaper than one ``bench_alerts.py --rules`` replay per variant (a run's replay costs the
same with three variants beside the defaults as without), and exact as long as the rule
under study neither inhibits another nor is inhibited (a variant's page cannot hold back
another rule's page here): a change it suggests is then checked with ``bench_alerts.py
--rules``. Round forty's three ``start_rise`` values on 599 runs of ``--split read60``:
``docs/ALERTS_EVIDENCE.md``.

    python bench/rule_variants.py bench/variants_round40.yaml --split read60 \\
        --logits-above 50 --intervals 1 --jobs 2 --json /tmp/variants.json
    python bench/rule_variants.py bench/variants_round40.yaml --split fresh61 --names-file runs.txt
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_alerts as ba  # noqa: E402
from scenario_frames import derive, read_header, read_run  # noqa: E402

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
FP16_MAX = 65504.0
SEP = "--"  # a variant is named <default rule>--<tag> (rule names allow letters, digits, _ . -)


def variants_of(path: str | Path) -> tuple[str, list[str], list[Any]]:
    """The default rule the YAML's variants vary, their names, and the rule set to replay
    (the defaults with the variants added); raises ``ValueError`` saying what is wrong."""
    from logitwatch.server.alerts.defaults import DEFAULT_RULES, load_rules_file

    extra = load_rules_file(path)
    bases = {r.name.split(SEP, 1)[0] for r in extra}
    defaults = {r.name for r in DEFAULT_RULES}
    if not extra or len(bases) != 1 or any(SEP not in r.name for r in extra):
        raise ValueError(f"{path}: name every rule <default rule>--<tag>, all of one default "
                         f"rule (got {[r.name for r in extra]})")
    (base,) = bases
    if base not in defaults:
        raise ValueError(f"{path}: {base!r} is not a default rule (one of {sorted(defaults)})")
    return base, [r.name for r in extra], [*DEFAULT_RULES, *extra]


def logits_pass(name: str, above: float) -> bool:
    """Whether run ``name``'s max attention logit passes ``above`` in a wide dtype (every
    frame's ``attn.dtype_max`` over float16's 65504) before its divergence, if any: the runs
    a change to the wide-dtype departure can touch."""
    header, frames = read_run(SCENARIOS / f"{name}.jsonl.gz")
    end = header["divergence_step"]
    for f in frames:
        if f["scalars"].get("attn.dtype_max", math.inf) <= FP16_MAX:
            return False
        if end is not None and f["step"] >= end:
            break
        rows = (f.get("heads") or {}).get("attn.logit_max") or ()
        if any(float(x) > above for r in rows for x in r if x is not None):
            return True
    return False


def pages_of(name: str, k: int, variants: str) -> dict[str, Any]:
    """Run ``name`` replayed at interval ``k`` with the defaults and the variants: each
    rule's first page from step 50."""
    from logitwatch.server.alerts.replay import replay

    logging.getLogger("logitwatch").setLevel(logging.ERROR)
    rules = variants_of(variants)[2]
    header, frames = read_run(SCENARIOS / f"{name}.jsonl.gz")
    res = replay(derive(frames, k), rules=rules, batch=ba.REPLAY_BATCH)
    pages: dict[str, int] = {}
    for a in res.alerts:
        s = ba._paged_step(a)
        if s is not None and s >= ba.START:
            pages[a.rule] = min(pages.get(a.rule, s), s)
    return {"scenario": name, "interval": k, "label": header["label"],
            "divergence_step": header["divergence_step"], "pages": pages}


def first_page(pages: dict[str, int], base: str, variant: str) -> int | None:
    """The run's first page had ``variant`` stood in for ``base``."""
    steps = [s for r, s in pages.items() if r != base and not r.startswith(base + SEP)]
    if variant in pages:
        steps.append(pages[variant])
    return min(steps, default=None)


def tally(rows: list[dict[str, Any]], base: str, variant: str) -> Counter[str]:
    """Caught (diverging paged by its divergence), healthy and degraded paged."""
    c: Counter[str] = Counter()
    for r in rows:
        f = first_page(r["pages"], base, variant)
        c[r["label"]] += 1
        if r["label"] == "diverging":
            c["caught"] += f is not None and f <= r["divergence_step"]
        else:
            c[f"{r['label']} paged"] += f is not None
    return c


def report(rows: list[dict[str, Any]], base: str, variants: list[str]) -> str:
    """Per interval and variant against ``base``: the tallies and the runs that moved."""
    out = []
    for k in sorted({r["interval"] for r in rows}):
        at = [r for r in rows if r["interval"] == k]
        for v in [base, *variants]:
            c = tally(at, base, v)
            out.append(f"@{k:<3} {v:<40} caught {c['caught']}/{c['diverging']}  healthy "
                       f"paged {c['healthy paged']}/{c['healthy']}  degraded paged "
                       f"{c['degraded paged']}/{c['degraded']}")
        for v in variants:
            for r in at:
                was, now = (first_page(r["pages"], base, x) for x in (base, v))
                if was != now:
                    out.append(f"    {v}: {r['scenario']} ({r['label']}, divergence "
                               f"{r['divergence_step']}): first page {was} -> {now}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", help="rules YAML of <default rule>--<tag> variants")
    p.add_argument("--split", default="tune", choices=(*ba.SETS, "both", *ba.READ_THROUGH),
                   help="the recorded sets to replay (as bench_alerts.py --split)")
    p.add_argument("--names", nargs="*", help="only these runs of the split")
    p.add_argument("--names-file", help="only the runs named in this file (whitespace)")
    p.add_argument("--logits-above", type=float, default=None, metavar="X",
                   help="only runs whose max attention logit passes X in a wide dtype before "
                   "any divergence (round forty: 50, the departure's floor)")
    p.add_argument("--intervals", default="1,50", help="sampling intervals (default 1,50)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--json", help="write every run's per-rule first pages here")
    a = p.parse_args(argv)
    try:
        base, names, _ = variants_of(a.variants)
    except (ValueError, OSError) as e:
        p.error(str(e))
    splits = ba.sets_of(a.split)
    runs = sorted(h["scenario"] for h in map(read_header, SCENARIOS.glob("*.jsonl.gz"))
                  if h.get("split") in splits)
    wanted = set(a.names or ())
    if a.names_file:
        wanted |= set(Path(a.names_file).read_text().split())
    if wanted:
        unknown = wanted - set(runs)
        if unknown:
            p.error(f"not runs of --split {a.split}: {sorted(unknown)[:5]}")
        runs = [n for n in runs if n in wanted]
    if a.logits_above is not None:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max(1, a.jobs)) as ex:
            keep = list(ex.map(logits_pass, runs, [a.logits_above] * len(runs), chunksize=8))
        print(f"{sum(keep)} of {len(runs)} runs pass {a.logits_above:g} in a wide dtype "
              f"before any divergence ({time.perf_counter() - t0:.0f}s)", flush=True)
        runs = [n for n, y in zip(runs, keep, strict=True) if y]
    ks = [int(x) for x in a.intervals.split(",")]
    names_k = [(n, k) for n in runs for k in ks]
    print(f"{len(runs)} runs x {len(ks)} intervals, {base} and {len(names)} variants",
          flush=True)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max(1, a.jobs)) as ex:
        got = ex.map(pages_of, [n for n, _ in names_k], [k for _, k in names_k],
                     [a.variants] * len(names_k))
        for i, row in enumerate(got, 1):
            rows.append(row)
            if i % 25 == 0 or i == len(names_k):
                print(f"[{i}/{len(names_k)}] {time.perf_counter() - t0:.0f}s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"base": base, "variants": names, "rows": rows}))
    print(report(rows, base, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
