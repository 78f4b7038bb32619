"""The UI's sign-in: a token kept in an HttpOnly, SameSite=Strict cookie — a session token
the sign-in made for this browser from the user's token pasted, or a platform token as
pasted.

The cookie holds a token, so the UI's pages are authorized exactly like the API's routes:
:func:`authorize_session` hands the cookie's token to the same :func:`api.auth.enforce`
the /v1 guard uses, against the same ``access`` rule each UI route declares.  The token
is never written into a page or a log line.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urlsplit

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.handlers import BaseRouteHandler

from api.auth import enforce
from shared.errors import Unauthorized

UI_PATH = "/ui"
COOKIE = "spar_ui_token"
LOGIN_PATH = f"{UI_PATH}/login"


def session_token(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    token = connection.cookies.get(COOKIE, "").strip()
    if not token:
        raise Unauthorized("not signed in")
    return token


async def authorize_session(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """The /ui guard: the caller's token is the session cookie's."""
    await enforce(connection, handler, session_token)


def session_cookie(request: Request[Any, Any, Any], token: str) -> Cookie:
    """The cookie that signs the browser in (``Secure`` when the request came over https)."""
    return Cookie(
        key=COOKIE,
        value=token,
        path=UI_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def cleared_cookie(request: Request[Any, Any, Any]) -> Cookie:
    return Cookie(
        key=COOKIE,
        value="",
        path=UI_PATH,
        max_age=0,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a page of the UI, never another site."""
    if not target or "\\" in target:
        return UI_PATH
    parts = urlsplit(target)
    if (
        parts.scheme
        or parts.netloc
        or not (parts.path == UI_PATH or parts.path.startswith(f"{UI_PATH}/"))
    ):
        return UI_PATH
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def from_this_site(request: Request[Any, Any, Any]) -> bool:
    """A form post made by Spar's own pages, not by another site (which could otherwise
    sign a browser in with the other site's token: login CSRF).  Browsers say where a
    request comes from in ``Sec-Fetch-Site``, older ones in ``Origin``; a client that sends
    neither is not a browser, and has no cookie of a victim to ride on."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


def here(request: Request[Any, Any, Any]) -> str:
    """The page asked for: its path and query."""
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def login_url(request: Request[Any, Any, Any]) -> str:
    """The sign-in page, coming back to the page asked for (a GET's) afterwards."""
    if request.method != "GET":
        return LOGIN_PATH
    return f"{LOGIN_PATH}?{urlencode({'next': here(request)})}"


def followed_from_elsewhere(request: Request[Any, Any, Any]) -> bool:
    """A link followed from another site: the browser left the SameSite=Strict cookie out,
    though it may hold one.  The same request made from this site would carry it."""
    return (
        request.method == "GET"
        and COOKIE not in request.cookies
        and request.headers.get("sec-fetch-site") == "cross-site"
    )
