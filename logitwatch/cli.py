"""The ``logitwatch`` command line: ``serve`` the collector, ``push`` a spool, run the
``demo``."""

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
              help="Database URL (default: $LOGITWATCH_DB_URL, else the SQLite file "
              "logitwatch.db in $LOGITWATCH_HOME, else in ~/.local/share/logitwatch). "
              "PostgreSQL: postgresql+psycopg://user:pw@host:5432/db")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port to listen on (0: any free port).")
@click.option("--webhook", "webhook_url", default=None, metavar="URL",
              help="POST every alert as JSON to this URL (Slack-compatible 'text' field).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="Level of the collector's log on stderr.")
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
    from logitwatch.server.serving import PortInUse, check_port
    from logitwatch.server.serving import serve as run_guarded

    try:  # before the banner: a port in use fails here, not after "startup complete"
        check_port(host, port)
    except PortInUse as e:
        raise click.ClickException(str(e)) from e
    if tokens == 0 and insecure_no_auth:
        click.secho(f"WARNING: serving on {host} WITHOUT AUTHENTICATION: anyone who can reach "
                    "this port can read and write every run.", fg="red", err=True)
    mode = f"{active} API token(s) active" if tokens else "open mode: no API tokens"
    click.echo(f"logitwatch collector on http://{_url_host(host)}:{port}  ({mode})")
    run_guarded(create_app(settings), settings, log_level=log_level)


def _url_host(host: str) -> str:
    """``host`` as it goes into a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def show_store(url: str) -> str:
    """A database URL to print: the password of a PostgreSQL URL hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - printing must not fail; the URL is checked elsewhere
        return url


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


class NoStore(click.ClickException):
    """A command that only reads found no store where it looked."""


def resolve_db(db_url: str | None) -> str:
    """The store a command uses: ``--db``, else ``$LOGITWATCH_DB_URL``, else the SQLite
    file in logitwatch's home (:func:`logitwatch.paths.default_db_url`)."""
    _need_server()
    from logitwatch.server.settings import Settings

    try:
        return Settings(db_url=db_url).db_url if db_url else Settings().db_url
    except ValueError as e:
        raise click.ClickException(str(e)) from e


@contextmanager
def _store(db_url: str | None, *, announce: bool = True,
           create: bool = True) -> Iterator[Session]:
    """A migrated database's session, committed on success. ``announce``: say on stderr
    which store this is (every command that reads or writes one does, once). ``create``
    False: a SQLite store that does not exist yet is an error, not a new empty file."""
    _need_server()
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import make_engine, migrate, session_scope
    from logitwatch.server.errors import ApiError

    url = resolve_db(db_url)
    if announce:
        click.echo(f"store: {show_store(url)}", err=True)
    if not create and not _store_exists(url):
        raise NoStore(f"no store at {show_store(url)} yet: nothing was recorded there "
                      "(`logitwatch serve` and `logitwatch demo` create it; --db or "
                      "LOGITWATCH_HOME name another)")
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
                   help="Database URL (default: $LOGITWATCH_DB_URL, else the SQLite file "
                   "logitwatch.db in $LOGITWATCH_HOME, else in ~/.local/share/logitwatch: "
                   "the store `logitwatch serve` and the demo use).")


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


@main.group()
def runs() -> None:
    """List, tag and delete runs (directly in the database: no collector needed)."""


def _find_run(s: Session, run: str, project: str | None) -> int:
    """A run id from an id or a name (``--project`` disambiguates names)."""
    from sqlalchemy import select

    from logitwatch.server.db.models import Run

    if run.isdigit():
        return int(run)
    q = select(Run.id, Run.project).where(Run.name == run)
    if project is not None:
        q = q.where(Run.project == project)
    rows = s.execute(q).all()
    if not rows:
        raise click.ClickException(f"no run named {run!r}" + (
            f" in project {project!r}" if project else "") + " (see `logitwatch runs list`)")
    if len(rows) > 1:
        raise click.ClickException(
            f"{len(rows)} runs are named {run!r} (projects "
            f"{', '.join(sorted(r.project for r in rows))}): pass --project or the run id")
    return int(rows[0].id)


@runs.command("list")
@click.option("--project", default=None, help="Only this project's runs.")
@click.option("--tag", default=None, help="Only runs with this tag.")
@click.option("--status", default=None,
              type=click.Choice(["running", "finished", "stopped", "diverged"]),
              help="Only runs with this status.")
