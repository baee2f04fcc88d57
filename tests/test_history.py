"""Every-step scalars between sampled frames (a frame's ``history``): the wire format and
its checks on both parse paths, the store, the live stream and the client (the hooks that
record them: ``test_history_hooks.py``)."""

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


# --- the store: one scalars-only frame row per history step ------------------------------


def post(c: TestClient, *frames: dict[str, Any]) -> dict[str, Any]:
    r = c.post("/api/v1/ingest", content=body(*frames),
               headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def three_frames() -> list[dict[str, Any]]:
    """Steps 0, 5, 10 sampled; 1-4 and 6-9 in the histories (step 3 without grad norm,
    step 8 without any value)."""
    return [
        hframe(100, 0, loss=4.0, lr=0.1),
        hframe(101, 5, {"steps": [1, 2, 3, 4],
                        "scalars": {"loss": [3.9, 3.8, "NaN", 3.6],
                                    "grad.norm": [1.5, 1.25, None, 0.5],
                                    "lr": [0.1, 0.1, 0.1, 0.1]}}, loss=3.5, lr=0.1),
        hframe(102, 10, {"steps": [6, 7, 8, 9],
                         "scalars": {"loss": [3.4, 3.3, None, 3.1],
                                     "grad.norm": [None, None, None, 2.0],
                                     "lr": [0.05, 0.05, None, 0.05]}}, loss=3.0, lr=0.05),
    ]


@pytest.fixture
def store(db_url: str) -> Any:
    with TestClient(create_app(Settings(db_url=db_url, rate_limit_per_second=0))) as c:
        yield c


def series(c: TestClient, name: str) -> tuple[list[int], list[Any]]:
    r = c.get("/api/v1/runs/1/series", params={"name": name})
    assert r.status_code == 200, r.text
    return r.json()["steps"], r.json()["values"]


def rows(db_url: str) -> tuple[int, int, list[tuple[int, int]]]:
    """(frames, points, [(seq, step)] of the history rows)."""
    from sqlalchemy import func, select

    from logitwatch.server.db.models import Frame, Point
    from logitwatch.server.db.session import make_engine

    engine = make_engine(db_url)
    try:
        with engine.connect() as c:
            frames = c.execute(select(func.count()).select_from(Frame)).scalar_one()
            points = c.execute(select(func.count()).select_from(Point)).scalar_one()
            hist = c.execute(select(Frame.seq, Frame.step).where(Frame.seq < 0)
                             .order_by(Frame.step)).all()
    finally:
        engine.dispose()
    return int(frames), int(points), [(int(s), int(t)) for s, t in hist]


def test_every_step_is_stored_and_a_resent_batch_is_stored_once(store: TestClient,
                                                               db_url: str) -> None:
    frames = three_frames()
    out = post(store, *frames)
    assert (out["accepted"], out["duplicates"]) == (3, 0)  # frames, not history rows
    steps, values = series(store, "loss")
    assert steps == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10]  # step 8 measured nothing
    assert values == [4.0, pytest.approx(3.9), pytest.approx(3.8), "NaN", pytest.approx(3.6),
                      3.5, pytest.approx(3.4), pytest.approx(3.3), pytest.approx(3.1), 3.0]
    assert series(store, "grad.norm") == ([1, 2, 4, 9], [1.5, 1.25, 0.5, 2.0])
    assert series(store, "lr")[0] == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10]
    run = store.get("/api/v1/runs/1").json()
    assert (run["last_step"], run["last_time"]) == (10, T0 + 10)  # the sampled frames'
    n_frames, n_points, hist = rows(db_url)
    assert hist == [(-(s + 1), s) for s in (1, 2, 3, 4, 6, 7, 9)]
    assert n_frames == 3 + 7
    # Resent (a lost answer): nothing new, history included.
    out = post(store, *frames)
    assert (out["accepted"], out["duplicates"]) == (0, 3)
    assert rows(db_url) == (n_frames, n_points, hist)
    # A job restarted from the checkpoint of step 5 sends steps 6-9 again: the first
    # values stay, its own sampled frame (a new seq) is new.
    again = hframe(200, 10, {"steps": [6, 7, 8, 9], "scalars": {"loss": [9.0] * 4}}, loss=9.5)
    out = post(store, again)
    assert (out["accepted"], out["duplicates"]) == (1, 0)
    steps, values = series(store, "loss")
    assert values[steps.index(7)] == pytest.approx(3.3)  # the first one stored
    assert values[steps.index(8)] == 9.0  # step 8 had no value: this is its first
    assert steps.count(10) == 2


