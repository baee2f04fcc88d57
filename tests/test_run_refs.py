"""Runs addressed by id or by name in the API (``/runs/{run}``, ``?project=``), and each
run's real ``last_frame_id`` in ``GET /runs``: a real collector (uvicorn on loopback) on a
real SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from logitwatch.demo.runner import Collector


@pytest.fixture
def col(tmp_path: Path) -> Iterator[Collector]:
    with Collector(f"sqlite:///{tmp_path / 'refs.db'}") as c:
        yield c


def ingest(url: str, frames: list[dict[str, Any]]) -> None:
    r = httpx.post(f"{url}/api/v1/ingest", json={"frames": frames}, timeout=10)
    assert r.status_code == 200, r.text


def frame(run: str, seq: int, project: str = "default") -> dict[str, Any]:
    return {"run": run, "project": project, "seq": seq, "step": seq, "time": 1000.0 + seq,
            "scalars": {"loss": 2.0}}


def get(url: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}/api/v1{path}", params=params, timeout=10)


def test_a_run_is_reached_by_name_as_by_id(col: Collector) -> None:
    ingest(col.url, [frame("alpha", s) for s in range(3)])
    (run,) = get(col.url, "/runs").json()
    by_id = get(col.url, f"/runs/{run['id']}").json()
    by_name = get(col.url, "/runs/alpha").json()
    assert by_name == by_id and by_name["name"] == "alpha"
    assert get(col.url, "/runs/alpha/series", name="loss").json()["steps"] == [0, 1, 2]
    assert get(col.url, "/runs/alpha/metrics").status_code == 200
    assert get(col.url, "/runs/alpha/alerts").json() == []
    assert get(col.url, "/runs/alpha", project="default").json()["id"] == run["id"]

    missing = get(col.url, "/runs/nope")
    assert missing.status_code == 404 and missing.json()["code"] == "run-not-found"
    assert "no run named 'nope'" in missing.json()["message"]
    elsewhere = get(col.url, "/runs/alpha", project="other")
    assert elsewhere.status_code == 404 and "in project 'other'" in elsewhere.json()["message"]


def test_a_name_in_two_projects_needs_the_project(col: Collector) -> None:
    ingest(col.url, [frame("shared", 1, "p1"), frame("shared", 1, "p2")])
    r = get(col.url, "/runs/shared")
    assert r.status_code == 409 and r.json()["code"] == "run-ambiguous"
    assert "p1, p2" in r.json()["message"] and "?project=" in r.json()["message"]
    p2 = get(col.url, "/runs/shared", project="p2").json()
    assert p2["project"] == "p2" and p2["name"] == "shared"


def test_digits_are_always_an_id(col: Collector) -> None:
    """A run named "7" (id 1) is not /runs/7: it is reached by its id, found by name."""
    ingest(col.url, [frame("7", 1)])
    (run,) = get(col.url, "/runs").json()
    assert run["id"] == 1 and run["name"] == "7"
    r = get(col.url, "/runs/7")
    assert r.status_code == 404 and r.json()["message"] == "no run with id 7"
    assert [x["id"] for x in get(col.url, "/runs", name="7").json()] == [1]
    assert get(col.url, "/runs/1").json()["name"] == "7"
    r = get(col.url, "/runs/99999999999999999999")
    assert r.status_code == 422 and "run_id" in r.json()["message"]


def test_delete_by_name_with_confirmation(col: Collector) -> None:
    ingest(col.url, [frame("gone", 1), frame("kept", 1)])
    url = f"{col.url}/api/v1/runs/gone"
    assert httpx.delete(url, params={"confirm": "kept"}, timeout=10).status_code == 422
    r = httpx.delete(url, params={"confirm": "gone"}, timeout=10)
    assert r.status_code == 200 and r.json()["name"] == "gone"
    assert [x["name"] for x in get(col.url, "/runs").json()] == ["kept"]


def test_runs_list_gives_each_runs_last_frame_id(col: Collector) -> None:
    """``last_frame_id`` in the list is the run's newest frame id, as in GET /runs/{run}
    (it was 0 for every run)."""
    ingest(col.url, [frame("a", s) for s in range(4)])
    ingest(col.url, [frame("b", s) for s in range(2)])
    ingest(col.url, [frame("a", 10)])
    listed = {r["name"]: r["last_frame_id"] for r in get(col.url, "/runs").json()}
    one = {n: get(col.url, f"/runs/{n}").json()["last_frame_id"] for n in ("a", "b")}
    assert listed == one
    assert listed["a"] > listed["b"] > 0
