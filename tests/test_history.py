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


# --- the hooks: every step's scalars, no sync between sampled steps ------------------------


class Sink:
    """Stands for the client: keeps what the monitor sends."""

    def __init__(self) -> None:
        from logitwatch.client import Client

        self.client = Client(None, run="h")
        self.frames: list[dict[str, Any]] = []

        def send(step: int, scalars: Any, heads: Any, time: float | None = None,
                 history: Any = None) -> None:
            self.frames.append({"step": step, "scalars": dict(scalars), "history": history})

        self.client.send = send  # type: ignore[method-assign]

    def sampled(self) -> list[int]:
        """The sampled steps: frames that are neither a flush of the history between
        samples nor the closing frame."""
        return [f["step"] for f in self.frames
                if "hooks.history_flush" not in f["scalars"]
                and "hooks.closing" not in f["scalars"]]

    def every_step(self, name: str) -> dict[int, float | None]:
        """``name`` at every step the frames tell of: their own scalars and histories."""
        out: dict[int, float | None] = {}
        for f in self.frames:
            h = f["history"]
            if h is not None:
                values = h["scalars"].get(name, [None] * len(h["steps"]))
                out.update(zip(h["steps"], values, strict=True))
            out[f["step"]] = f["scalars"].get(name)
        return out


def tiny_lm(seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(48, 32)
            self.qkv = nn.Linear(32, 96)
            self.out = nn.Linear(32, 48)
            self.plain = False  # return the loss tensor itself, not an HF-style output

        def forward(self, ids: Any) -> Any:
            from types import SimpleNamespace

            import torch.nn.functional as F

            x = self.emb(ids)
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            logits = self.out(x + y.transpose(1, 2).reshape(b, t, 32))
            loss = F.cross_entropy(logits.reshape(-1, 48), ids.roll(-1, 1).reshape(-1))
            return loss if self.plain else SimpleNamespace(loss=loss, logits=logits)

    return LM()


def train(model: Any, opt: Any, steps: int, *, clip: float | None = 1.3, micro: int = 1,
          log: Any = None, sched: Any = None, seed: int = 1) -> list[dict[str, Any]]:
    """A plain loop; per step what it saw: the loss (mean over micro-batches), the norm
    the clip call returned, the lr it trained with, and the host reads made."""
    import torch

    from logitwatch.hooks._probes import CountSyncs

    gen = torch.Generator().manual_seed(seed)
    seen = []
    heads: list[tuple[Any, Any]] = []  # per LM-head call: log Z (mean), hidden mean square

    def head_call(module: Any, args: Any, output: Any) -> None:
        with torch.no_grad():  # read after the step (a read in it would count as a sync)
            heads.append((torch.logsumexp(output.float(), -1).mean(),
                          args[0].float().square().mean()))

    handle = model.out.register_forward_hook(head_call)
    for _ in range(steps):
        losses = []
        heads.clear()
        with CountSyncs() as syncs:
            for _ in range(micro):
                ids = torch.randint(0, 48, (2, 12), generator=gen)
                out = model(ids)
                loss = out if model.plain else out.loss
                (loss / micro).backward()
                losses.append(loss.detach())
                if log is not None:
                    log(loss)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip) if clip else None
            lr = opt.param_groups[0]["lr"]
            opt.step()
            opt.zero_grad()
        if sched is not None:
            sched.step()
        mean = torch.stack(losses).mean() if micro > 1 else losses[0]
        seen.append({"loss": float(mean), "last": float(losses[-1]),
                     "norm": None if norm is None else float(norm), "lr": lr,
                     "clipped": None if norm is None else float(norm > clip),  # in float32
                     "syncs": syncs.calls,
                     "logz": sum(float(z) for z, _ in heads) / len(heads),
                     "rms": (sum(float(r) for _, r in heads) / len(heads)) ** 0.5})
    handle.remove()
    return seen