@_DB
def runs_list(project: str | None, tag: str | None, status: str | None,
              db_url: str | None) -> None:
    """List runs, most recently active first, with their status: running, finished (the
    job said it ended), stopped (no data: hung or crashed), diverged."""
    try:
        with _store(db_url, create=False) as s:
            from logitwatch.server.store.queries import list_runs

            found = list_runs(s, project=project, tag=tag,
                              status=status)  # type: ignore[arg-type]
    except NoStore as e:
        click.echo(f"no runs: {e.message}")
        return
    if not found:
        click.echo("no runs")
        return
    click.echo(f"{'id':>5}  {'project':<20} {'name':<32} {'status':<9} {'last step':>10} "
               f"{'alerts':>6}  tags")
    for r in found:
        click.echo(f"{r.id:>5}  {r.project:<20} {r.name:<32} {r.status:<9} "
                   f"{r.last_step or 0:>10} {r.open_alerts:>6}  {','.join(r.tags)}")


@runs.command("delete")
@click.argument("run")
@click.option("--project", default=None, help="The run's project, when names repeat.")
@click.option("--yes", is_flag=True, default=False, help="Do not ask for confirmation.")
@_DB
def runs_delete(run: str, project: str | None, yes: bool, db_url: str | None) -> None:
    """Delete RUN (an id or a name) with all its frames, values, alerts and tags."""
    with _store(db_url, create=False) as s:
        from logitwatch.server.store.queries import delete_run, get_run

        rid = _find_run(s, run, project)
        info = get_run(s, rid)
        if not yes:
            click.confirm(f"delete run {rid} ({info.project}/{info.name}, last step "
                          f"{info.last_step}) and all its data?", abort=True)
        out = delete_run(s, rid)
    click.echo(f"deleted run {out.run_id} ({out.project}/{out.name}): {out.frames} frames, "
               f"{out.points} stored rows")


@runs.command("tag")
@click.argument("run")
@click.argument("tags", nargs=-1)
@click.option("--remove", "remove", multiple=True, help="A tag to take off (repeatable).")
@click.option("--project", default=None, help="The run's project, when names repeat.")
@_DB
def runs_tag(run: str, tags: tuple[str, ...], remove: tuple[str, ...], project: str | None,
             db_url: str | None) -> None:
    """Add TAGS to RUN (an id or a name); find them with GET /api/v1/runs?tag=."""
    with _store(db_url, create=False) as s:
        from logitwatch.server.store.queries import set_tags

        now = set_tags(s, _find_run(s, run, project), add=list(tags), remove=list(remove))
    click.echo(f"tags: {', '.join(now) or '(none)'}")


@main.command()
@click.option("--older-than", "days", required=True, type=click.FloatRange(min=0),
              help="Thin frames older than this many days.")
@click.option("--bucket-steps", default=100, show_default=True, type=click.IntRange(1),
              help="Keep one frame's per-head matrices per this many steps (the peak).")
@click.option("--run", "run", default=None, help="Only this run (id or name).")
@click.option("--project", default=None, help="The run's project, when names repeat.")
@_DB
def retention(days: float, bucket_steps: int, run: str | None, project: str | None,
              db_url: str | None) -> None:
    """Downsample old data now: per-head matrices of frames older than --older-than days
    are kept for one frame per --bucket-steps steps, the one with the bucket's largest
    value, so spikes survive; scalars are kept whole. A running collector does the same on
    a schedule with LOGITWATCH_RETENTION_DAYS."""
    with _store(db_url, create=False) as s:
        from logitwatch.server.store.retention import thin_old_frames, vacuum

        rid = _find_run(s, run, project) if run else None
        out = thin_old_frames(s, older_than=days * 86400, bucket_steps=bucket_steps,
                              run_id=rid, progress=lambda m: click.echo(m, err=True))
    with _store(db_url, announce=False) as s:
        vacuum(s)
    click.echo(f"retention: {out.matrices_deleted} matrices ({out.values_deleted} values) "
               f"deleted, {out.matrices_kept} kept in {out.metrics} series")


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
        click.echo(f"skipped {d}: its job is still running and sends it itself", err=True)
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
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Collector port (0: any free port).")
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
def demo(port: int, db_url: str | None, steps: int | None, settings: tuple[str, ...],
         seed: int, keep_serving: bool) -> None:
    """Start a collector on SQLite, train three tiny transformers that stream to it (one
    setting drives attention logits up until loss diverges, one is the same run with fuses
    on auto that train it through, one stays healthy), and report when the first alert
    fired, when the loss diverged and what the fuses did. The runs stay in the store:
    `logitwatch runs list` and `logitwatch serve` show them afterwards."""
    from logitwatch.demo.runner import run_demo
    from logitwatch.server.serving import PortInUse, check_port

    url = resolve_db(db_url)
    click.echo(f"store: {show_store(url)}", err=True)
    try:
        check_port("127.0.0.1", port)
    except PortInUse as e:
        raise click.ClickException(str(e)) from e
    code = run_demo(port=port, db_url=url, steps=steps, settings=list(settings) or None,
                    seed=seed, keep_serving=keep_serving, echo=click.echo)
    sys.exit(code)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--db", "db_url", default=None, metavar="URL",
              help="Store the replayed run here, and apply the rules stored there (default: "
              "a temporary SQLite database, with the rules stored in the default store).")
