"""What a value on the wire may be, and the one-pass checks of a frame's values.

A float travels as a JSON number or as one of the non-finite strings (:data:`WireFloat`,
see ``logitwatch.wire``); steps and ranks are bounded by what the store keeps. A frame's
``scalars``, ``heads`` and ``history`` are each checked and decoded in one pass
(:func:`check_scalars`, :func:`check_heads`, :func:`check_history`) that names at most
:data:`MAX_PROBLEMS` problems, never one per value: an error per bad value would let a
small body build gigabytes of errors. The ingest models (:mod:`.ingest_schemas`) call them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

from logitwatch.wire import (
    MAX_HEADS,
    MAX_HISTORY_SERIES,
    MAX_HISTORY_STEPS,
    MAX_MATRIX_VALUES,
    MAX_SCALARS,
    NAME_RE,
    NONFINITE,
    decode_float,
    encode_float,
)

__all__ = [
    "MAX_PROBLEMS",
    "MAX_RANK",
    "MAX_STEP",
    "WireFloat",
    "check_heads",
    "check_history",
    "check_scalars",
]

#: A float that travels as a JSON number or as "NaN" / "Infinity" / "-Infinity".
WireFloat = Annotated[
    float, BeforeValidator(decode_float), PlainSerializer(encode_float, return_type=Any)
]
#: Bounds of integers the store keeps (64-bit columns; ranks fit 32 bits).
MAX_STEP = 2**62
MAX_RANK = 1_000_000
#: How many problems one refusal of a history names at most (not one per value).
MAX_PROBLEMS = 3


def _history_value(v: Any) -> float | None:
    if v is None:
        return None
    return _wire_value(v)  # an int too large for a float is a ValueError, not a 500


def check_history(data: Any) -> dict[str, Any]:
    """Check and decode a frame's ``history`` (see ``logitwatch.wire``) in one pass.

    Returns ``{"steps": [int], "scalars": {name: [float | None]}}``. Raises one
    ``ValueError`` naming at most :data:`MAX_PROBLEMS` problems, the first one per series,
    so a history of 65,536 bad values costs one short error, not 65,536 of them. The
    bound on the frame's own ``step`` is :class:`FrameIn`'s check.
    """
    if not isinstance(data, dict):
        raise ValueError('must be an object {"steps": [...], "scalars": {...}}')
    extra = sorted(str(k)[:40] for k in data if k not in ("steps", "scalars"))
    if extra:
        raise ValueError(f"unknown fields {extra[:MAX_PROBLEMS]}; only steps and scalars")
    steps, scalars = data.get("steps"), data.get("scalars", {})
    if not isinstance(steps, list):
        raise ValueError("steps: " + ("must be a list of steps" if "steps" in data
                                      else "missing (a list of steps)"))
    if len(steps) > MAX_HISTORY_STEPS:
        raise ValueError(f"steps: {len(steps)} steps, at most {MAX_HISTORY_STEPS}")
    if not isinstance(scalars, dict):
        raise ValueError("scalars: must be an object {name: [values]}")
    if len(scalars) > MAX_HISTORY_SERIES:
        raise ValueError(f"scalars: {len(scalars)} series, at most {MAX_HISTORY_SERIES}")
    problems: list[str] = []
    prev = -1
    for i, s in enumerate(steps):
        if type(s) is not int or not 0 <= s <= MAX_STEP:
            problems.append(f"steps.{i}: {repr(s)[:40]} is not an int in [0, 2**62]")
        elif s <= prev:
            problems.append(f"steps.{i}: {s} does not follow {prev} "
                            "(steps must be strictly increasing)")
        if len(problems) >= MAX_PROBLEMS:
            break
        prev = s if type(s) is int else prev
    out: dict[str, list[float | None]] = {}
    for name, values in scalars.items():
        if len(problems) >= MAX_PROBLEMS:
            break
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(f"scalars: name {str(name)[:140]!r} is not 1-128 "
                            "characters of [A-Za-z0-9._:-]")
            continue
        if not isinstance(values, list) or len(values) != len(steps):
            n = len(values) if isinstance(values, list) else "no"
            problems.append(f"scalars.{name}: {n} values for {len(steps)} steps "
                            "(one value or null per step)")
            continue
        try:
            out[name] = [_history_value(v) for v in values]
        except ValueError:
            j = next(j for j, v in enumerate(values) if not _history_value_ok(v))
            problems.append(f"scalars.{name}.{j}: expected a number, null or one "
                            f"of {sorted(NONFINITE)}, got {str(values[j])[:40]!r}")
    if problems:
        raise ValueError("; ".join(problems[:MAX_PROBLEMS]))
    return {"steps": steps, "scalars": out}


def _history_value_ok(v: Any) -> bool:
    try:
        _history_value(v)
    except ValueError:
        return False
    return True


def _show(v: Any) -> str:
    """A short, safe rendering of a bad input value for an error message."""
    return repr(v)[:40] if not isinstance(v, (dict, list)) else type(v).__name__


def _wire_value(v: Any) -> float:
    """A wire float (a JSON number, or a non-finite string); ValueError for anything else."""
    t = type(v)
    if t is float:
        return v  # type: ignore[no-any-return]
    if t is int:
        try:
            return float(v)
        except OverflowError:
            raise ValueError from None
    if t is str and v in NONFINITE:
        return NONFINITE[v]
    raise ValueError


_EXPECTED = f"expected a number or one of {sorted(NONFINITE)}"


def check_scalars(data: Any) -> dict[str, float]:
    """Check and decode a frame's ``scalars`` in one pass, as :func:`check_history` does:
    one ``ValueError`` naming at most :data:`MAX_PROBLEMS` problems, never one per value."""
    if not isinstance(data, dict):
        raise ValueError("must be an object {name: number}")
    if len(data) > MAX_SCALARS:
        raise ValueError(f"{len(data)} scalars, at most {MAX_SCALARS}")
    out: dict[str, float] = {}
    problems: list[str] = []
    for name, v in data.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(f"name {str(name)[:140]!r} is not 1-128 characters of "
                            "[A-Za-z0-9._:-]")
        else:
            try:
                out[name] = _wire_value(v)
            except ValueError:
                problems.append(f"{name}: {_EXPECTED}, got {_show(v)}")
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise ValueError("; ".join(problems))
    return out


def _check_matrix(rows: Any) -> list[list[float]]:
    """One layers x heads matrix, decoded; ValueError naming its first problem."""
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], list) or not rows[0]:
        raise ValueError("is empty or not a list of lists; send a layers x heads matrix")
    width = len(rows[0])
    if len(rows) * width > MAX_MATRIX_VALUES:
        raise ValueError(f"has more than {MAX_MATRIX_VALUES} values")
    out: list[list[float]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width:
            raise ValueError(f"is not rectangular (layers x heads): row {i} is not a list "
                             f"of {width} values")
        try:
            out.append([_wire_value(x) for x in row])
        except ValueError:
            j = next(j for j, x in enumerate(row) if not _wire_value_ok(x))
            raise ValueError(f"{i}.{j}: {_EXPECTED}, got {_show(row[j])}") from None
    return out


def _wire_value_ok(v: Any) -> bool:
    try:
        _wire_value(v)
    except ValueError:
        return False
    return True


def check_heads(data: Any) -> dict[str, list[list[float]]]:
    """Check and decode a frame's ``heads`` in one pass: one ``ValueError`` naming at most
    :data:`MAX_PROBLEMS` problems (the first one per matrix), never one per value, so a
    matrix of 65,536 booleans costs one short error."""
    if not isinstance(data, dict):
        raise ValueError("must be an object {name: [[per head] per layer]}")
    if len(data) > MAX_HEADS:
        raise ValueError(f"{len(data)} matrices, at most {MAX_HEADS}")
    out: dict[str, list[list[float]]] = {}
    problems: list[str] = []
    for name, rows in data.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(f"name {str(name)[:140]!r} is not 1-128 characters of "
                            "[A-Za-z0-9._:-]")
        else:
            try:
                out[name] = _check_matrix(rows)
            except ValueError as e:
                problems.append(f"{name}: {e}")
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise ValueError("; ".join(problems))
    return out
