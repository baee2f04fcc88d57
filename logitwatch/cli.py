"""The ``logitwatch`` command line: ``serve`` the collector, ``push`` a spool, run the
``demo``, print a run's ``alerts``; ``replay`` recorded frames is in
:mod:`logitwatch._cli_replay` (its progress lines, and ``runs export``'s, in
:mod:`logitwatch._cli_progress`), the store's administration (``token``, ``runs``,
``retention``) in :mod:`logitwatch._cli_admin`, what every command that opens the store
shares in :mod:`logitwatch._cli_store`."""

from __future__ import annotations

import os
import sys

import click

from logitwatch._cli_admin import retention, runs, token
from logitwatch._cli_replay import replay
from logitwatch._cli_store import DB_OPTION as _DB
from logitwatch._cli_store import find_run as _find_run
from logitwatch._cli_store import need_server as _need_server
from logitwatch._cli_store import resolve_db, show_store
from logitwatch._cli_store import store as _store
from logitwatch._cli_store import url_host as _url_host

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logitwatch")
def main() -> None:
    """logitwatch: early warning for transformer training runs."""


for _admin in (token, runs, retention):  # the store's administration: logitwatch/_cli_admin.py
    main.add_command(_admin)
main.add_command(replay)  # logitwatch/_cli_replay.py


# The options that are settings (--db, --host, --port, --webhook, --insecure-no-auth) have
# no default of their own: one not given leaves its setting to its LOGITWATCH_* variable
# (read by Settings), else to Settings' default, which its help names.
@main.command()
@click.option("--db", "db_url", default=None, metavar="URL",
              help="Database URL (default: $LOGITWATCH_DB_URL, else the SQLite file "
              "logitwatch.db in $LOGITWATCH_HOME, else in ~/.local/share/logitwatch). "
              "PostgreSQL: postgresql+psycopg://user:pw@host:5432/db")
@click.option("--host", default=None,
              help="Interface to bind (default: $LOGITWATCH_HOST, else 127.0.0.1).")
@click.option("--port", default=None, type=click.IntRange(0, 65535),
              help="TCP port to listen on, 0: any free port (default: $LOGITWATCH_PORT, "
              "else 8000).")
@click.option("--webhook", "webhook_url", default=None, metavar="URL",
              help="POST every alert as JSON to this URL (Slack-compatible 'text' field; "
              "default: $LOGITWATCH_WEBHOOK_URL, else none).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="Level of the collector's log on stderr.")
@click.option("--insecure-no-auth", is_flag=True, default=False,
              help="INSECURE: serve on a non-loopback interface without API tokens; anyone "
              "who reaches the port reads and writes every run. Trusted networks only "
              "(also turned on by LOGITWATCH_INSECURE_NO_AUTH=1).")
def serve(db_url: str | None, host: str | None, port: int | None, webhook_url: str | None,
          log_level: str, insecure_no_auth: bool) -> None:
    """Run the collector and dashboard (migrates the database schema at start).

    Bound to 127.0.0.1 without tokens, it serves one user with no login. Another interface
    needs API tokens first (`logitwatch token create`).
    """
    _need_server()
    from logitwatch.server.app import create_app
    from logitwatch.server.auth import bind_refusal
    from logitwatch.server.settings import Settings

    # only what was given on the command line: the rest comes from LOGITWATCH_* or defaults
    kwargs: dict[str, object] = {}
    if host is not None:
        kwargs["host"] = host
    if port is not None:
        kwargs["port"] = port
    if db_url:
        kwargs["db_url"] = db_url
    if webhook_url:
        kwargs["webhook_url"] = webhook_url
    if insecure_no_auth:
        kwargs["insecure_no_auth"] = True
    try:
        settings = Settings(**kwargs)  # type: ignore[arg-type]
    except ValueError as e:
        from logitwatch._cli_store import settings_error

        raise click.ClickException(settings_error(e)) from e
    _check_rules(settings)
    _warn_unknown_env()
    with _store(settings.db_url) as s:
        from logitwatch.server.store.tokens import count_tokens

        tokens = count_tokens(s)
        active = count_tokens(s, active_only=True)
    refusal = bind_refusal(settings, tokens, db_option=f"--db '{settings.db_url}'"
                           if db_url else "")
    if refusal is not None:
        raise click.ClickException(refusal)
    from logitwatch.server.serving import PortInUse, check_port
    from logitwatch.server.serving import serve as run_guarded

    host, port = settings.host, settings.port  # the option, else LOGITWATCH_*, else default
    try:  # before the banner: a port in use fails here, not after "startup complete"
        check_port(host, port)
    except PortInUse as e:
        raise click.ClickException(str(e)) from e
    if tokens == 0 and settings.insecure_no_auth:  # --insecure-no-auth or its variable
        click.secho(f"WARNING: serving on {host} WITHOUT AUTHENTICATION: anyone who can reach "
                    "this port can read and write every run.", fg="red", err=True)
    if tokens:
        mode = f"{active} API token(s) active"
    elif settings.require_tokens:
        mode = "tokens required, none yet: `logitwatch token create ...`"
    else:
        mode = "open mode: no API tokens"
    where = (f"http://{_url_host(host)}:{port}" if port else
             f"{_url_host(host)}, on the port the server log below names")
    click.echo(f"logitwatch collector on {where}  ({mode})")
    run_guarded(create_app(settings), settings, log_level=log_level)



#: ``LOGITWATCH_*`` variables that are neither a collector setting nor a client field
_OTHER_ENV = {"HOME", "TOKEN", "ALERT_RULES", "TORCH_INDEX", "TEST_PG_URL", "REQUIRE_PG",
              "REQUIRE_BROWSER"}


def _warn_unknown_env() -> None:
    """Say which ``LOGITWATCH_*`` variables nothing reads (a misspelt
    ``LOGITWATCH_REQUIRE_TOKEN`` would leave the collector open without a word), with the
    name meant when one is close."""
    import difflib
    from dataclasses import fields

    from logitwatch.client import ClientConfig
    from logitwatch.server.settings import Settings

    known = {n.upper() for n in Settings.model_fields} | {
        f.name.upper() for f in fields(ClientConfig)} | _OTHER_ENV
    for var in sorted(os.environ):
        name = var.removeprefix("LOGITWATCH_")
        if var.startswith("LOGITWATCH_") and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean LOGITWATCH_{close[0]}?)" if close else ""
            click.secho(f"WARNING: {var} is not a logitwatch setting and is ignored{hint}",
                        fg="yellow", err=True)


