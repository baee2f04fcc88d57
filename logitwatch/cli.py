"""The ``logitwatch`` command line: ``serve`` the collector, run the ``demo``."""

from __future__ import annotations

import sys

import click

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
def serve(db_url: str | None, host: str, port: int, webhook_url: str | None,
          log_level: str) -> None:
    """Run the collector and dashboard (migrates the database schema at start)."""
    try:
        import uvicorn

        from logitwatch.server.app import create_app
        from logitwatch.server.settings import Settings
    except ImportError as e:  # pragma: no cover - depends on the install
        raise click.ClickException(
            f"the collector needs the server extra ({e.name} is missing): "
            "pip install 'logitwatch[server]'"
        ) from e
    kwargs: dict[str, object] = {"host": host, "port": port}
    if db_url:
        kwargs["db_url"] = db_url
    if webhook_url:
        kwargs["webhook_url"] = webhook_url
    try:
        settings = Settings(**kwargs)  # type: ignore[arg-type]
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"logitwatch collector on http://{host}:{port}  (database: {settings.db_url})")
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level)


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
