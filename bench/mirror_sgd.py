"""Offline mirrors of two momentum-SGD limits on every step of the recorded runs (the
headers' every-step loss and gradient norm), to measure what a rule change could do without
replaying the engine (docs/ALERTS.md, *Known limits*).

``garbage``: every SGD run with injected bad batches after step 20. It prints how far the
loss sits over its level before the garbage (the median of the 20 steps before it) 0-50 steps
after the garbage ends, by label (5th, 50th and 95th percentiles, and the extremes); how many
steps after the garbage's end the diverging runs are dated; and, for a grid of rules "the
loss ``nats`` over that level with the gradient ``grad`` x its median before, within 10
steps of the garbage's end", the healthy runs it would fire on and the diverging runs it
would fire on by their divergence. The garbage's end is the recorder's, which the engine
does not know: a mirror of the best a rule could do.

``soft``: every unclipped SGD run. For a grid of "softer corroborations" of an unclipped
loss jump (the loss ``nats`` over its 20-step median, not under an earlier jump of the last
40 steps, after a precursor (the gradient 2.2x its calm median in the 5 steps before), with
the gradient ``grad`` x that median on the step or the one before), the healthy runs it
fires on and the diverging runs it fires on by their divergence. ``--candidates FILE`` writes
the runs any of them fires on; replayed at interval 1 (``bench_alerts.py --names $(cat FILE)
--json``) and given back with ``--paged``, they say which of those healthy runs are paged
already and which diverging runs paged after their divergence it would page in time.

The mirror ignores the rules' interplay (another rule paging first, inhibition): a change it
suggests must then be replayed (``bench_alerts.py --rules``).

    python bench/mirror_sgd.py garbage --split read73
    python bench/mirror_sgd.py soft --split read77 --candidates runs.txt
    python bench/bench_alerts.py --split read77 --intervals 1 --names $(cat runs.txt) \
        --json paged.json
    python bench/mirror_sgd.py soft --split read77 --paged paged.json
    python bench/mirror_sgd.py soft --split read78 --grid 2:8,2:12,2.5:12,2:16
"""

from __future__ import annotations

import argparse
import json
import statistics as st
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from bench_alerts import pairs, sets_of
from scenario_frames import read_header

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
#: steps after the garbage's end at which ``garbage`` reads the loss's excess
AFTER = (0, 5, 10, 15, 20, 30, 50)
#: ``garbage``'s grid: (nats over the level before, gradient x its median before)
GARBAGE_GRID = ((0.8, 5.0), (1.0, 3.0), (1.0, 5.0), (1.5, 5.0), (2.0, 5.0), (2.0, 10.0))
#: ``soft``'s grid: (nats over the 20-step median, gradient x its calm median)
SOFT_GRID = ((1.5, 3.0), (2.0, 3.0), (2.0, 4.0), (2.5, 4.0), (2.5, 5.0))
PRECURSOR = 2.2  # loss_jump's precursor_above
WITHIN = 10  # garbage: steps after the end a rule may fire


def _num(v: Any) -> float:
    """A recorded value as a float (a non-finite one, stored as a string, as +inf)."""
    return float(v) if isinstance(v, (int, float)) else float("inf")


def _sgd(path: Path, sets: frozenset[str]
         ) -> tuple[dict[str, Any], list[float], list[float]] | None:
    """An SGD run of ``sets``: its header, every step's loss and gradient norm; else None."""
    h = read_header(path)
    if h["split"] not in sets or h["spec"]["optimizer"] != "sgd":
        return None
    return h, [_num(v) for v in h["losses"]], [_num(v) for v in h["grad_norms"]]


