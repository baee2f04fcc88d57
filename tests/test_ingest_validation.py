"""Ingest bodies the collector must refuse with a clear 4xx (never a 500, never stored
coerced), the per-request limits, the shape-change message, and ``logitwatch replay`` on
malformed files (a message naming the file, line and field; no traceback).

Each test here failed before the fix it guards.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from logitwatch.cli import main
from logitwatch.server.schemas import (
    MAX_REQUEST_HISTORY_STEPS,
    MAX_REQUEST_RANKS,
    MAX_REQUEST_RUNS,
)
from tests.hostile import runs


def _frame(**kw: Any) -> dict[str, Any]:
    return {"run": "r", "seq": 0, "step": 10, "time": time.time(),
            "scalars": {"loss": 1.0}, **kw}


def _post(c: TestClient, frames: list[dict[str, Any]]) -> Any:
    return c.post("/api/v1/ingest", json={"frames": frames})


# --- 1. a huge integer in a history: 422, as under scalars ----------------------------------


def test_a_huge_int_in_a_history_is_a_422_naming_it(app_client: TestClient) -> None:
    f = _frame(history={"steps": [1], "scalars": {"loss": [10**400]}})
    r = _post(app_client, [f])
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid-request"
    assert "scalars.loss.0" in r.json()["message"]
    assert runs(app_client) == []


# --- 2. what one request may make the store do ----------------------------------------------


def test_too_many_history_steps_in_one_request_are_refused(app_client: TestClient) -> None:
    per = 4096
    n = MAX_REQUEST_HISTORY_STEPS // per + 1
    frames = [_frame(rank=k, step=5000, history={"steps": list(range(per)),
                                                   "scalars": {"loss": [1.0] * per}})
              for k in range(n)]
    r = _post(app_client, frames)
    assert r.status_code == 422, r.text
    msg = r.json()["message"]
    assert f"{n * per} history steps" in msg and str(MAX_REQUEST_HISTORY_STEPS) in msg
    assert "smaller batches" in msg and "nothing was stored" in msg
    assert runs(app_client) == []
    # Just under the limit: stored.
    ok = frames[: MAX_REQUEST_HISTORY_STEPS // per]
    assert _post(app_client, ok).status_code == 200


def test_too_many_runs_in_one_request_are_refused(app_client: TestClient) -> None:
    frames = [_frame(run=f"r{i}") for i in range(MAX_REQUEST_RUNS + 1)]
    r = _post(app_client, frames)
    assert r.status_code == 422, r.text
    msg = r.json()["message"]
    assert f"{MAX_REQUEST_RUNS + 1} distinct runs" in msg and str(MAX_REQUEST_RUNS) in msg
    assert "smaller batches" in msg
    assert runs(app_client) == []


def test_too_many_ranks_in_one_request_are_refused(app_client: TestClient) -> None:
    """A batch of one run's 1,001 ranks: refused before the store or the alert engine
    runs (each new rank's alert state is rebuilt under the ingest lock); 1,000 are
    stored."""
    frames = [{**_frame(run="wide"), "rank": i} for i in range(MAX_REQUEST_RANKS + 1)]
    r = _post(app_client, frames)
    assert r.status_code == 422, r.text
    msg = r.json()["message"]
    assert f"{MAX_REQUEST_RANKS + 1} distinct (run, rank) pairs" in msg and "smaller" in msg
    assert runs(app_client) == []
    assert _post(app_client, frames[:MAX_REQUEST_RANKS]).status_code == 200


def test_the_limits_hold_on_the_slow_path_too(app_client: TestClient) -> None:
    # "NaN" sends the body through the pydantic model instead of the fast path.
    frames = [_frame(run=f"r{i}", scalars={"loss": "NaN"}) for i in range(MAX_REQUEST_RUNS + 1)]
    r = _post(app_client, frames)
    assert r.status_code == 422, r.text
    assert "distinct runs" in r.json()["message"]


def test_a_full_client_batch_of_default_history_is_accepted(app_client: TestClient) -> None:
    # The client's largest batch (max_batch 256) with the hooks' widest default interval
    # (a frame at least every 50 steps: 49 history steps a frame).
    frames = []
    for k in range(256):
        s = 50 * (k + 1)
        frames.append(_frame(seq=k, step=s, history={
            "steps": list(range(s - 49, s)), "scalars": {"loss": [1.0] * 49}}))
    assert _post(app_client, frames).status_code == 200


# --- 3. strict types ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [
    {"seq": True}, {"step": False}, {"rank": True},
    {"seq": "7"}, {"step": "8"}, {"rank": "2"}, {"time": "1.5"}, {"time": True},
])
def test_wrong_types_are_refused_not_coerced(app_client: TestClient,
                                              bad: dict[str, Any]) -> None:
    r = _post(app_client, [_frame(**bad)])
    assert r.status_code == 422, r.text
    assert next(iter(bad)) in r.json()["message"]
    assert runs(app_client) == []


def test_an_int_time_is_still_a_number(app_client: TestClient) -> None:
    r = _post(app_client, [_frame(time=int(time.time()), scalars={"loss": "NaN"})])
    assert r.status_code == 200, r.text


# --- 5. a run re-used for another model ----------------------------------------------------


def test_a_shape_change_says_why_and_what_to_do(app_client: TestClient) -> None:
    m = [[1.0] * 4 for _ in range(2)]
    assert _post(app_client, [_frame(heads={"attn.logit_max": m})]).status_code == 200
    r = _post(app_client, [_frame(seq=1, step=20, heads={"attn.logit_max": m + m})])
    assert r.status_code == 422 and r.json()["code"] == "shape-mismatch"
    msg = r.json()["message"]
    assert "2x4" in msg and "4x4" in msg
    assert "Nothing of this batch was stored" in msg
    assert "shape changed" in msg and "new run name" in msg


# --- 4. logitwatch replay on malformed files ------------------------------------------------


def _lines(frames: list[Any]) -> str:
    return "".join(json.dumps(f) + "\n" for f in frames)


def _replay(path: Path) -> Any:
    return CliRunner().invoke(main, ["replay", str(path)])


def _ok_frames(n: int) -> list[dict[str, Any]]:
    return [{"run": "a", "seq": i, "step": i, "time": 1.0, "scalars": {"loss": 2.0}}
            for i in range(n)]


def _clean(result: Any) -> str:
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exc_info
    assert "Traceback" not in result.output and "Aborted" not in result.output
    return str(result.output)


def test_replay_deeply_nested_json_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "deep.jsonl"
    p.write_text(_lines(_ok_frames(2)) + '{"run":"a","seq":2,"scalars":' + "[" * 100_000
                 + "\n")
    out = _clean(_replay(p))
    assert f"{p}:3" in out and "nested too deeply" in out


def test_replay_a_truncated_gzip_says_so(tmp_path: Path) -> None:
    p = tmp_path / "trunc.jsonl.gz"
    p.write_bytes(gzip.compress(_lines(_ok_frames(500)).encode())[:-40])
    out = _clean(_replay(p))
    assert "trunc.jsonl.gz" in out and "ends early" in out


def test_replay_binary_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bin.jsonl"
    p.write_bytes(_lines(_ok_frames(3)).encode() + b"\xff\xfe\x00garbage\n")
    out = _clean(_replay(p))
    assert f"{p}:4" in out and "UTF-8" in out


def test_replay_a_bad_value_names_its_line_and_field(tmp_path: Path) -> None:
    frames: list[Any] = _ok_frames(41)
    frames[40]["scalars"] = {"loss": "oops"}
    p = tmp_path / "bad.jsonl"
    p.write_text(_lines(frames))
    out = _clean(_replay(p))
    assert "line 41: scalars: loss" in out and "'oops'" in out
    assert "frames.8" not in out and "pydantic" not in out


def test_replay_a_huge_int_names_its_line_and_field(tmp_path: Path) -> None:
    frames: list[Any] = _ok_frames(3)
    frames[2]["history"] = {"steps": [1], "scalars": {"loss": [10**400]}}
    p = tmp_path / "huge.jsonl"
    p.write_text(_lines(frames))
    out = _clean(_replay(p))
    assert "line 3: history: scalars.loss.0" in out
    assert "int too large" not in out


def test_replay_a_number_of_thousands_of_digits_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "digits.jsonl"
    p.write_text(_lines(_ok_frames(2)) + '{"run":"a","seq":2,"step":2,"time":1.0,'
                 '"scalars":{"loss":' + "1" * 5000 + "}}\n")
    out = _clean(_replay(p))
    assert f"{p}:3" in out and "too many digits" in out


@pytest.mark.parametrize("query", ["/api/v1/runs?since=nan", "/api/v1/runs?until=inf",
                                   "/api/v1/runs/1/series?name=loss&start_time=nan",
                                   "/api/v1/runs/1/series?name=loss&end_time=-inf"])
def test_a_non_finite_time_in_a_query_is_named_as_such(app_client: TestClient,
                                                       query: str) -> None:
    """``since=nan`` is not "more than 10^12": the 422 says the time must be finite."""
    r = app_client.get(query)
    assert r.status_code == 422
    assert "finite" in r.json()["message"], r.json()
