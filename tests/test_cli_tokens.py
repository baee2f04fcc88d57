"""`logitwatch token create|list|revoke` and the safe defaults of `logitwatch serve`."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from logitwatch.cli import main
from logitwatch.server.app import create_app
from logitwatch.server.settings import Settings


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_create_list_revoke(sqlite_url: str) -> None:
    r = cli("token", "create", "--project", "alpha", "--scope", "read", "--name", "laptop",
            "--db", sqlite_url)
    assert r.exit_code == 0, r.output
    secret = r.stdout.strip().splitlines()[0]
    assert secret.startswith("lw_") and "shown only now" in r.stderr
    assert "Authorization: Bearer" in r.stderr

    listed = cli("token", "list", "--db", sqlite_url).stdout
    assert "alpha" in listed and "laptop" in listed and "active" in listed
    assert secret[:10] in listed and secret not in listed  # a prefix, never the secret

    with TestClient(create_app(Settings(db_url=sqlite_url, auth_cache_seconds=0))) as c:
        headers = {"Authorization": f"Bearer {secret}"}
        assert c.get("/api/v1/runs", headers=headers).status_code == 200
        assert cli("token", "revoke", "1", "--db", sqlite_url).exit_code == 0
        assert c.get("/api/v1/runs", headers=headers).status_code == 401
    assert "revoked" in cli("token", "list", "--db", sqlite_url).stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--project", "a b", "--scope", "read"], "project must be"),
        (["--project", "alpha", "--scope", "admin"], "Invalid value for '--scope'"),
        (["--project", "foo\n", "--scope", "read"], "project must be"),
    ],
)
def test_create_refuses_bad_arguments(sqlite_url: str, args: list[str], message: str) -> None:
    r = CliRunner().invoke(main, ["token", "create", *args, "--db", sqlite_url])
    assert r.exit_code != 0 and message in r.output


def test_revoke_unknown_token(sqlite_url: str) -> None:
    # no store there: said, and none is created
    r = CliRunner().invoke(main, ["token", "revoke", "42", "--db", sqlite_url])
    assert r.exit_code == 1 and "no store at" in r.output, r.output
    r = CliRunner().invoke(main, ["token", "create", "--project", "p", "--scope", "read",
                                  "--db", sqlite_url])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["token", "revoke", "42", "--db", sqlite_url])
    assert r.exit_code == 1 and "no token with id 42" in r.output, r.output
    # an id past what a database integer holds: a usage error, not a traceback
    r = CliRunner().invoke(main, ["token", "revoke", "9" * 20, "--db", sqlite_url])
    assert r.exit_code == 2 and "Invalid value for 'TOKEN_ID'" in r.output, r.output


def test_serve_on_all_interfaces_without_tokens_is_refused(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(kw))
    # --port 0: these runs never bind (uvicorn.run is replaced), so the port-in-use check
    # must not look at 8000, which another process may hold
    r = CliRunner().invoke(main, ["serve", "--port", "0", "--host", "0.0.0.0",
                                  "--db", sqlite_url])
    assert r.exit_code == 1 and not started
    assert "refusing to serve on 0.0.0.0 without API tokens" in r.output
    assert f"logitwatch token create --project default --scope ingest --db '{sqlite_url}'" in (
        r.output)

    r = CliRunner().invoke(main, ["serve", "--port", "0", "--host", "0.0.0.0",
                                  "--db", sqlite_url, "--insecure-no-auth"])
    assert r.exit_code == 0 and "WITHOUT AUTHENTICATION" in r.stderr
    assert started[-1]["host"] == "0.0.0.0"

    cli("token", "create", "--project", "default", "--scope", "ingest", "--db", sqlite_url)
    r = CliRunner().invoke(main, ["serve", "--port", "0", "--host", "0.0.0.0",
                                  "--db", sqlite_url])
    assert r.exit_code == 0 and "1 API token(s) active" in r.output

    r = CliRunner().invoke(main, ["serve", "--port", "0", "--db", sqlite_url])  # loopback: fine
    assert r.exit_code == 0 and started[-1]["host"] == "127.0.0.1"
