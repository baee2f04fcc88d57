"""The crash-safe disk spool: segment files of encoded frames, one directory per process.

Layout (``root`` is ``ClientConfig.spool_root()``)::

    <root>/<project>/<run>/rank-<rank>/<pid>-<start µs>/
        meta.json                                 run, project, rank, url, pid
        LOCK                                      flock()ed while the process lives
        00001764430000123456-00001764430000123999.seg
        00001764430000124000-00001764430000124000.rejected    quarantine: never replayed

A *segment* holds up to ``max_batch`` frames, oldest first: one header line
``LWSEG1 {"frames": n, "first": seq, "last": seq, "bytes": b, "crc": crc32}`` and then
one JSON frame per line, exactly the bytes that go on the wire. It is written once, to a
``.tmp-`` file that is flushed and fsync'ed, then renamed into place and the directory
fsync'ed: after a crash (of the job, the machine, or the power) a segment is there whole
or not at all, and its CRC catches what the disk itself corrupted. Names sort by sequence
number, so replay order is ``sorted()``; a delivered segment is unlinked.

Why files and not SQLite: a segment is written and read whole, in order, never updated;
the spool is used only while the collector is away, and its state must be readable by a
person (``ls``, ``head``) and by ``logitwatch push`` from another process or host. Files
give that with one fsync per segment and nothing to vacuum; deleting a delivered segment
frees its disk space at once, which a SQLite file does not do without VACUUM.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # POSIX; on Windows the directory is simply not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MAGIC",
    "Segment",
    "SpoolCorrupt",
    "WriterDir",
    "find_writer_dirs",
    "is_locked",
    "try_lock",
    "read_header",
    "read_segment",
    "write_segment",
]

MAGIC = b"LWSEG1 "
SUFFIX = ".seg"
META = "meta.json"
LOCK = "LOCK"

#: Seconds after a failure to make the spool directory (disk full, no flock, permissions)
#: before it is tried again: until then :meth:`WriterDir.ensure` fails at once, touching
#: nothing, so a spool that cannot work costs no disk operation per frame.
RETRY_MAKE_AFTER = 5.0


class SpoolCorrupt(Exception):
    """A segment file that cannot be trusted (bad header, CRC or frame count)."""


@dataclass(slots=True)
class Segment:
    """One segment file, as indexed in memory."""

    path: Path
    first: int
    last: int
    frames: int
    size: int
    busy: bool = False  # being sent: not evicted


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not supported everywhere (Windows)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_segment(directory: Path, seqs: list[int], lines: list[bytes],
                  suffix: str = SUFFIX) -> Segment:
    """Write ``lines`` (one encoded frame each, ``seqs`` ascending) as a new segment.

    Durable when it returns. Raises ``OSError`` (disk full, permissions) with nothing left
    behind but possibly a ``.tmp-`` file, which readers ignore. Another ``suffix`` than
    ``.seg`` writes a file that is never replayed: the quarantine (``.rejected``: frames the
    collector refused as invalid; ``.quarantine``: frames it failed on, answering 500,
    while the rest of their batch went through), kept for a person to look at.
    """
    body = b"\n".join(lines) + b"\n"
    first, last = seqs[0], seqs[-1]
    header = MAGIC + json.dumps({
        "frames": len(lines), "first": first, "last": last, "bytes": len(body),
        "crc": zlib.crc32(body),
    }).encode() + b"\n"
    name = f"{first:020d}-{last:020d}{suffix}"
    tmp = directory / f".tmp-{name}"
    final = directory / name
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(directory)
    return Segment(final, first, last, len(lines), len(header) + len(body))


def read_header(path: Path) -> dict[str, Any]:
    """The header of a segment file (``frames``, ``first``, ``last``, ``bytes``, ``crc``)."""
    with open(path, "rb") as f:
        line = f.readline(4096)
    return _parse_header(path, line)


def _parse_header(path: Path, line: bytes) -> dict[str, Any]:
    if not line.startswith(MAGIC) or not line.endswith(b"\n"):
        raise SpoolCorrupt(f"{path}: not a logitwatch spool segment (bad header)")
    try:
        head = json.loads(line[len(MAGIC):])
        ok = all(isinstance(head.get(k), int) for k in ("frames", "first", "last", "bytes",
                                                        "crc"))
    except ValueError:
        ok = False
    if not ok:
        raise SpoolCorrupt(f"{path}: unreadable segment header")
    return head  # type: ignore[no-any-return]


def read_segment(path: Path) -> list[bytes]:
    """The encoded frames of a segment, after checking its size, CRC and frame count.

    Raises:
        SpoolCorrupt: the file is damaged; its frames cannot be trusted.
        OSError: the file cannot be read (e.g. it is gone).
    """
    data = path.read_bytes()
    cut = data.find(b"\n") + 1
    head = _parse_header(path, data[:cut])
    body = data[cut:]
    if len(body) != head["bytes"] or zlib.crc32(body) != head["crc"]:
        raise SpoolCorrupt(f"{path}: checksum mismatch (the file was damaged on disk)")
    lines = body.split(b"\n")[:-1]
    if len(lines) != head["frames"]:
        raise SpoolCorrupt(f"{path}: {len(lines)} frames, header says {head['frames']}")
    return lines


class WriterDir:
    """The spool directory of this process for one (project, run, rank), made on first use.

    While the process lives the directory is locked (``flock`` on ``LOCK``), so
    ``logitwatch push`` leaves it alone. A forked child calls :meth:`forget` and gets a
    directory of its own on its first write.
    """

    def __init__(self, root: str | os.PathLike[str], *, project: str, run: str, rank: int,
                 url: str | None) -> None:
        self.base = Path(root) / _safe(project) / _safe(run) / f"rank-{rank}"
        self._meta = {"project": project, "run": run, "rank": rank, "url": url}
        self.path: Path | None = None
        self._lock_fd: int | None = None
        self._failed: OSError | None = None  # why the last _make failed, and when to retry
        self._retry_at = 0.0
        # The spooler thread (memory -> disk) and the sender (frames set aside) both call
        # ensure(): without the lock both could make a directory, and one of them would be
        # orphaned (its files invisible to spool_path).
        self._made = threading.Lock()

    def ensure(self) -> Path:
        """Create (once) and lock this process's directory; return it.

        Raises ``OSError`` if it cannot be made, and then for :data:`RETRY_MAKE_AFTER`
        seconds without trying again.
        """
        if self.path is not None:
            return self.path
        with self._made:
            if self.path is not None:
                return self.path
            failed = self._failed
            if failed is not None and time.monotonic() < self._retry_at:
                raise OSError(f"{failed} (making the spool directory is retried at most "
                              f"every {RETRY_MAKE_AFTER:g} s)")
            try:
                return self._make()
            except OSError as e:
                self._failed, self._retry_at = e, time.monotonic() + RETRY_MAKE_AFTER
                raise

    def _make(self) -> Path:
        pid = os.getpid()
        path = self.base / f"{pid}-{time.time_ns() // 1000}"
        path.mkdir(parents=True, exist_ok=False)
        fd: int | None = None
        try:
            fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            meta = {**self._meta, "pid": pid, "created": time.time()}
            tmp = path / f".tmp-{META}"
            tmp.write_text(json.dumps(meta, indent=1) + "\n")
            os.replace(tmp, path / META)
        except BaseException:
            # A full disk (meta.json) or a filesystem without flock: undo it all. Left
            # open, the descriptor leaked with every later attempt, one per spill, until
            # the job's own open() failed with EMFILE; left on disk, the directories piled
            # up (each attempt makes a new one).
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
            remove_writer_dir(path)
            raise
        _fsync_dir(path)
        _fsync_dir(path.parent)
        self._lock_fd = fd
        self.path = path
        self._failed = None
        return path

    def release(self) -> None:
        """Unlock; remove the directory if no segment is left in it."""
        path, fd = self.path, self._lock_fd
        self._lock_fd = None
        if path is not None and not any(path.glob(f"*{SUFFIX}")):
            remove_writer_dir(path)
            self.path = None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def forget(self) -> None:
        """In a forked child: drop the parent's directory without touching it."""
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # the parent's descriptor keeps its lock
        self._lock_fd = None
        self.path = None
        self._failed = None
        self._made = threading.Lock()  # a parent's thread may have held it at the fork


