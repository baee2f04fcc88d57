"""Fuses on real runs (docs/FUSES.md): did the job train through, and at what cost.

* ``demo``: the demo's unstable setting (``logitwatch/demo/train.py``: fp16 attention
  scores, peak LR 0.2, no QK-norm; it diverges around steps 800-960) trained with QK-clip
  off and on (``auto``), and its healthy twin (QK-norm): divergence step, final loss (mean of
  the last 50 steps), the max attention logit over time (max over layers and heads of
  ``attn.logit_max``, per 100-step window), the steps where the fuse acted;
* ``bias``: the QK-clip-with-biases setting (a tiny HF GPT-2, biased ``c_attn``, AdamW at
  1e-2, the alert suite's ``gpt2_qk_clip_s0``) under QK-clip ``auto`` at tau 5, scaling the
  weights only vs weights and biases: q/k bias and weight norms (mean over heads) and the
  max logit over time;
* ``cost``: step time with the fuses armed and not firing, as ratios against no hooks in
  the same round (``bench_hooks.py``'s model: GPT-2, 4 layers, d 256, seq 256, batch 2);
* ``rollback``: the demo's unstable setting with an LR spike (x``--spike`` for 10 steps at
  step 300, set by the loop's own counter) over 600 steps, without the fuse, with rollback
  ``auto``, and its twin without the spike; the demo's unstable run (1200 steps) with
  rollback, and rollback with LR backoff: diverged or not, final loss, rollbacks, steps
  lost, batches skipped; and one snapshot's time and bytes on ``cost``'s model;
* ``qknorm``: the demo's unstable run with the temporary QK-norm auto (limit ``--tau``,
  anneal 10 % of the remaining steps), with it and LR backoff, with soft-cap auto (cap
  ``--tau``), without a fuse, and the healthy twin; the float16 overflow is taken from the
  q/k the SDPA call receives (``kernel_attention``): diverged, final loss, max logit per
  100 steps (pre-cap; soft-cap: also what the softmax receives), steps inserted/annealing,
  λ over the anneal;
* ``families``: recorded diverging scenarios (``FAMILY_RUNS``: one per mechanism of
  attention-logit growth or an LR ramp/jump and model family, from ``scenario_specs.py``)
  trained by ``scenario_models.train`` with each fuse configuration of ``FAMILY_FUSES``
  (off, QK-clip auto at ``--tau``, LR backoff auto, rollback auto, all three, temporary
  QK-norm auto with limit ``--tau``, soft-cap auto at cap ``--tau``) and their
  healthy twin, the hooks at their defaults streaming to a real collector on 127.0.0.1
  (its alerts trigger LR backoff and rollback, as in a job): diverged (step), final loss
  against the twin's, max logit, steps in each fuse. ``--only NAME``, ``--configs C``,
  ``--steps N``, ``--jobs 2``.

    nice -n 10 python bench/bench_fuses.py demo            # ~3 runs of <= 1200 steps
    nice -n 10 python bench/bench_fuses.py bias --steps 800
    nice -n 10 python bench/bench_fuses.py cost --rounds 3 --steps 8
    nice -n 10 python bench/bench_fuses.py interleaved --rounds 40
    nice -n 10 python bench/bench_fuses.py rollback        # ~5 demo runs, 600-1200 steps
    nice -n 10 python bench/bench_fuses.py qknorm          # 5 demo runs of <= 1200 steps
    nice -n 10 python bench/bench_fuses.py families --jobs 2   # 5 scenarios x 8 runs
    python bench/bench_fuses.py all --json out.json

One thread (``torch.set_num_threads(1)``); frames are kept in memory (no collector, but in
``families``).
"""

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
from torch.overrides import TorchFunctionMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from logitwatch.client import Client  # noqa: E402
from logitwatch.hooks import attach  # noqa: E402
from logitwatch.hooks.fuses import LRBackoff, QKClip, QKNorm, Rollback, SoftCap  # noqa: E402


class Recorder(Client):
    """A client that keeps the frames the monitor sends (no collector)."""

    def __init__(self) -> None:
        super().__init__(None, run="bench")
        self.frames: list[dict[str, Any]] = []

    def send(self, step: int, scalars: Any, heads: Any, time: float | None = None,
             history: Any = None) -> None:
        self.frames.append({"step": step, "scalars": dict(scalars), "heads": dict(heads)})


