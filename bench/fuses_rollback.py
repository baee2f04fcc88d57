"""``bench_fuses.py rollback``: the demo's unstable setting with an LR spike, and its
unstable run, without the fuse, with rollback ``auto`` and with rollback and LR backoff
(:func:`rollback_run`, judged by :func:`recovered`), and one snapshot's time and bytes on
``cost``'s model (:func:`snapshot_cost`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from typing import Any

import torch
from fuses_common import Recorder, windows

from logitwatch.hooks import attach
from logitwatch.hooks.fuses import LRBackoff, Rollback


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