@pytest.fixture
def torch_one_thread(one_torch_thread: None) -> Any:
    import torch

    return torch


def test_every_step_loss_grad_norm_clip_flag_and_lr_without_a_sync(torch_one_thread: Any
                                                                   ) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)  # lr jumps mid-way
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None)
    seen = train(model, opt, 35, sched=sched)
    mon.close()
    assert [f["step"] for f in sink.frames] == [0, 10, 20, 30, 34]  # 34: close()'s
    assert sink.frames[0]["history"] is None
    assert [f["history"]["steps"] for f in sink.frames[1:]] == [
        list(range(1, 10)), list(range(11, 20)), list(range(21, 30)), [31, 32, 33]]
    covered = range(35)
    loss, norm = sink.every_step("loss"), sink.every_step("grad.norm")
    clipped, lr = sink.every_step("grad.clipped"), sink.every_step("lr")
    assert [loss[s] for s in covered] == [seen[s]["loss"] for s in covered]  # exactly
    assert [norm[s] for s in covered] == [seen[s]["norm"] for s in covered]
    assert [clipped[s] for s in covered] == [seen[s]["clipped"] for s in covered]
    assert 0 < sum(clipped.values()) < len(covered)  # both cases met
    assert [lr[s] for s in covered] == [seen[s]["lr"] for s in covered]
    assert {seen[s]["lr"] for s in covered} == {0.2, 0.1, 0.05, 0.025, 0.0125}
    for s in range(35):  # one read-back on a sampled step (a .cpu() too on an
        assert seen[s]["syncs"] == (["tolist"] if s % 10 == 0 else []), s  # accelerator)
    f = sink.frames[1]["scalars"]
    assert f["hooks.syncs"] == 0 and "hooks.history_dropped" not in f
    assert f["hooks.bytes"] >= 4 * 4 * 9  # the history's rows came back in that transfer


def test_a_job_that_does_not_clip_sends_no_grad_norm_between_samples(torch_one_thread: Any
                                                                    ) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    model.plain = True  # a loss tensor: Monitor.log(loss=...) gives it
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # (CPU Adam reads its step count)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None, max_grad_norm=1.0)
    seen = train(model, opt, 21, clip=None, micro=2, log=lambda loss: mon.log(loss=loss))
    mon.close()
    assert all(s["syncs"] == [] for i, s in enumerate(seen) if i % 10)
    for f in sink.frames[1:]:
        h = f["history"]
        assert set(h["scalars"]) == {"loss", "lr", "final.logz", "final.hidden_rms"}, (
            h["scalars"].keys())  # no grad norm: null everywhere, left out
        assert "grad.norm" in f["scalars"]  # measured on the sampled step itself
    # log() replaces, as on sampled steps: the step's loss is the last one logged
    loss = sink.every_step("loss")
    assert [loss[s] for s in range(21)] == [seen[s]["last"] for s in range(21)]


def monitored(torch: Any, steps: int, every: int, lr: float, micro: int = 1
              ) -> tuple[Sink, list[dict[str, Any]]]:
    """``tiny_lm`` trained ``steps`` steps with plain SGD, sampled one step in ``every``."""
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=every,
                 overhead_budget=None)
    seen = train(model, opt, steps, micro=micro)
    mon.close()
    return sink, seen


def test_gradient_accumulation_keeps_the_mean_loss(torch_one_thread: Any) -> None:
    sink, seen = monitored(torch_one_thread, 11, 5, 0.1, micro=3)
    loss = sink.every_step("loss")
    assert sorted(loss) == list(range(11))
    logz, rms = sink.every_step("final.logz"), sink.every_step("final.hidden_rms")
    for s in range(11):
        assert loss[s] == pytest.approx(seen[s]["loss"], rel=1e-6), s
        # the mean over the step's three LM-head calls, sampled step or not
        assert logz[s] == pytest.approx(seen[s]["logz"], rel=1e-5), s
        assert rms[s] == pytest.approx(seen[s]["rms"], rel=1e-5), s


