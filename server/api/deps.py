"""FastAPI dependencies as Annotated aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from logitwatch.server.db.session import session_scope
from logitwatch.server.settings import Settings

__all__ = ["SessionDep", "SettingsDep", "get_session"]


def get_session(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.sessions) as s:
        yield s


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
