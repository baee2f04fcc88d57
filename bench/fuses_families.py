"""``bench_fuses.py families``: the recorded diverging scenarios (:data:`FAMILY_RUNS`)
trained with each fuse configuration of :data:`FAMILY_FUSES` and their healthy twin, the
hooks streaming to a real collector on 127.0.0.1 (:class:`Tap`, :func:`family_run`); a JSON
line per run as it ends, then a Markdown table (:func:`family_line`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from logitwatch.client import Client
from logitwatch.hooks import attach
from logitwatch.hooks.fuses import LRBackoff, QKClip, QKNorm, Rollback, SoftCap

#: The fuse configurations of ``families``, one line each: a name and a factory of the fuse
#: list (``None``: no fuse); ``tau`` is ``--tau``. A new fuse is one more line here.
FAMILY_FUSES: dict[str, Callable[[float], list | None]] = {
    "off": lambda tau: None,
    "qk_clip": lambda tau: [QKClip(tau=tau, mode="auto")],
    "lr_backoff": lambda tau: [LRBackoff(mode="auto")],
    "rollback": lambda tau: [Rollback(mode="auto")],
    "all three": lambda tau: [QKClip(tau=tau, mode="auto"), LRBackoff(mode="auto"),
                              Rollback(mode="auto")],
    "qk_norm": lambda tau: [QKNorm(limit=tau, mode="auto")],
    "soft_cap": lambda tau: [SoftCap(cap=tau, mode="auto")],
}

#: The recorded diverging scenarios ``families`` trains (``scenario_specs.py``): one per
#: mechanism that diverges through attention-logit growth or an LR ramp or jump and model
#: family, each with its healthy twin: the same spec with the destabilising change undone.
#: The first :data:`FAMILY_DEFAULT` run by default (5 x 8 runs, each 1-2 minutes of a core,
#: 2-6 on the loaded 2-core machine); the others with ``--only NAME`` or ``--all``.
FAMILY_RUNS: list[tuple[str, dict[str, Any], str]] = [
    ("attn_growth_s0", {"qk_norm": True}, "with QK-norm (the demo's healthy setting)"),
    ("bf16_high_lr", {"qk_norm": True}, "with QK-norm"),
    ("llama_rewarm_s0", {"rewarm": None}, "no second warm-up"),
    ("gpt2_lr_jump_s0", {"lr_steps": ()}, "no jump"),
    ("qknorm_lr_spike_s0", {"lr_steps": ()}, "no spike"),
    # -- with --only or --all --------------------------------------------------------------
    ("lr_ramp", {"lr": 0.2}, "warm-up to 0.2 instead of 1.5"),
    ("gemma2_rewarm_s0", {"rewarm": None}, "no second warm-up"),
    ("postln_lr_jump_s0", {"lr_steps": ()}, "no jump"),
    ("lr_jump", {"lr_steps": ()}, "no jump"),
    ("qknorm_high_lr", {"lr": 0.2}, "peak LR 0.2 instead of 0.5"),
    ("gpt2_rewarm_s1", {"rewarm": None}, "no second warm-up"),
    ("postln_rewarm_s0", {"rewarm": None}, "no second warm-up"),
    ("llama_lr_jump_s0", {"lr_steps": ()}, "no jump"),
    ("gemma2_lr_jump_s0", {"lr_steps": ()}, "no jump"),
]
FAMILY_DEFAULT = 5
TWIN = "twin"

_collector: Any = None


class Tap(Client):
    """A client that sends to a collector and keeps a copy of each frame."""

    def __init__(self, url: str, run: str) -> None:
        super().__init__(url, run=run)
        self.frames: list[dict[str, Any]] = []

    def send(self, step: int, scalars: Any, heads: Any, time: float | None = None,
             history: Any = None) -> None:
        self.frames.append({"step": step, "scalars": dict(scalars), "heads": dict(heads)})
        super().send(step, scalars, heads, time=time, history=history)


def _fuse(mon: Any, name: str) -> Any:
    return next((f for f in (mon.fuses or ()) if f.name == name), None)


def _last(frames: list[dict[str, Any]], name: str) -> float:
    """The newest value of scalar ``name`` in ``frames`` (0: none)."""
    return next((float(f["scalars"][name]) for f in reversed(frames)
                 if name in f["scalars"]), 0.0)


def _collector_url() -> str:
    """A real collector on 127.0.0.1 (SQLite in a temporary directory), one per process:
    the alerts that trigger LR backoff and rollback come from it, as in a job."""
    global _collector
    if _collector is None:
        import logging
        import tempfile

        from logitwatch.demo.runner import Collector

        logging.getLogger("logitwatch.alerts").setLevel(logging.ERROR)
        db = os.path.join(tempfile.mkdtemp(prefix="bench-fuses-"), "families.db")
        _collector = Collector(f"sqlite:///{db}").__enter__()
    return _collector.url


def family_run(name: str, config: str, steps: int | None, tau: float) -> dict[str, Any]:
    """Train recorded scenario ``name`` with the fuses of ``config`` (or, for ``twin``, its
    healthy twin with none), the real hooks at their defaults streaming to a collector."""
    from scenario_labels import excursions, stop_reason
    from scenario_models import train
    from scenario_sets import BY_NAME

    torch.set_num_threads(1)
    sc = BY_NAME[name]
    twin_kw, _ = next((kw, why) for n, kw, why in FAMILY_RUNS if n == name)
    spec = dataclasses.replace(sc.spec, **twin_kw) if config == TWIN else sc.spec
    if steps:
        spec = dataclasses.replace(spec, steps=steps)
    fuses = None if config == TWIN else FAMILY_FUSES[config](tau)
    run = f"{name}.{config.replace(' ', '_')}.{os.getpid()}.{time.time_ns() % 10**9}"
    tap = Tap(_collector_url(), run)
    box: dict[str, Any] = {"backoff_steps": 0, "alerts": []}

    def count_backoff(opt: Any, args: Any, kwargs: Any) -> None:
        lrb = _fuse(box["mon"], "lr_backoff")
        if lrb is not None and getattr(lrb, "_applied", False):
            box["backoff_steps"] += 1

    def on_alert(alert: dict[str, Any]) -> None:
        box["alerts"].append((alert.get("fired_step"), alert.get("rule"),
                              alert.get("severity")))

    def attach_(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
        mon = attach(model, opt, run=run, client=tap, max_grad_norm=spec.max_norm,
                     fuses=fuses)
        box["mon"] = mon
        mon.client.on_alert(on_alert)
        if fuses and any(isinstance(f, LRBackoff) for f in fuses):
            opt.register_step_pre_hook(count_backoff)  # after the fuse's own pre-hook
        return mon

    t0 = time.perf_counter()
    # without a fuse, stop as the recorded suite does (100 steps after a divergence that has
    # not recovered); with one, only after 10 non-finite losses in a row: a fuse may act late
    res = train(spec, attach=attach_, should_stop=stop_reason if fuses is None else (
        lambda losses: stop_reason(losses) if stop_reason(losses) == "nonfinite" else None))
    wall = time.perf_counter() - t0
    mon = box["mon"]
    events = [e.as_dict() for e in mon.fuses.events] if mon.fuses else []
    rb = _fuse(mon, "rollback")
    losses = res.losses
    div, bumps = excursions(losses)
    tail = losses[-50:]
    logit = [v for f in tap.frames for row in f["heads"].get("attn.logit_max", [])
             for v in row if isinstance(v, float) and not math.isnan(v)]
    return {
        "run": name, "config": config, "group": sc.group, "family": spec.family,
        "nonfinite_steps": [i for i, x in enumerate(losses) if not math.isfinite(x)][:20],
        "steps_planned": spec.steps, "steps_done": res.steps_done, "stop": res.stop,
        "diverged_at": div, "bumps": bumps,
        "first_nonfinite": next((i for i, x in enumerate(losses) if not math.isfinite(x)),
                                None),
        "final_loss": statistics.fmean(tail) if tail else None,
        "max_logit": max(logit) if logit else None,
        "clip_steps": int(sum(f["scalars"].get("fuse.qk_clip.steps", 0) for f in tap.frames)),
        "clipped_head_steps": int(sum(f["scalars"].get("fuse.qk_clip.heads", 0)
                                      for f in tap.frames)),
        "backoff_steps": box["backoff_steps"],
        "qk_norm_steps": int(_last(tap.frames, "fuse.qk_norm.steps_inserted")
                             + _last(tap.frames, "fuse.qk_norm.steps_annealing")),
        "soft_cap_steps": int(_last(tap.frames, "fuse.soft_cap.steps_capped")),
        "backoffs": [[e["step"], e.get("reason")] for e in events
                     if e["action"] == "backoff"][:8],
        "rollbacks": [[e["step"], e.get("to_step")] for e in events
                      if e["action"] == "rollback"],
        "steps_lost": getattr(rb, "steps_lost", 0), "skipped": getattr(rb, "skipped", 0),
        "unavailable": sorted({e["fuse"] for e in events
                               if e["action"] in ("unavailable", "failed")}),
        "why_unavailable": [[e["step"], e["fuse"], e.get("reason")] for e in events
                            if e["action"] in ("unavailable", "failed")][:4],
        "alerts": box["alerts"][:6],
        "wall_s": round(wall, 1),
    }


def _fmt_loss(x: float | None) -> str:
    return "-" if x is None else ("NaN" if not math.isfinite(x) else f"{x:.3f}")


def family_line(r: dict[str, Any], twin: float | None) -> str:
    """One Markdown row of the families table."""
    div = ("no" if r["diverged_at"] is None else f"**{r['diverged_at']}**")
    if r["rollbacks"]:
        div += " (NaN or alert at " + ", ".join(str(a) for a, _ in r["rollbacks"]) + \
            ": rolled back)"
    if r["stop"] != "end":
        div += f" (stopped at {r['steps_done']})"
    fl = r["final_loss"]
    delta = (f"{fl - twin:+.3f}" if fl is not None and twin is not None and math.isfinite(fl)
             else "-")
    ml = r["max_logit"]
    acted = []
    if r["clip_steps"]:
        acted.append(f"clip {r['clip_steps']}")
    if r["backoff_steps"]:
        acted.append(f"backoff {r['backoff_steps']}")
    if r.get("qk_norm_steps"):
        acted.append(f"QK-norm {r['qk_norm_steps']}")
    if r.get("soft_cap_steps"):
        acted.append(f"soft-cap {r['soft_cap_steps']}")
    if r["rollbacks"]:
        acted.append("rollback " + ", ".join(f"{a}->{b}" for a, b in r["rollbacks"])
                     + f" (lost {r['steps_lost']}, skipped {r['skipped']})")
    if r["unavailable"]:
        acted.append("unavailable: " + ", ".join(r["unavailable"]))
    return (f"| {r['run']} | {r['config']} | {div} | {_fmt_loss(fl)} | {delta} | "
            f"{'-' if ml is None else f'{ml:.3g}'} | {', '.join(acted) or '-'} |")


def _family_job(job: tuple[str, str, int | None, float]) -> dict[str, Any]:
    return family_run(*job)


def families(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run of :data:`FAMILY_RUNS` (or ``--only``) with each configuration of
    :data:`FAMILY_FUSES` (or ``--configs``) and its twin; a JSON line per run as it ends,
    then a Markdown table."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    known = [n for n, _, _ in FAMILY_RUNS]
    names = args.only or (known if args.all else known[:FAMILY_DEFAULT])
    unknown = [n for n in names if n not in known]
    configs = args.configs or [TWIN, *FAMILY_FUSES]  # named ones: without the twin unless named
    if unknown or any(c not in FAMILY_FUSES and c != TWIN for c in configs):
        raise SystemExit(f"families: runs from {known}, configurations from "
                         f"{[TWIN, *FAMILY_FUSES]}")
    jobs = [(n, c, args.steps, args.tau) for n in names for c in configs]
    out: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futs = [pool.submit(_family_job, j) for j in jobs]
        for i, fut in enumerate(as_completed(futs), 1):
            r = fut.result()
            out.append(r)
            print(json.dumps(r), flush=True)
            print(f"# {i}/{len(jobs)} {r['run']} / {r['config']}: diverged "
                  f"{r['diverged_at']}, final {_fmt_loss(r['final_loss'])}, "
                  f"{r['wall_s']} s ({time.perf_counter() - t0:.0f} s so far)",
                  file=sys.stderr, flush=True)
    twins = {r["run"]: r["final_loss"] for r in out if r["config"] == TWIN}
    order = {c: i for i, c in enumerate([TWIN, *FAMILY_FUSES])}
    print("| run | fuses | diverged at | final loss | vs twin | max logit | steps in the "
          "fuse |\n|---|---|---|---|---|---|---|")
    for r in sorted(out, key=lambda r: (names.index(r["run"]), order[r["config"]])):
        print(family_line(r, twins.get(r["run"])))
    return out