def test_every_step_log_z_and_hidden_rms_without_a_sync(torch_one_thread: Any) -> None:
    sink, seen = monitored(torch_one_thread, 25, 10, 0.5)
    logz, rms = sink.every_step("final.logz"), sink.every_step("final.hidden_rms")
    assert sorted(logz) == sorted(rms) == list(range(25))
    for s in range(25):  # 24 positions a batch: the unsampled estimate reads them all
        assert logz[s] == pytest.approx(seen[s]["logz"], rel=1e-5), s
        assert rms[s] == pytest.approx(seen[s]["rms"], rel=1e-5), s
        assert seen[s]["syncs"] == (["tolist"] if s % 10 == 0 else []), s
    assert len({round(v, 4) for v in logz.values()}) > 20  # it moves: a value per step


def test_the_unsampled_log_z_reads_evenly_spaced_positions() -> None:
    import torch

    from logitwatch.hooks._final import step_final
    from logitwatch.hooks._probes import CountSyncs

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 300, 50, generator=gen).to(torch.bfloat16) * 4
    hidden = torch.randn(4, 300, 16, generator=gen)
    with CountSyncs() as syncs:
        logz, square = step_final(hidden, logits, rows=64)
    assert syncs.calls == [] and logz.dtype == square.dtype == torch.float32
    rows = logits.reshape(-1, 50).float()[torch.arange(9, 1200, 19)[:64]]  # odd stride
    assert float(logz) == pytest.approx(float(torch.logsumexp(rows, -1).mean()), rel=1e-6)
    assert float(square) == pytest.approx(float(hidden.square().mean()), rel=1e-5)
    every = torch.logsumexp(logits.float(), -1).flatten()
    # an estimate of the pooled mean: within 4 standard errors of a 64-position mean
    assert abs(float(logz) - float(every.mean())) < 4 * float(every.std()) / 64 ** 0.5


def test_a_full_ring_keeps_the_newest_steps_and_counts_the_rest(torch_one_thread: Any
                                                                ) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach
    from logitwatch.hooks._history import StepHistory

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None)
    mon._history = StepHistory(capacity=4)
    seen = train(model, opt, 21)
    mon.close()
    assert [f["history"] and f["history"]["steps"] for f in sink.frames] == [
        None, [6, 7, 8, 9], [16, 17, 18, 19]]
    assert [f["scalars"].get("hooks.history_dropped") for f in sink.frames] == [None, 5.0, 5.0]
    h = sink.frames[2]["history"]
    assert h["scalars"]["loss"] == [seen[s]["loss"] for s in (16, 17, 18, 19)]


def test_a_failing_history_is_disabled_and_training_goes_on(torch_one_thread: Any,
                                                            caplog: Any) -> None:
    torch = torch_one_thread
    from logitwatch.hooks import attach

    def run(broken: bool) -> tuple[list[dict[str, Any]], Sink, Any]:
        model = tiny_lm()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sink = Sink()
        mon = attach(model, opt, run="h", client=sink.client, sample_every=4,
                     overhead_budget=None)
        if broken:
            def put(*args: Any) -> None:
                raise RuntimeError("broken history")

            mon._history.put = put  # type: ignore[method-assign]
        seen = train(model, opt, 9)
        mon.close()
        return seen, sink, mon

    good, _, _ = run(False)
    bad, sink, mon = run(True)
    assert [s["loss"] for s in bad] == [s["loss"] for s in good]  # training unchanged
    assert mon.disabled == {"history"} and "broken history" in caplog.text
    assert [f["step"] for f in sink.frames] == [0, 4, 8]  # frames still sent
    assert all(f["history"] is None for f in sink.frames)


