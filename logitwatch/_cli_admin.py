"""The store's administration commands of ``logitwatch``: ``token`` (ingest and read
tokens), ``runs`` (list, tag, export, delete) and ``retention`` (thin old per-head data now). They
work on the database directly: no collector needed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from logitwatch._cli_export import runs_export
from logitwatch._cli_store import DB_OPTION as _DB
from logitwatch._cli_store import NoStore
from logitwatch._cli_store import find_run as _find_run
from logitwatch._cli_store import store as _store

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["retention", "runs", "token"]


@click.group()
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

    try:
        with _store(db_url, create=False) as s:
            from logitwatch.server.store.tokens import list_tokens

            tokens = list_tokens(s, project=project)
    except NoStore as e:
        click.echo(f"no tokens: {e.message}")
        return
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
@click.argument("token_id", type=click.IntRange(1, 2**63 - 1))
@_DB
def token_revoke(token_id: int, db_url: str | None) -> None:
    """Revoke token TOKEN_ID (see `token list`); a running collector stops accepting it
    within its auth cache time (2 s by default)."""
    with _store(db_url, create=False) as s:
        from logitwatch.server.store.tokens import revoke_token

        info = revoke_token(s, token_id=token_id)
    click.echo(f"revoked token {info.id} ({info.name}, {info.scope} for {info.project!r})")


@click.group()
def runs() -> None:
    """List, tag, export and delete runs (directly in the database: no collector needed)."""


runs.add_command(runs_export)  # `runs export`: logitwatch/_cli_export.py


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


#: Seconds back in which a run still running counts as live: retention that reaches into
#: them asks first (it thins what the dashboard and the alert engine are looking at).
LIVE_WINDOW = 86400.0


@click.command()
@click.option("--older-than", "days", required=True, type=click.FloatRange(min=0),
              help="Thin frames older than this many days (0: every frame, now).")
@click.option("--bucket-steps", default=100, show_default=True, type=click.IntRange(1),
              help="Keep one frame's per-head matrices per this many steps (the peak).")
@click.option("--run", "run", default=None, help="Only this run (id or name).")
@click.option("--project", default=None, help="The run's project, when names repeat.")
@click.option("--yes", is_flag=True, default=False,
              help="Do not ask for confirmation (asked with --older-than 0, or when live "
              "runs' data of the last day would be thinned).")
@_DB
def retention(days: float, bucket_steps: int, run: str | None, project: str | None,
              yes: bool, db_url: str | None) -> None:
    """Downsample old data now: per-head matrices of frames older than --older-than days
    are kept for one frame per --bucket-steps steps, the one with the bucket's largest
    value, so spikes survive; scalars are kept whole. A running collector does the same on
    a schedule with LOGITWATCH_RETENTION_DAYS.

    The matrices deleted are gone for good: with --older-than 0, or when the pass would
    reach into the last day of runs still running, it asks first (--yes does not)."""
    import time

    with _store(db_url, create=False) as s:
        from logitwatch.server.store.retention import thin_old_frames, vacuum

        rid = _find_run(s, run, project) if run else None
        now = time.time()
        if not yes:
            _confirm_retention(s, days=days, now=now, run_id=rid, bucket_steps=bucket_steps)
        out = thin_old_frames(s, older_than=days * 86400, bucket_steps=bucket_steps,
                              run_id=rid, now=now, progress=lambda m: click.echo(m, err=True))
    with _store(db_url, announce=False) as s:
        vacuum(s)
    click.echo(f"retention: {out.matrices_deleted} matrices ({out.values_deleted} values) "
               f"deleted, {out.matrices_kept} kept in {out.metrics} series")


def _confirm_retention(s: Session, *, days: float, now: float, run_id: int | None,
                       bucket_steps: int) -> None:
    """Ask before a pass that thins every frame (``--older-than 0``) or the last day's
    frames of runs still running (their live data); abort on no."""
    from sqlalchemy import exists, select

    from logitwatch.server.db.models import Frame, Metric, Run

    cutoff = now - days * 86400
    touched = (select(Run.project, Run.name)
               .where(exists().where(Metric.run_id == Run.id, Metric.layers > 0))
               .order_by(Run.project, Run.name))
    if run_id is not None:
        touched = touched.where(Run.id == run_id)
    live = [f"{r.project}/{r.name}" for r in s.execute(touched.where(
        Run.status == "running",
        exists().where(Frame.run_id == Run.id, Frame.time >= now - LIVE_WINDOW,
                       Frame.time < cutoff))).all()]
    if not live and days > 0:
        return
    every = s.execute(touched.where(exists().where(Frame.run_id == Run.id,
                                                   Frame.time < cutoff))).all()
    if not every:
        return  # nothing to thin
    what = (f"frames older than {days:g} day(s)" if days > 0 else "every frame")
    what = f"the per-head matrices of {what} in {len(every)} run(s)"
    still = (f", {len(live)} of them still running ({', '.join(live[:5])}"
             f"{', ...' if len(live) > 5 else ''})" if live else "")
    click.confirm(f"thin {what}{still} to one frame per {bucket_steps} steps (its peak), "
                  "deleting the others for good?", abort=True)
