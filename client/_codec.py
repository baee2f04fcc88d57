"""Frames in memory and on the wire: packed on the training thread, encoded off it.

:func:`pack` runs inside :meth:`Client.send` and does only what must happen there: copy
the caller's numbers (so later mutation cannot change a queued frame) into compact
``array('d')`` buffers (8 bytes a value instead of a 24-byte float object plus a list
slot), and check names and shapes, because one bad metric would make the collector refuse
its whole batch. :func:`encode` runs on the sender or spooler thread and produces the JSON
line of ``logitwatch/wire.py``: finite values as JSON numbers, NaN and ±Inf as the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

A frame's ``history`` (the scalars of the unsampled steps before it) is copied the same
way: its steps into an ``array('q')``, each series into a list of floats and ``None``.

Per-head matrices are the bulk of a frame, and the collector stores them as float32, so
their values are written with 9 significant digits (``%.9g``: every float32 survives the
round trip exactly) in one C-level format call per matrix: a third of the CPU of
``json.dumps``'s shortest double repr, and 11 bytes a value instead of 19. Scalars and
``time`` keep full double precision. Checking a matrix for non-finite values costs one
``sum`` (the sum of finite values is finite unless it overflows, which only sends the
matrix down the slower, still exact, per-value path).
"""

from __future__ import annotations

import json
import marshal
import time as _time
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from logitwatch.wire import (
    MAX_HEADS,
    MAX_HISTORY_SERIES,
    MAX_HISTORY_STEPS,
    MAX_MATRIX_VALUES,
    MAX_SCALARS,
    NAME_RE,
    encode_float,
)

__all__ = ["NameBudget", "Packed", "Queued", "encode", "freeze", "pack", "thaw"]

#: The bounds the collector enforces on a frame (see ``server/schemas.py``): a frame past
#: one of them would make it refuse the whole batch, so pack() leaves out what is past.
MAX_STEP = 2**62
MAX_VALUES = MAX_MATRIX_VALUES
MAX_AHEAD = 86_400.0  # seconds a frame's time may be ahead of the clock
_FRAME_OVERHEAD = 200  # bytes counted for a frame besides its values
_METRIC_OVERHEAD = 64

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_good_names: set[str] = set()


#: A packed history: its steps and, per series, one value or None per step.
History = tuple["array[int]", dict[str, list[float | None]]]


class Packed:
    """One frame as it waits in memory (``seq`` is set when it is queued)."""

    __slots__ = ("end", "heads", "history", "nbytes", "scalars", "seq", "step", "time")

    def __init__(self, step: int, time: float, scalars: dict[str, float],
                 heads: dict[str, tuple[int, array[float]]], nbytes: int,
                 history: History | None = None) -> None:
        self.seq = -1
        self.step = step
        self.time = time
        self.scalars = scalars
        self.heads = heads
        self.nbytes = nbytes
        self.history = history
        self.end: str | None = None  # "finished": an end frame (no scalars, heads, history)


class NameBudget:
    """The distinct metric names a run has sent, up to ``limit`` (the collector's
    ``max_metrics_per_run``): past it, the collector refuses every frame that brings a new
    name, its loss with it, so pack() leaves such names out instead (and says so)."""

    __slots__ = ("limit", "names")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.names: set[str] = set()

    def admit(self, name: str) -> bool:
        names = self.names
        if name in names:
            return True
        if len(names) >= self.limit:
            return False
        names.add(name)
        return True


#: A frame as it waits in the queue: ``(seq, nbytes, blob)``, the blob :func:`freeze`'s.
#: A tuple of an int, an int and a bytes object is no work for the garbage collector
#: (CPython stops tracking such a tuple at its first collection), where a Packed frame is
#: ~8 tracked objects: 10,000 queued frames made each full collection, run on whatever
#: thread allocates (the training thread's send() too), take tens of milliseconds.
Queued = tuple[int, int, bytes]


def freeze(frame: Packed) -> bytes:
    """``frame`` as one bytes object (marshal: a few µs; the sender thaws it)."""
    history = None
    if frame.history is not None:
        steps, series = frame.history
        history = (steps.tobytes(), series)
    return marshal.dumps((frame.step, frame.time, frame.scalars,
                          {k: (w, buf.tobytes()) for k, (w, buf) in frame.heads.items()},
                          history, frame.end, frame.nbytes))


