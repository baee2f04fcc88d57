"""What every ``logitwatch`` command that opens the store shares: which store (``--db``,
``$LOGITWATCH_DB_URL``, logitwatch's home), how it is shown (password hidden), a migrated
session on it, and a run found by id or name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session

__all__ = ["DB_OPTION", "NoStore", "find_run", "migrate_store", "need_server", "resolve_db",
           "schema_too_new", "show_store", "sqlite_url", "store", "store_exists", "url_host"]


def url_host(host: str) -> str:
    """``host`` as it goes into a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def show_store(url: str) -> str:
    """A database URL to print: the password of a PostgreSQL URL hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - printing must not fail; the URL is checked elsewhere
        return url


def need_server() -> None:
    """Stop with what to install when the collector's packages (the server extra) are
    missing."""
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
    need_server()
    from logitwatch.server.settings import Settings

    try:
        return Settings(db_url=db_url).db_url if db_url else Settings().db_url
    except ValueError as e:
        raise click.ClickException(settings_error(e)) from e


#: settings the command line sets, by field: the option to name in an error
_OPTIONS = {"db_url": "--db", "host": "--host", "port": "--port", "webhook_url": "--webhook"}


def settings_error(e: ValueError) -> str:
    """A settings error as lines a person can act on: each naming the option or the
    ``LOGITWATCH_*`` variable it came from (pydantic's own text names the field only)."""
    from pydantic import ValidationError

    if not isinstance(e, ValidationError):
        return str(e)
    lines = []
    for err in e.errors():
        field = str(err["loc"][0]) if err.get("loc") else ""
        where = (f"{_OPTIONS[field]} / LOGITWATCH_{field.upper()}" if field in _OPTIONS
                 else f"LOGITWATCH_{field.upper()}" if field else "settings")
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        got = "" if "got " in msg else f" (got {err.get('input')!r})"
        given = err.get("input")
        if field == "db_url" and isinstance(given, str) and given.strip() and "://" not in given:
            # a file path where a URL goes: the URL of that file (absolute: four slashes)
            got += (f": for that SQLite file use {sqlite_url(given)} (sqlite:/// and its "
                    "absolute path)")
        lines.append(f"{where}: {msg}{got}")
    return "\n".join(lines)


def sqlite_url(path: str) -> str:
    """The URL of the SQLite file ``path``, made absolute (``sqlite:////tmp/x.db``: the
    scheme's three slashes, then the path's own), quoted for a shell where it must be."""
    import shlex
    from pathlib import Path

    return shlex.quote(f"sqlite:///{Path(path.strip()).expanduser().absolute()}")


@contextmanager
def store(db_url: str | None, *, announce: bool = True,
          create: bool = True) -> Iterator[Session]:
    """A migrated database's session, committed on success. ``announce``: say on stderr
    which store this is (every command that reads or writes one does, once). ``create``
    False: a SQLite store that does not exist yet is an error, not a new empty file."""
    need_server()
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import SchemaTooNew, make_engine, session_scope
    from logitwatch.server.errors import ApiError

    url = resolve_db(db_url)
    if announce:
        click.echo(f"store: {show_store(url)}", err=True)
    if not create and not store_exists(url):
        raise NoStore(f"no store at {show_store(url)} yet: nothing was recorded there "
                      "(`logitwatch serve` and `logitwatch demo` create it; --db or "
                      "LOGITWATCH_HOME name another)")
    from sqlalchemy.exc import DBAPIError

    try:
        engine = make_engine(url)
    except (ModuleNotFoundError, OSError) as e:
        raise _store_failure(url, e) from e
    try:
        migrate_store(engine)
        with session_scope(sessionmaker(engine, expire_on_commit=False)) as s:
            yield s
    except SchemaTooNew as e:
        raise schema_too_new(url, e) from e
    except ApiError as e:
        raise click.ClickException(e.message) from e
    except (DBAPIError, OSError) as e:
        raise _store_failure(url, e) from e
    finally:
        engine.dispose()


def migrate_store(engine: Engine) -> None:
    """Migrate the store to this logitwatch's schema (as every command that opens it does),
    saying so on stderr when a store that has a schema is upgraded: an older logitwatch
    refuses it afterwards. A store already at head, or a new one, says nothing.

    Raises:
        SchemaTooNew: a newer logitwatch wrote the store (:func:`schema_too_new`).
    """
    from logitwatch.server.db.session import migrate

    started = False

    def say(current: str, head: str) -> None:
        nonlocal started
        click.echo(f"store: upgrading the schema from {current} to {head} (an older "
                   "logitwatch will refuse this store afterwards)...", nl=False, err=True)
        started = True

    try:
        migrate(engine, on_upgrade=say)
    except BaseException:
        if started:
            click.echo(" failed", err=True)
        raise
    if started:
        click.echo(" done", err=True)


def schema_too_new(url: str, e: Exception) -> click.ClickException:
    """A store written by a newer logitwatch, in one line naming it and the way out."""
    return click.ClickException(f"cannot use the store {show_store(url)}: {e}")


def _store_failure(url: str, e: Exception) -> click.ClickException:
    """Why the store at ``url`` cannot be used, in one line that says what to check."""
    where = f"cannot use the store {show_store(url)}"
    if isinstance(e, ModuleNotFoundError):
        return click.ClickException(f"{where}: its database driver ({e.name}) is not "
                                    "installed; for PostgreSQL: pip install "
                                    "'logitwatch[server,postgres]'")
    if isinstance(e, OSError):
        return click.ClickException(f"{where}: it cannot be created or opened ({e}); check "
                                    "the path (--db, LOGITWATCH_HOME)")
    why = str(getattr(e, "orig", None) or e).strip().splitlines()[0][:300]
    return click.ClickException(f"{where}: {why}; is the database server running, and are "
                                "the URL and its credentials right?")


DB_OPTION = click.option("--db", "db_url", default=None, metavar="URL",
                         help="Database URL (default: $LOGITWATCH_DB_URL, else the SQLite "
                         "file logitwatch.db in $LOGITWATCH_HOME, else in "
                         "~/.local/share/logitwatch: the store `logitwatch serve` and the "
                         "demo use).")


def find_run(s: Session, run: str, project: str | None) -> int:
    """A run id from an id or a name (``--project`` disambiguates names).

    Run names may be all digits, so digits are looked up both ways: a run of that id and a
    run of that name that are not the same run is refused (a command that deletes must not
    guess), and an id outside ``--project`` is not that project's run."""
    from sqlalchemy import select

    from logitwatch.server.db.models import Run

    q = select(Run.id, Run.project).where(Run.name == run)
    if project is not None:
        q = q.where(Run.project == project)
    rows = s.execute(q).all()
    where = f" in project {project!r}" if project else ""
    if len(rows) > 1:
        raise click.ClickException(
            f"{len(rows)} runs are named {run!r} (projects "
            f"{', '.join(sorted(r.project for r in rows))}): pass --project or the run id")
    named = int(rows[0].id) if rows else None
    by_id = None
    digits = run.isascii() and run.isdigit()  # "²".isdigit(), and int("١") == 1
    if digits and int(run) <= 2**31 - 1:
        q = select(Run.id, Run.project, Run.name).where(Run.id == int(run))
        if project is not None:
            q = q.where(Run.project == project)
        row = s.execute(q).first()
        if row is not None:
            by_id = int(row.id)
            if named is not None and named != by_id:
                raise click.ClickException(
                    f"{run!r} is both the id of run {row.project}/{row.name} and the name of "
                    f"run {named}: pass {named} for the run named {run!r} (see `logitwatch "
                    "runs list`)")
    if by_id is None and named is None:
        raise click.ClickException(f"no run {'with id or ' if digits else ''}named "
                                   f"{run!r}{where} (see `logitwatch runs list`)")
    return by_id if by_id is not None else int(named)  # type: ignore[arg-type]


def store_exists(url: str) -> bool:
    """Whether ``url`` names a store that exists (a SQLite file is there; any other
    database is taken to exist)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return True
    return bool(u.database) and u.database != ":memory:" and Path(str(u.database)).exists()
