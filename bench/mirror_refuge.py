"""An offline mirror of the QK-clip bias refuge rules (``q_bias_refuge``, ``k_bias_refuge``)
on every recorded step, to sweep the bias's share of the weight's norm and the steps a
breach must hold without replaying the engine (docs/ALERTS.md, *Known limits*).

At each recorded step of a run whose model has q/k biases (GPT-2 and post-LN), per head, the
two rules' conditions with their parameters read from ``server/alerts/defaults.py`` but the
share: over the 100 steps before, W's norm fell 20 % or more and the bias's norm rose 45 %
(q) or 20 % (k) or more, the head's max attention logit is at least 1 and did not fall 20 %
with the weight. A grid of
``SHARE:HOLD`` pairs then pages a run on the first step where a head has breached with its
bias's norm at least ``SHARE`` of the weight's for ``HOLD`` steps in a row (round forty-five:
0.25:30; round forty-six: 0.5:0). Per pair it prints the runs whose QK-clip scales the biases
too that it pages (nothing to warn of), the refuges (``expect_alert``) it pages and how much
later or earlier than the first pair, and any other run it pages by its divergence. The
mirror ignores the engine's sampling and its other rules: a change it suggests must then be
replayed (``bench_alerts.py --rules``).

    python bench/mirror_refuge.py --split read80                     # 0.25:30 against 0.5:0
    python bench/mirror_refuge.py --split read80 --grid 0.25:30,0.35:0,0.4:0,0.5:0,0.5:30
"""

from __future__ import annotations

import argparse
import statistics as st
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from bench_alerts import pairs, sets_of
from scenario_frames import read_header, read_run

from logitwatch.server.alerts.defaults import DEFAULT_RULES

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
#: the two refuge rules as the defaults have them (their ``share`` is what the grid sweeps)
REFUGES = tuple(r for r in DEFAULT_RULES if r.name in ("q_bias_refuge", "k_bias_refuge"))
#: (share, hold): round forty-five's rule first (the pair the others are compared with)
GRID = ((0.25, 30), (0.5, 0))
#: the lowest share the mirror keeps a breach at (under every pair the grid may hold)
KEEP = 0.25


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


def breach_row(path: Path, sets: frozenset[str]) -> dict[str, Any] | None:
    """One run of ``sets`` with q/k biases: every head's breaching steps as ``(step, share)``
    (share at least :data:`KEEP`), by ``"q0.1"`` (side, layer, head); else None."""
    h = read_header(path)
    if h["split"] not in sets or h["spec"]["family"] not in ("gpt2", "postln"):
        return None
    h, frames = read_run(path)
    by = {f["step"]: f["heads"] for f in frames
          if f.get("heads") and "qk.q_bias_norm" in f["heads"]}
    out: dict[str, list[tuple[int, float]]] = {}
    for rule in REFUGES:
        wk, bk, lk = rule.metric, str(rule.param("other")), str(rule.param("logit"))
        fall, floor = float(rule.param("min_change")), float(rule.param("logit_floor"))
        rise = fall if rule.param("min_rise") is None else float(rule.param("min_rise"))
        side = rule.name[0]  # q or k
        for step in sorted(by):
            then, now = by.get(step - int(rule.param("window"))), by[step]
            if then is None:
                continue
            for li, row in enumerate(now[wk]):
                for hi in range(len(row)):
                    v = [_num(x[key][li][hi]) for x in (then, now) for key in (wk, bk, lk)]
                    if any(x is None for x in v):
                        continue
                    w0, b0, l0, w1, b1, l1 = v  # type: ignore[misc]
                    if not (w0 > 0 and b0 > 0 and w1 > 0):
                        continue
                    share = b1 / w1
                    if (w1 / w0 - 1 <= -fall and b1 / b0 - 1 >= rise and share >= KEEP
                            and l1 >= floor and l1 >= (1 - fall) * l0):
                        out.setdefault(f"{side}{li}.{hi}", []).append((step, round(share, 4)))
    return {"name": h["scenario"], "label": h["label"], "div": h["divergence_step"],
            "scaled": bool(h["spec"].get("qk_clip_biases")), "expect": h.get("expect_alert"),
            "steps": sorted(by), "breaches": out}


