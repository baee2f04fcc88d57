"""The ingest request's models: a batch of frames (:class:`IngestIn`), each one sampled
step of one rank (:class:`FrameIn`) with the every-step scalars before it
(:class:`HistoryIn`), and the bounds one request may carry (:func:`request_limits_problem`).

The frame's values are checked by the one-pass checks of :mod:`.wire_values`;
``server/store/parse.py`` parses the same body faster and falls back on these models for
anything odd, so both accept and refuse alike.
"""

from __future__ import annotations

import time as _time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from logitwatch.server.wire_values import (
    MAX_PROBLEMS,
    MAX_RANK,
    MAX_STEP,
    WireFloat,
    check_heads,
    check_history,
    check_scalars,
)
from logitwatch.wire import (
    MAX_HEADS,
    MAX_HISTORY_SERIES,
    MAX_HISTORY_STEPS,
    MAX_REQUEST_HISTORY_STEPS,
    MAX_SCALARS,
    NAME_RE,
    encode_float,
)

__all__ = [
    "MAX_AHEAD",
    "MAX_REQUEST_RANKS",
    "MAX_REQUEST_RUNS",
    "FrameIn",
    "HistoryIn",
    "IngestIn",
    "request_limits_problem",
]

#: A run, project or series name: 1-128 characters of ``logitwatch.wire.NAME_RE``.
Name = Annotated[str, Field(pattern=NAME_RE.pattern, max_length=128)]
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
