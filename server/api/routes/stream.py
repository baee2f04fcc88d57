"""GET /api/v1/runs/{id}/stream: Server-Sent Events for live dashboards.

The stream polls the store (every ``stream_interval`` seconds) rather than an in-process
bus, so it sees frames written by any collector process sharing the database.

Each stream holds a thread-pool slot every poll and a connection open for as long as the
dashboard stays, so a process serves at most ``stream_max_total`` streams at once, and one
token (without auth: one client address) at most ``stream_max_per_principal``; past either a
new stream is answered 429 ``streams-busy`` with ``Retry-After``.

A poll reads ``frames`` and ``points`` within time bounds (``store/live.py``): on a
PostgreSQL store partitioned by day, only the partitions of the run's days are planned, not
every day kept. The stream keeps only the id of the last frame it sent, not its time: a
frame of the run stored later may be stamped earlier (a resumed job whose clock is behind,
a spool pushed late), and a lower bound from the last time sent would skip it.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from sse_starlette import EventSourceResponse

from logitwatch.server.api.deps import ReadDep, RunIdDep, client_address, credentials
from logitwatch.server.db.models import Run
from logitwatch.server.db.session import session_scope
from logitwatch.server.errors import ApiError, NotFound, RateLimited
from logitwatch.server.schemas import MAX_RANK, MAX_STEP, AlertOut
from logitwatch.server.store.alerts import list_alerts
from logitwatch.server.store.live import frames_since

router = APIRouter(tags=["stream"])


class StreamSlots:
    """The live streams open in this process, per caller and in all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self.total = 0

    def take(self, who: str, *, per_caller: int, total: int) -> None:
        """Count one more stream of ``who``, or raise 429 past a bound."""
        with self._lock:
            if self.total >= total:
                raise RateLimited(
                    "streams-busy",
                    f"this collector already serves {self.total} live streams "
                    f"(stream_max_total = {total}); close some dashboards or retry later",
                    retry_after=30)
            if self._open[who] >= per_caller:
                raise RateLimited(
                    "streams-busy",
                    f"{who} already holds {self._open[who]} live streams "
                    f"(stream_max_per_principal = {per_caller}); close some dashboard tabs "
                    "or retry later",
                    retry_after=30)
            self._open[who] += 1
            self.total += 1

    def give(self, who: str) -> None:
        with self._lock:
            self._open[who] -= 1
            if self._open[who] <= 0:
                del self._open[who]
            self.total -= 1


def _shown(a: AlertOut) -> tuple[Any, ...]:
    """What the dashboard shows of an alert: a change of any of it is sent again (its state,
    and an escalation from info, an acknowledgement or a silence while it stays firing)."""
    return (a.state, a.severity, a.paged_step, a.acked_at, a.suppressed, a.resolved_step,
            a.message)


def _slots(app: Any) -> StreamSlots:
    slots: StreamSlots | None = getattr(app.state, "stream_slots", None)
    if slots is None:  # one event loop: no race between the check and the set
        slots = app.state.stream_slots = StreamSlots()
    return slots


class _SlotResponse(EventSourceResponse):
    """An event stream that gives its slot back however it ends (even never started)."""

    def __init__(self, *args: Any, release: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


@router.get("/runs/{run_id}/stream")
async def stream(
    run_id: RunIdDep,
    principal: ReadDep,
    request: Request,
    rank: Annotated[int, Query(ge=0, le=MAX_RANK)] = 0,
    after: Annotated[int, Query(ge=0, le=MAX_STEP, description="last frame id already shown")] = 0,
) -> EventSourceResponse:
    """Events: ``frame`` (new steps' scalars + the latest per-head matrices), ``alert``, and
    ``end`` (``{"code", "message"}``) when the stream stops for good.

    The run's dependency has authorized the caller (the same principal, cached for the
    request) and answered 404 for a run it may not see, before the stream starts; the token
    is checked again at every poll: a revoked token ends the stream.
    """
    state = request.app.state
    secret = credentials(request)
    address = client_address(request)

    def poll(after_id: int, alerts_seen: dict[int, Any]) -> tuple[int, list[Any], Any, list[Any]]:
        state.auth.authorize(secret, scope="read", charge=False)
        with session_scope(state.sessions) as s:
            # the run still there (deleted: the stream ends), by its row alone: not the
            # run's summary (queries.get_run: alerts, tags, newest frame), which a poll does
            # not send; no read of frames without a time bound (store/live.py)
            if s.scalar(select(Run.id).where(Run.id == run_id)) is None:
                raise NotFound("run-not-found", f"no run with id {run_id}")
            last, frames, latest = frames_since(s, run_id=run_id, after_id=after_id, rank=rank)
            alerts = [(a.model_dump(mode="json"), _shown(a)) for a in list_alerts(s, run_id)
                      if alerts_seen.get(a.id) != _shown(a)]
        return last, frames, latest, alerts

    who = (f"client {address or 'unknown'}" if principal.open
           else f"token {principal.token_id} ({principal.name})")

    slots = _slots(request.app)
    slots.take(who, per_caller=state.settings.stream_max_per_principal,
               total=state.settings.stream_max_total)

    async def events() -> AsyncIterator[dict[str, str]]:
        after_id = after
        seen: dict[int, Any] = {}
        while not await request.is_disconnected():
            try:
                after_id, frames, latest, alerts = await anyio.to_thread.run_sync(
                    poll, after_id, seen
                )
            except ApiError as e:  # revoked token, run gone: say why, then end
                yield {"event": "end", "data": json.dumps(e.body())}
                return
            if frames:
                yield {"event": "frame", "id": str(after_id),
                       "data": json.dumps({"frames": frames, "latest": latest})}
            for a, shown in alerts:
                seen[a["id"]] = shown
                yield {"event": "alert", "data": json.dumps(a)}
            await anyio.sleep(state.settings.stream_interval)

    # the response gives the slot back once, when it ends
    return _SlotResponse(events(), ping=15, release=lambda: slots.give(who))
