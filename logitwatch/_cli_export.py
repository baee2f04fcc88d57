"""``logitwatch runs export``: a stored run back out of the store, as the wire frames
``logitwatch replay`` reads (to move it to another collector, attach it to a bug report)
or as long CSV rows (for pandas). The reading is :mod:`logitwatch.server.store.export`'s;
this module is the command: options, the output file, progress and errors."""

from __future__ import annotations

import gzip
import io
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import click

from logitwatch._cli_store import DB_OPTION as _DB
from logitwatch._cli_store import find_run as _find_run
from logitwatch._cli_store import store as _store

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from logitwatch.server.store.export import RunExport

__all__ = ["runs_export"]


class _Unwritable(click.ClickException):
    """The output cannot be written (raised inside the store's scope, which would otherwise
    take an ``OSError`` for the store's own)."""


def _format_of(output: str, fmt: str | None) -> str:
    """``--format``, else what the output's name says (``.csv``, ``.csv.gz``), else
    jsonl."""
    if fmt:
        return fmt
    return "csv" if output.removesuffix(".gz").lower().endswith(".csv") else "jsonl"


@contextmanager
def _opened(output: str) -> Iterator[IO[bytes]]:
    """A binary stream to ``output``: stdout for ``-``; else a temporary file beside it,
    gzip'd when the name ends in ``.gz``, put in its place only once complete (a failed or
    interrupted export leaves no half file, and an older export of that name whole)."""
    if output == "-":
        sys.stdout.flush()  # what went out as text before the bytes
        yield sys.stdout.buffer
        return
    target = Path(output)
    if target.is_dir():
        raise _Unwritable(f"cannot write {output}: it is a directory")
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                   suffix=".part")
    except OSError as e:
        raise _Unwritable(f"cannot write {output}: {e.strerror or e}") from e
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
    raw = os.fdopen(fd, "wb")
    done = False
    try:
        if output.endswith(".gz"):
            with gzip.GzipFile(filename=target.name.removesuffix(".gz"), mode="wb",
                               fileobj=raw) as gz:
                yield cast(IO[bytes], gz)
        else:
            yield raw
        raw.close()
        os.replace(tmp, target)
        done = True
    except OSError as e:
        raise _Unwritable(f"cannot write {output}: {e.strerror or e}") from e
    finally:
        raw.close()
        if not done:
            Path(tmp).unlink(missing_ok=True)


