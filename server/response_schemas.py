"""The read API's response models: alerts, runs, metrics, series, heatmaps, what an ingest
answered and what a deletion removed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from logitwatch.server.wire_values import WireFloat

__all__ = [
    "AlertOut",
    "DeletedOut",
    "HeatmapOut",
    "IngestOut",
    "MetricOut",
    "RunOut",
    "SeriesOut",
]


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

