"""The ingest body, parsed and validated fast, with pydantic's answers for anything odd.

``POST /api/v1/ingest`` carries ~1,600 numbers per frame. Validating each through a Python
callback costs more than storing it, so :func:`parse_ingest` takes a fast path: orjson
parses the body, each layer x head matrix becomes one numpy array in a single C call, and
the few per-frame fields are checked explicitly. The fast path only *accepts*: whenever a
body is anything but plainly valid (a non-finite string, a boolean anywhere, a ragged
matrix, a float where an int belongs, bad JSON...) it hands the body to the pydantic model
:class:`~logitwatch.server.schemas.IngestIn`, which accepts or refuses it exactly as
before, with the same 422 that names the field. So the fast path can never accept what
the model refuses, and every refusal reads the same.
"""

from __future__ import annotations

import json
import re
import time as _time
from typing import Any

import numpy as np
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from logitwatch.server.schemas import (
    MAX_AHEAD,
    MAX_RANK,
    MAX_STEP,
    FrameIn,
    HistoryIn,
    IngestIn,
    request_limits_problem,
)
from logitwatch.wire import MAX_HISTORY_SERIES, MAX_HISTORY_STEPS, NONFINITE

try:  # orjson is in the server extra; the stdlib parser is the fallback
    import orjson

    _loads: Any = orjson.loads
    _FastError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - depends on the install
    _loads = json.loads
    _FastError = ValueError

__all__ = ["ingest_openapi_body", "parse_ingest"]

_NAME = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_KEYS = frozenset(FrameIn.model_fields)
_REQUIRED = frozenset({"run", "seq", "step", "time"})
_MAX_FRAMES = 10_000
_MAX_MATRIX = 65_536


class _Slow(Exception):
    """The fast path is not sure: let the pydantic model decide."""


def parse_ingest(body: bytes, content_type: str | None) -> IngestIn:
    """Parse and validate an ingest body; raise ``RequestValidationError`` (422, the field
    named, as FastAPI would) when it is invalid.

    Per-head matrices of the result may be float64 ``numpy`` arrays (fast path) or lists
    of lists (pydantic path); the store accepts both.
    """
    if not _is_json(content_type):
        raise RequestValidationError([{
            "type": "model_attributes_type", "loc": ("body",),
            "msg": "Input should be a valid dictionary or object to extract fields from "
                   "(send Content-Type: application/json)",
            "input": None,
        }])
    if not body:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    # A boolean anywhere may hide in a matrix, where numpy would read it as 1.0.
    if b"true" not in body and b"false" not in body:
        try:
            return _fast(_loads(body))
        except (_Slow, _FastError, ValueError, TypeError, OverflowError):
            pass
    return _slow(body)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/")
                                          and main.endswith("+json"))


