"""The ``logitwatch`` command line: ``serve`` the collector, run the ``demo``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logitwatch")
def main() -> None:
    """logitwatch: early warning for transformer training runs."""


@main.command()
@click.option("--db", "db_url", default=None, metavar="URL",
              help="Database URL. Default: sqlite:///.logitwatch/logitwatch.db. "
              "PostgreSQL: postgresql+psycopg://user:pw@host:5432/db")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--webhook", "webhook_url", default=None, metavar="URL",
              help="POST every alert as JSON to this URL (Slack-compatible 'text' field).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--insecure-no-auth", is_flag=True, default=False,
              help="INSECURE: serve on a non-loopback interface without API tokens; anyone "
              "who reaches the port reads and writes every run. Trusted networks only.")
def serve(db_url: str | None, host: str, port: int, webhook_url: str | None,
          log_level: str, insecure_no_auth: bool) -> None:
    """Run the collector and dashboard (migrates the database schema at start).

    Bound to 127.0.0.1 without tokens, it serves one user with no login. Another interface
    needs API tokens first (`logitwatch token create`).
    """
    _need_server()
    import uvicorn

    from logitwatch.server.app import create_app
    from logitwatch.server.auth import bind_refusal
    from logitwatch.server.settings import Settings

    kwargs: dict[str, object] = {"host": host, "port": port}
    if db_url:
        kwargs["db_url"] = db_url
    if webhook_url:
        kwargs["webhook_url"] = webhook_url
    if insecure_no_auth:
        kwargs["insecure_no_auth"] = True
    try:
        settings = Settings(**kwargs)  # type: ignore[arg-type]
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    with _store(settings.db_url) as s:
        from logitwatch.server.store.tokens import count_tokens

        tokens = count_tokens(s)
        active = count_tokens(s, active_only=True)
    refusal = bind_refusal(settings, tokens, db_option=f"--db '{settings.db_url}'"
                           if db_url else "")
    if refusal is not None:
        raise click.ClickException(refusal)
    if tokens == 0 and insecure_no_auth:
        click.secho(f"WARNING: serving on {host} WITHOUT AUTHENTICATION: anyone who can reach "
                    "this port can read and write every run.", fg="red", err=True)
    mode = f"{active} API token(s) active" if tokens else "open mode: no API tokens"
    click.echo(f"logitwatch collector on http://{host}:{port}  (database: {settings.db_url}; "
               f"{mode})")
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level)


def _need_server() -> None:
    try:
        import fastapi  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the install
        raise click.ClickException(
            f"the collector needs the server extra ({e.name} is missing): "
            "pip install 'logitwatch[server]'"
        ) from e


@contextmanager
def _store(db_url: str | None) -> Iterator[Session]:
    """A migrated database's session, committed on success."""
    _need_server()
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import make_engine, migrate, session_scope
    from logitwatch.server.errors import ApiError
    from logitwatch.server.settings import Settings

    try:
        url = Settings(db_url=db_url).db_url if db_url else Settings().db_url
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    engine = make_engine(url)
    try:
        migrate(engine)
        with session_scope(sessionmaker(engine, expire_on_commit=False)) as s:
            yield s
    except ApiError as e:
        raise click.ClickException(e.message) from e
    finally:
        engine.dispose()


_DB = click.option("--db", "db_url", default=None, metavar="URL",
                   help="Database URL (default: $LOGITWATCH_DB_URL, else "
                   "sqlite:///.logitwatch/logitwatch.db).")


@main.group()
def token() -> None:
    """Create, list and revoke API tokens (per project; scope ingest or read)."""


@token.command("create")
@click.option("--project", required=True, help="The project the token is for.")
@click.option("--scope", required=True, type=click.Choice(["ingest", "read"]),
              help="ingest: training jobs send frames; read: the dashboard and the API.")
@click.option("--name", default="", help="A label to recognise the token by.")
@_DB
def token_create(project: str, scope: str, name: str, db_url: str | None) -> None:
    """Create a token; it is printed once and cannot be shown again."""
    with _store(db_url) as s:
        from logitwatch.server.store.tokens import create_token

        new = create_token(s, project=project, scope=scope, name=name)
    click.echo(new.secret)
    use = (
        f"  training job: logitwatch.attach(..., project={project!r}, token=<token>) or set "
        "LOGITWATCH_TOKEN=<token>\n"
        "  (the client sends it as 'Authorization: Bearer <token>')"
        if scope == "ingest" else
        "  dashboard: open it and paste the token in the login form\n"
        "  API: curl -H 'Authorization: Bearer <token>' http://HOST:8000/api/v1/runs"
    )
    click.echo(
        f"\ntoken {new.info.id} ({new.info.name}): {scope} for project {project!r}. "
        "It is shown only now: store it in a secret manager.\n" + use, err=True,
    )


@token.command("list")
@click.option("--project", default=None, help="Only this project's tokens.")
@_DB
def token_list(project: str | None, db_url: str | None) -> None:
    """List tokens (prefix only: the secrets are not stored)."""
    import time

    with _store(db_url) as s:
        from logitwatch.server.store.tokens import list_tokens

        tokens = list_tokens(s, project=project)
    if not tokens:
        click.echo("no tokens (open mode on 127.0.0.1)")
        return

    def when(t: float | None) -> str:
        return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))

    click.echo(f"{'id':>4}  {'project':<20} {'scope':<7} {'prefix':<11} {'state':<8} "
               f"{'created':<16}  {'last used':<16}  name")
    for t in tokens:
        state = "active" if t.active else "revoked"
        click.echo(f"{t.id:>4}  {t.project:<20} {t.scope:<7} {t.prefix + '…':<11} {state:<8} "
                   f"{when(t.created_at):<16}  {when(t.last_used_at):<16}  {t.name}")


@token.command("revoke")
@click.argument("token_id", type=int)
@_DB
def token_revoke(token_id: int, db_url: str | None) -> None:
    """Revoke token TOKEN_ID (see `token list`); a running collector stops accepting it
    within its auth cache time (2 s by default)."""
    with _store(db_url) as s:
        from logitwatch.server.store.tokens import revoke_token

        info = revoke_token(s, token_id=token_id)
    click.echo(f"revoked token {info.id} ({info.name}, {info.scope} for {info.project!r})")


@main.command()
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Collector port (0: any free port).")
@click.option("--db", "db_url", default="sqlite:///.logitwatch/demo.db", show_default=True,
              metavar="URL", help="Database of the demo collector.")
@click.option("--steps", default=None, type=click.IntRange(1),
              help="Steps per job (default: each setting's own).")
@click.option("--setting", "settings", multiple=True,
              type=click.Choice(["unstable", "healthy"]), help="Which jobs (default both).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--serve/--exit", "keep_serving", default=True, show_default=True,
              help="Keep the dashboard up after the jobs end (Ctrl-C to stop).")
def demo(port: int, db_url: str, steps: int | None, settings: tuple[str, ...], seed: int,
         keep_serving: bool) -> None:
    """Start a collector on SQLite, train two tiny transformers that stream to it (one
    setting drives attention logits up until loss diverges, one stays healthy), and report
    when the first alert fired and when the loss diverged."""
    from logitwatch.demo.runner import run_demo

    code = run_demo(port=port, db_url=db_url, steps=steps, settings=list(settings) or None,
                    seed=seed, keep_serving=keep_serving, echo=click.echo)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