def thaw(queued: Queued) -> Packed:
    """The :class:`Packed` frame of a queued one (its ``seq`` set)."""
    step, t, scalars, heads, history, end, nbytes = marshal.loads(queued[2])
    hd: dict[str, tuple[int, array[float]]] = {}
    for k, (w, raw) in heads.items():
        buf = array("d")
        buf.frombytes(raw)
        hd[k] = (w, buf)
    hist: History | None = None
    if history is not None:
        steps = array("q")
        steps.frombytes(history[0])
        hist = (steps, history[1])
    frame = Packed(step, t, scalars, hd, nbytes, hist)
    frame.end = end
    frame.seq = queued[0]
    return frame


def _plain(name: Any) -> Any:
    """A metric name as a plain ``str``: a subclass (``numpy.str_``, a ``str`` Enum) is
    kept as its characters, which marshal and JSON carry as any str; anything else is
    returned as it is (and refused by :func:`_name_ok`)."""
    return str.__str__(name) if isinstance(name, str) and type(name) is not str else name


def _name_ok(name: object) -> bool:
    if name in _good_names:
        return True
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return False
    if len(_good_names) < 4096:
        _good_names.add(name)
    return True


def _pack_history(history: Mapping[str, Any], step: int, problems: list[str],
                  budget: NameBudget | None = None) -> tuple[History | None, int]:
    """Copy a history (see ``logitwatch.wire``); return it (None: left out) and its bytes.

    A bad series is left out, a bad ``steps`` leaves the whole history out; beyond
    :data:`MAX_HISTORY_STEPS` steps the newest are kept (each case noted in ``problems``).
    """
    try:
        steps = array("q", history["steps"])
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        problems.append(f"history left out: steps must be a list of ints ({e})")
        return None, 0
    if not steps:
        return None, 0
    if not (0 <= steps[0] and steps[-1] < step
            and all(a < b for a, b in zip(steps[:-1], steps[1:], strict=True))):
        problems.append(f"history left out: steps must be strictly increasing ints in "
                        f"[0, {step}) (the frame's step)")
        return None, 0
    cut = max(0, len(steps) - MAX_HISTORY_STEPS)
    if cut:
        problems.append(f"history: the oldest {cut} of {len(steps)} steps left out (at most "
                        f"{MAX_HISTORY_STEPS})")
        steps = steps[cut:]
    n = len(steps)
    series: dict[str, list[float | None]] = {}
    given = history.get("scalars") or {}
    if not isinstance(given, Mapping):
        problems.append("history left out: scalars must be a mapping of name -> list")
        return None, 0
    for k, values in given.items():
        k = _plain(k)
        if len(series) == MAX_HISTORY_SERIES:
            problems.append(f"history: series beyond {MAX_HISTORY_SERIES} left out ({k!r}...)")
            break
        if not _name_ok(k):
            problems.append(f"history: name {k!r} is not 1-128 characters of [A-Za-z0-9._:-]")
            continue
        try:
            copy = [None if v is None else float(v) for v in values]
        except (TypeError, ValueError, OverflowError):
            copy = []
        if len(copy) != n + cut:
            problems.append(f"history[{k!r}] must hold one number or None per step")
            continue
        if budget is not None and not budget.admit(k):
            problems.append(_over_budget(budget, k))
            continue
        series[k] = copy[cut:]
    if not series:
        return None, 0
    nbytes = (1 + len(series)) * (_METRIC_OVERHEAD + 8 * n)
    return (steps, series), nbytes