def test_history_rows_are_new_frames_in_step_order(sqlite_url: str) -> None:
    from logitwatch.server.db.session import make_engine, migrate, session_scope
    from logitwatch.server.store.ingest import ingest_frames

    engine = make_engine(sqlite_url)
    migrate(engine)
    from sqlalchemy.orm import sessionmaker

    sessions = sessionmaker(engine)
    frames = three_frames()
    batch = [frames[2], hframe(7, 3, {"steps": [1, 2], "scalars": {"loss": [1.0, 2.0]}},
                               rank=1), frames[0], frames[1]]
    parsed = IngestIn.model_validate({"frames": batch}).frames
    try:
        with session_scope(sessions) as s:
            new = ingest_frames(s, parsed).new_frames
        assert [(f.rank, f.step) for f in new] == (
            [(0, s) for s in (0, 1, 2, 3, 4, 5, 6, 7, 9, 10)] + [(1, 1), (1, 2), (1, 3)])
        by_step = {(f.rank, f.step): f for f in new}
        assert by_step[(0, 3)].scalars.keys() == {"loss", "lr"}  # null grad norm: absent
        assert math.isnan(by_step[(0, 3)].scalars["loss"])
        assert by_step[(0, 9)].heads == {} and by_step[(0, 9)].time == T0 + 10
        assert by_step[(0, 9)].scalars == {"loss": 3.1, "grad.norm": 2.0, "lr": 0.05}
        with session_scope(sessions) as s:
            assert ingest_frames(s, parsed).new_frames == []
    finally:
        engine.dispose()


def test_a_history_step_fires_a_scalar_rule_at_its_step(store: TestClient) -> None:
    post(store, hframe(0, 0, loss=4.0))
    post(store, hframe(1, 10, {"steps": list(range(1, 10)),
                               "scalars": {"loss": [3.9] * 6 + ["NaN", 3.0, 3.0]}},
                       loss=3.0))
    alerts = store.get("/api/v1/runs/1/alerts").json()
    fired = [a for a in alerts if a["rule"] == "loss_nonfinite"]
    assert len(fired) == 1 and fired[0]["fired_step"] == 7, alerts


def test_history_names_count_against_the_metric_limit_and_keep_one_shape(db_url: str) -> None:
    settings = Settings(db_url=db_url, rate_limit_per_second=0, max_metrics_per_run=3)
    with TestClient(create_app(settings)) as c:
        h = {"steps": [1], "scalars": {"a": [1.0], "b": [2.0], "c": [3.0]}}
        r = c.post("/api/v1/ingest", content=body(hframe(0, 5, h, loss=1.0)),
                   headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["code"]) == (422, "too-many-metrics"), r.text
        h = {"steps": [1], "scalars": {"m": [1.0]}}
        both = [hframe(0, 5, h), {**hframe(1, 6), "heads": {"m": [[1.0, 2.0]]}}]
        r = c.post("/api/v1/ingest", content=body(*both),
                   headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["code"]) == (422, "shape-mismatch"), r.text
        assert c.get("/api/v1/runs").json() == []