def garbage_row(path: Path, sets: frozenset[str]) -> dict[str, Any] | None:
    """One SGD run with bad batches after step 20: its excess after the garbage and the
    first step each of :data:`GARBAGE_GRID` fires within :data:`WITHIN` steps of its end."""
    got = _sgd(path, sets)
    if got is None or not got[0]["spec"].get("bad_data"):
        return None
    h, loss, grad = got
    start, end, _ = h["spec"]["bad_data"][0]
    if start < 20 or end >= len(loss):
        return None
    level, glevel = st.median(loss[start - 20:start]), st.median(grad[start - 20:start])
    excess = []
    for k in AFTER:
        w = loss[end + k:end + k + 5]
        excess.append(st.median(w) - level if w else None)
    fires = {}
    for nats, gx in GARBAGE_GRID:
        fires[f"{nats}/{gx}"] = next(
            (t for t in range(end, min(len(loss), end + WITHIN))
             if loss[t] - level > nats and grad[t] > gx * glevel), None)
    return {"name": h["scenario"], "label": h["label"], "div": h["divergence_step"],
            "end": end, "excess": excess, "fires": fires}


def soft_row(path: Path, sets: frozenset[str],
             grid: tuple[tuple[float, float], ...] = SOFT_GRID) -> dict[str, Any] | None:
    """One unclipped SGD run: the first step each pair of ``grid`` fires (from 50)."""
    got = _sgd(path, sets)
    if got is None or got[0]["spec"]["max_norm"] is not None:
        return None
    h, loss, grad = got
    fires: dict[str, int | None] = {}
    for nats, gx in grid:
        hit = None
        for t in range(50, len(loss)):
            m = st.median(loss[t - 20:t])
            if not loss[t] - m >= nats or max(loss[t - 40:t]) >= loss[t]:
                continue  # no jump, or under an earlier one
            calm = st.median(grad[max(0, t - 55):t - 5])
            if not calm > 0 or max(grad[t - 5:t]) < PRECURSOR * calm:
                continue
            if max(grad[t - 1], grad[t]) >= gx * calm:
                hit = t
                break
        fires[f"{nats}/{gx}"] = hit
    return {"name": h["scenario"], "label": h["label"], "div": h["divergence_step"],
            "fires": fires}


def rows(kind: str, split: str, jobs: int, scenarios: Path = SCENARIOS,
         grid: tuple[tuple[float, float], ...] = SOFT_GRID) -> list[dict[str, Any]]:
    """The ``kind`` rows (``garbage`` or ``soft``, judged by ``grid``) of the recorded runs
    of ``split``."""
    sets = frozenset(sets_of(split))
    files = sorted(scenarios.glob("*.jsonl.gz"))
    one = (partial(garbage_row, sets=sets) if kind == "garbage"
           else partial(soft_row, sets=sets, grid=grid))
    with ProcessPoolExecutor(jobs) as ex:
        return [r for r in ex.map(one, files, chunksize=32) if r is not None]


def _q(v: list[float], q: float) -> float:
    return v[min(len(v) - 1, int(q * len(v)))]


def tally(rs: list[dict[str, Any]], key: str) -> tuple[int, int]:
    """(healthy runs ``key`` fires on, diverging runs it fires on by their divergence)."""
    healthy = sum(1 for r in rs if r["label"] == "healthy" and r["fires"][key] is not None)
    caught = sum(1 for r in rs if r["label"] == "diverging" and r["fires"][key] is not None
                 and r["div"] is not None and r["fires"][key] <= r["div"])
    return healthy, caught


def report_garbage(rs: list[dict[str, Any]]) -> None:
    print(f"{len(rs)} SGD runs with bad batches after step 20:",
          dict(Counter(r["label"] for r in rs)))
    for label in ("healthy", "diverging", "degraded"):
        these = [r for r in rs if r["label"] == label]
        if not these:
            continue
        print(f"{label}: the loss over its level before the garbage, k steps after its end")
        for i, k in enumerate(AFTER):
            v = sorted(r["excess"][i] for r in these if r["excess"][i] is not None)
            if v:
                print(f"  end+{k:<3d} q05 {_q(v, .05):7.2f}  q50 {_q(v, .5):7.2f}  "
                      f"q95 {_q(v, .95):9.2f}  min {v[0]:6.2f}  max {v[-1]:9.2f}")
    div = [r["div"] - r["end"] for r in rs if r["label"] == "diverging" and r["div"]]
    print("diverging: dated this many steps after the garbage's end:",
          dict(sorted(Counter(div).items())))
    n_h = sum(r["label"] == "healthy" for r in rs)
    n_d = sum(r["label"] == "diverging" for r in rs)
    for nats, gx in GARBAGE_GRID:
        h, d = tally(rs, f"{nats}/{gx}")
        print(f"loss +{nats} nat, gradient {gx}x, within {WITHIN} steps of the end: "
              f"healthy fired {h}/{n_h}, diverging by their divergence {d}/{n_d}")


