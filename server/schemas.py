"""Pydantic request/response models (separate from the SQLAlchemy tables)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator

from logitwatch.wire import NAME_RE, decode_float, encode_float

__all__ = [
    "AlertOut",
    "DeletedOut",
    "FrameIn",
    "HeatmapOut",
    "IngestIn",
    "IngestOut",
    "MetricOut",
    "RunOut",
    "SeriesOut",
    "WireFloat",
]

#: A float that travels as a JSON number or as "NaN" / "Infinity" / "-Infinity".
WireFloat = Annotated[
    float, BeforeValidator(decode_float), PlainSerializer(encode_float, return_type=Any)
]
Name = Annotated[str, Field(pattern=NAME_RE.pattern, max_length=128)]
#: Bounds of integers the store keeps (64-bit columns; ranks fit 32 bits).
MAX_STEP = 2**62
MAX_RANK = 1_000_000


class FrameIn(BaseModel):
    """One sampled step of one rank (see ``logitwatch.wire``)."""

    model_config = ConfigDict(extra="forbid")

    run: Name
    project: Name = "default"
    rank: int = Field(0, ge=0, le=MAX_RANK)
    seq: int = Field(ge=0, le=MAX_STEP)
    step: int = Field(ge=0, le=MAX_STEP)
    time: float = Field(allow_inf_nan=False, ge=0)
    scalars: dict[Name, WireFloat] = Field(default_factory=dict, max_length=256)
    heads: dict[Name, list[list[WireFloat]]] = Field(default_factory=dict, max_length=64)

    @field_validator("heads")
    @classmethod
    def _rectangular(cls, v: dict[str, list[list[float]]]) -> dict[str, list[list[float]]]:
        for name, rows in v.items():
            if not rows or not rows[0]:
                raise ValueError(f"heads[{name!r}] is empty; send a layers x heads matrix")
            width = len(rows[0])
            if any(len(r) != width for r in rows):
                raise ValueError(f"heads[{name!r}] is not rectangular (layers x heads)")
            if len(rows) * width > 65_536:
                raise ValueError(f"heads[{name!r}] has more than 65536 values")
        return v


class IngestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    frames: list[FrameIn] = Field(min_length=1, max_length=10_000)


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
    last_time: float | None
    open_alerts: int
    last_frame_id: int = Field(0, description="Pass as the live stream's `after`.")
    status: str = Field(
        "idle", description="`active` (a frame within run_active_seconds) or `idle`."
    )
    tags: list[str] = Field(default_factory=list, description="Labels (`logitwatch runs tag`).")


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
