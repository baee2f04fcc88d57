"""Pydantic request/response models (separate from the SQLAlchemy tables)."""

from __future__ import annotations

import math
import time as _time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from logitwatch.wire import (
    MAX_HEADS,
    MAX_HISTORY_SERIES,
    MAX_HISTORY_STEPS,
    MAX_MATRIX_VALUES,
    MAX_REQUEST_HISTORY_STEPS,
    MAX_SCALARS,
    NAME_RE,
    NONFINITE,
    decode_float,
    encode_float,
)

__all__ = [
    "AlertOut",
    "DeletedOut",
    "FrameIn",
    "HeatmapOut",
    "HistoryIn",
    "IngestIn",
    "IngestOut",
    "MAX_REQUEST_HISTORY_STEPS",
    "MAX_REQUEST_RANKS",
    "MAX_REQUEST_RUNS",
    "MetricOut",
    "RunOut",
    "SeriesOut",
    "WireFloat",
    "request_limits_problem",
]

#: A float that travels as a JSON number or as "NaN" / "Infinity" / "-Infinity".
WireFloat = Annotated[
    float, BeforeValidator(decode_float), PlainSerializer(encode_float, return_type=Any)
]
Name = Annotated[str, Field(pattern=NAME_RE.pattern, max_length=128)]
#: Bounds of integers the store keeps (64-bit columns; ranks fit 32 bits).
MAX_STEP = 2**62
MAX_RANK = 1_000_000
#: How far a frame's ``time`` may be ahead of the collector's clock (seconds).
MAX_AHEAD = 86_400.0
#: Most history steps (summed over its frames) and most distinct runs one ingest request may
#: carry: what one request makes the store do under the ingest lock stays a few seconds.
#: The client never comes near them: a batch is at most 256 frames (``max_batch``) of one
#: run, and with the default hooks a frame's history is at most ~50 steps (a frame at least
#: every 50 steps, a flush every 10), so a full batch carries at most ~13,000.
MAX_REQUEST_RUNS = 1_000
#: Most distinct (run, rank) pairs one ingest request may carry: the alert engine rebuilds
#: the state of each pair it does not hold from the store, under the ingest lock (a batch
#: of 10,000 ranks held it 10-15 s, and every other job's ingest waited). A client's batch
#: is one rank of one run.
MAX_REQUEST_RANKS = 1_000


#: A history value: a wire float, or null where the step did not measure the series.
HistoryValue = Annotated[
    float | None,
    PlainSerializer(lambda x: None if x is None else encode_float(x), return_type=Any),
]
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


class HistoryIn(BaseModel):
    """The every-step scalars of the steps between a (run, rank)'s previous frame and this
    one (see ``logitwatch.wire``); checked by :func:`check_history`."""

    model_config = ConfigDict(extra="forbid")

    steps: list[int] = Field(max_length=MAX_HISTORY_STEPS)
    scalars: dict[Name, list[HistoryValue]] = Field(default_factory=dict,
                                                     max_length=MAX_HISTORY_SERIES)

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        return data if isinstance(data, HistoryIn) else check_history(data)