def first_page(row: dict[str, Any], share: float, hold: int) -> int | None:
    """The first step a head of ``row`` has breached at ``share`` or more for ``hold`` steps
    in a row (its recorded steps, none missed between), None if never."""
    index = {s: i for i, s in enumerate(row["steps"])}
    best = None
    for seq in row["breaches"].values():
        start = prev = None
        for step, sh in seq:
            if sh < share:
                start = prev = None
                continue
            if prev is None or index[step] != index[prev] + 1:
                start = step
            prev = step
            if step - start >= hold:
                best = step if best is None else min(best, step)
                break
    return best


def rows(split: str, jobs: int, scenarios: Path = SCENARIOS) -> list[dict[str, Any]]:
    """The rows of every recorded run of ``split`` with q/k biases."""
    one = partial(breach_row, sets=frozenset(sets_of(split)))
    with ProcessPoolExecutor(jobs) as ex:
        return [r for r in ex.map(one, sorted(scenarios.glob("*.jsonl.gz")), chunksize=16)
                if r is not None]


def judge(rs: list[dict[str, Any]], grid: tuple[tuple[float, int], ...]
          ) -> list[dict[str, Any]]:
    """Per pair of ``grid``: the scaled runs it pages, the refuges it pages (of all), their
    first pages' shift against the first pair's (median, 90th percentile, extremes), and the
    other runs it pages by their divergence."""
    base = {r["name"]: first_page(r, *grid[0]) for r in rs}
    refuges = [r for r in rs if r["expect"]]
    out = []
    for share, hold in grid:
        got = {r["name"]: first_page(r, share, hold) for r in rs}
        shift = sorted(got[r["name"]] - base[r["name"]] for r in refuges
                       if got[r["name"]] is not None and base[r["name"]] is not None)
        out.append({
            "share": share, "hold": hold,
            "scaled": sorted(r["name"] for r in rs if r["scaled"] and got[r["name"]] is not None),
            "refuges": (sum(got[r["name"]] is not None for r in refuges), len(refuges)),
            "shift": (st.median(shift), shift[int(0.9 * (len(shift) - 1))], shift[0], shift[-1])
            if shift else None,
            "others": sorted(r["name"] for r in rs if not r["scaled"] and not r["expect"]
                             and got[r["name"]] is not None
                             and (r["div"] is None or got[r["name"]] <= r["div"]))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="read80", help="recorded sets to read (default read80)")
    ap.add_argument("--grid", type=pairs("SHARE:HOLD", float, int), default=GRID,
                    help="SHARE:HOLD pairs, comma-separated, the first the baseline (default "
                    + ",".join(f"{s:g}:{h}" for s, h in GRID) + ")")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    ap.add_argument("--scenarios", type=Path, default=SCENARIOS)
    a = ap.parse_args(argv)
    grid = a.grid
    if any(s < KEEP for s, _ in grid):
        ap.error(f"--grid: give shares of {KEEP} or more")
    rs = rows(a.split, a.jobs, a.scenarios)
    if not rs:
        ap.error(f"no recorded runs with q/k biases in --split {a.split} under {a.scenarios}")
    print(f"{len(rs)} runs with q/k biases, {sum(r['scaled'] for r in rs)} scaling them in "
          f"the clip, {sum(bool(r['expect']) for r in rs)} refuges")
    for j in judge(rs, grid):
        shift = ("-" if j["shift"] is None else
                 "median {:g}, p90 {:g}, from {:g} to {:g} steps".format(*j["shift"]))
        print(f"share {j['share']:g}, held {j['hold']}: scaled paged {len(j['scaled'])} "
              f"{j['scaled'][:4]}; refuges paged {j['refuges'][0]}/{j['refuges'][1]} "
              f"(first page against {grid[0][0]:g}:{grid[0][1]}: {shift}); "
              f"others paged by their divergence {j['others'][:4]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