def _check_rules(settings: object) -> None:
    """Load the alert rules the collector will start from (``LOGITWATCH_ALERT_RULES``) before
    anything is printed: a bad file is a one-line error, not a traceback after the banner."""
    from logitwatch.server.alerts.config import configured_rules, rules_file
    from logitwatch.server.alerts.rules import RuleError

    try:
        configured_rules(settings)
    except RuleError as e:
        raise click.ClickException(f"LOGITWATCH_ALERT_RULES ({rules_file(None)}): {e}"
                                   ) from e


@main.command()
@click.argument("spool", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--url", default=None, metavar="URL",
              help="Collector base URL, e.g. http://127.0.0.1:8000 (default: the one the "
              "job was sending to).")
@click.option("--token", default=None, envvar="LOGITWATCH_TOKEN", show_envvar=True,
              help="Ingest token of the run's project, if the collector requires tokens.")
@click.option("--batch", "max_batch", default=256, show_default=True,
              type=click.IntRange(1, 10_000), help="Frames per request.")
@click.option("--attempts", default=5, show_default=True, type=click.IntRange(1, 100),
              help="Tries per batch while the collector does not answer or fails (with "
              "backoff), before giving up; a wrong URL or token stops at once.")
def push(spool: str | None, url: str | None, token: str | None, max_batch: int,
         attempts: int) -> None:
    """Send the frames a training job left in its disk spool (SPOOL: the directory named
    in the job's shutdown message, or any spool directory above it; default: this user's
    whole spool, $LOGITWATCH_HOME/spool when that is set, else ~/.cache/logitwatch/spool),
    then delete them.

    Safe to run again after an interruption: the collector ignores frames it already has.
    Directories of jobs that are still running are skipped (they send their own).
    """
    from pathlib import Path

    from logitwatch.client import ClientConfig
    from logitwatch.client._push import PushError, push_spool, spool_frames
    from logitwatch.client._url import normalize_url

    if url is not None:
        try:
            base = normalize_url(url, warn=False)
        except ValueError as e:
            raise click.ClickException(str(e)) from e
        if base != url.strip().rstrip("/"):
            click.echo(f"--url {url} taken as {base} (the collector's base URL)", err=True)
        url = base
    if spool is None:
        try:
            spool = ClientConfig.from_env().spool_root()
        except ValueError as e:
            raise click.ClickException(str(e)) from e
    click.echo(f"spool: {spool}", err=True)
    if not Path(spool).is_dir():
        click.echo(f"nothing to push under {spool}")
        return
    total, ready, locked = spool_frames(Path(spool))
    for d in locked:
        click.echo(f"skipped {d}: in use by its job, still running (it sends it itself), or "
                   "by another push", err=True)
    if not ready:
        click.echo(f"nothing to push under {spool}")
        return
    click.echo(f"pushing {total} frame(s) from {len(ready)} spool director"
               f"{'y' if len(ready) == 1 else 'ies'}" + (f" to {url}" if url else ""))
    try:
        if sys.stderr.isatty():  # a bar only where one is drawn (else click prints its label)
            with click.progressbar(length=total, label="frames", file=sys.stderr) as bar:
                result = push_spool(spool, url=url, token=token, max_batch=max_batch,
                                    attempts=attempts, progress=bar.update)
        else:
            result = push_spool(spool, url=url, token=token, max_batch=max_batch,
                                attempts=attempts)
    except PushError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"sent {result.sent} frame(s): {result.accepted} stored, {result.duplicates} "
               "already there")
    for d in sorted(set(result.skipped) - {str(x) for x in locked}):  # taken since listed
        click.echo(f"skipped {d}: another push (or its job) took it meanwhile", err=True)
    for line in result.damaged:
        click.echo(f"damaged segment set aside: {line}", err=True)
    if result.rejected or result.damaged:
        raise click.ClickException(
            f"{result.rejected} frame(s) refused by the collector as invalid (kept as "
            f"*.rejected) and {len(result.damaged)} damaged segment file(s) (kept as "
            f"*.corrupt, about {result.corrupt} frame(s) as far as their headers can be "
            "believed)"
        )