def test_the_live_stream_sends_every_step_and_the_sampled_frames_matrices(
        sqlite_url: str) -> None:
    from logitwatch.server.db.session import make_engine, session_scope
    from logitwatch.server.store.live import frames_since

    with TestClient(create_app(Settings(db_url=sqlite_url, rate_limit_per_second=0))) as c:
        f = hframe(0, 4, {"steps": [1, 2, 3], "scalars": {"loss": [3.0, 2.0, 1.0]}})
        post(c, {**f, "heads": {"attn.logit_max": [[1.0, 2.0]]}})
        run = c.get("/api/v1/runs/1").json()
        post(c, hframe(1, 8, {"steps": [5, 6, 7], "scalars": {"loss": [1.0, 1.0, 1.0]}}))
    engine = make_engine(sqlite_url)
    try:
        from sqlalchemy.orm import sessionmaker

        with session_scope(sessionmaker(engine)) as s:
            last, frames, latest = frames_since(s, run_id=1, after_id=0, limit=4)
            assert [f["step"] for f in frames] == [1, 2, 3, 4]
            assert latest == {"step": 4, "attn.logit_max": [[1.0, 2.0]]}
            assert last == run["last_frame_id"]
            _, frames, latest = frames_since(s, run_id=1, after_id=last, limit=2)
            assert [f["step"] for f in frames] == [5, 6] and latest == {"step": 6}
            # a scalars-only frame (a history flush) after the sampled one in the same page
            # leaves the heatmap on the sampled frame's matrices
            _, frames, latest = frames_since(s, run_id=1, after_id=0, limit=100)
            assert [f["step"] for f in frames] == list(range(1, 9))
            assert latest == {"step": 4, "attn.logit_max": [[1.0, 2.0]]}
    finally:
        engine.dispose()


def test_worst_heads_counts_sampled_frames_not_history_steps(api: TestClient) -> None:
    frames = []
    for i, step in enumerate((0, 10, 20)):
        h = {"steps": list(range(step - 9, step)), "scalars": {"loss": [1.0] * 9}} if step \
            else None
        frames.append({**hframe(i, step, h), "heads": {"attn.logit_max": [[1.0 + i, 0.5]]}})
    post(api, *frames)
    r = api.get("/api/v1/runs/1/worst_heads", params={"name": "attn.logit_max", "window": 3})
    assert r.status_code == 200, r.text
    top = r.json()["rows"][0]
    assert (r.json()["window"], top["trend_steps"], top["before"]) == (3, [0, 10, 20], 1.0)


def test_worst_heads_passes_over_the_history_flushes_between_samples(api: TestClient) -> None:
    """Sampled every 100 steps, the hooks send a scalars-only frame every 10 steps in
    between (``hooks.history_flush``): the worst-heads window still holds the newest
    ``window`` sampled matrices, not those among the newest few frames."""
    frames, seq = [], 0
    for step in range(0, 301, 10):
        seq += 1
        if step % 100:
            frames.append(hframe(seq, step, **{"loss": 3.0, "hooks.history_flush": 1.0}))
        else:
            frames.append({**hframe(seq, step),
                           "heads": {"attn.logit_max": [[1.0 + step / 100, 0.5]]}})
    post(api, *frames)
    r = api.get("/api/v1/runs/1/worst_heads", params={"name": "attn.logit_max", "window": 3})
    assert r.status_code == 200, r.text
    top = r.json()["rows"][0]
    assert (r.json()["window"], top["trend_steps"], top["before"]) == (3, [100, 200, 300], 2.0)


# --- the client: send(..., history=) ------------------------------------------------------


