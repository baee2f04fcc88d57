"""Reading a frames file for :mod:`.replay`, a line at a time: ``logitwatch replay FILE``.

A frames file is JSON lines (gzip'd if its name ends in ``.gz``): an optional header object
on line 1 (no ``seq``), then one wire frame a line (``logitwatch.wire``). The header of a
file ``logitwatch runs export`` wrote (``{"logitwatch_export": 1, "project", "run",
"config", "tags", ...}``) is checked by :func:`export_header`; any other header (a recorded
scenario's label and divergence step) is read past.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

__all__ = ["FrameFile", "FrameFileError", "Numbered", "export_header", "read_frame_lines",
           "read_frames"]



class FrameFileError(ValueError):
    """A line of a frames file that cannot be read (its file and line named). ``replayed``:
    the frames stored before it, when a replay was reading it."""

    replayed: int = 0


#: One frame of a file: its line number (None: not from a file), the line's bytes, the frame.
Numbered = tuple[int | None, int, Any]


class FrameFile:
    """A JSON-lines frames file (gzip'd if its name ends in ``.gz``), read a line at a time:
    an optional header object on line 1 (no ``seq``), then one frame a line. Opening it
    reads up to its first frame: :attr:`header` and :attr:`empty` are known at once.
    Iterating yields ``(line, bytes, frame)``, each frame parsed as it is reached, so
    memory does not grow with the file. A context manager (closes the file).

    Raises :class:`FrameFileError` naming the file and line that cannot be read (not JSON,
    nested too deeply, not UTF-8, a truncated or corrupt gzip file, a read error).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.header: dict[str, Any] | None = None
        #: frames yielded so far
        self.read = 0
        self._line = 0
        self._fh: IO[bytes] | None = None
        try:
            self._fh = gzip.open(self.path) if self.gzipped else open(self.path, "rb")
        except OSError as e:
            raise FrameFileError(f"{self.path}: cannot be read ({e.strerror or e})") from None
        self._lines = self._parsed()
        self._first = next(self._lines, None)
        if self._first is not None and self._first[0] == 1 and isinstance(
                self._first[2], dict) and "seq" not in self._first[2]:
            self.header = self._first[2]
            self._first = next(self._lines, None)

    @property
    def gzipped(self) -> bool:
        return self.path.endswith(".gz")

    @property
    def empty(self) -> bool:
        """No frame after the header."""
        return self._first is None

    def __enter__(self) -> FrameFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __iter__(self) -> Iterator[Numbered]:
        if self._first is not None:
            first, self._first = self._first, None
            self.read += 1
            yield first
        for item in self._lines:
            self.read += 1
            yield item

    def count(self) -> int | None:
        """How many frames the file holds, counted without parsing: its lines (a blank one
        counted too) less the header. A plain file only (a scan of its bytes, about a
        second a gigabyte); None for a gzip'd one, which would be decompressed twice."""
        if self.gzipped:
            return None
        n = 0
        last = b"\n"
        try:
            with open(self.path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    n += chunk.count(b"\n")
                    last = chunk[-1:]
        except OSError:
            return None
        n += last != b"\n"  # a last line without its newline
        return max(0, n - (self.header is not None))

    def _parsed(self) -> Iterator[Numbered]:
        """The file's non-blank lines, parsed: ``(line, bytes, object)``."""
        assert self._fh is not None
        path, i = self.path, 0
        try:
            for i, raw in enumerate(self._fh, 1):
                line = raw.decode("utf-8")  # per line: an error names its line
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise FrameFileError(f"{path}:{i}: not JSON ({e.msg})") from None
                except RecursionError:
                    raise FrameFileError(f"{path}:{i}: JSON nested too deeply (a frame is at "
                                         "most 4 levels deep)") from None
                except ValueError as e:  # an integer past Python's 4,300 digits
                    raise FrameFileError(f"{path}:{i}: a number has too many digits ({e})"
                                         ) from None
                yield i, len(raw), obj
        except UnicodeDecodeError as e:
            raise FrameFileError(f"{path}:{i}: not UTF-8 text ({e.reason} at byte "
                                 f"{e.start + 1} of the line); a frames file is JSON lines"
                                 ) from None
        except EOFError:
            raise FrameFileError(f"{path}:{i + 1}: the gzip file ends early (truncated: was "
                                 "it still being written or cut off in a copy?); "
                                 f"{self.read} frames were read before it") from None
        except OSError as e:  # gzip.BadGzipFile, zlib errors are OSError / zlib.error
            where = f"{path}:{i + 1}" if i else path
            raise FrameFileError(f"{where}: cannot be read ({e.strerror or e})") from None
        except zlib.error as e:
            raise FrameFileError(f"{path}:{i + 1}: corrupt gzip data ({e})") from None


def read_frames(path: str | Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A whole JSON-lines file in memory (:class:`FrameFile`): its header (or None) and
    its frames. Raises :class:`FrameFileError` (a ``ValueError``) for a line it cannot
    read."""
    header, frames, _ = read_frame_lines(path)
    return header, frames


def read_frame_lines(
    path: str | Path,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[int]]:
    """:func:`read_frames`, with the line number of each frame (for :func:`replay`'s
    ``lines``)."""
    with FrameFile(path) as f:
        items = list(f)
    return f.header, [obj for _, _, obj in items], [int(i or 0) for i, _, _ in items]


def export_header(header: Mapping[str, Any] | None, path: str = "") -> dict[str, Any] | None:
    """``header`` when it is the header of a ``logitwatch runs export`` file (it has
    ``logitwatch_export``), checked: a version this code reads, a run and project named, a
    config object and a list of tags. None for any other header (a recorded scenario's),
    which replay reads past.

    Raises:
        FrameFileError: a newer export version, or a header that is not an export's shape.
    """
    if header is None or "logitwatch_export" not in header:
        return None
    from logitwatch.server.store.export import EXPORT_VERSION  # the writer's version

    where = f"{path}:1: " if path else "line 1: "
    v = header["logitwatch_export"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise FrameFileError(f"{where}logitwatch_export: {v!r} is not an export version")
    if v > EXPORT_VERSION:
        raise FrameFileError(
            f"{where}an export of version {v} (logitwatch_export), newer than this logitwatch "
            f"reads (version {EXPORT_VERSION}): upgrade logitwatch to replay it (--no-header "
            "reads past the header and stores the frames alone)")
    bad = [k for k in ("project", "run") if not isinstance(header.get(k), str)]
    if bad:
        raise FrameFileError(f"{where}an export header names its run's project and name; "
                             f"{' and '.join(bad)} missing or not text")
    if not isinstance(header.get("config", {}), dict):
        raise FrameFileError(f"{where}config: not a JSON object")
    tags = header.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise FrameFileError(f"{where}tags: not a list of text")
    return dict(header)