def report_soft(rs: list[dict[str, Any]], paged: dict[str, Any] | None,
                grid: tuple[tuple[float, float], ...] = SOFT_GRID) -> None:
    print(f"{len(rs)} unclipped SGD runs:", dict(Counter(r["label"] for r in rs)))
    late = set()
    if paged is not None:
        late = {name for name, x in paged.items() if x["label"] == "diverging"
                and (x["first"] is None or x["first"] > x["divergence_step"])}
        print(f"{len(late)} diverging runs of --paged paged after their divergence (or never)")
    for nats, gx in grid:
        key = f"{nats}/{gx}"
        h, d = tally(rs, key)
        line = (f"loss +{nats} nat after a precursor, gradient {gx}x: healthy fired {h}, "
                f"diverging by their divergence {d}")
        if paged is not None:
            hit = [r for r in rs if r["fires"][key] is not None]
            new = [r["name"] for r in hit if r["label"] == "healthy"
                   and r["name"] in paged and paged[r["name"]]["first"] is None]
            mended = [r["name"] for r in hit if r["name"] in late
                      and r["fires"][key] <= r["div"]]
            unknown = sum(1 for r in hit if r["label"] == "healthy" and r["name"] not in paged)
            line += (f"; healthy not paged now {len(new)} ({unknown} not in --paged), "
                     f"late ones paged in time {len(mended)}: {', '.join(sorted(mended))}")
        print(line)


def load_paged(paths: list[Path]) -> dict[str, Any]:
    """Interval-1 rows of ``bench_alerts.py --json`` outputs, by run: label, divergence step
    and the rules' first page."""
    out = {}
    for p in paths:
        for x in json.loads(p.read_text())["rows"]:
            if x["interval"] == 1:
                out[x["scenario"]] = {"label": x["label"],
                                      "divergence_step": x["divergence_step"],
                                      "first": x["logitwatch"]["first"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("garbage", "soft"))
    ap.add_argument("--split", default="read77", help="recorded sets to read (default read77)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    ap.add_argument("--paged", type=Path, nargs="*", default=None,
                    help="soft: bench_alerts.py --json outputs (interval 1) to compare with")
    ap.add_argument("--candidates", type=Path, default=None,
                    help="soft: write the runs any rule of the grid fires on to this file")
    ap.add_argument("--grid", type=pairs("NATS:GRAD", float, float), default=SOFT_GRID,
                    help="soft: NATS:GRAD pairs to judge, comma-separated (default "
                    + ",".join(f"{n:g}:{g:g}" for n, g in SOFT_GRID) + ")")
    ap.add_argument("--scenarios", type=Path, default=SCENARIOS)
    a = ap.parse_args(argv)
    grid = a.grid
    rs = rows(a.kind, a.split, a.jobs, a.scenarios, grid)
    if not rs:
        ap.error(f"no recorded runs of that kind in --split {a.split} under {a.scenarios}")
    if a.kind == "garbage":
        report_garbage(rs)
    else:
        report_soft(rs, load_paged(a.paged) if a.paged else None, grid)
        if a.candidates is not None:
            names = sorted(r["name"] for r in rs if any(v is not None
                                                         for v in r["fires"].values()))
            a.candidates.write_text("\n".join(names) + "\n")
            print(f"{len(names)} runs written to {a.candidates}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