def _max(rows: list[list[float]] | None) -> float | None:
    vals = [v for row in rows or [] for v in row if isinstance(v, float) and not math.isnan(v)]
    return max(vals) if vals else None


def windows(frames: list[dict], name: str, width: int = 100) -> dict[int, float]:
    """Max over heads of matrix ``name``, maxed per ``width``-step window (key: start)."""
    out: dict[int, float] = {}
    for f in frames:
        m = _max(f["heads"].get(name))
        if m is None:
            continue
        key = f["step"] // width * width
        out[key] = m if key not in out else max(out[key], m)
    return out


def clip_steps(frames: list[dict]) -> list[int]:
    return [f["step"] for f in frames if f["scalars"].get("fuse.qk_clip.heads", 0) > 0]


# -- demo ---------------------------------------------------------------------------------


def demo_run(name: str, steps: int, tau: float | None, seed: int) -> dict[str, Any]:
    from logitwatch.demo.train import SETTINGS, train

    setting = dataclasses.replace(SETTINGS["healthy" if name == "healthy" else "unstable"],
                                  seed=seed)
    rec = Recorder()
    box: dict[str, Any] = {}

    def on_model(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        fuses = [QKClip(tau=tau, mode="auto")] if tau is not None else None
        box["mon"] = attach(model, opt, run="bench", client=rec, sample_every=10,
                            overhead_budget=None, max_grad_norm=setting.max_norm, fuses=fuses)

    t0 = time.perf_counter()
    res = train(setting, steps=steps, on_model=on_model,
                on_loss=lambda loss: box["mon"].log(loss=loss), log=lambda _: None,
                num_threads=1)
    box["mon"].close()
    wall = time.perf_counter() - t0
    finite = [x for x in res.losses if math.isfinite(x)]
    clips = clip_steps(rec.frames)
    return {
        "run": name, "tau": tau, "seed": seed, "steps_done": res.steps_done,
        "diverged_at": res.divergence_step,
        "final_loss": statistics.fmean(res.losses[-50:]) if res.losses else None,
        "best_loss": min(finite) if finite else None,
        "max_logit": windows(rec.frames, "attn.logit_max"),
        "clip_steps": len(clips), "first_clip": clips[0] if clips else None,
        "last_clip": clips[-1] if clips else None,
        "clipped_head_steps": sum(int(f["scalars"].get("fuse.qk_clip.heads", 0))
                                  for f in rec.frames),
        "wall_s": round(wall, 1), "ms_per_step": round(1e3 * wall / max(1, res.steps_done), 2),
    }


def demo(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for name, tau in (("unstable, QK-clip off", None), (f"unstable, QK-clip auto tau {args.tau:g}",
                                                         args.tau), ("healthy", None)):
        r = demo_run(name, args.steps or 1200, tau, args.seed)
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


# -- bias ---------------------------------------------------------------------------------


def bias_run(biases: bool, steps: int, tau: float, seed: int) -> dict[str, Any]:
    from scenario_models import train
    from scenario_specs import hf

    spec = hf("gpt2", init_std=0.05, lr=1e-2, steps=steps, seed=seed)
    rec = Recorder()
    res = train(spec, attach=lambda m, o: attach(
        m, o, run="bench", client=rec, sample_every=10, overhead_budget=None,
        fuses=[QKClip(tau=tau, mode="auto", biases=biases)]))
    by: dict[int, dict[str, float]] = {}
    for f in rec.frames:
        if f["step"] % 100 and f["step"] != steps - 1:
            continue
        row = {}
        for name in ("qk.q_bias_norm", "qk.k_bias_norm", "qk.q_weight_norm",
                     "qk.k_weight_norm"):
            vals = [v for r in f["heads"].get(name, []) for v in r]
            row[name] = round(statistics.fmean(vals), 4) if vals else None
        row["attn.logit_max"] = round(_max(f["heads"].get("attn.logit_max")) or math.nan, 3)
        by[f["step"]] = row
    clips = clip_steps(rec.frames)
    finite = [x for x in res.losses if math.isfinite(x)]
    return {"biases_scaled": biases, "tau": tau, "seed": seed, "steps_done": res.steps_done,
            "final_loss": statistics.fmean(res.losses[-50:]),
            "best_loss": min(finite) if finite else None, "clip_steps": len(clips),
            "clipped_head_steps": sum(int(f["scalars"].get("fuse.qk_clip.heads", 0))
                                      for f in rec.frames),
            "max_logit": windows(rec.frames, "attn.logit_max"), "by_step": by}


def bias(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for biases in (False, True):
        r = bias_run(biases, args.steps or 800, args.bias_tau, args.seed)
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


# -- cost ---------------------------------------------------------------------------------


class Unscreened(QKClip):
    """QK-clip whose max-only steps compute every head's logits (no CPU screen): the cost
    of an accelerator, where the screen is off, or of heads near tau."""

    def step_end(self, step: int, sampled: bool) -> None:
        super().step_end(step, sampled)
        mon = self.fuses.monitor if self.fuses is not None else None
        if mon is not None:
            mon._max_below = None


def cost(args: argparse.Namespace) -> dict[str, Any]:
    import bench_hooks

    hargs = argparse.Namespace(d_model=256, layers=4, heads=4, seq=256, vocab=512, batch=2,
                               attn="sdpa", clock="thread", tmp=None)
    state = bench_hooks.build(hargs).state_dict()
    configs = {
        "none": None,
        "default": {},
        "qk_clip armed, max-only (default)": {"fuses": [QKClip(tau=1e9, mode="auto")]},
        "qk_clip armed, max-only, unscreened": {"fuses": [Unscreened(tau=1e9, mode="auto",
                                                                  calm_every=1)]},
        "qk_clip armed, measure=full": {"fuses": [QKClip(tau=1e9, mode="auto",
                                                         measure="full")]},
        "qk_clip armed, full, every 10": {"fuses": [QKClip(tau=1e9, mode="auto", every=10,
                                                           measure="full")]},
        "qk_clip suggest": {"fuses": [QKClip(tau=1e9)]},
    }
    ratios: dict[str, list[float]] = {k: [] for k in configs if k != "none"}
    for _ in range(args.rounds):
        times = {}
        for name, kw in configs.items():
            runner = bench_hooks.Runner("none", hargs, state)
            if kw is not None:
                runner.mon = attach(runner.model, runner.opt, run="bench",
                                    client=Client(None, run="bench"),
                                    **{k: v for k, v in kw.items()})
                # Runner.timed() calls start(), which attaches nothing for "none"
            times[name] = runner.timed(args.steps, 2)
            if runner.mon is not None:
                runner.mon.close()
        for name in ratios:
            ratios[name].append(times[name] / times["none"])
        print(json.dumps({k: round(v * 1e3, 1) for k, v in times.items()}), flush=True)
    out = {name: round(statistics.median(r) - 1, 4) for name, r in ratios.items()}
    print(json.dumps({"overhead": out}), flush=True)
    return out


def cost_interleaved(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration attached once, their steps interleaved (one step of each in
    turn, ``rounds`` turns, after ``warmup`` steps of each): per configuration the min, the
    median and the mean step time (thread CPU), as ratios to no hooks; the min is what load
    on a shared machine inflates least, the mean what a schedule that measures one step in
    several (the calm one, the monitor's samples) costs on average. The warm-up (default 24)
    takes the calm configuration past its 20 calm measured steps."""
    import bench_hooks

    hargs = argparse.Namespace(d_model=256, layers=4, heads=4, seq=256, vocab=512, batch=2,
                               attn="sdpa", clock="thread", tmp=None)
    state = bench_hooks.build(hargs).state_dict()
    fuses: dict[str, Any] = {
        "none": None,
        "default": [],
        "qk_clip armed, max-only (default)": [QKClip(tau=1e9, mode="auto")],
        "qk_clip armed, max-only, unscreened, calm_every=1": [
            Unscreened(tau=1e9, mode="auto", calm_every=1)],
        "qk_clip armed, max-only, unscreened, calm (default)": [
            Unscreened(tau=1e9, mode="auto")],
        "qk_clip armed, measure=full": [QKClip(tau=1e9, mode="auto", measure="full",
                                               calm_every=1)],
        "qk_clip suggest": [QKClip(tau=1e9)],
        "rollback armed (every 100, keep 2)": [Rollback(mode="auto")],
    }
    runners = {}
    for name, fl in fuses.items():
        r = bench_hooks.Runner("none", hargs, state)
        if fl is not None:
            r.mon = attach(r.model, r.opt, run="bench", client=Client(None, run="bench"),
                           fuses=fl or None)
        for _ in range(max(2, args.warmup)):
            r.step()
        runners[name] = r
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, r in runners.items():
            t0 = time.thread_time()
            r.step()
            times[name].append(time.thread_time() - t0)
    for r in runners.values():
        if r.mon is not None:
            r.mon.close()
    base_min, base_med = min(times["none"]), statistics.median(times["none"])
    base_mean = statistics.fmean(times["none"])
    out = {name: {"min": round(min(t) / base_min - 1, 4),
                  "median": round(statistics.median(t) / base_med - 1, 4),
                  "mean": round(statistics.fmean(t) / base_mean - 1, 4),
                  "ms_min": round(1e3 * min(t), 1)} for name, t in times.items()}
    print(json.dumps({"interleaved": out}), flush=True)
    return out


# -- rollback -------------------------------------------------------------------------------


def recovered(losses: list[float]) -> bool:
    """Whether the run ends trained: its last 50 losses finite and their mean within 1 nat
    of the best 10-step mean (a rollback's NaN step is not the end)."""
    tail = losses[-50:]
    if not tail or not all(math.isfinite(x) for x in tail):
        return False
    finite = [x for x in losses if math.isfinite(x)]
    best = min(statistics.fmean(finite[i:i + 10]) for i in range(max(1, len(finite) - 9)))
    return statistics.fmean(tail) <= best + 1.0


def rollback_run(name: str, steps: int, fuses: list | None, spike: float | None,
                 seed: int) -> dict[str, Any]:
    from logitwatch.demo.train import SETTINGS, train

    setting = dataclasses.replace(SETTINGS["unstable"], seed=seed)
    rec = Recorder()
    box: dict[str, Any] = {"k": 0}

    def spike_lr(opt: Any, args: Any, kwargs: Any) -> None:
        if spike is not None and 300 <= box["k"] < 310:
            for group in opt.param_groups:
                group["lr"] *= spike
        box["k"] += 1

    def on_model(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.register_step_pre_hook(spike_lr)  # before the fuses' hooks: the loop's own lr
        box["mon"] = attach(model, opt, run="bench", client=rec, sample_every=10,
                            overhead_budget=None, max_grad_norm=setting.max_norm,
                            fuses=fuses)

    t0 = time.perf_counter()
    res = train(setting, steps=steps, on_model=on_model,
                on_loss=lambda loss: box["mon"].log(loss=loss), log=lambda _: None,
                num_threads=1, stop_after_divergence=10**9)
    mon = box["mon"]
    mon.close()
    wall = time.perf_counter() - t0
    events = [e.as_dict() for e in mon.fuses.events] if mon.fuses else []
    rb = [e for e in events if e["action"] == "rollback"]
    fuse = mon.fuses["rollback"] if mon.fuses else None
    first_bad = next((i for i, x in enumerate(res.losses) if not math.isfinite(x)), None)
    return {
        "run": name, "seed": seed, "steps": res.steps_done, "first_nonfinite": first_bad,
        "trained_through": recovered(res.losses),
        "final_loss": statistics.fmean(res.losses[-50:]),
        "rollbacks": [[e["step"], e["to_step"]] for e in rb],
        "steps_lost": getattr(fuse, "steps_lost", 0), "skipped": getattr(fuse, "skipped", 0),
        "snapshot_bytes": getattr(fuse, "snapshot_bytes", 0),
        "peak_bytes": getattr(fuse, "peak_bytes", 0),
        "backoffs": sum(e["action"] == "backoff" for e in events),
        "max_logit": windows(rec.frames, "attn.logit_max"),
        "ms_per_step": round(1e3 * wall / max(1, res.steps_done), 2),
    }


def snapshot_cost(rounds: int = 5) -> dict[str, Any]:
    """One snapshot's time and bytes on ``cost``'s model (AdamW state filled)."""
    import bench_hooks

    from logitwatch.hooks.fuses._snapshots import capture

    hargs = argparse.Namespace(d_model=256, layers=4, heads=4, seq=256, vocab=512, batch=2,
                               attn="sdpa", clock="thread", tmp=None)
    runner = bench_hooks.Runner("none", hargs, bench_hooks.build(hargs).state_dict())
    steps = []
    for _ in range(3):
        t0 = time.thread_time()
        runner.step()
        steps.append(time.thread_time() - t0)
    times, size = [], 0
    for _ in range(rounds):
        t0 = time.thread_time()
        snap = capture(0, runner.model, runner.opt, None)
        times.append(time.thread_time() - t0)
        size = snap.bytes
    step = statistics.median(steps)
    snap_s = statistics.median(times)
    return {"bytes": size, "params": sum(p.numel() for p in runner.model.parameters()),
            "snapshot_ms": round(1e3 * snap_s, 1), "step_ms": round(1e3 * step, 1),
            "amortized_every_100": round(snap_s / (100 * step), 5)}


def rollback(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    spike = args.spike
    plans = [
        (f"lr spike x{spike:g}, no fuse", 600, None, spike),
        (f"lr spike x{spike:g}, rollback auto", 600,
         [Rollback(mode="auto")], spike),
        ("no spike (twin)", 600, None, None),
        ("unstable 1200, rollback auto", 1200, [Rollback(mode="auto")], None),
        ("unstable 1200, rollback + lr backoff auto", 1200,
         [Rollback(mode="auto"), LRBackoff(mode="auto", rules=())], None),
    ]
    for name, steps, fuses, sp in plans[: args.plans]:
        r = rollback_run(name, steps, fuses, sp, args.seed)
        print(json.dumps(r), flush=True)
        out.append(r)
    r = {"snapshot_cost": snapshot_cost()}
    print(json.dumps(r), flush=True)
    out.append(r)
    return out


# -- families -------------------------------------------------------------------------------

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
    from record_scenarios import BY_NAME
    from scenario_labels import excursions, stop_reason
    from scenario_models import train

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


# -- qknorm -----------------------------------------------------------------------------------


class KernelSpy(TorchFunctionMode):
    """The q/k/scale of the last SDPA call as the kernel receives it. Entered around the
    whole run, so below the monitor's mode: it sees a call after a fuse rewrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.last: tuple[Any, Any, Any] | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            a = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal",
                          "scale"), args, strict=False))
            a.update(kwargs)
            self.last = (a["query"], a["key"], a.get("scale"))
        return func(*args, **kwargs)


def kernel_attention(spy: KernelSpy) -> Callable[..., torch.Tensor]:
    """The demo's ``attention`` with its float16 overflow taken from the ``q``/``k`` the
    SDPA call received (the demo's own takes them before the call, so a fuse that rewrites
    the call would not change its emulated overflow). A call a fuse computed explicitly
    (soft-cap: float32 scores, capped) has no float16 scores: no overflow."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from logitwatch.demo import model as demo_model

    plain = demo_model.attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  attn_dtype: str) -> torch.Tensor:
        if attn_dtype != "float16":
            return plain(q, k, v, scale=scale, attn_dtype=attn_dtype)
        qh, kh, vh = q.to(torch.float16), k.to(torch.float16), v.to(torch.float16)
        spy.last = None
        backend = sdpa_kernel(SDPBackend.MATH) if q.device.type == "cpu" else nullcontext()
        with backend:
            out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                   scale=scale)
        out = out.to(torch.float32)
        if spy.last is not None:
            rq, rk, rs = spy.last
            out = out + demo_model.fp16_overflow_poison(rq, rk, rs if rs else scale)
        return out

    return attention


def qknorm_run(name: str, steps: int, make: Callable[[], list | None], seed: int
               ) -> dict[str, Any]:
    from logitwatch.demo import model as demo_model
    from logitwatch.demo.train import SETTINGS, train

    setting = dataclasses.replace(SETTINGS["healthy" if name == "healthy" else "unstable"],
                                  seed=seed)
    rec = Recorder()
    box: dict[str, Any] = {}
    spy = KernelSpy()

    def on_model(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        box["mon"] = attach(model, opt, run="bench", client=rec, sample_every=10,
                            overhead_budget=None, max_grad_norm=setting.max_norm,
                            fuses=make())

    plain = demo_model.attention
    demo_model.attention = kernel_attention(spy)
    t0 = time.perf_counter()
    try:
        with spy:
            res = train(setting, steps=steps, on_model=on_model,
                        on_loss=lambda loss: box["mon"].log(loss=loss), log=lambda _: None,
                        num_threads=1)
    finally:
        demo_model.attention = plain
        box["mon"].close()
    wall = time.perf_counter() - t0
    mon = box["mon"]
    events = [e.as_dict() for e in mon.fuses.events] if mon.fuses else []
    norm = next((f for f in mon.fuses if f.name == "qk_norm"), None) if mon.fuses else None
    cap = next((f for f in mon.fuses if f.name == "soft_cap"), None) if mon.fuses else None
    out: dict[str, Any] = {
        "run": name, "seed": seed, "steps_done": res.steps_done,
        "diverged_at": res.divergence_step,
        "final_loss": statistics.fmean(res.losses[-50:]) if res.losses else None,
        "max_logit": windows(rec.frames, "attn.logit_max"),
        "ms_per_step": round(1e3 * wall / max(1, res.steps_done), 2),
        "events": [[e["step"], e["fuse"], e["action"], e.get("layers")] for e in events
                   if e["action"] not in ("suggest",)][:40],
    }
    if norm is not None:
        out["steps_inserted"] = norm.steps_inserted
        out["steps_annealing"] = norm.steps_annealing
        out["raw_max"] = {f["step"] // 100 * 100: f["scalars"]["fuse.qk_norm.raw_max"]
                          for f in rec.frames if "fuse.qk_norm.raw_max" in f["scalars"]}
        trace = list(norm.trace)
        out["lambda"] = [[s, layer, round(lam, 4)] for s, layer, lam in trace[:: max(
            1, len(trace) // 24)]]
    if cap is not None:
        out["steps_capped"] = cap.steps_capped
        out["received_max"] = windows(rec.frames, "fuse.soft_cap.logit_max")
    return out


def qknorm(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The demo's unstable run with the temporary QK-norm auto, with soft-cap auto, without
    a fuse, and its healthy twin (learned QK-norm), every run with the kernel-side overflow
    (:func:`kernel_attention`)."""
    steps = args.steps or 1200
    limit = args.tau
    plans: list[tuple[str, Callable[[], list | None]]] = [
        ("unstable, no fuse", lambda: None),
        (f"unstable, QK-norm auto (limit {limit:g})",
         lambda: [QKNorm(limit=limit, mode="auto", anneal=0.1, total_steps=steps)]),
        (f"unstable, QK-norm + LR backoff auto (limit {limit:g})",
         lambda: [QKNorm(limit=limit, mode="auto", anneal=0.1, total_steps=steps),
                  LRBackoff(mode="auto", rules=())]),
        (f"unstable, soft-cap auto (cap {limit:g})",
         lambda: [SoftCap(cap=limit, mode="auto")]),
        ("healthy", lambda: None),
    ]
    out = []
    for name, make in plans[: args.plans]:
        r = qknorm_run(name, steps, make, args.seed)
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("demo", "bias", "cost", "interleaved", "rollback",
                                    "families", "qknorm", "all"))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--tau", type=float, default=50.0, help="demo, families: QK-clip tau")
    p.add_argument("--bias-tau", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=24, help="interleaved: steps before timing")
    p.add_argument("--spike", type=float, default=20.0, help="rollback: the LR spike")
    p.add_argument("--plans", type=int, default=5, help="rollback: the first N runs")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="families: this recorded scenario only (repeatable)")
    p.add_argument("--all", action="store_true", help="families: every run of FAMILY_RUNS")
    p.add_argument("--configs", action="append", default=None, metavar="CONFIG",
                   help="families: this fuse configuration only (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="families: parallel processes")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    result: dict[str, Any] = {}
    if args.what in ("demo", "all"):
        result["demo"] = demo(args)
    if args.what in ("bias", "all"):
        result["bias"] = bias(args)
    if args.what in ("cost", "all"):
        result["cost"] = cost(argparse.Namespace(rounds=args.rounds, steps=args.steps or 8))
    if args.what == "rollback":
        result["rollback"] = rollback(args)
    if args.what == "families":
        result["families"] = families(args)
    if args.what == "qknorm":
        result["qknorm"] = qknorm(args)
    if args.what == "interleaved":
        result["interleaved"] = cost_interleaved(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
