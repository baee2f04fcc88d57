"""The whole API fuzzed from its own OpenAPI schema (schemathesis + Hypothesis).

Every operation gets generated requests, valid and invalid; none may answer 5xx, and every
4xx must be a ``{"code", "message"}`` body. The database is seeded with one run so that
run-scoped operations are reached past their 404 too. The live stream is left out: it never
ends by design (its inputs are the same path and query parameters, checked by the targeted
tests in test_security.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error

from logitwatch.server.app import create_app
from logitwatch.server.settings import Settings

GenerationMode = schemathesis.GenerationMode


@pytest.fixture
def app_db(tmp_path: Path) -> Iterator[Any]:
    """A collector on a seeded SQLite file, lifespan running (migrated, state ready)."""
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'fuzz.db'}",
                              rate_limit_per_second=0))
    with TestClient(app) as c:
        seed = {"run": "seed", "seq": 0, "step": 0, "time": 1.0,
                "scalars": {"loss": 1.0, "grad.norm": 0.5},
                "heads": {"attn.logit_max": [[1.0, 2.0], [3.0, 4.0]]}}
        assert c.post("/api/v1/ingest", json={"frames": [seed]}).status_code == 200
        yield app


def _aim_at_seed(drawn: tuple[Any, bool]) -> Any:
    """Half the valid cases name the seeded run, a real figure and a stored metric, so the
    fuzz gets past 404 into the queries and figure builders."""
    case, aim = drawn
    if aim and case.path_parameters and "run_id" in case.path_parameters:
        case.path_parameters["run_id"] = 1
        if "kind" in case.path_parameters:
            case.path_parameters["kind"] = "heatmap" if case.path_parameters["kind"] < "h" \
                else "loss"
        if case.query and "name" in case.query:
            case.query["name"] = "attn.logit_max" if "heatmap" in case.operation.path \
                else "loss"
    return case


def test_api_never_fails_and_explains_every_refusal(app_db: Any) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app_db).exclude(
        path_regex=r"/stream$"
    )
    labels = []
    for result in schema.get_all_operations():
        op = result.ok()
        labels.append(op.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            strategy = op.as_strategy(generation_mode=mode)
            if mode == GenerationMode.POSITIVE:
                strategy = st.tuples(strategy, st.booleans()).map(_aim_at_seed)

            @given(case=strategy)
            @settings(max_examples=30, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case: Any) -> None:
                response = case.call_and_validate(checks=[not_a_server_error])
                if 400 <= response.status_code < 500:
                    body = response.json()
                    assert isinstance(body, dict) and {"code", "message"} <= set(body), (
                        case.as_curl_command(), body)
                    assert isinstance(body["code"], str) and body["message"]

            try:
                check()
            except Unsatisfiable:
                # An operation without inputs (GET /runs) has no invalid form to generate.
                assert mode == GenerationMode.NEGATIVE, op.label
    assert "POST /api/v1/ingest" in labels and len(labels) >= 10, labels


def test_a_figure_kind_too_long_is_refused_not_a_server_error(app_db: Any) -> None:
    """Found by the fuzz above: a ``kind`` past FigureQuery's 32 characters was refused by
    the model inside the handler (a 500); the path parameter now says the limit (422)."""
    with TestClient(app_db) as c:
        r = c.get("/api/v1/runs/1/figures/" + "q" * 40)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "invalid-request" and "path.kind" in r.json()["message"]
        assert c.get("/api/v1/runs/1/figures/loss").status_code == 200
