"""Replay every recorded scenario through the real alert engine, beside the peer detectors.

For each detector: recall (diverging scenarios alarmed no later than the step the loss
diverged), median and worst lead in steps (divergence step - first alarm step, over the
caught ones), lead >= 50 over the diverging scenarios where some signal other than the loss
left its own range at least 50 steps before the divergence (the first alert of any
severity, ``info`` included, from a rule not on the loss; the column "signal"), false-alarm runs
(healthy scenarios with any alarm) and warned degraded runs (runs that did not diverge but
ended >= 0.25 nat above their best loss, labelled by record_scenarios.outcome: a warning there
is wanted, so they count neither as catches nor as false alarms; the line below the table
says what the false alarms would be if they were counted as healthy). For logitwatch also
the number of alerts of every severity each run got (noise), with the default rules and
with every rule's hold (``keep_firing_for``) set to 0, the lifecycle before holds existed
(an alert resolved after 3 calm samples and a new breach opened a new one).

* logitwatch: ``logitwatch.server.alerts.replay.replay`` (schema validation, storage,
  ``AlertEngine.process``) with the default rules; an alarm is a ``warning`` or
  ``critical`` alert (``info`` alerts are shown on the dashboard, never paged); an alert
  stored as ``info`` by a downgrade and escalated later alarms at its ``escalated_step``.
* the peers, implemented as their projects describe them:
  - Megatron-LM: loss or grad norm above 10x the maximum of the first 100 values, or a
    NaN/Inf loss (its check_for_nan_in_loss_and_grad);
  - OLMo-core: loss or grad norm above mean + 6 sigma of the previous 128 values;
  - llm-foundry KillLossSpike: loss above 2x the running mean (window 100) for more than
    4 consecutive values;
  - Lightning SpikeDetection: loss above 2x the 10-value running mean (relative mode), or
    non-finite (``finite_only``);
  - fixed max-logit threshold: any head's max attention logit above 100 (QK-clip's tau).
  Loss-based peers see EVERY step's loss (the scenario header holds them), as they would in
  a training loop; grad-norm and logit peers see the sampled frames (one step in 10), as
  logitwatch does.

Usage: ``python bench/bench_alerts.py [--scenarios DIR] [--json OUT]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.replay import read_frames, replay
from logitwatch.wire import decode_float

HERE = Path(__file__).resolve().parent
ALARM = ("warning", "critical")

Series = list[tuple[int, float]]


def _num(v: Any) -> float:
    try:
        return decode_float(v)
    except ValueError:
        return float(v)  # "nan" in the header's loss list


def _series(frames: list[dict[str, Any]], name: str) -> Series:
    out = []
    for f in frames:
        if name in f["scalars"]:
            out.append((f["step"], _num(f["scalars"][name])))
    return out


def _max_logit(frames: list[dict[str, Any]]) -> Series:
    out = []
    for f in frames:
        m = f["heads"].get("attn.logit_max")
        if m:
            vals = [_num(x) for row in m for x in row]
            out.append((f["step"], max(vals) if all(math.isfinite(x) for x in vals) else math.nan))
    return out


def megatron(s: Series) -> int | None:
    first: list[float] = []
    for step, v in s:
        if not math.isfinite(v):
            return step
        if len(first) < 100:
            first.append(v)
            continue
        if v > 10 * max(first):
            return step
    return None


def olmo(s: Series, window: int = 128, sigmas: float = 6.0) -> int | None:
    hist: list[float] = []
    for step, v in s:
        if len(hist) >= window:
            w = hist[-window:]
            mu = statistics.fmean(w)
            sd = statistics.pstdev(w)
            if math.isfinite(v) and v > mu + sigmas * sd:
                return step
        if math.isfinite(v):
            hist.append(v)
    return None


def kill_loss_spike(s: Series, window: int = 100, mult: float = 2.0,
                    patience: int = 4) -> int | None:
    hist: list[float] = []
    streak = 0
    for step, v in s:
        if len(hist) >= window:
            mean = statistics.fmean(hist[-window:])
            streak = streak + 1 if math.isfinite(v) and v > mult * mean else 0
            if streak > patience:
                return step
        if math.isfinite(v):
            hist.append(v)
    return None


def lightning(s: Series, window: int = 10, threshold: float = 2.0) -> int | None:
    hist: list[float] = []
    for step, v in s:
        if not math.isfinite(v):
            return step
        if len(hist) >= window and v > threshold * statistics.fmean(hist[-window:]):
            return step
        hist.append(v)
    return None


def fixed_logit(s: Series, tau: float = 100.0) -> int | None:
    return next((step for step, v in s if math.isfinite(v) and v > tau), None)


def _first(*steps: int | None) -> int | None:
    have = [s for s in steps if s is not None]
    return min(have) if have else None


def peers(header: dict[str, Any], frames: list[dict[str, Any]]) -> dict[str, int | None]:
    losses = [(i, _num(x)) for i, x in enumerate(header.get("losses") or [])] or \
        _series(frames, "loss")
    grad = _series(frames, "grad.norm")
    return {
        "Megatron-LM 10x max(first 100)": _first(megatron(losses), megatron(grad)),
        "OLMo-core mean+6sd/128": _first(olmo(losses), olmo(grad)),
        "llm-foundry KillLossSpike": kill_loss_spike(losses),
        "Lightning SpikeDetection": lightning(losses),
        "fixed max-logit > 100": fixed_logit(_max_logit(frames)),
    }


NO_HOLD = [dataclasses.replace(r, keep_firing_for=0) for r in DEFAULT_RULES]


LOSS_RULES = {r.name for r in DEFAULT_RULES if r.metric == "loss"}


def logitwatch_first(frames: list[dict[str, Any]]
                     ) -> tuple[int | None, list[str], int, int | None]:
    """First alarm step, the rules that alarmed then, how many alerts were stored, and the
    first step any signal but the loss left its range (an alert of any severity)."""
    res = replay(frames)
    alarms = sorted((int(a.evidence.get("escalated_step", a.fired_step)), a.rule)
                    for a in res.alerts if a.severity in ALARM)
    first = alarms[0][0] if alarms else None
    rules = sorted({r for s, r in alarms if first is not None and s == first})
    signal = min((a.fired_step for a in res.alerts if a.rule not in LOSS_RULES), default=None)
    return first, rules, len(res.alerts), signal


def logitwatch_row(header: dict[str, Any], frames: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario's row as :func:`summarize` reads it: label, divergence step, the first
    signal and logitwatch's first alarm (with the rules behind it and the alert count)."""
    first, rules, count, signal = logitwatch_first(frames)
    return {"scenario": header["scenario"], "label": header["label"],
            "divergence_step": header["divergence_step"], "signal": signal,
            "logitwatch": first, "logitwatch_rules": rules, "alerts": count}


