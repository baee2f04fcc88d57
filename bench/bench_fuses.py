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

The sub-benches but ``demo`` and ``bias`` live in sibling modules: ``fuses_cost.py``
(``cost``, ``interleaved``), ``fuses_rollback.py``, ``fuses_qknorm.py`` and
``fuses_families.py``, with their shared helpers in ``fuses_common.py``.
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
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuses_common import Recorder, _max, clip_steps, windows  # noqa: E402
from fuses_cost import cost, cost_interleaved  # noqa: E402
from fuses_families import families  # noqa: E402
from fuses_qknorm import qknorm  # noqa: E402
from fuses_rollback import rollback  # noqa: E402

from logitwatch.hooks import attach  # noqa: E402
from logitwatch.hooks.fuses import QKClip  # noqa: E402

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
