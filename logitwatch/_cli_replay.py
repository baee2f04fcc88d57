"""``logitwatch replay FILE``: recorded frames (a job's, a recorded scenario's, what
``logitwatch runs export`` wrote) through the collector's ingest path and alert engine. The
work is :mod:`logitwatch.server.alerts.replay`'s; this module is the command: options, the
store, progress, the summary and errors."""

from __future__ import annotations

import json
from typing import Any

import click

from logitwatch._cli_store import need_server as _need_server
from logitwatch._cli_store import resolve_db, schema_too_new, show_store
from logitwatch._cli_store import store as _store
from logitwatch._cli_store import store_exists as _store_exists

__all__ = ["replay"]


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--db", "db_url", default=None, metavar="URL",
              help="Store the replayed run here, and apply the rules stored there (default: "
              "a temporary SQLite database, with the rules stored in the default store).")
@click.option("--rules", "rules_file", default=None, type=click.Path(exists=True),
              help="A YAML rules file, merged over the defaults in place of "
              "$LOGITWATCH_ALERT_RULES.")
@click.option("--header/--no-header", "use_header", default=True, show_default=True,
              help="Give the run the config and tags of the header line `logitwatch runs "
              "export` wrote (--no-header: read past it and store the frames alone).")
@click.option("--batch", default=None, type=click.IntRange(1, 10_000), metavar="N",
              help="Frames stored per transaction (default 256, at most the collector's "
              "max_frames_per_request); what is stored and judged does not depend on it.")
@click.option("--json", "as_json", is_flag=True, help="Print the alerts as JSON.")
def replay(file: str, db_url: str | None, rules_file: str | None, use_header: bool,
           batch: int | None, as_json: bool) -> None:
    """Feed the frames of FILE (one JSON frame a line, the wire format, gzip'd if FILE ends
    in .gz; an optional header line without `seq`) through the collector's ingest path and
    alert engine, and print the alerts they fire. FILE is read a line at a time and stored a
    batch at a time: its size does not matter (a line that cannot be read stops the replay,
    the frames before it stored).

    A file `logitwatch runs export` wrote gets its run's config and tags back from its
    header line (unless --no-header); its frames must all be of that run.

    The rules are those `logitwatch serve` applies: the defaults with the LOGITWATCH_ALERT_*
    settings, the YAML file of --rules (else $LOGITWATCH_ALERT_RULES), and the rules stored
    through the API in the store (--db, else the default store: the replay then goes to a
    temporary database, and the default store is only read). Which ones is printed.

    A replayed run has no live job: each run FILE leaves running is then marked finished,
    after its last frame, as its job's end frame (Monitor.close()) would have done, so that
    `logitwatch serve` on that store does not report it stopped (no data: hung or crashed).
    A run FILE ends itself is left as it is. The summary names them.
    """
    _need_server()
    from logitwatch._cli_progress import Progress
    from logitwatch.server.alerts.config import configured_rules
    from logitwatch.server.alerts.replay import (
        REPLAY_BATCH,
        FrameFile,
        FrameFileError,
        export_header,
        replay_rules,
    )
    from logitwatch.server.alerts.replay import replay as run_replay
    from logitwatch.server.alerts.rules import RuleError
    from logitwatch.server.settings import Settings

    try:
        source = FrameFile(file)
    except FrameFileError as e:
        raise click.ClickException(str(e)) from e
    with source:
        try:
            header = export_header(source.header, file) if use_header else None
            settings = Settings()
            configured_rules(settings, rules_file)  # a bad rules file: say so before replaying
        except (ValueError, RuleError, OSError) as e:
            raise click.ClickException(str(e)) from e
        if source.empty:
            raise click.ClickException(f"{file}: no frames")
        rules = where = None
        if db_url:
            db_url = resolve_db(db_url)
            click.echo(f"store: {show_store(db_url)}", err=True)
            with _store(db_url, announce=False):  # migrated (saying so), or why it cannot be
                pass
        else:
            store = resolve_db(None)
            click.echo(f"store: {show_store(store)} (its rules only; the replay goes to a "
                       "temporary database: --db URL keeps it)", err=True)
            if _store_exists(store):  # never create the default store just to read its rules
                with _store(store, announce=False) as s:
                    rules, where = replay_rules(settings, path=rules_file, session=s)
        total = _total(source, header)
        click.echo(f"replaying {f'{total} frames' if total is not None else 'the frames'} of "
                   f"{file}", err=True)
        from logitwatch.server.db.session import SchemaTooNew

        progress = Progress(total)
        try:
            result = run_replay(source, db_url=db_url, settings=settings,
                                rules_file=rules_file, rules=rules, progress=progress,
                                batch=batch or REPLAY_BATCH, header=header)
        except SchemaTooNew as e:  # the store's fault, not the file's
            raise schema_too_new(db_url or "", e) from e
        except FrameFileError as e:  # a line that cannot be read: the frames before it stay
            kept = (f"; the {e.replayed} frames before it are stored in {show_store(db_url)}"
                    " (replayed again, a whole file skips them)"
                    if db_url and e.replayed else "")
            raise click.ClickException(f"{e}{kept}") from e
        except Exception as e:  # a frame the collector refuses: say which
            raise click.ClickException(f"{file}: {e}") from e
        finally:
            progress.close()
    _summary(result, db_url, header, where)
    _print(result, source.header, as_json)