@main.command()
@click.option("--port", default=None, type=click.IntRange(0, 65535),
              help="Collector port, 0: any free port (default: $LOGITWATCH_PORT, else 8000, "
              "as `logitwatch serve`).")
@click.option("--db", "db_url", default=None, metavar="URL",
              help="Database of the demo collector (default: the store `logitwatch serve`, "
              "`runs` and `alerts` use: $LOGITWATCH_DB_URL, else logitwatch.db in "
              "$LOGITWATCH_HOME, else in ~/.local/share/logitwatch).")
@click.option("--steps", default=None, type=click.IntRange(1),
              help="Steps per job (default: each setting's own).")
@click.option("--setting", "settings", multiple=True,
              type=click.Choice(["unstable", "fused", "healthy"]),
              help="Which jobs (default all three; repeatable): unstable diverges, fused is "
              "the same run with fuses on auto (QK-clip at tau 50, LR backoff), "
              "healthy its twin with QK-norm.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Random seed of the jobs (model initialisation and batches).")
@click.option("--serve/--exit", "keep_serving", default=True, show_default=True,
              help="Keep the dashboard up after the jobs end (Ctrl-C to stop).")
def demo(port: int | None, db_url: str | None, steps: int | None, settings: tuple[str, ...],
         seed: int, keep_serving: bool) -> None:
    """Start a collector on SQLite, train three tiny transformers that stream to it (one
    setting drives attention logits up until loss diverges, one is the same run with fuses
    on auto that train it through, one stays healthy), and report when the first alert
    fired, when the loss diverged and what the fuses did. The runs stay in the store:
    `logitwatch runs list` and `logitwatch serve` show them afterwards."""
    from logitwatch.demo.runner import run_demo
    from logitwatch.server.serving import PortInUse, check_port
    from logitwatch.server.settings import Settings

    url = resolve_db(db_url)
    click.echo(f"store: {show_store(url)}", err=True)
    try:
        settings_now = Settings(db_url=url)
    except ValueError as e:  # a bad LOGITWATCH_* (the port's, say): one line, as serve
        from logitwatch._cli_store import settings_error

        raise click.ClickException(settings_error(e)) from e
    _check_rules(settings_now)
    port = settings_now.port if port is None else port
    try:
        check_port("127.0.0.1", port)
    except PortInUse as e:
        raise click.ClickException(str(e)) from e
    with _store(url, announce=False):  # migrated here, where the CLI says so, not silently
        pass
    code = run_demo(port=port, db_url=url, steps=steps, settings=list(settings) or None,
                    seed=seed, keep_serving=keep_serving, echo=click.echo)
    sys.exit(code)


def _some(names: list[str], most: int = 5) -> str:
    """``names`` joined, the first ``most`` of them when there are more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _nats(x: object) -> str:
    return f"{x:.3f} nat" if isinstance(x, (int, float)) else "some nats"


def _print_alerts(alerts: list) -> None:  # type: ignore[type-arg]
    if not alerts:
        click.echo("no alerts")
        return
    for a in alerts:
        flag = f" [{a.suppressed}]" if a.suppressed else ""
        if a.paged_step is not None and a.paged_step != a.fired_step:
            flag += f" (paged at step {a.paged_step})"
        click.echo(f"step {a.fired_step:>7} {a.severity:<8} {a.state:<8} {a.rule}{flag}: "
                   f"{a.message}")


@main.command("alerts")
@click.option("--run", "run", required=True, help="Run id or name.")
@click.option("--project", default=None, help="Project of the run (when names repeat).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON (an array, one object per alert).")
@_DB
def alerts_cmd(run: str, project: str | None, as_json: bool, db_url: str | None) -> None:
    """Print the alerts a run fired, with their steps (read from the database)."""
    import json

    with _store(db_url, create=False) as s:
        from logitwatch.server.store.alerts import list_alerts

        alerts = list_alerts(s, _find_run(s, run, project))
    if as_json:
        click.echo(json.dumps([a.model_dump(mode="json") for a in alerts], indent=1))
    else:
        _print_alerts(alerts)


if __name__ == "__main__":  # pragma: no cover
    main()