def _slow(body: bytes) -> IngestIn:
    """What FastAPI does with a pydantic body parameter, errors included, except that
    frames are validated one at a time and only the first :data:`MAX_ERRORS` errors are
    kept (with the count of all of them): a body of 10,000 bad frames costs one frame's
    errors in memory, and its answer stays small."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body",), "input": {},
            "msg": "JSON decode error: nested too deeply (a frame is at most 4 levels "
                   "deep)",
        }]) from None
    except json.JSONDecodeError as e:
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
            "input": {}, "ctx": {"error": e.msg},
        }]) from None
    except UnicodeDecodeError as e:
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body",), "msg": f"JSON decode error: {e.reason}",
            "input": {},
        }]) from None
    except ValueError as e:  # an integer past Python's 4,300 digits (a plain ValueError)
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body",), "input": {},
            "msg": f"JSON decode error: a number has too many digits ({e}); send numbers as "
                   "floats or ints of at most 19 digits",
        }]) from None
    frames = data.get("frames") if type(data) is dict else None
    if type(frames) is not list or not 1 <= len(frames) <= _MAX_FRAMES or len(data) != 1:
        return _validate(IngestIn, data, ())  # one error about the batch itself
    errors: list[dict[str, Any]] = []
    count = 0
    good: list[FrameIn] = []
    for i, f in enumerate(frames):
        try:
            good.append(FrameIn.model_validate(f))
        except ValidationError as e:
            count += e.error_count()
            if len(errors) < MAX_ERRORS:
                errors += [{**err, "loc": ("body", "frames", i, *err["loc"])}
                           for err in e.errors(include_url=False, include_input=False)]
    if errors:
        raise TooManyErrors(errors[:MAX_ERRORS], count)
    return _validate(IngestIn, {"frames": good}, ())  # the per-request limits


#: Errors one refusal lists at most (the answer says how many there were in all).
MAX_ERRORS = 10


class TooManyErrors(RequestValidationError):
    """A 422 that lists the first :data:`MAX_ERRORS` errors and counts all of them."""

    def __init__(self, errors: list[dict[str, Any]], count: int) -> None:
        super().__init__(errors)
        self.count = count


def _validate(model: Any, data: Any, loc: tuple[Any, ...]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *loc, *err["loc"])}
                  for err in e.errors(include_url=False, include_input=False)[:MAX_ERRORS]]
        raise TooManyErrors(errors, e.error_count()) from None


def _int(v: Any, hi: int) -> int:
    if type(v) is not int or not 0 <= v <= hi:
        raise _Slow
    return v


def _name(v: Any) -> str:
    if type(v) is not str or _NAME.fullmatch(v) is None:
        raise _Slow
    return v


def _float(v: Any) -> float:
    t = type(v)
    if t is float:
        return v  # type: ignore[no-any-return]
    if t is int:
        return float(v)
    if t is str and v in NONFINITE:
        return NONFINITE[v]
    raise _Slow


def _matrix(v: Any) -> np.ndarray:
    if type(v) is not list or not v:
        raise _Slow
    a = np.array(v)  # ragged -> ValueError; strings, None, dicts -> another dtype
    if a.ndim != 2 or a.dtype.kind not in "fi" or not 0 < a.size <= _MAX_MATRIX:
        raise _Slow
    return a.astype(np.float64, copy=False)


def _history_values(v: Any, n: int) -> list[float | None]:
    """One history series: ``n`` numbers in one C call, or (nulls, non-finite strings)
    value by value."""
    if type(v) is not list or len(v) != n:
        raise _Slow
    if not n:
        return []
    a = np.array(v)
    if a.ndim == 1 and a.dtype.kind in "fi":
        return a.astype(np.float64, copy=False).tolist()  # type: ignore[no-any-return]
    out: list[float | None] = []
    for x in v:
        t = type(x)
        if x is None:
            out.append(None)
        elif t is float:
            out.append(x)
        elif t is int:
            out.append(float(x))
        elif t is str and x in NONFINITE:
            out.append(NONFINITE[x])
        else:
            raise _Slow
    return out


def _history(v: Any, step: int) -> HistoryIn | None:
    """A frame's ``history`` (see ``logitwatch.wire``): checked as the model checks it."""
    if v is None:
        return None
    if type(v) is not dict or "steps" not in v or not v.keys() <= {"steps", "scalars"}:
        raise _Slow
    steps, scalars = v["steps"], v.get("scalars", {})
    if type(steps) is not list or len(steps) > MAX_HISTORY_STEPS:
        raise _Slow
    if type(scalars) is not dict or len(scalars) > MAX_HISTORY_SERIES:
        raise _Slow
    n = len(steps)
    if n:
        a = np.array(steps)  # floats, strings, nesting, ints beyond int64: another dtype
        if a.ndim != 1 or a.dtype.kind != "i" or a[0] < 0 or a[-1] >= step:
            raise _Slow
        if n > 1 and not bool((a[1:] > a[:-1]).all()):
            raise _Slow
    return HistoryIn.model_construct(
        steps=steps,
        scalars={_name(k): _history_values(x, n) for k, x in scalars.items()},
    )


def _frame(d: Any) -> FrameIn:
    if type(d) is not dict or not _REQUIRED <= d.keys() or not d.keys() <= _KEYS:
        raise _Slow
    if "end" in d:  # an end frame (one per job): the model checks it
        raise _Slow
    time = d["time"]
    if type(time) is int:
        time = float(time)
    if type(time) is not float or not 0 <= time <= _time.time() + MAX_AHEAD:
        raise _Slow  # NaN and infinities too
    scalars = d.get("scalars", {})
    heads = d.get("heads", {})
    if type(scalars) is not dict or len(scalars) > 256:
        raise _Slow
    if type(heads) is not dict or len(heads) > 64:
        raise _Slow
    step = _int(d["step"], MAX_STEP)
    return FrameIn.model_construct(
        _fields_set=set(d),
        run=_name(d["run"]),
        project=_name(d["project"]) if "project" in d else "default",
        rank=_int(d["rank"], MAX_RANK) if "rank" in d else 0,
        seq=_int(d["seq"], MAX_STEP),
        step=step,
        time=time,
        scalars={_name(k): _float(v) for k, v in scalars.items()},
        heads={_name(k): _matrix(v) for k, v in heads.items()},
        history=_history(d.get("history"), step),
    )


def _fast(data: Any) -> IngestIn:
    if type(data) is not dict or data.keys() != {"frames"}:
        raise _Slow
    frames = data["frames"]
    if type(frames) is not list or not 1 <= len(frames) <= _MAX_FRAMES:
        raise _Slow
    good = [_frame(f) for f in frames]
    if request_limits_problem(good):
        raise _Slow  # the model's 422 names the limit
    return IngestIn.model_construct(frames=good)


def ingest_openapi_body() -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of the ingest route: the :class:`IngestIn` schema, with
    its definitions inlined (the route reads the raw body itself)."""
    schema = IngestIn.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {"required": True,
            "content": {"application/json": {"schema": inline(schema)}}}
