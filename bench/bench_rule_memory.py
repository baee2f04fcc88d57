"""What keeping the alert engine's whole-run memory costs (``rule_memory``, migration 0014).

The engine writes what a replay of a run's newest frames cannot rebuild (the lowest
settled levels, the LR's settled peak, the best loss) with each ingest batch that changed
it, and on a rebuild (a restart, a forgotten idle run) replays the run's first steps too.
Both are measured here against the same code without them, in the same process and run:

* ingest: a recorded scenario's frames (every step, with heads) through the collector's
  write path and the engine, in batches of ``--batch`` frames, each in its own
  transaction; with the write, then with it replaced by a no-op, alternating ``--rounds``
  times; the ratio of the medians;
* rebuild: the engine's rebuild of that run at its end, with and without the run's first
  steps replayed (``RESTORE_FIRST_STEPS`` 0).

    python bench/bench_rule_memory.py [--scenario bf16_high_lr] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from logitwatch.server.alerts import state
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.replay import replay_rules
from logitwatch.server.db.models import RuleMemory
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings
from logitwatch.server.store import lifecycle

SCENARIOS = Path(__file__).parent / "scenarios"


def frames_of(name: str) -> list[dict[str, Any]]:
    with gzip.open(SCENARIOS / f"{name}.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f][1:]


def ingest(frames: list[dict[str, Any]], batch: int, save: bool) -> tuple[float, Any, int]:
    """Seconds to ingest and judge ``frames``; the session factory; rule_memory writes."""
    rules, _ = replay_rules(Settings())
    db = make_engine(f"sqlite:///{tempfile.mkdtemp()}/bench.db")
    migrate(db)
    sessions = sessionmaker(db, expire_on_commit=False)
    engine = AlertEngine(rules)
    writes = 0
    if not save:
        engine._save_long_state = lambda session, keys: None  # type: ignore[method-assign]
    else:
        orig = engine._save_long_state

        def counted(session: Any, keys: Any) -> None:
            nonlocal writes
            before = len(engine._saved), dict(engine._saved)
            orig(session, keys)
            writes += sum(engine._saved.get(k) != before[1].get(k) for k in keys)

        engine._save_long_state = counted  # type: ignore[method-assign]
    t = time.perf_counter()
    for i in range(0, len(frames), batch):
        body = IngestIn.model_validate({"frames": frames[i:i + batch]})
        with session_scope(sessions) as s:
            stored, _ = lifecycle.ingest(s, body.frames)
            engine.process(s, stored.new_frames)
    return time.perf_counter() - t, sessions, writes


def rebuild(sessions: Any, first_steps: int, rounds: int) -> float:
    """Median seconds of the engine's rebuild of run 1, rank 0 at the run's end."""
    rules, _ = replay_rules(Settings())
    state.RESTORE_FIRST_STEPS = first_steps
    times = []
    for _ in range(rounds):
        engine = AlertEngine(rules)
        with session_scope(sessions) as s:
            t = time.perf_counter()
            engine._restore(s, 1, 0, before_step=10**12)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="bf16_high_lr")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import logging

    logging.disable(logging.WARNING)  # the alerts' log lines
    frames = frames_of(a.scenario)
    print(f"{a.scenario}: {len(frames)} frames in batches of {a.batch}, {a.rounds} rounds")
    with_s, without_s = [], []
    sessions, writes = None, 0
    for _ in range(a.rounds):
        t, sessions, writes = ingest(frames, a.batch, save=True)
        with_s.append(t)
        without_s.append(ingest(frames, a.batch, save=False)[0])
    w, wo = statistics.median(with_s), statistics.median(without_s)
    batches = -(-len(frames) // a.batch)
    print(f"ingest + engine: {w:.2f} s with the rule_memory write, {wo:.2f} s without: "
          f"x{w / wo:.3f} ({writes} writes in {batches} batches)")
    with session_scope(sessions) as s:
        size = s.scalar(select(func.length(RuleMemory.data)))
    print(f"rule_memory row: {size} bytes")
    full = state.RESTORE_FIRST_STEPS
    new, old = rebuild(sessions, full, a.rounds), rebuild(sessions, 0, a.rounds)
    state.RESTORE_FIRST_STEPS = full
    print(f"rebuild at the run's end: {new * 1e3:.0f} ms with its first {full} steps, "
          f"{old * 1e3:.0f} ms without: x{new / old:.2f}")


if __name__ == "__main__":
    main()
