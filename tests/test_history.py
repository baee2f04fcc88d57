"""Every-step scalars between sampled frames (a frame's ``history``): the wire format and
its checks on both parse paths."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings
from logitwatch.server.store import parse
from logitwatch.server.store.parse import parse_ingest

T0 = 1_764_430_000.0


def hframe(seq: int, step: int, history: Any = None, *, run: str = "h", rank: int = 0,
           **scalars: Any) -> dict[str, Any]:
    f: dict[str, Any] = {"run": run, "rank": rank, "seq": seq, "step": step,
                         "time": T0 + step, "scalars": scalars or {"loss": 3.0}}
    if history is not None:
        f["history"] = history
    return f


def body(*frames: dict[str, Any]) -> bytes:
    return json.dumps({"frames": list(frames)}).encode()


# --- parsing: the fast path accepts exactly what the model accepts -------------------------


GOOD = [
    {"steps": [1, 2, 3], "scalars": {"loss": [3.0, 2.5, 2.25]}},
    {"steps": [1, 2, 3], "scalars": {"loss": [3, "NaN", None], "lr": [1, 2, 3]}},
    {"steps": [4, 7], "scalars": {"grad.norm": ["Infinity", "-Infinity"],
                                  "grad.clipped": [None, None]}},
    {"steps": [9]},
    {"steps": [], "scalars": {}},
]


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None
                                      and (x == y or math.isnan(x) and math.isnan(y)))
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("history", GOOD)
def test_fast_parse_of_a_history_matches_the_model(history: dict[str, Any]) -> None:
    raw = body(hframe(0, 10, history))
    fast = parse._fast(parse._loads(raw)).frames[0].history  # no fallback to the model
    model = IngestIn.model_validate(json.loads(raw)).frames[0].history
    assert fast is not None and model is not None
    assert fast.steps == model.steps == history["steps"]
    assert fast.scalars.keys() == model.scalars.keys() == history.get("scalars", {}).keys()
    for name, values in model.scalars.items():
        assert all(v is None or type(v) is float for v in values)
        assert _same(fast.scalars[name], values), name
    assert parse_ingest(body(hframe(0, 10)), "application/json").frames[0].history is None


BAD: list[tuple[str, Any, str]] = [
    ("lengths differ", {"steps": [1, 2, 3], "scalars": {"loss": [1.0, 2.0]}},
     "scalars.loss: 2 values for 3 steps"),
    ("repeated step", {"steps": [1, 2, 2], "scalars": {}}, "steps.2: 2 does not follow 2"),
    ("decreasing", {"steps": [5, 3], "scalars": {}}, "steps.1: 3 does not follow 5"),
    ("the frame's step", {"steps": [8, 10], "scalars": {}}, "the last step 10 is not before"),
    ("after the frame", {"steps": [11]}, "the last step 11 is not before"),
    ("negative step", {"steps": [-1]}, "steps.0: -1 is not an int"),
    ("float step", {"steps": [1.0]}, "steps.0: 1.0 is not an int"),
    ("bool step", {"steps": [True]}, "steps.0: True is not an int"),
    ("lowercase nan", {"steps": [1], "scalars": {"loss": ["nan"]}}, "scalars.loss.0"),
    ("bool value", {"steps": [1], "scalars": {"loss": [False]}}, "scalars.loss.0"),
    ("nested value", {"steps": [1], "scalars": {"loss": [[1.0]]}}, "scalars.loss.0"),
    ("bad name", {"steps": [1], "scalars": {"my loss": [1.0]}}, "'my loss'"),
    ("newline in name", {"steps": [1], "scalars": {"loss\n": [1.0]}}, "'loss\\n'"),
    ("unknown field", {"steps": [1], "values": []}, "unknown fields ['values']"),
    ("no steps", {"scalars": {}}, "steps: missing"),
    ("not an object", [1, 2], "must be an object"),
    ("too many steps", {"steps": list(range(4097))}, "4097 steps, at most 4096"),
    ("too many series", {"steps": [1], "scalars": {f"s{i}": [1.0] for i in range(17)}},
     "17 series, at most 16"),
]


@pytest.fixture
def api(sqlite_url: str) -> Any:
    with TestClient(create_app(Settings(db_url=sqlite_url, rate_limit_per_second=0))) as c:
        yield c


@pytest.mark.parametrize(("what", "history", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_history_is_refused_with_one_small_error(api: TestClient, what: str,
                                                       history: Any, says: str) -> None:
    step = 5000 if what == "too many steps" else 10
    good = hframe(0, 5, {"steps": [1, 2], "scalars": {"loss": [1.0, 2.0]}})
    r = api.post("/api/v1/ingest", content=body(good, hframe(1, step, history)),
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["code"] == "invalid-request" and len(out["errors"]) == 1, out
    assert out["message"].startswith("body.frames.1") and "history" in out["message"], out
    assert says in out["message"], out
    assert len(r.content) < 2000
    assert api.get("/api/v1/runs").json() == []  # nothing stored, not even the good frame


def test_a_history_of_bad_values_costs_one_short_error(api: TestClient) -> None:
    steps = list(range(4096))
    history = {"steps": steps, "scalars": {f"s{i}": ["x"] * 4096 for i in range(16)}}
    r = api.post("/api/v1/ingest", content=body(hframe(0, 5000, history)),
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    out = r.json()
    assert len(out["errors"]) == 1 and out["message"].count("expected a number") == 3
    assert len(r.content) < 2000