@click.option("--rules", "rules_file", default=None, type=click.Path(exists=True),
              help="A YAML rules file, merged over the defaults in place of "
              "$LOGITWATCH_ALERT_RULES.")
@click.option("--json", "as_json", is_flag=True, help="Print the alerts as JSON.")
def replay(file: str, db_url: str | None, rules_file: str | None, as_json: bool) -> None:
    """Feed the frames of FILE (one JSON frame a line, the wire format, gzip'd if FILE ends
    in .gz; an optional header line without `seq`) through the collector's ingest path and
    alert engine, and print the alerts they fire.

    The rules are those `logitwatch serve` applies: the defaults with the LOGITWATCH_ALERT_*
    settings, the YAML file of --rules (else $LOGITWATCH_ALERT_RULES), and the rules stored
    through the API in the store (--db, else the default store: the replay then goes to a
    temporary database, and the default store is only read). Which ones is printed.
    """
    _need_server()
    import json

    from logitwatch.server.alerts.config import configured_rules
    from logitwatch.server.alerts.replay import read_frames, replay_rules
    from logitwatch.server.alerts.replay import replay as run_replay
    from logitwatch.server.alerts.rules import RuleError
    from logitwatch.server.settings import Settings

    try:
        header, frames = read_frames(file)
        settings = Settings()
        configured_rules(settings, rules_file)  # a bad rules file: say so before replaying
    except (ValueError, RuleError, OSError) as e:
        raise click.ClickException(str(e)) from e
    if not frames:
        raise click.ClickException(f"{file}: no frames")
    rules = source = None
    if db_url:
        db_url = resolve_db(db_url)
        click.echo(f"store: {show_store(db_url)}", err=True)
    else:
        store = resolve_db(None)
        click.echo(f"store: {show_store(store)} (its rules only; the replay goes to a "
                   "temporary database: --db URL keeps it)", err=True)
        if _store_exists(store):  # never create the default store just to read its rules
            with _store(store, announce=False) as s:
                rules, source = replay_rules(settings, path=rules_file, session=s)
    click.echo(f"replaying {len(frames)} frames of {file}", err=True)
    try:
        result = run_replay(frames, db_url=db_url, settings=settings, rules_file=rules_file,
                            rules=rules,
                            progress=lambda n: click.echo(f"  {n}/{len(frames)} frames",
                                                          err=True) if n % 256 == 0 else None)
    except Exception as e:  # a frame the collector refuses: say which
        raise click.ClickException(f"{file}: {e}") from e
    click.echo(f"rules: {source or result.rules}", err=True)
    if as_json:
        click.echo(json.dumps([a.model_dump(mode="json") for a in result.alerts], indent=1))
    else:
        _print_alerts(result.alerts)
        if header and header.get("divergence_step") is not None:
            click.echo(f"(the file's header says the loss diverged at step "
                       f"{header['divergence_step']})")
        elif header and header.get("label") == "degraded":
            click.echo(f"(the file's header says the run did not diverge but ended "
                       f"{_nats(header.get('regression'))} above its best loss: degraded)")


def _store_exists(url: str) -> bool:
    """Whether ``url`` names a store that exists (a SQLite file is there; any other
    database is taken to exist)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return True
    return bool(u.database) and u.database != ":memory:" and Path(str(u.database)).exists()


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
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per alert).")
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