def _dumps() -> Callable[[Any], bytes]:
    """A compact JSON encoder to bytes: orjson where installed (the server extra has it,
    several times faster), else the standard library's, which also takes what orjson
    refuses (an integer past 64 bits in a run's config). Both write a float as the shortest
    text that reads back as that float64, and neither is handed a NaN (the wire's strings
    stand for them)."""
    import json

    def std(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    try:
        import orjson
    except ImportError:  # pragma: no cover - depends on the install
        return std

    def fast(obj: Any) -> bytes:
        try:
            return orjson.dumps(obj)
        except TypeError:
            return std(obj)

    return fast


def _write_jsonl(s: Session, export: RunExport, out: IO[bytes], progress: Any) -> int:
    """The header line, then a wire frame a line; returns the frames written."""
    from logitwatch.server.store.export import count_frames, end_frame, header, wire_frames

    dumps = _dumps()
    total = count_frames(s, export, sampled_only=True)
    progress.total = total + (end_frame(s, export) is not None)
    out.write(dumps(header(s, export, frames=total)) + b"\n")
    n = 0
    for frame in wire_frames(s, export):
        out.write(dumps(frame) + b"\n")
        n += 1
        progress(n)
    return n


def _write_csv(s: Session, export: RunExport, out: IO[bytes], progress: Any) -> int:
    """The long rows with their column names; returns the frame rows read."""
    import csv

    from logitwatch.server.store.export import CSV_COLUMNS, count_frames, csv_rows

    progress.total = count_frames(s, export, sampled_only=False)
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=False)
    try:
        w = csv.writer(text, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        n = 0
        for rows in csv_rows(s, export):
            w.writerows(rows)
            n += 1
            progress(n)
        text.flush()
    finally:
        text.detach()  # the stream is the caller's to close
    return n


_EXAMPLES = """\b
Examples:
  logitwatch runs export my-run -o my-run.jsonl.gz
  logitwatch replay my-run.jsonl.gz --db postgresql+psycopg://u:pw@host/lw
  logitwatch runs export my-run --format csv --metrics loss,attn.logit_max -o m.csv
  python -c "import pandas as pd; print(pd.read_csv('m.csv').head())"
"""


@click.command("export", epilog=_EXAMPLES)
@click.argument("run")
@click.option("--project", default=None, help="The run's project, when names repeat.")
@click.option("-o", "--output", default="-", show_default=True, metavar="FILE",
              help="Where to write it (-: stdout); a name ending in .gz is gzip'd.")
@click.option("--format", "fmt", default=None, type=click.Choice(["jsonl", "csv"]),
              help="jsonl: wire frames, one a line, after a header line (what `logitwatch "
              "replay` reads); csv: long rows step,rank,metric,layer,head,value. Default: "
              "csv for a FILE named *.csv or *.csv.gz, else jsonl.")
@click.option("--rank", "ranks", multiple=True, type=click.IntRange(0), metavar="N",
              help="Only this rank's frames (repeatable; default: every rank).")
@click.option("--metrics", default=None, metavar="A,B",
              help="Only these series, comma-separated (default: all). In jsonl every "
              "frame is still written, with the chosen values only.")
@_DB
def runs_export(run: str, project: str | None, output: str, fmt: str | None,
                ranks: tuple[int, ...], metrics: str | None, db_url: str | None) -> None:
    """Write RUN (an id or a name) out of the store, losslessly.

    jsonl is the wire format the hooks send: every sampled frame with its scalars and
    per-head matrices, the every-step scalars between samples in its `history`, NaN and
    infinities as "NaN"/"Infinity"/"-Infinity", and the run's end frame if it finished.
    `logitwatch replay FILE --db URL` stores it again, value for value; the first line
    holds the run's config, tags and status, and replay gives the copy its config and tags
    from it.

    csv has one row per stored value, history steps included (a scalar's layer and head
    are empty), for pandas.
    """
    from logitwatch._cli_progress import Progress  # replay's progress lines
    from logitwatch.server.store.export import ExportError, prepare

    form = _format_of(output, fmt)
    chosen = None
    if metrics is not None:
        chosen = [m.strip() for m in metrics.split(",") if m.strip()]
        if not chosen:
            raise click.BadParameter("name at least one series", param_hint="--metrics")
    with _store(db_url, create=False) as s:
        rid = _find_run(s, run, project)
        try:
            export = prepare(s, rid, ranks=list(ranks) or None, metrics=chosen)
        except ExportError as e:
            raise click.ClickException(str(e)) from e
        progress = Progress(0)
        where = "stdout" if output == "-" else output
        click.echo(f"exporting {export.project}/{export.name} (run {rid}) as {form} to "
                   f"{where}", err=True)
        try:
            with _opened(output) as out:
                writer = _write_csv if form == "csv" else _write_jsonl
                writer(s, export, out, progress)
                out.flush()
        except BrokenPipeError:  # `... | head`: the reader has what it wanted
            _quiet_stdout()
            sys.exit(1)
        except OSError as e:  # stdout gone otherwise (a full disk behind a redirect)
            raise _Unwritable(f"cannot write {where}: {e.strerror or e}") from e
        finally:
            progress.close()
    _summary(export, form, where)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's own flush at exit does not fail on
    the closed pipe again with a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


def _summary(export: RunExport, form: str, where: str) -> None:
    """What was written, on stderr, and what of the run the file cannot carry."""
    if form == "csv":
        click.echo(f"exported {export.frames} frames and {export.history_steps} history "
                   f"steps of {export.project}/{export.name} to {where}", err=True)
    else:
        end = ", and its end frame" if export.ended else ""
        click.echo(f"exported {export.frames} frames carrying {export.history_steps} history "
                   f"steps of {export.project}/{export.name} (ranks "
                   f"{', '.join(map(str, export.ranks)) or 'none'}){end} to {where}", err=True)
    if export.left_out:
        click.secho(f"warning: {export.left_out} history step(s) left out: no sampled frame "
                    "of their rank and time is stored to carry them on the wire (the csv "
                    "format has them)", fg="yellow", err=True)
    if export.thinned:
        click.secho(f"warning: {export.thinned} per-head matrices were thinned by retention; "
                    "their frames' envelope (max over heads) is not on the wire, so a replayed "
                    "copy lacks it there", fg="yellow", err=True)