def pack(
    step: int,
    scalars: Mapping[str, float],
    heads: Mapping[str, Sequence[Sequence[float]]],
    time: float | None,
    history: Mapping[str, Any] | None = None,
    budget: NameBudget | None = None,
) -> tuple[Packed, list[str]]:
    """Copy one frame into compact buffers; return it and the problems found.

    A problem with one metric (a bad name, a value that is not a number, a matrix that is
    not layers x heads of numbers or has more than 65,536 values, a scalar past the 256th
    or a matrix past the 64th of the frame, a new name past the run's ``budget``) drops
    that metric only and is described in the returned list; so does one with the history.
    Each problem starts with its cause. A name that is a ``str`` subclass (``numpy.str_``,
    a ``str`` Enum) is kept as a plain ``str``.

    Raises:
        ValueError: the frame itself is unusable (step not an int in [0, 2**62]).
    """
    if isinstance(step, bool) or not isinstance(step, int):
        step = int(step)  # numpy / torch integers
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be an int in [0, 2**62], got {step!r}")
    now = _time.time()
    t = now if time is None else float(time)
    problems: list[str] = []
    if not 0.0 <= t <= now + MAX_AHEAD:  # NaN too
        if t == t and t > 0:
            problems.append(f"time {t:.6g} is more than a day ahead of this clock (now used;"
                            " the collector refuses it)")
        t = now
    sc: dict[str, float] = {}
    for k, v in scalars.items():
        k = _plain(k)
        if not _name_ok(k):
            problems.append(f"scalar name {k!r} is not 1-128 characters of [A-Za-z0-9._:-]")
        elif len(sc) == MAX_SCALARS:
            problems.append(f"scalars past the {MAX_SCALARS}th of a frame left out "
                            f"({len(scalars) - MAX_SCALARS} or more, from {k!r})")
            break
        elif budget is not None and not budget.admit(k):
            problems.append(_over_budget(budget, k))
        else:
            try:
                sc[k] = float(v)
            except (TypeError, ValueError, OverflowError):
                problems.append(f"scalar {k!r} left out: {type(v).__name__} is not a number")
    nbytes = _FRAME_OVERHEAD + _METRIC_OVERHEAD * len(sc)
    hd: dict[str, tuple[int, array[float]]] = {}
    for k, rows in heads.items():
        k = _plain(k)
        if not _name_ok(k):
            problems.append(f"metric name {k!r} is not 1-128 characters of [A-Za-z0-9._:-]")
            continue
        if len(hd) == MAX_HEADS:
            problems.append(f"matrices past the {MAX_HEADS}th of a frame left out "
                            f"({len(heads) - MAX_HEADS} or more, from {k!r})")
            break
        buf = array("d")
        width = -1
        ok = True
        try:
            for row in rows:
                before = len(buf)
                buf.extend(row)  # a row of numbers: floats, ints, numpy scalars
                w = len(buf) - before
                if width < 0:
                    width = w
                elif w != width:
                    ok = False
                    break
        except (TypeError, ValueError, OverflowError):  # a 1-D list, a None, a string
            ok = False
        if not ok or width <= 0 or len(buf) > MAX_VALUES:
            problems.append(
                f"heads[{k!r}] must be a non-empty layers x heads matrix of at most "
                f"{MAX_VALUES} values"
            )
            continue
        if budget is not None and not budget.admit(k):
            problems.append(_over_budget(budget, k))
            continue
        hd[k] = (width, buf)
        nbytes += _METRIC_OVERHEAD + 8 * len(buf)
    packed_history = None
    if history is not None:
        packed_history, n = _pack_history(history, step, problems, budget)
        nbytes += n
    return Packed(step, t, sc, hd, nbytes, packed_history), problems


def _over_budget(budget: NameBudget, name: str) -> str:
    return (f"new metric names past the run's {budget.limit} left out (max_metrics; the "
            f"collector's max_metrics_per_run would refuse the frame), e.g. {name!r}")


_formats: dict[tuple[int, int], str] = {}


def _matrix(width: int, buf: array[float]) -> str:
    """A layers x heads matrix as JSON text."""
    total = sum(buf)
    if total - total == 0.0:  # finite: no NaN or ±Inf among the values
        key = (width, len(buf))
        fmt = _formats.get(key)
        if fmt is None:
            row = "[" + ",".join(["%.9g"] * width) + "]"
            fmt = "[" + ",".join([row] * (len(buf) // width)) + "]"
            if len(_formats) < 256:
                _formats[key] = fmt
        return fmt % tuple(buf)
    flat = [encode_float(float(f"{x:.9g}")) for x in buf]
    return _dumps([flat[i:i + width] for i in range(0, len(flat), width)])


def encode(frame: Packed | Queued, run: str, project: str, rank: int) -> bytes:
    """The frame's JSON line (UTF-8, no newline), as in ``logitwatch/wire.py``."""
    if isinstance(frame, tuple):
        frame = thaw(frame)
    if frame.end is not None:  # an end frame: the job ended after ``step``
        return _dumps({"run": run, "project": project, "rank": rank, "seq": frame.seq,
                       "step": frame.step, "time": frame.time, "end": frame.end}).encode()
    scalars = {k: v if v - v == 0.0 else encode_float(v) for k, v in frame.scalars.items()}
    head = _dumps({
        "run": run, "project": project, "rank": rank, "seq": frame.seq, "step": frame.step,
        "time": frame.time, "scalars": scalars,
    })
    # names are checked against NAME_RE in pack(): nothing in them needs JSON escaping
    heads = ",".join(f'"{k}":{_matrix(w, buf)}' for k, (w, buf) in frame.heads.items())
    if frame.history is None:
        return (head[:-1] + ',"heads":{' + heads + "}}").encode()
    steps, series = frame.history
    history = _dumps({"steps": steps.tolist(), "scalars": {
        k: [v if v is None or v - v == 0.0 else encode_float(v) for v in values]
        for k, values in series.items()}})
    return (head[:-1] + ',"heads":{' + heads + '},"history":' + history + "}").encode()