def test_the_clip_flag_compares_as_the_device_does(torch_one_thread: Any) -> None:
    torch = torch_one_thread
    from logitwatch.hooks._history import StepHistory

    h = StepHistory(capacity=8)
    cases = [(0.1, 0.1), (0.2, 0.1), (0.05, 0.1), (math.nan, 1.0), (math.inf, 1.0),
             (1.0, math.inf), (2.0, torch.tensor(1.5)), (1.0, torch.tensor(1.5))]
    want = []
    for step, (norm, max_norm) in enumerate(cases):
        total = torch.tensor(norm, dtype=torch.float32)  # 0.1: just above 0.1 in float32
        hit = (total > max_norm).to(torch.int32)
        want.append(float(hit))
        h.put_norm(total, max_norm, hit)
        h.end_step(step)
    block = h.take()
    assert block is not None
    flat = [x for t in block.tensors for x in t.reshape(-1).tolist()]
    got = block.values(flat)["scalars"]["grad.clipped"]
    assert got == want == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


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


def test_an_lr_jump_or_a_climb_past_the_settled_peak_samples_the_next_step(
        torch_one_thread: Any) -> None:
    """At sample_every=40: constant lr for 150 steps (settled), a x5 jump at step 160 and a
    climb from step 200 (doubling every 4 steps): the step after the jump and a few steps
    of the climb (one per doubling past 2x the settled peak) are sampled; nothing read on
    the others."""
    torch = torch_one_thread
    from logitwatch.hooks import attach
    from logitwatch.hooks._lrwatch import LrWatch

    def lr_at(step: int) -> float:
        if step < 160:
            return 1e-3
        if step < 200:
            return 5e-3 if step < 170 else 1e-3
        return 1e-3 * 2 ** ((step - 200) / 4)

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s) / 1e-3)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=40,
                 overhead_budget=None)
    seen = train(model, opt, 216, sched=sched)
    mon.close()
    assert sink.frames[-1]["step"] == 215  # close() sends the steps since the last frame
    sampled = sink.sampled()
    watch, expected, last = LrWatch(), [0], 0
    for s in range(215):
        if watch.step(s, seen[s]["lr"]) or s + 1 >= last + 40:
            expected.append(s + 1)
            last = s + 1
    assert sampled == expected
    assert 161 in sampled and 171 in sampled  # the jump up, and back down
    assert len([s for s in sampled if s > 200]) >= 2  # the climb
    for s in range(216):
        assert seen[s]["syncs"] == (["tolist"] if s in sampled else []), s
    # plain schedules never trigger it: a warm-up, a constant lr, a step decay
    w = LrWatch()
    assert not any(w.step(s, 1e-3 * min(1.0, (s + 1) / 100) * (0.5 if s > 500 else 1.0))
                   for s in range(1000))


def test_close_sends_the_steps_since_the_last_frame(torch_one_thread: Any) -> None:
    """A run that ends between two samples: close() sends the last steps (the newest as a
    frame of its own scalars, the others as its history), so its end is not lost."""
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=10,
                 overhead_budget=None)
    seen = train(model, opt, 26)
    assert [f["step"] for f in sink.frames] == [0, 10, 20]
    mon.close()
    last = sink.frames[-1]
    assert last["step"] == 25 and last["history"]["steps"] == [21, 22, 23, 24]
    loss = sink.every_step("loss")
    assert [loss[s] for s in range(26)] == [seen[s]["loss"] for s in range(26)]
    assert last["scalars"]["grad.norm"] == seen[25]["norm"]