def summarize(name: str, rows: Sequence[dict[str, Any]],
              pick: Callable[[dict[str, Any]], int | None]) -> dict[str, Any]:
    div = [r for r in rows if r["label"] == "diverging"]
    healthy = [r for r in rows if r["label"] == "healthy"]
    degraded = [r for r in rows if r["label"] == "degraded"]
    leads = []
    for r in div:
        s = pick(r)
        if s is not None and s <= r["divergence_step"]:
            leads.append(r["divergence_step"] - s)
    fa = [r["scenario"] for r in healthy if pick(r) is not None]
    led = [r for r in div if r["signal"] is not None and r["signal"] <= r["divergence_step"] - 50]
    early = [r for r in led if pick(r) is not None and r["divergence_step"] - pick(r) >= 50]
    warned = [r["scenario"] for r in degraded if pick(r) is not None]
    return {"detector": name, "recall": f"{len(leads)}/{len(div)}",
            "median_lead": statistics.median(leads) if leads else None,
            "worst_lead": min(leads) if leads else None,
            "lead>=50": f"{len(early)}/{len(led)}",
            "late": [r["scenario"] for r in led if r not in early],
            "false_alarm_runs": f"{len(fa)}/{len(healthy)}", "false_alarms": fa,
            "degraded_warned": f"{len(warned)}/{len(degraded)}",
            "false_alarm_runs_if_degraded_healthy":
                f"{len(fa) + len(warned)}/{len(healthy) + len(degraded)}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", type=Path, default=HERE / "scenarios")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    a = p.parse_args(argv)
    logging.getLogger("logitwatch.alerts").setLevel(logging.ERROR)  # the table says it all
    files = sorted(a.scenarios.glob("*.jsonl"))
    if not files:
        p.error(f"no scenarios in {a.scenarios}: run bench/record_scenarios.py")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, path in enumerate(files, 1):
        header, frames = read_frames(path)
        if header is None:
            p.error(f"{path}: no header line (label, divergence_step)")
        row = {**logitwatch_row(header, frames),
               "alerts_no_hold": len(replay(frames, rules=NO_HOLD).alerts),
               **peers(header, frames)}
        rows.append(row)
        print(f"[{i}/{len(files)}] {row['scenario']:20s} {row['label']:9s} "
              f"div {row['divergence_step']!s:>5}  logitwatch {row['logitwatch']!s:>5} "
              f"{','.join(row['logitwatch_rules'])}", file=sys.stderr, flush=True)
    names = ["logitwatch", *[k for k in rows[0] if k not in
                             ("scenario", "label", "divergence_step", "signal", "logitwatch",
                              "logitwatch_rules", "alerts", "alerts_no_hold")]]
    print("\nFirst alarm step per scenario (divergence step: the demo's divergence_step):")
    short = [n.split()[0] for n in names]
    print(f"{'scenario':20s} {'label':9s} {'diverges':>8s} {'signal':>6s} " +
          " ".join(f"{s:>11.11s}" for s in short) + "   alerts (all severities; hold 0)")
    for r in rows:
        print(f"{r['scenario']:20s} {r['label']:9s} {r['divergence_step']!s:>8s} "
              f"{r['signal']!s:>6s} " +
              " ".join(f"{r[n]!s:>11s}" for n in names) +
              f"   {r['alerts']:>6d} ({r['alerts_no_hold']})")
    print(f"{'all':20s} {'':9s} {'':8s} {'':6s} {'':>11s} "
          + " ".join(f"{'':>11s}" for _ in names[1:])
          + f"   {sum(r['alerts'] for r in rows):>6d} "
          f"({sum(r['alerts_no_hold'] for r in rows)})")
    summary = [summarize(n, rows, lambda r, n=n: r[n]) for n in names]
    print(f"\n{'detector':32s} {'recall':>7s} {'median lead':>12s} {'worst lead':>11s} "
          f"{'lead>=50':>9s} {'false-alarm runs':>17s} {'degraded warned':>16s}")
    for s in summary:
        print(f"{s['detector']:32s} {s['recall']:>7s} {s['median_lead']!s:>12s} "
              f"{s['worst_lead']!s:>11s} {s['lead>=50']:>9s} {s['false_alarm_runs']:>17s} "
              f"{s['degraded_warned']:>16s}"
              + (f"  (false alarms: {', '.join(s['false_alarms'])})" if s["false_alarms"]
                 else ""))
    print("\nlead>=50 counts the diverging runs where a signal left its range >= 50 steps "
          "before the divergence; below 50 there: "
          + "; ".join(f"{s['detector'].split()[0]} {', '.join(s['late']) or '-'}"
                      for s in summary[:1]))
    print("false-alarm runs if the degraded runs counted as healthy: "
          + ", ".join(f"{s['detector'].split()[0]} {s['false_alarm_runs_if_degraded_healthy']}"
                      for s in summary))
    print(f"\n{len(files)} scenarios replayed in {time.perf_counter() - t0:.1f}s")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