class FrameIn(BaseModel):
    """One sampled step of one rank (see ``logitwatch.wire``)."""

    model_config = ConfigDict(extra="forbid")

    run: Name
    project: Name = "default"
    # Strict: a JSON integer (not true/false, not "7"); time a JSON number (not a string).
    rank: StrictInt = Field(0, ge=0, le=MAX_RANK)
    seq: StrictInt = Field(ge=0, le=MAX_STEP)
    step: StrictInt = Field(ge=0, le=MAX_STEP)
    time: StrictFloat = Field(allow_inf_nan=False, ge=0, description="Unix seconds; at most "
                        "MAX_AHEAD (a day) ahead of the collector's clock.")
    scalars: dict[Name, WireFloat] = Field(default_factory=dict, max_length=MAX_SCALARS)
    heads: dict[Name, list[list[WireFloat]]] = Field(default_factory=dict,
                                                     max_length=MAX_HEADS)
    history: HistoryIn | None = None
    end: Literal["finished"] | None = Field(
        None, description="An end frame: the job ended normally after `step` (its last "
        "step); it carries no scalars, heads or history.")

    # Scalars and matrices are checked in one pass each (check_scalars, check_heads): an
    # error per bad value would let a small body build gigabytes of errors.
    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.keys() <= _FRAME_FIELDS:
            extra = [k for k in data if k not in _FRAME_FIELDS]
            raise ValueError(f"unknown field(s) {[str(k)[:40] for k in extra[:MAX_PROBLEMS]]}"
                             f" ({len(extra)} in all); a frame has "
                             f"{', '.join(sorted(_FRAME_FIELDS))}")
        return data

    @field_validator("scalars", mode="wrap")
    @classmethod
    def _scalars(cls, v: Any, _: Any) -> dict[str, float]:
        return check_scalars(v)

    @field_validator("heads", mode="wrap")
    @classmethod
    def _heads(cls, v: Any, _: Any) -> dict[str, list[list[float]]]:
        return check_heads(v)

    @field_validator("time")
    @classmethod
    def _not_ahead(cls, v: float) -> float:
        now = _time.time()
        if v > now + MAX_AHEAD:
            raise ValueError(f"{v:.6g} is more than a day ahead of the collector's clock "
                             f"({now:.0f}); send unix seconds (a run would look active for "
                             "ever)")
        return v

    @model_validator(mode="after")
    def _history_before_step(self) -> FrameIn:
        h = self.history
        if h is not None and h.steps and h.steps[-1] >= self.step:
            raise ValueError(f"history.steps: the last step {h.steps[-1]} is not before "
                             f"the frame's step {self.step}")
        return self

    @model_validator(mode="after")
    def _end_frame_is_empty(self) -> FrameIn:
        if self.end is not None and (self.scalars or self.heads or self.history is not None):
            raise ValueError("end: an end frame carries no scalars, heads or history (send "
                             "them in a frame of their own before it)")
        return self


_FRAME_FIELDS = frozenset(FrameIn.model_fields)


class IngestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.keys() <= {"frames"}:
            extra = [str(k)[:40] for k in data if k != "frames"]
            raise ValueError(f"unknown field(s) {extra[:MAX_PROBLEMS]} ({len(extra)} in all);"
                             " a batch is {\"frames\": [...]}")
        return data

    frames: list[FrameIn] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _request_limits(self) -> IngestIn:
        problem = request_limits_problem(self.frames)
        if problem:
            raise ValueError(problem)
        return self


def request_limits_problem(frames: list[FrameIn]) -> str | None:
    """What makes a batch of valid ``frames`` more than one request may carry
    (:data:`MAX_REQUEST_HISTORY_STEPS`, :data:`MAX_REQUEST_RUNS`,
    :data:`MAX_REQUEST_RANKS`), or None."""
    steps = sum(len(f.history.steps) for f in frames if f.history is not None)
    if steps > MAX_REQUEST_HISTORY_STEPS:
        return (f"frames: {steps} history steps in all, at most {MAX_REQUEST_HISTORY_STEPS} "
                "a request; send the frames in smaller batches")
    runs = len({(f.project, f.run) for f in frames})
    if runs > MAX_REQUEST_RUNS:
        return (f"frames: {runs} distinct runs, at most {MAX_REQUEST_RUNS} a request; send "
                "the frames in smaller batches")
    ranks = len({(f.project, f.run, f.rank) for f in frames})
    if ranks > MAX_REQUEST_RANKS:
        return (f"frames: {ranks} distinct (run, rank) pairs, at most {MAX_REQUEST_RANKS} a "
                "request; send the frames in smaller batches (one per rank, as the client "
                "does)")
    return None