def _safe(name: str) -> str:
    """A run or project name as a path component ("." and ".." are legal run names)."""
    return "_" + name if name in (".", "..") else name


def remove_writer_dir(path: Path) -> None:
    """Remove an emptied writer directory and its empty parents (best effort)."""
    for name in (META, LOCK):
        with contextlib.suppress(OSError):
            (path / name).unlink()
    for tmp in path.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            tmp.unlink()
    with contextlib.suppress(OSError):
        path.rmdir()
        parent = path.parent
        for _ in range(3):  # rank-N, run, project
            parent.rmdir()
            parent = parent.parent


def try_lock(path: Path, *, create: bool = False) -> int | None:
    """Take the writer directory ``path``'s lock (``flock`` on ``LOCK``) without waiting:
    the descriptor holding it (closing it drops the lock), -1 where there is no lock to
    take (no ``flock``; no ``LOCK`` file and not ``create``; none that can be opened), or
    None when another process holds it (the job writing it, a push).

    Raises:
        FileNotFoundError: with ``create``, the directory is gone.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return -1
    try:  # made if missing (a spool copied without it): two pushes of it still exclude
        fd = os.open(path / LOCK, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        if create:
            raise
        return -1
    except OSError:  # not ours to write (permissions): a read-only descriptor locks too
        try:
            fd = os.open(path / LOCK, os.O_RDONLY)
        except OSError:
            return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def is_locked(path: Path) -> bool:
    """Whether a live process holds the writer directory ``path``."""
    fd = try_lock(path)
    if fd is None:
        return True
    if fd >= 0:
        os.close(fd)  # closing drops the lock we took
    return False


def find_writer_dirs(path: Path) -> list[Path]:
    """Every directory at or below ``path`` that holds segments, sorted.

    A directory removed while it is listed (another push emptied it) is left out, where
    ``Path.rglob`` raised ``FileNotFoundError``."""
    found = {Path(top) for top, _, names in os.walk(path)
             if any(n.endswith(SUFFIX) and not n.startswith(".tmp-") for n in names)}
    return sorted(found)


def read_meta(path: Path) -> dict[str, Any]:
    """A writer directory's ``meta.json`` (``{}`` if missing or unreadable)."""
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}
