"""Long series bucketed in SQL (server/store/buckets.py): the same points as reading the
whole series and min/max downsampling it, spikes and non-finite values kept. SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.store import buckets, queries
from logitwatch.server.store.downsample import minmax_downsample
from logitwatch.server.store.ingest import ingest_frames
from logitwatch.server.store.parse import parse_ingest

N = 20_000
SPIKE, NAN, INF = 12_345, 7_777, 15_001
NOW = time.time()


def _values() -> np.ndarray:
    v = np.random.default_rng(7).standard_normal(N).astype(np.float32).astype(np.float64)
    v[SPIKE] = 1e6
    return v


def _wire(x: float) -> Any:
    return "NaN" if np.isnan(x) else ("Infinity" if np.isinf(x) else float(x))


@pytest.fixture
def store(db_url: str) -> Iterator[tuple[Engine, int]]:
    engine = make_engine(db_url)
    migrate(engine)
    v = _values()
    sessions = sessionmaker(engine, expire_on_commit=False)
    for a in range(0, N, 2_000):
        frames = []
        for i in range(a, a + 2_000):
            loss = float("nan") if i == NAN else (float("inf") if i == INF else v[i])
            for rank in (0, 1):
                frames.append({"run": "long", "rank": rank, "seq": i, "step": i,
                               "time": NOW - N + i, "scalars": {"loss": _wire(loss + rank)},
                               "heads": {"attn.x": [[_wire(loss), 0.0], [-1.0, 2.0 * i]]}})
        body = json.dumps({"frames": frames}).encode()
        with session_scope(sessions) as s:
            ingest_frames(s, parse_ingest(body, "application/json").frames)
    with session_scope(sessions) as s:
        run_id = queries.list_runs(s)[0].id
    yield engine, run_id
    engine.dispose()


def test_bucketed_series_match_the_downsampler(store: tuple[Engine, int],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    engine, run_id = store
    used: list[bool] = []
    real = buckets.bucketed

    def spy(*a: Any, **kw: Any) -> Any:
        got = real(*a, **kw)
        used.append(got is not None)
        return got

    monkeypatch.setattr(queries, "bucketed", spy)
    with session_scope(sessionmaker(engine)) as s:
        for kw in ({"name": "loss"}, {"name": "loss", "rank": 1},
                   {"name": "attn.x", "layer": 0, "head": 0},
                   {"name": "attn.x", "layer": 1, "head": 1}, {"name": "attn.x"},
                   {"name": "loss", "start": 1_000, "end": 19_000}):
            used.clear()
            got = queries.get_series(s, run_id=run_id, max_points=2_000, **kw)
            assert used == [True], kw
            whole = queries.get_series(s, run_id=run_id, max_points=2**62, **kw)
            assert got.total == len(whole.steps) == (18_001 if "start" in kw else N)
            steps, values = minmax_downsample(np.asarray(whole.steps),
                                              np.asarray(whole.values), 2_000)
            np.testing.assert_array_equal(np.asarray(got.steps), steps)
            np.testing.assert_array_equal(np.asarray(got.values), values)
            assert len(got.steps) <= 2_000 + 2
        # The spike, the NaN and the Inf of rank 0's loss, at their steps.
        got = queries.get_series(s, run_id=run_id, name="loss", max_points=2_000)
        at = dict(zip(got.steps, got.values, strict=True))
        assert at[SPIKE] == np.float32(1e6) and np.isnan(at[NAN]) and at[INF] == np.inf
        assert max(got.values[i] for i in range(len(got.values))
                   if np.isfinite(got.values[i])) == np.float32(1e6)
        # A zoom of fewer steps than 4 x the budget, or a merge of ranks: read whole.
        for kw in ({"start": 100, "end": 5_000}, {"merge": "max"}):
            used.clear()
            got = queries.get_series(s, run_id=run_id, name="loss", max_points=2_000, **kw)
            assert used in ([False], []), kw


def test_keys_round_trip_every_float32() -> None:
    x = np.array([0.0, -0.0, 1.5, -1.5, 3.4e38, -3.4e38, 1e-45, -1e-45, np.inf, -np.inf,
                  np.nan], dtype="<f4")
    u = x.view(np.uint32).astype(np.int64)
    k = np.where(u < 2**31, u, 2**31 - 1 - u)
    np.testing.assert_array_equal(buckets.key_to_f32(k), x.astype(np.float64))
    finite = np.isfinite(x)
    order = np.argsort(k[finite], kind="stable")
    assert (np.diff(x[finite][order]) >= 0).all()


def test_a_nan_tail_is_a_few_points_a_bucket(db_url: str) -> None:
    """A run that logs NaN after it diverged: each bucket keeps the first point of each
    non-finite kind, not every point (20,000 NaN steps were 19,901 points at max_points=4),
    in SQL and in the downsampler alike."""
    engine = make_engine(db_url)
    migrate(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    try:
        for a in range(0, N, 5_000):
            frames = [{"run": "tail", "seq": i, "step": i, "time": NOW - N + i,
                       "scalars": {"loss": 2.0 if i < 100 else ("Infinity" if i % 1000 == 7
                                                                else "NaN")}}
                      for i in range(a, a + 5_000)]
            with session_scope(sessions) as s:
                ingest_frames(s, parse_ingest(json.dumps({"frames": frames}).encode(),
                                              "application/json").frames)
        with session_scope(sessions) as s:
            run_id = queries.list_runs(s)[0].id
            whole = queries.get_series(s, run_id=run_id, name="loss", max_points=2**62)
            assert len(whole.steps) == N
            for budget in (4, 200, 2_000):
                got = queries.get_series(s, run_id=run_id, name="loss", max_points=budget)
                steps, values = minmax_downsample(np.asarray(whole.steps),
                                                  np.asarray(whole.values), budget)
                np.testing.assert_array_equal(np.asarray(got.steps), steps)
                assert len(got.steps) <= 2 * budget, (budget, len(got.steps))
                at = dict(zip(got.steps, got.values, strict=True))
                assert np.isnan(at[100]) and at[1007] == np.inf and at[0] == 2.0
    finally:
        engine.dispose()
