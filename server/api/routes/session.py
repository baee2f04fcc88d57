"""The dashboard's login: a read token in, an HttpOnly, SameSite=Strict cookie out.

Browsers cannot put an ``Authorization`` header on an ``EventSource``, so the pages log in
once (``POST /session``) and the cookie then authenticates every API call and the live
stream. The cookie holds the token itself: revoking the token ends the session.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from logitwatch.server.api.deps import COOKIE, AnyPrincipalDep, client_address
from logitwatch.server.auth import Principal
from logitwatch.server.errors import Forbidden, Unauthorized

router = APIRouter(tags=["session"])

COOKIE_MAX_AGE = 7 * 24 * 3600


class LoginIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=200, description="a read token (lw_...)")


class SessionOut(BaseModel):
    mode: str = Field(description="`open` (no tokens: everything allowed) or `token`")
    project: str | None = Field(description="the token's project; null in open mode")
    scope: str = Field(description="`read`, `ingest`, or `open`")
    name: str = ""


def _out(p: Principal) -> SessionOut:
    return SessionOut(mode="open" if p.open else "token", project=p.project, scope=p.scope,
                      name=p.name)


@router.get("/session", response_model=SessionOut)
def whoami(principal: AnyPrincipalDep) -> SessionOut:
    """Who the request's token (header or cookie) is; 401 when it needs one."""
    return _out(principal)


@router.post("/session", response_model=SessionOut,
             responses={401: {"description": "unknown or revoked token"},
                        403: {"description": "not a read token"}})
def login(body: LoginIn, request: Request, response: Response) -> SessionOut:
    """Log the dashboard in with a read token: sets the session cookie."""
    auth = request.app.state.auth
    info = auth.check_token(body.token, client_address(request))
    if info is None or not info.active:
        raise Unauthorized("invalid-token",
                           "token: unknown or revoked (see `logitwatch token list`)")
    if info.scope != "read":
        raise Forbidden("scope-forbidden",
                        f"token: the dashboard takes a read token; this is an {info.scope} "
                        "token. Create one with `logitwatch token create --scope read`")
    principal = auth.authorize(body.token, scope="read")
    secure = request.url.scheme == "https" or request.app.state.settings.secure_cookies
    response.set_cookie(COOKIE, body.token, max_age=COOKIE_MAX_AGE, path="/", httponly=True,
                        samesite="strict", secure=secure)
    return _out(principal)


@router.delete("/session", status_code=204)
def logout(request: Request) -> Response:
    """Forget the session cookie."""
    secure = request.url.scheme == "https" or request.app.state.settings.secure_cookies
    response = Response(status_code=204)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=secure)
    return response