class AlertOut(BaseModel):
    id: int
    run_id: int
    run: str
    project: str
    rule: str
    metric: str
    severity: str
    state: str
    rank: int
    layer: int | None
    head: int | None
    started_step: int
    fired_step: int
    fired_at: float
    paged_step: int | None = Field(
        None, description="The step at which the alert first became warning or critical: "
        "its fired_step when it fired so, the escalation step when an info alert was "
        "escalated; null for info that never was.")
    resolved_step: int | None
    value: WireFloat | None
    baseline: WireFloat | None
    threshold: WireFloat | None
    message: str
    evidence: dict[str, Any]
    remedies: list[str]
    heads: list[int] | None = None
    suppressed: str | None = None
    acked_at: float | None = None
    acked_by: str | None = None
    fired_layer: int | None = Field(
        None, description="The layer it fired on: `layer`, or for an alert over every head "
        "the layer holding the max (`evidence.at_layer`); null for a run-level alert.")
    fired_heads: list[int] | None = Field(
        None, description="The heads it fired on, sorted (kept when it fired: `heads` "
        "grows as more heads breach while it is open); for an alert over every head, the "
        "head holding the max (`evidence.at_head`); null for a run-level alert.")
    fuses: list[dict[str, Any]] | None = Field(
        None, description="The fuses that address this alert (kept when it fired), each "
        "`{fuse, job, control, actions, apply}`: the job's state of it (`suggesting`, "
        "`acting`, `off`, `unavailable`; null: the job never said it has it), what a person "
        "last asked (`apply`/`undo`, `POST /runs/{run}/fuses`), those actions, and the "
        "control that applies it (docs/FUSES.md).")


class IngestOut(BaseModel):
    accepted: int
    duplicates: int
    alerts: list[AlertOut]
    control: dict[str, Any]


class RunOut(BaseModel):
    id: int
    project: str
    name: str
    created_at: float
    last_step: int | None
    last_time: float | None = Field(None, description="The newest frame's time, as its job "
                                    "stamped it (the job's clock).")
    seen_at: float | None = Field(None, description="When the collector last received a "
                                  "frame of it, by the collector's clock: what `active` and "
                                  "the no_data rule read.")
    first_time: float | None = Field(None, description="Its first frame's time, as its job "
                                     "stamped it: with `last_time` or `ended_at`, how long "
                                     "it ran by one clock, the job's.")
    open_alerts: int
    last_frame_id: int = Field(0, description="Pass as the live stream's `after`.")
    status: str = Field(
        "running", description="`running`; `finished` (its job said it ended); `stopped` "
        "(no frame for the no_data rule's seconds without having finished: hung or "
        "crashed); `diverged` (a run-level divergence alert, loss_nonfinite or loss_jump, "
        "paged on it; whatever came after).")
    active: bool = Field(False, description="A frame received within run_active_seconds "
                         "(by the collector's clock).")
    ended_at: float | None = Field(None, description="When its job said it ended (the end "
                                   "frame's time); null until then and once resumed.")
    end_step: int | None = Field(None, description="Its last step, as its job said when "
                                 "it ended; null until then and once resumed.")
    diverged_step: int | None = Field(None, description="The step at which it diverged "
                                      "(the fired_step of the first run-level divergence "
                                      "alert that paged).")
    tags: list[str] = Field(default_factory=list, description="Labels (`logitwatch runs tag`).")
    config: dict[str, Any] | None = Field(None, description="What its job says about itself "
                                          "(`PUT /api/v1/runs/{run}/config`); null until set.")


class MetricOut(BaseModel):
    name: str
    kind: str
    layers: int
    heads: int


class SeriesOut(BaseModel):
    name: str
    rank: int | None = Field(description="The rank read; null when ranks are merged.")
    merge: str | None = Field(None, description="How ranks were merged at each step, if so.")
    layer: int | None = None
    head: int | None = None
    total: int = Field(description="Points in the range before downsampling.")
    steps: list[int]
    values: list[WireFloat]


class HeatmapOut(BaseModel):
    name: str
    rank: int
    step: int | None = Field(description="The step shown; with `agg`, the last step read.")
    values: list[list[WireFloat]]
    agg: str | None = Field(None, description="How the steps were reduced, with `agg`.")
    first_step: int | None = Field(None, description="With `agg`: the first step read.")
    frames: int = Field(1, description="Frames reduced into this matrix.")


class DeletedOut(BaseModel):
    """What ``DELETE /api/v1/runs/{id}`` removed."""

    run_id: int
    name: str
    project: str
    frames: int
    points: int


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
