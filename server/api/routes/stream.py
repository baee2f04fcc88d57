"""GET /api/v1/runs/{id}/stream: Server-Sent Events for live dashboards.

The stream polls the store (every ``stream_interval`` seconds) rather than an in-process
bus, so it sees frames written by any collector process sharing the database.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from sse_starlette import EventSourceResponse

from logitwatch.server.api.deps import RunIdDep, credentials
from logitwatch.server.db.session import session_scope
from logitwatch.server.errors import ApiError
from logitwatch.server.schemas import MAX_RANK, MAX_STEP
from logitwatch.server.store import queries
from logitwatch.server.store.alerts import list_alerts
from logitwatch.server.store.live import frames_since

router = APIRouter(tags=["stream"])


@router.get("/runs/{run_id}/stream")
async def stream(
    run_id: RunIdDep,
    request: Request,
    rank: Annotated[int, Query(ge=0, le=MAX_RANK)] = 0,
    after: Annotated[int, Query(ge=0, le=MAX_STEP, description="last frame id already shown")] = 0,
) -> EventSourceResponse:
    """Events: ``frame`` (new steps' scalars + the latest per-head matrices), ``alert``, and
    ``end`` (``{"code", "message"}``) when the stream stops for good.

    The caller's token is checked again at every poll: a revoked token ends the stream.
    """
    state = request.app.state
    secret = credentials(request)

    def poll(after_id: int, alerts_seen: dict[int, str]) -> tuple[int, list[Any], Any, list[Any]]:
        state.auth.authorize(secret, scope="read", charge=False)
        with session_scope(state.sessions) as s:
            queries.get_run(s, run_id)
            last, frames, latest = frames_since(s, run_id=run_id, after_id=after_id, rank=rank)
            alerts = [
                a.model_dump(mode="json")
                for a in list_alerts(s, run_id)
                if alerts_seen.get(a.id) != a.state
            ]
        return last, frames, latest, alerts

    # Fail fast with a 404 before the stream starts.
    await anyio.to_thread.run_sync(lambda: poll(2**62, {}))

    async def events() -> AsyncIterator[dict[str, str]]:
        after_id = after
        seen: dict[int, str] = {}
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
            for a in alerts:
                seen[a["id"]] = a["state"]
                yield {"event": "alert", "data": json.dumps(a)}
            await anyio.sleep(state.settings.stream_interval)

    return EventSourceResponse(events(), ping=15)
