"""What the alert engine holds in memory per (run, rank), to size a collector
(``LOGITWATCH_ALERT_STATE_MAX_RANKS``, default 2,000, bounds how many it keeps).

Synthetic runs of a model of ``--layers`` x ``--heads`` attention heads, sampled every
``--every`` steps for ``--steps`` steps, with every step's loss, gradient norm and LR in
the frames' ``history`` and the six per-head statistics the hooks send, go through the
collector's write path and the engine (``lifecycle.ingest`` + ``AlertEngine.process``, as
``serve`` runs them). The memory the engine holds (tracemalloc, after a garbage
collection, with the engine alive) is measured for 1 run and for ``1 + --more`` runs in
the same process; their difference over ``--more`` is one (run, rank)'s share, with what
every run shares (imports, caches, compiled statements) left out. The engine's scalar
series keep their newest 1,024 steps, so a run longer than that costs about what 1,024
steps do.

    python bench/bench_engine_memory.py                         # 24 x 16 heads, 1,500 steps
    python bench/bench_engine_memory.py --layers 4 --heads 4 --steps 4000 --every 1
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import sys
import tempfile
import time
import tracemalloc
from typing import Any

from sqlalchemy.orm import sessionmaker

from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.replay import replay_rules
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings
from logitwatch.server.store import lifecycle

HEADS = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
         "attn.entropy_min", "attn.entropy_mean")
SCALARS = ("loss", "grad.norm", "lr")


def frames(run: str, layers: int, heads: int, steps: int, every: int,
           rnd: random.Random) -> list[dict[str, Any]]:
    """A healthy-looking run: noisy flat scalars, per-head statistics creeping up slowly."""
    out = []
    for i, step in enumerate(range(0, steps, every)):
        f: dict[str, Any] = {
            "run": run, "seq": i, "step": step, "time": 1000.0 + step,
            "scalars": {"loss": 3 + 0.1 * rnd.random(), "grad.norm": 1 + 0.1 * rnd.random(),
                        "lr": 1e-3, "final.logz": 5.0, "final.hidden_rms": 1.0},
            "heads": {n: [[5 + rnd.random() + 1e-3 * step for _ in range(heads)]
                          for _ in range(layers)] for n in HEADS}}
        if i and every > 1:
            between = list(range(step - every + 1, step))
            f["history"] = {"steps": between, "scalars": {
                n: [f["scalars"][n] for _ in between] for n in SCALARS}}
        out.append(f)
    return out


def held_mb(runs: int, a: argparse.Namespace) -> tuple[float, float]:
    """(MB the engine holds after ``runs`` runs went through it, seconds it took)."""
    rules, _ = replay_rules(Settings())
    db = make_engine(f"sqlite:///{tempfile.mkdtemp()}/bench.db")
    migrate(db)
    sessions = sessionmaker(db, expire_on_commit=False)
    rnd = random.Random(0)
    every = [frames(f"r{i}", a.layers, a.heads, a.steps, a.every, rnd) for i in range(runs)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    engine = AlertEngine(rules)
    t = time.perf_counter()
    for k in range(len(every[0])):  # the runs side by side, a frame of each per batch
        body = IngestIn.model_validate({"frames": [fs[k] for fs in every]})
        with session_scope(sessions) as s:
            stored, _ = lifecycle.ingest(s, body.frames)
            engine.process(s, stored.new_frames)
        if k % 20 == 0:
            print(f"\r  {runs} run(s): {k + 1}/{len(every[0])} frames each",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    took = time.perf_counter() - t
    del every, body, stored
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before  # the engine, a local, still alive
    tracemalloc.stop()
    db.dispose()
    return held / 1e6, took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--every", type=int, default=10, help="sampling interval in steps")
    p.add_argument("--more", type=int, default=2, help="runs added to the second measure")
    a = p.parse_args(argv)
    if min(a.layers, a.heads, a.steps, a.every, a.more) < 1:
        p.error("--layers, --heads, --steps, --every and --more must be at least 1")
    logging.disable(logging.WARNING)  # the alerts' log lines
    one, t1 = held_mb(1, a)
    more, t2 = held_mb(1 + a.more, a)
    each = (more - one) / a.more
    print(f"{a.layers} x {a.heads} heads, {a.steps} steps sampled every {a.every}: the engine "
          f"holds {one:.1f} MB with 1 run, {more:.1f} MB with {1 + a.more} "
          f"({t1:.0f} s, {t2:.0f} s): {each:.2f} MB per (run, rank); at the default cap of "
          f"2,000 (run, rank)s about {each * 2000 / 1e3:.1f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