def test_the_client_encodes_a_history_the_collector_reads_back() -> None:
    from logitwatch.client._codec import encode, pack

    steps = [3, 4, 6]
    history = {"steps": steps, "scalars": {
        "loss": [2.5, math.nan, None], "grad.norm": [0.1 + 0.2, math.inf, 1],
        "lr": [None, None, None]}}
    packed, problems = pack(7, {"loss": 1.0}, {}, T0, history)
    plain, _ = pack(7, {"loss": 1.0}, {}, T0)
    assert problems == [] and packed.nbytes >= plain.nbytes + 8 * 4 * len(steps)
    history["scalars"]["loss"][0] = 99.0  # copied: the caller may reuse its lists
    steps.append(5)
    packed.seq = 1
    line = encode(packed, "r", "default", 0)
    assert json.loads(line)["history"] == {"steps": [3, 4, 6], "scalars": {
        "loss": [2.5, "NaN", None], "grad.norm": [0.1 + 0.2, "Infinity", 1.0],
        "lr": [None, None, None]}}
    got = parse_ingest(b'{"frames": [' + line + b"]}", "application/json").frames[0].history
    assert got is not None and got.steps == [3, 4, 6]
    assert got.scalars["grad.norm"] == [0.1 + 0.2, math.inf, 1.0]  # full double precision
    assert got.scalars["loss"][0] == 2.5 and math.isnan(got.scalars["loss"][1])


@pytest.mark.parametrize(("history", "says", "kept"), [
    ({"steps": [1, 1], "scalars": {"loss": [1.0, 2.0]}}, "strictly increasing", None),
    ({"steps": [5, 7], "scalars": {"loss": [1.0, 2.0]}}, "strictly increasing", None),
    ({"steps": ["a"], "scalars": {}}, "list of ints", None),
    ({"steps": [1, 2], "scalars": {"loss": [1.0], "lr": [1.0, 2.0]}}, "'loss'",
     {"steps": [1, 2], "scalars": {"lr": [1.0, 2.0]}}),
    ({"steps": [1], "scalars": {"my loss": [1.0], "loss": ["x"]}}, "'my loss'", None),
])
def test_a_bad_history_is_left_out_and_the_frame_sent(history: Any, says: str,
                                                      kept: Any) -> None:
    from logitwatch.client._codec import encode, pack

    packed, problems = pack(7, {"loss": 1.0}, {}, T0, history)
    assert problems and says in problems[0], problems
    packed.seq = 1
    frame = json.loads(encode(packed, "r", "default", 0))
    assert frame["scalars"] == {"loss": 1.0} and frame.get("history") == kept
    parse_ingest(json.dumps({"frames": [frame]}).encode(), "application/json")


def test_send_with_a_history_reaches_the_collector(sqlite_url: str) -> None:
    import httpx

    from logitwatch.client import Client, ClientConfig

    with TestClient(create_app(Settings(db_url=sqlite_url, rate_limit_per_second=0))) as api:
        def forward(request: httpx.Request) -> httpx.Response:
            r = api.post(request.url.path, content=request.content,
                         headers=dict(request.headers))
            return httpx.Response(r.status_code, content=r.content, headers=r.headers)

        http = httpx.Client(transport=httpx.MockTransport(forward))
        client = Client("http://collector", run="h", config=ClientConfig(interval=0.02),
                        http=http)
        client.send(0, {"loss": 4.0}, {})
        client.send(3, {"loss": 1.0}, {}, history={"steps": [1, 2], "scalars": {
            "loss": [3.0, None], "grad.norm": [None, 0.5]}})
        client.send(4, {"loss": 0.5}, {}, history={"steps": "oops"})  # never raises
        assert client.flush(10.0)
        client.shutdown(5.0)
        assert client.stats["rejected"] == 0
        assert series(api, "loss") == ([0, 1, 3, 4], [4.0, 3.0, 1.0, 0.5])
        assert series(api, "grad.norm") == ([2], [0.5])


def test_a_name_with_a_trailing_newline_is_left_out_by_the_client() -> None:
    """``re.match`` lets ``$`` match before a final newline; the collector does not, and
    would refuse the whole batch."""
    from logitwatch.client import Client
    from logitwatch.client._codec import pack

    packed, problems = pack(3, {"loss\n": 1.0, "lr": 0.1}, {},
                            T0, {"steps": [1], "scalars": {"loss\n": [1.0], "lr": [0.1]}})
    assert list(packed.scalars) == ["lr"] and len(problems) == 2
    assert packed.history is not None and list(packed.history[1]) == ["lr"]
    with pytest.raises(ValueError):
        Client(None, run="r\n")
