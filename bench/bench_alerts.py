"""Replay the recorded scenarios through the real alert engine, beside the peer detectors,
per split (tuning half, held-out half) and per sampling interval.

Every scenario is recorded at every step (``record_scenarios.py``); for an interval ``k`` the
bench replays the frames a job sampling one step in ``k`` would send, each with the scalars
of the steps in between as its ``history`` (``scenario_frames.derive``), through
``logitwatch.server.alerts.replay.replay`` (schema validation, storage,
``AlertEngine.process``; the rules ``logitwatch serve`` applies, by default the defaults).

Per detector, over the runs of a split at an interval:

* **recall**: diverging runs paged no later than their divergence step and not before step
  50 (earlier pages are early-training noise, not a warning of this divergence). A page is
  an alert of severity ``warning`` or ``critical``; an ``info`` alert escalated later pages
  at its ``paged_step`` (``evidence.escalated_step`` for older engines);
* **median / worst lead** (steps from that page to the divergence) over the caught runs;
* **lead >= 50**: over the diverging runs where a *signal* leads (the first alert of any
  severity from a rule not on the loss, at step >= 50 and at least 50 steps before the
  divergence), those the detector paged at least 50 steps ahead; **held**: the same where
  the signal is the first such alert still firing at the divergence (not resolved before
  it: an early blip that came back in range is no lead of this divergence);
* **healthy paged**: healthy runs with a page at any step (the line below the table says
  which were paged only by the rule their ``expect_alert`` names: QK-clip's bias refuge is a
  real pathology under a healthy loss); **healthy any alert**: with an alert of any
  severity, ``info`` included (logitwatch only; a peer's alarm is its page);
* **degraded warned**: degraded runs paged at step >= 50 (wanted, counted apart);
* **nothing to warn of, paged**: the healthy runs whose header names no expected alert, and
  those paged (per detector); and the verdict the issue's target names, per set and
  interval: whether logitwatch catches more runs than every peer and pages fewer healthy
  runs at once, counting every healthy run and counting those alone;
* **expect_alert**: runs whose header names a rule that should fire (``qk_bias_refuge``:
  ``q_bias_refuge`` or ``k_bias_refuge``), and how many got it (any severity / paged).

The peers, as their projects' code has them (the parameters are their defaults):

* Megatron-LM (``megatron/core/rerun_state_machine.py``): a NaN/Inf loss or grad norm (its
  check_for_nan_in_loss_and_grad, on by default), or the loss or grad norm above 10x the
  maximum of its first 100 values (``is_unexpectedly_large``: the spiky-loss and
  large-grads checks, opt-in there, counted here as on);
* OLMo-core (``StabilityMonitorCallback``): the loss or grad norm above mean + 6 sigma
  (population) of the previous 128 values. OLMo-core only logs such a spike (a
  ``SpikeScore`` metric) and never stops or pages: counted here as if a person were paged
  on each spike it logs, which gives it more catches and more false alarms than the tool
  has;
* llm-foundry KillLossSpike: loss above 2x the running mean (window 100) for more than 4
  consecutive values;
* Lightning SpikeDetection (``lightning_fabric/utilities/spike.py``): from the second
  batch, a non-finite loss, or a loss above the previous good one and ``rtol`` (2) x the
  running mean of the last 10 good losses away from it (3x the mean); the first spike
  stops training (``TrainingSpikeException``): nothing after it is counted;
* fixed max-logit threshold: any head's max attention logit above 100 (QK-clip's tau).

Loss and grad-norm peers see EVERY step (the header holds them), as they would in a training
loop; the logit peer sees the frames sampled at the interval, as logitwatch does.

Held-out numbers are printed only with ``--split holdout`` or ``--split both``: whoever
tunes the rules looks at the tuning half alone until the tuning is done. After the first
held-out half was read, every rule change has had its own held-out set, fixed and recorded
before the set before it was read (``scenario_specs_freshN.py``, split ``freshN``, listed in
the order they were fixed in ``scenario_sets.HELD_OUT``). A change is chosen on ``--split
readN`` (every run recorded before ``fresh{N+1}``: ``read``/``seen``/``read5`` name the early
rounds' data) and replayed once on the set fixed after it; which round read which set, and
what each replay gave: docs/ALERTS_EVIDENCE.md. Round forty-four was chosen on ``--split
read68`` (``long1`` and ``long2`` with it) and replayed once on ``fresh69`` to ``fresh78``
(their summaries kept in ``bench/reads/``, which ``pool_reads.py`` pools). The current rules
(round forty-five: the QK-clip bias refuge held 30 steps) were chosen on ``--split read78``
and ``qkclip1`` (a QK-clip that scales the biases too) and replayed once on ``qkclip2`` and
``fresh79`` (every clipped run clipping at 0.7 of its usual norm), and ``fresh80`` (initial
weights at 0.75 of the scale) with it, no change made (their summaries in
``bench/reads/round45/``). The current rules (round forty-six: the refuge at half the
weight's norm) were chosen on ``--split read80`` (through both probes and ``fresh80``) and
replayed once on ``qkclip3`` (a third such probe) and ``fresh81`` (batches of 12 sequences;
summaries in ``bench/reads/round46/``). Round forty-seven changed the hooks, not the rules:
the spike watch's loss test is the ``loss_jump`` rule's own and a CPU job flushes the history
at once after an anomalous step (``scenario_frames.derive`` derives the same frames); chosen
on ``--split read81`` and replayed once on ``fresh82`` (width 48 instead of 64; summaries in
``bench/reads/round47/``). The next change is chosen on ``--split read82`` and replayed once
on ``fresh83`` (warm-ups of 150 steps). ``--summary`` keeps a read's summaries alone with
the rules' fingerprint.

Usage::

    python bench/bench_alerts.py                           # tuning half, all intervals
    python bench/bench_alerts.py --intervals 1,10,40 --jobs 2 --json /tmp/alerts.json
    python bench/bench_alerts.py --split all --intervals 1 --jobs 2      # every set, all read
    python bench/bench_alerts.py --split fresh27 --rules change.yaml     # one set, a change
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_detectors import PEERS, START, peers  # noqa: E402
from scenario_frames import derive, history_supported, read_header, read_run  # noqa: E402

from logitwatch.server.alerts.defaults import DEFAULT_RULES  # noqa: E402

HERE = Path(__file__).resolve().parent
ALARM = ("warning", "critical")
INTERVALS = (1, 10, 25, 40, 50)
#: logitwatch's pages counted at the step of the frame that carried them to the collector
#: (a page judged on a step of a history arrives with the next sampled frame)
ARRIVAL = "logitwatch, on arrival"
LEAD = 50
REPLAY_BATCH = 256
#: An ``expect_alert`` names a rule, or one of these families of rules.
ALERT_FAMILIES = {"qk_bias_refuge": ("q_bias_refuge", "k_bias_refuge")}
LOSS_RULES = {r.name for r in DEFAULT_RULES if r.metric == "loss"}


# -- logitwatch ------------------------------------------------------------------------------


def _paged_step(a: Any) -> int | None:
    """The step an alert paged at (None: never became warning or critical, or was stored
    inhibited: a paged divergence alert of its run had already told people, so it was not
    sent)."""
    if getattr(a, "suppressed", None) == "inhibited":
        return None
    step = getattr(a, "paged_step", None)
    if step is not None:
        return int(step)
    if a.severity in ALARM:
        return int(a.evidence.get("escalated_step", a.fired_step))
    return None


def _expected(rule: str, expect: str) -> bool:
    return rule == expect or rule in ALERT_FAMILIES.get(expect, ())


def logitwatch_row(header: dict[str, Any], frames: list[dict[str, Any]],
                   rules: Sequence[Any] | None = None) -> dict[str, Any]:
    """One scenario's row at one interval (``frames`` already derived): label, divergence
    step, logitwatch's first page (any step, and from step 50) with the rules behind it,
    its first alert of any severity, the first signal (a non-loss rule's alert at step >=
    50), the alert count and, where the header names one, whether the expected rule fired."""
    from logitwatch.server.alerts.replay import replay

    res = replay(frames, rules=rules, batch=REPLAY_BATCH)
    pages = sorted((s, a.rule) for a in res.alerts if (s := _paged_step(a)) is not None)
    from50 = next((s for s, _ in pages if s >= START), None)
    # a page judged on a step of a frame's history reaches people with that frame
    sent = sorted(f["step"] for f in frames)

    def arrival(step: int | None) -> int | None:
        if step is None:
            return None
        i = bisect.bisect_left(sent, step)
        return sent[i] if i < len(sent) else step
    expect = header.get("expect_alert")
    row = {
        "scenario": header["scenario"], "label": header["label"],
        "divergence_step": header["divergence_step"], "split": header.get("split"),
        "group": header.get("group"), "family": header.get("family"),
        "logitwatch": {"first": pages[0][0] if pages else None, "from50": from50},
        ARRIVAL: {"first": arrival(pages[0][0]) if pages else None, "from50": arrival(from50)},
        "logitwatch_rules": sorted({r for s, r in pages if s == from50}),
        "any_alert": min((a.fired_step for a in res.alerts), default=None),
        "signal": min((a.fired_step for a in res.alerts if _is_signal(a)), default=None),
        "signal_held": _held_signal(res.alerts, header["divergence_step"]),
        "alerts": len(res.alerts),
        "rules_fired": sorted({a.rule for a in res.alerts}),
        "rules_paged": sorted({r for _, r in pages}),
    }
    if expect:
        row["expect_alert"] = expect
        row["expect_fired"] = any(_expected(a.rule, expect) for a in res.alerts)
        row["expect_paged"] = any(_expected(a.rule, expect) and _paged_step(a) is not None
                                  for a in res.alerts)
    return row


def _is_signal(a: Any) -> bool:
    """Whether alert ``a`` is a signal: a rule not on the loss, fired at step >= 50."""
    return a.rule not in LOSS_RULES and a.fired_step >= START


def _held_signal(alerts: Sequence[Any], divergence: int | None) -> int | None:
    """The first signal (:func:`_is_signal`) that fired by ``divergence`` and was still
    firing at it (not resolved before it); None without a divergence or such an alert."""
    if divergence is None:
        return None
    return min((a.fired_step for a in alerts
                if _is_signal(a) and a.fired_step <= divergence
                and (a.resolved_step is None or a.resolved_step >= divergence)), default=None)


def rules_over_defaults(path: str | Path) -> list[Any]:
    """A rules YAML merged over the defaults, as ``serve`` and ``replay`` apply
    ``LOGITWATCH_ALERT_RULES`` (a rule there replaces the default of its name); raises
    ``RuleError`` or ``OSError`` saying what is wrong."""
    from logitwatch.server.alerts.defaults import DEFAULT_RULES, load_rules_file, merge_rules

    return merge_rules(DEFAULT_RULES, load_rules_file(path))


def rules_fingerprint(rules: Sequence[Any] | None = None) -> str:
    """A short digest of a rule set (None: the defaults), every rule's whole definition: reads
    pooled by ``pool_reads.py`` must have been made with the same rules."""
    text = json.dumps([r.to_dict() for r in (DEFAULT_RULES if rules is None else rules)],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def quiet() -> None:
    """The collector's alert log off below errors (the tables say it all): the command's and
    its workers', never :func:`bench_one`'s (a test replaying a run keeps its logging)."""
    logging.getLogger("logitwatch").setLevel(logging.ERROR)


def bench_one(path: str, k: int, history: bool | None = None,
              rules: Sequence[Any] | None = None) -> dict[str, Any]:
    """Replay scenario ``path`` at interval ``k``; its row with the peers' columns.
    ``rules``: the rule set to replay (None: the defaults; see :func:`rules_over_defaults`)."""
    header, frames = read_run(path)
    use_history = history_supported() if history is None else history
    derived = derive(frames, k, history=use_history)
    t0 = time.perf_counter()
    row = logitwatch_row(header, derived, rules)
    row.update(peers(header, derived))
    row.update(interval=k, frames=len(derived), replay_s=round(time.perf_counter() - t0, 2))
    return row


# -- summary ----------------------------------------------------------------------------------


def summarize(name: str, rows: Sequence[dict[str, Any]],
              pick: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
              any_alert: Callable[[dict[str, Any]], int | None] | None = None
              ) -> dict[str, Any]:
    """One detector's figures over ``rows`` (``pick(row)`` -> ``{"first", "from50"}``;
    default ``row[name]``)."""
    pick = pick or (lambda r: r[name])
    div = [r for r in rows if r["label"] == "diverging"]
    healthy = [r for r in rows if r["label"] == "healthy"]
    degraded = [r for r in rows if r["label"] == "degraded"]
    leads, missed = [], []
    for r in div:
        s = pick(r)["from50"]
        if s is not None and s <= r["divergence_step"]:
            leads.append(r["divergence_step"] - s)
        else:
            missed.append(r["scenario"])
    led = [r for r in div if r["signal"] is not None
           and r["signal"] <= r["divergence_step"] - LEAD]
    early = [r for r in led if (s := pick(r)["from50"]) is not None
             and r["divergence_step"] - s >= LEAD]
    held = [r for r in div if r.get("signal_held") is not None
            and r["signal_held"] <= r["divergence_step"] - LEAD]
    held_early = [r for r in held if (s := pick(r)["from50"]) is not None
                  and r["divergence_step"] - s >= LEAD]
    paged = [r["scenario"] for r in healthy if pick(r)["first"] is not None]
    # the healthy runs with nothing to warn of (their header names no expected alert: the
    # QK-clip refuge's runs have a healthy loss and a real pathology), and those paged
    plain = [r for r in healthy if not r.get("expect_alert")]
    unwanted = [r["scenario"] for r in plain if r["scenario"] in paged]
    # paged only by the rule its header expects (a healthy loss, a real pathology)
    wanted = [r["scenario"] for r in healthy if r["scenario"] in paged
              and r.get("expect_alert") and name.startswith("logitwatch")
              and all(_expected(x, r["expect_alert"]) for x in r.get("rules_paged", ()))]
    noisy = ([r["scenario"] for r in healthy if any_alert(r) is not None]
             if any_alert is not None else paged)
    warned = [r["scenario"] for r in degraded if pick(r)["from50"] is not None]
    expect = [r for r in rows if r.get("expect_alert")]
    return {"detector": name, "recall": f"{len(leads)}/{len(div)}", "missed": missed,
            "median_lead": statistics.median(leads) if leads else None,
            "worst_lead": min(leads) if leads else None,
            "lead>=50": f"{len(early)}/{len(led)}",
            "late": [r["scenario"] for r in led if r not in early],
            "lead>=50 held": f"{len(held_early)}/{len(held)}",
            "healthy_paged": f"{len(paged)}/{len(healthy)}", "false_alarms": paged,
            "unwanted_paged": f"{len(unwanted)}/{len(plain)}",
            "paged_as_expected": wanted,
            "healthy_any_alert": f"{len(noisy)}/{len(healthy)}",
            "degraded_warned": f"{len(warned)}/{len(degraded)}",
            "expect_alert": (f"{sum(bool(r.get('expect_fired')) for r in expect)}/{len(expect)}"
                             f" ({sum(bool(r.get('expect_paged')) for r in expect)} paged)"
                             if expect and name.startswith("logitwatch") else "")}


def summaries(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [summarize("logitwatch", rows, any_alert=lambda r: r["any_alert"]),
            summarize(ARRIVAL, rows, any_alert=lambda r: r["any_alert"]),
            *[summarize(p, rows) for p in PEERS]]


def _table(split: str, k: int, summary: list[dict[str, Any]], n: int) -> str:
    lines = [f"\n== {split} half, interval {k} ({n} runs) ==",
             f"{'detector':32s} {'recall':>7s} {'med lead':>8s} {'worst':>6s} {'lead>=50':>9s} "
             f"{'healthy paged':>13s} {'any alert':>9s} {'degraded':>8s}  expect_alert"]
    for s in summary:
        lines.append(f"{s['detector']:32.32s} {s['recall']:>7s} {s['median_lead']!s:>8s} "
                     f"{s['worst_lead']!s:>6s} {s['lead>=50']:>9s} {s['healthy_paged']:>13s} "
                     f"{s['healthy_any_alert']:>9s} {s['degraded_warned']:>8s}  "
                     f"{s['expect_alert']}")
    lw = summary[0]
    expected = (f" ({len(lw['paged_as_expected'])} only by their expect_alert rule)"
                if lw["paged_as_expected"] else "")
    lines.append(f"logitwatch missed: {', '.join(lw['missed']) or '-'}; "
                 f"paged healthy: {', '.join(lw['false_alarms']) or '-'}{expected}; "
                 f"late where a signal led: {', '.join(lw['late']) or '-'}")
    return "\n".join(lines)


def _side_by_side(results: dict[tuple[str, int], list[dict[str, Any]]],
                  splits: Sequence[str], intervals: Sequence[int]) -> str:
    cols = [(sp, k) for k in intervals for sp in splits]
    head = f"{'detector':26s} " + " ".join(f"{f'{sp} @{k}':>15s}" for sp, k in cols)
    out = ["\nSide by side: recall (<= divergence, >= step 50) | healthy paged",
           head]
    names = [s["detector"] for s in results[cols[0]]]
    for i, name in enumerate(names):
        cells = []
        for c in cols:
            s = results[c][i]
            cells.append(f"{s['recall']:>7s} {s['healthy_paged']:>7s}")
        out.append(f"{name:26.26s} " + " ".join(f"{c:>15s}" for c in cells))
    out.append("\nHealthy runs with nothing to warn of (no expected alert in their header), "
               "paged")
    for i, name in enumerate(names):
        out.append(f"{name:26.26s} " + " ".join(f"{results[c][i]['unwanted_paged']:>15s}"
                                                for c in cols))
    out.append("\nlogitwatch against every peer at once (more runs caught and fewer healthy "
               "runs paged): every healthy run | those with nothing to warn of")
    for c in cols:
        out.append(f"  {c[0]:7s} @{c[1]:<3d} {_at_once(results[c], 'healthy_paged'):30s} | "
                   f"{_at_once(results[c], 'unwanted_paged')}")
    out.append("\nlogitwatch: median lead | lead >= 50 where a signal led (where it held to "
               "the divergence) | healthy with any alert | degraded warned")
    for c in cols:
        s = results[c][0]
        out.append(f"  {c[0]:7s} @{c[1]:<3d} {s['median_lead']!s:>6s} | {s['lead>=50']:>6s} "
                   f"({s['lead>=50 held']:>5s}) | "
                   f"{s['healthy_any_alert']:>6s} | {s['degraded_warned']:>6s}"
                   + (f" | expect_alert {s['expect_alert']}" if s["expect_alert"] else ""))
    return "\n".join(out)


#: the peers' short names (the verdict line)
PEER_SHORT = {p: ("max-logit" if p.startswith("fixed") else p.split(" ")[0]) for p in PEERS}


def _count(fraction: str) -> int:
    return int(fraction.split("/")[0])


def not_beaten(summary: list[dict[str, Any]], paged: str) -> list[str]:
    """The peers of ``summary`` that logitwatch (``summary[0]``) does not beat at once: more
    runs caught and fewer healthy runs paged (``paged``: every healthy run's count,
    ``healthy_paged``, or the unwanted ones', ``unwanted_paged``)."""
    lw = summary[0]
    return [s["detector"] for s in summary if s["detector"] in PEERS
            and not (_count(lw["recall"]) > _count(s["recall"])
                     and _count(lw[paged]) < _count(s[paged]))]


def _at_once(summary: list[dict[str, Any]], paged: str) -> str:
    """The verdict line's words for :func:`not_beaten`."""
    short = [PEER_SHORT[d] for d in not_beaten(summary, paged)]
    return "better than every peer" if not short else f"not better than {', '.join(short)}"


#: the newest held-out set is ``fresh{NEWEST}`` (a new set: bump it)
NEWEST = 88
#: sets fixed out of the ``freshN`` sequence, by the ``freshN`` they were fixed after: the
#: long runs, and the probes of a QK-clip that scales the biases too (``qkclip3`` fixed
#: after ``fresh81`` was fixed and ``fresh80`` read: it holds out the change chosen on
#: ``read80`` with ``fresh81``)
BETWEEN = {52: ("long1", "long2"), 79: ("qkclip1", "qkclip2"), 81: ("qkclip3",)}
#: every recorded set, in the order they were fixed
SETS = ("tune", "holdout", "fresh",
        *(s for i in range(2, NEWEST + 1) for s in (f"fresh{i}", *BETWEEN.get(i, ()))))
#: the "read" splits: every set up to and including the one named (a round's tuning data);
#: from read6 on, readN reads every set fixed before ``fresh{N+1}``, the one that holds it out
READ_THROUGH = {"seen": "fresh", "read": "fresh3", "read5": "fresh4",
                **{f"read{i}": (BETWEEN.get(i) or (f"fresh{i}",))[-1] for i in range(6, NEWEST)},
                "all": SETS[-1]}


def sets_of(split: str) -> tuple[str, ...]:
    """The recorded sets a ``--split`` names: ``both`` (tune and holdout), a read split
    (every set through the one it reads through) or one set."""
    if split == "both":
        return ("tune", "holdout")
    if split in READ_THROUGH:
        return SETS[:SETS.index(READ_THROUGH[split]) + 1]
    return (split,)


def pairs(names: str, first: Callable[[str], Any], second: Callable[[str], Any]
          ) -> Callable[[str], tuple[tuple[Any, Any], ...]]:
    """An argparse ``type`` for a comma-separated list of ``A:B`` pairs (the offline mirrors'
    ``--grid``), ``names`` saying what they are (``"NATS:GRAD"``): a text that is no such
    list is refused with that name."""
    def parse(text: str) -> tuple[tuple[Any, Any], ...]:
        try:
            out = tuple((first(a), second(b)) for a, b in
                        (pair.split(":") for pair in text.split(",") if pair.strip()))
        except ValueError:
            out = ()
        if not out:
            raise argparse.ArgumentTypeError(f"{text!r}: give {names} pairs, comma-separated")
        return out
    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", type=Path, default=HERE / "scenarios")
    p.add_argument("--split", choices=(*SETS, "both", *READ_THROUGH), default="tune",
                   help="which runs to report: one recorded set (in the order they were "
                   f"fixed: {', '.join(SETS)}; default tune), both (tune and holdout), or "
                   "every set up to and including one: "
                   + ", ".join(f"{k} (through {v})" for k, v in READ_THROUGH.items())
                   + ". Which set each round was tuned on and held out from: "
                   "bench/README.md, Alerts")
    p.add_argument("--intervals", default=",".join(map(str, INTERVALS)),
                   help="sampling intervals to replay at (default 1,10,25,40,50)")
    p.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    p.add_argument("--names", nargs="*", default=None, help="only these scenarios")
    p.add_argument("--no-history", action="store_true",
                   help="leave the derived frames' history out")
    p.add_argument("--rules", type=Path, default=None,
                   help="a rules YAML merged over the defaults (a rule there replaces the "
                   "default of its name): to measure a change, or one taken back, on the "
                   "tuning data")
    p.add_argument("--json", type=Path, default=None, help="write every row and summary here")
    p.add_argument("--summary", type=Path, default=None,
                   help="write the summaries alone here, with the rules' fingerprint (a few "
                   "KB: bench/reads/ keeps one per held-out read, for pool_reads.py)")
    a = p.parse_args(argv)
    rules = None
    if a.rules:
        from logitwatch.server.alerts.rules import RuleError

        try:
            rules = rules_over_defaults(a.rules)
        except (OSError, RuleError, ValueError) as e:
            p.error(f"--rules {a.rules}: {e}")
    intervals = sorted({int(x) for x in a.intervals.split(",") if x.strip()})
    splits = sets_of(a.split)
    files = sorted(a.scenarios.glob("*.jsonl.gz"))
    headers = {f: read_header(f) for f in files}
    files = [f for f in files if headers[f].get("split") in splits
             and (not a.names or headers[f]["scenario"] in a.names)]
    if not files:
        p.error(f"no {'/'.join(splits)} scenarios in {a.scenarios}: run "
                "bench/record_scenarios.py")
    history = False if a.no_history else history_supported()
    tasks = sorted(((str(f), k) for f in files for k in intervals),
                   key=lambda t: (t[1], -Path(t[0]).stat().st_size))
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    quiet()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs), initializer=quiet) as pool:
        futures = [pool.submit(bench_one, f, k, history, rules) for f, k in tasks]
        for i, fut in enumerate(as_completed(futures), 1):
            r = fut.result()
            rows.append(r)
            print(f"[{i}/{len(tasks)}] {r['scenario']:30s} @{r['interval']:<3d} "
                  f"{r['label']:9s} div {r['divergence_step']!s:>5} logitwatch "
                  f"{r['logitwatch']['from50']!s:>5} {','.join(r['logitwatch_rules'])} "
                  f"({r['replay_s']}s)", file=sys.stderr, flush=True)
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for sp in splits:
        for k in intervals:
            sel = sorted((r for r in rows if r["split"] == sp and r["interval"] == k),
                         key=lambda r: r["scenario"])
            results[(sp, k)] = summaries(sel)
            print(_table(sp, k, results[(sp, k)], len(sel)))
    print(_side_by_side(results, splits, intervals))
    print(f"\n{len(files)} scenarios x {len(intervals)} intervals replayed in "
          f"{time.perf_counter() - t0:.0f}s ({'with' if history else 'without'} history; "
          f"rules: the defaults{f' with {a.rules}' if a.rules else ''})")
    summary = {f"{sp}@{k}": s for (sp, k), s in results.items()}
    if a.summary:
        a.summary.write_text(json.dumps(
            {"split": a.split, "intervals": intervals, "runs": len(files),
             "rules": rules_fingerprint(rules), "rules_file": str(a.rules) if a.rules else None,
             "summary": summary}, indent=1) + "\n")
    if a.json:
        a.json.write_text(json.dumps(
            {"rows": sorted(rows, key=lambda r: (r["split"], r["interval"], r["scenario"])),
             "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
