"""``bench_fuses.py cost`` and ``interleaved``: step time with the fuses armed and not
firing, as ratios against no hooks on ``bench_hooks.py``'s model (GPT-2, 4 layers, d 256,
seq 256, batch 2), and :class:`Unscreened`, the QK-clip whose max-only steps skip the CPU
screen."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from logitwatch.client import Client
from logitwatch.hooks import attach
from logitwatch.hooks.fuses import QKClip, Rollback


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