def test_a_loss_or_grad_spike_samples_the_next_step_without_a_sync(torch_one_thread: Any
                                                                    ) -> None:
    """At sample_every=50: a gradient spike (the loss scaled x1e4 on one step, no clipping
    to bound it) and later a NaN loss: the step after each is sampled, so the frame that
    carries them reaches the collector at once; the watch reads nothing through torch on
    the other steps (a CPU buffer is host memory; an accelerator's is copied non-blocking)."""
    torch = torch_one_thread
    from logitwatch.hooks import attach

    model = tiny_lm()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sink = Sink()
    mon = attach(model, opt, run="h", client=sink.client, sample_every=50,
                 overhead_budget=None)
    gen = torch.Generator().manual_seed(0)
    syncs: list[list[str]] = []
    from logitwatch.hooks._probes import CountSyncs

    for step in range(130):
        with CountSyncs() as probe:
            ids = torch.randint(0, 48, (2, 12), generator=gen)
            loss = model(ids).loss
            if step == 70:
                loss = loss * 1e4  # one exploding step
            if step == 110:
                loss = loss * float("nan")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            opt.step()
            opt.zero_grad()
        syncs.append(probe.calls)
    mon.close()
    sampled = sink.sampled()
    assert 71 in sampled and 111 in sampled, sampled
    assert [s for s in sampled if s < 71] == [0, 50]  # steady training: nothing extra
    assert all(syncs[s] == [] for s in range(130) if s not in sampled), syncs
    # after the blow-up the run stays broken: sampled at most BURST times in REARM steps
    from logitwatch.hooks._stepwatch import BURST, REARM

    extra = [s for s in sampled if s not in (0, 50, 100)]
    assert all(b - a >= REARM for a, b in zip(extra, extra[BURST:], strict=False)), extra


def test_the_steps_between_samples_are_flushed_every_10_without_a_read_back(
        torch_one_thread: Any) -> None:
    """At sample_every=50 the kept steps go out every 10 unsampled steps as a scalars-only
    frame (``hooks.history_flush``), each step told exactly once with what it trained on,
    no host read on any unsampled step (the flush steps included), and the frames pass the
    collector's schema; ``history_every=None`` sends them with the sampled frames only."""
    torch = torch_one_thread
    from logitwatch.hooks import attach
    from logitwatch.server.schemas import IngestIn

    def run(**kw: Any) -> tuple[Sink, list[dict[str, Any]]]:
        model = tiny_lm()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        sink = Sink()
        mon = attach(model, opt, run="h", client=sink.client, sample_every=50,
                     overhead_budget=None, **kw)
        seen = train(model, opt, 75)
        mon.close()
        return sink, seen

    sink, seen = run()
    steps = [f["step"] for f in sink.frames]
    assert steps == [0, 10, 20, 30, 40, 50, 60, 70, 74], steps
    assert sink.sampled() == [0, 50]
    flushes = [f for f in sink.frames if "hooks.history_flush" in f["scalars"]]
    assert [f["step"] for f in flushes] == [10, 20, 30, 40, 60, 70]
    assert flushes[0]["history"]["steps"] == list(range(1, 10))
    assert sink.frames[5]["history"]["steps"] == list(range(41, 50))  # since the flush
    told = sorted(s for f in sink.frames for s in [*(f["history"] or {}).get("steps", []),
                                                   f["step"]])
    assert told == list(range(75))  # each step exactly once
    loss = sink.every_step("loss")
    assert all(loss[s] == pytest.approx(seen[s]["loss"], rel=1e-6) for s in range(75))
    norm = sink.every_step("grad.norm")
    assert all(norm[s] == pytest.approx(seen[s]["norm"], rel=1e-5) for s in range(75))
    assert all(seen[s]["syncs"] == [] for s in range(75) if s not in (0, 50)), seen
    wire = [{"run": "h", "seq": i + 1, "time": 1.0, "step": f["step"],
             "scalars": f["scalars"], "heads": {},
             **({"history": f["history"]} if f["history"] else {})}
            for i, f in enumerate(sink.frames)]
    assert [f.step for f in IngestIn.model_validate({"frames": wire}).frames] == steps

    off, _ = run(history_every=None)
    assert [f["step"] for f in off.frames] == [0, 50, 74]
    assert off.frames[1]["history"]["steps"] == list(range(1, 50))
    with pytest.raises(ValueError, match="history_every"):
        run(history_every=-1)