def _total(source: Any, header: dict[str, Any] | None) -> int | None:
    """The frames FILE holds, for the progress's percentage: a plain file's lines, counted
    (a scan of its bytes); in a gzip'd export, what its header says it wrote (the sampled
    frames, and the end frame of a finished run); else unknown (a gzip'd file would be
    decompressed twice to count)."""
    n = source.count()
    if n is not None:
        return int(n)
    frames = header.get("frames") if header else None
    if isinstance(frames, int) and not isinstance(frames, bool) and frames >= 0:
        ranks = header.get("ranks") if header else None
        ended = header is not None and header.get("end_step") is not None and (
            not isinstance(ranks, list) or 0 in ranks)
        return frames + ended
    return None


def _summary(result: Any, db_url: str | None, header: dict[str, Any] | None,
             where: str | None) -> None:
    """What was replayed, marked finished and applied, and which rules judged it."""
    from logitwatch.cli import _some

    n_runs = len(result.runs)
    click.echo(f"replayed {result.frames} frames of {n_runs} run{'s' if n_runs != 1 else ''}"
               f" ({_some(result.runs)})", err=True)
    if db_url and result.ended:
        click.echo(f"marked finished in {show_store(db_url)}: {_some(result.ended)} (a "
                   "replayed run has no live job: left running, it would be reported stopped)",
                   err=True)
    if header is not None and result.header_applied:
        config, tags = header.get("config") or {}, header.get("tags") or []
        click.echo(f"from the export header: {header['project']}/{header['run']} got "
                   f"{len(config)} config key{'s' if len(config) != 1 else ''} and the tags "
                   f"{', '.join(tags) or '(none)'}", err=True)
    click.echo(f"rules: {where or result.rules}", err=True)
    if result.unsent_steps:
        n = result.unsent_steps
        click.echo(f"note: {n} step{'s' if n != 1 else ''} between the frames came with no "
                   "`history` (every step's loss, gradient norm, clip flag and LR, as the "
                   "hooks send them): the rules judged those series only at the frames' "
                   "own steps, so a NaN, an LR jump or a blow-up between two of them may be "
                   "seen late or not at all (docs/ALERTS.md, Steps, not samples)", err=True)


def _print(result: Any, header: dict[str, Any] | None, as_json: bool) -> None:
    """The alerts, and what a recorded scenario's header says of its run."""
    from logitwatch.cli import _nats, _print_alerts

    if as_json:
        click.echo(json.dumps([a.model_dump(mode="json") for a in result.alerts], indent=1))
        return
    _print_alerts(result.alerts)
    if header and header.get("divergence_step") is not None:
        click.echo(f"(the file's header says the loss diverged at step "
                   f"{header['divergence_step']})")
    elif header and header.get("label") == "degraded":
        click.echo(f"(the file's header says the run did not diverge but ended "
                   f"{_nats(header.get('regression'))} above its best loss: degraded)")
