"""The results web UI (``/ui``): sign-in, organizations, batches, a batch's live progress,
run transcripts and two batches side by side.

Every page declares its ``access`` rule like an API route (``scenarios:read`` for the pages
of an organization, the rule of the API's batch and run reads) and the router's guard
enforces it with the API's own code, the token read from the session cookie
(:mod:`api.ui.session`).  The answers are pages: no valid cookie → the sign-in page, not a
member or another organization's id → 404, a member without the permission → 403.
Pages are rendered on the server (Jinja2, autoescaped); the one script polls a batch's
progress.  The UI is outside /v1 and outside the OpenAPI schema.

Signing in with a user's token makes the browser a session token of its own
(:func:`shared.identity.accounts.browser_session`), so that signing out (a POST from the
UI's own pages) revokes that one and nothing else: never the token pasted, which a CLI
profile or a script may hold.  A platform token is kept as it is, and only forgotten.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

import msgspec
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import Controller, Request, Response, Router, get, post
from litestar.datastructures import CacheControlHeader, ResponseHeader, State
from litestar.di import NamedDependency, Provide
from litestar.exceptions import ValidationException
from litestar.params import QueryParameter
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.status_codes import (
    HTTP_303_SEE_OTHER,
    HTTP_400_BAD_REQUEST,
    HTTP_403_FORBIDDEN,
    HTTP_404_NOT_FOUND,
)
from litestar.template import TemplateConfig

from api.auth import authenticate
from api.deps import OFFSET_LIMIT, Access, Caller, Config, DbReads, DbSession, PathId, reading
from api.ui import services as ui_services
from api.ui.session import (
    COOKIE,
    UI_PATH,
    authorize_session,
    cleared_cookie,
    followed_from_elsewhere,
    from_this_site,
    here,
    login_url,
    safe_next,
    session_cookie,
)
from shared.batches import services as batches
from shared.batches.detail import batch_detail
from shared.batches.schemas import BatchRunRead
from shared.db.base import utcnow
from shared.errors import NotFound, PermissionDenied, Unauthorized
from shared.identity import accounts
from shared.identity import organizations as identity
from shared.identity.access import AUTHENTICATED, PUBLIC, requires
from shared.outbound.schemas import compact_json
from shared.paging import MAX_LIMIT, Paging

HERE = Path(__file__).parent
READ = requires("scenarios:read")  # the API's rule for reading batches and runs
BATCH_PAGE = 100  # batches listed on a page, newest first
MAX_TOKEN_LENGTH = 1000  # far past any token Spar issues
OrgName = NamedDependency[str]


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"


def _pct(rate: float | None) -> str:
    return "—" if rate is None else f"{rate * 100:.1f} %"


def _signed_pct(rate: float) -> str:
    return f"{rate * 100:+.1f} %"


def _p_value(p: float | None) -> str:
    return "—" if p is None else f"{p:.4f}"


def _environment() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"), autoescape=True, undefined=StrictUndefined
    )
    environment.filters["when"] = _when
    environment.filters["pct"] = _pct
    environment.filters["signed_pct"] = _signed_pct
    environment.filters["p_value"] = _p_value
    environment.filters["json"] = compact_json  # escaped by the template
    environment.filters["badge"] = ui_services.badge
    return environment


TEMPLATES = TemplateConfig(instance=JinjaTemplateEngine.from_environment(_environment()))


# Every answer: nothing from elsewhere (no inline script, no CDN), never cached (tenant data).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def page(name: str, status_code: int = 200, **context: Any) -> Template:
    """A page of the UI (the headers are the router's too, but the router's do not reach
    the answers of its exception handlers)."""
    return Template(
        template_name=name, context=context, status_code=status_code, headers=PAGE_HEADERS
    )


class LiveProgress(msgspec.Struct, frozen=True):
    """What a batch's page polls: its counters and runs (those changed since the poll's
    ``since``, when given), its badge, whether it is over, and the ``cursor`` to give as
    the next poll's ``since``."""

    batch: BatchRunRead
    badge: ui_services.Badge
    over: bool
    cursor: datetime


async def provide_org_name(db_reads: DbReads, access: Access) -> str:
    """The name of the organization in the address, for the header of its pages: read on
    the connection the guard looked the token up on, given back before the page's own
    reads, so that no page holds a connection of each pool at once."""
    return await reading(db_reads, identity.organization_name, access=access)


ORG_PAGE = {"org_name": Provide(provide_org_name)}


class SessionController(Controller):
    path = "/"

    @get("/login", access=PUBLIC)
    async def login_page(
        self, next_: Annotated[str | None, QueryParameter(name="next")] = None
    ) -> Template:
        return page("login.html", next=safe_next(next_), error=None)

    @post("/login", access=PUBLIC, status_code=HTTP_303_SEE_OTHER)
    async def sign_in(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        settings: Config,
    ) -> Response[Any]:
        """Check the pasted token like any API request does; keep in the cookie a session
        of this browser's own made from it (a platform token: the token itself)."""
        if not from_this_site(request):
            return page(
                "login.html",
                HTTP_403_FORBIDDEN,
                next=UI_PATH,
                error="Sign in from Spar's own sign-in page.",
            )
        form = await request.form()
        token = str(form.get("token") or "").strip()
        target = safe_next(str(form.get("next") or ""))
        try:
            if not token or len(token) > MAX_TOKEN_LENGTH:
                raise Unauthorized("invalid token")
            principal, _ = await authenticate(request, token)
        except Unauthorized as exc:
            # The token is never echoed: the form comes back empty.
            return page(
                "login.html",
                HTTP_400_BAD_REQUEST,
                next=target,
                error=f"This token was refused ({exc.detail}). Paste a valid Spar token.",
            )
        if principal.is_user:
            token = await accounts.browser_session(
                db_session, settings=settings, principal=principal
            )
        return Redirect(
            target, status_code=HTTP_303_SEE_OTHER, cookies=[session_cookie(request, token)]
        )

    @post("/logout", access=PUBLIC, status_code=HTTP_303_SEE_OTHER)
    async def sign_out(
        self, request: Request[Any, Any, Any], db_session: DbSession
    ) -> Response[Any]:
        """Revoke this browser's session (never a token kept as it was pasted: a platform
        token, which others may use) and forget the cookie."""
        if not from_this_site(request):
            return page(
                "error.html",
                HTTP_403_FORBIDDEN,
                title="Not allowed",
                detail="Sign out from Spar's own pages.",
            )
        token = request.cookies.get(COOKIE, "").strip()
        if token and len(token) <= MAX_TOKEN_LENGTH:
            try:
                principal, _ = await authenticate(request, token)
            except Unauthorized:
                pass  # already over: nothing to revoke
            else:
                await accounts.end_browser_session(db_session, principal=principal)
        return Redirect(
            f"{UI_PATH}/login", status_code=HTTP_303_SEE_OTHER, cookies=[cleared_cookie(request)]
        )


class OrganizationController(Controller):
    path = "/"

    @get("/", access=AUTHENTICATED)
    async def organizations(self, db_reads: DbReads, principal: Caller) -> Response[Any]:
        """The caller's organizations; straight to the batches when there is only one."""
        orgs, _ = await reading(
            db_reads,
            identity.read_organizations,
            principal=principal,
            paging=Paging(limit=MAX_LIMIT),
        )
        if len(orgs) == 1:
            return Redirect(f"{UI_PATH}/orgs/{orgs[0].id}/batches", status_code=HTTP_303_SEE_OTHER)
        return page("orgs.html", organizations=orgs)


class BatchController(Controller):
    path = "/orgs/{org_id:str}/batches"
    dependencies = ORG_PAGE

    @get("/", access=READ)
    async def list_batches(
        self,
        db_reads: DbReads,
        access: Access,
        org_name: OrgName,
        offset: Annotated[
            int, QueryParameter(ge=0, le=OFFSET_LIMIT, description="Newer batches to skip.")
        ] = 0,
    ) -> Template:
        rows, total = await reading(
            db_reads,
            batches.list_batches,
            access=access,
            paging=Paging(limit=BATCH_PAGE, offset=offset),
            newest_first=True,
        )
        return page(
            "batches.html",
            org_id=access.organization_id,
            org_name=org_name,
            batches=[batches.batch_read(row) for row in rows],
            total=total,
            offset=offset,
            page_size=BATCH_PAGE,
        )

    @get("/compare", access=READ)
    async def compare(
        self,
        db_reads: DbReads,
        access: Access,
        org_name: OrgName,
        a: Annotated[UUID, QueryParameter(description="Batch A (before).")],
        b: Annotated[UUID, QueryParameter(description="Batch B (after).")],
    ) -> Template:
        comparison = await reading(db_reads, batches.compare_batches, access=access, a_id=a, b_id=b)
        return page(
            "compare.html",
            org_id=access.organization_id,
            org_name=org_name,
            comparison=comparison,
        )

    @get("/{batch_id:str}", access=READ)
    async def batch(
        self,
        db_reads: DbReads,
        state: State,
        access: Access,
        org_name: OrgName,
        batch_id: PathId,
    ) -> Template:
        looked = utcnow()  # its live script's first poll reads the runs changed since
        batch = await batch_detail(
            db_reads,
            state.database,
            access=access,
            batch_id=batch_id,
            broker=state.broker,
            limiter=state.limiter,
        )
        return page(
            "batch.html",
            org_id=access.organization_id,
            org_name=org_name,
            since=looked.isoformat(),
            batch=batch,
            runs=ui_services.runs_in_order(batch),
            over=batches.is_over(batch),
            flaky=ui_services.flaky(batch),
            curve=ui_services.pass_hat_curve(batch),
        )

    @get("/{batch_id:str}/progress", access=READ)
    async def progress(
        self,
        db_reads: DbReads,
        state: State,
        access: Access,
        batch_id: PathId,
        since: Annotated[
            datetime | None,
            QueryParameter(description="The previous poll's cursor: only the runs changed since."),
        ] = None,
    ) -> LiveProgress:
        """The batch's counters and its runs: every run on a first look, then (``since``,
        the previous answer's ``cursor``) only those changed since, like its event stream:
        a page of a batch of thousands of runs polls each second."""
        looked = utcnow()
        if since is None:
            batch = await batch_detail(
                db_reads,
                state.database,
                access=access,
                batch_id=batch_id,
                broker=state.broker,
                limiter=state.limiter,
            )
        else:
            batch = await reading(
                db_reads,
                batches.batch_changes,
                access=access,
                batch_id=batch_id,
                since=since,
                limiter=state.limiter,
            )
        return LiveProgress(
            batch=batch, badge=ui_services.badge(batch), over=batches.is_over(batch), cursor=looked
        )


class RunController(Controller):
    path = "/orgs/{org_id:str}/runs"
    dependencies = ORG_PAGE

    @get("/{run_id:str}", access=READ)
    async def run(
        self, db_reads: DbReads, access: Access, org_name: OrgName, run_id: PathId
    ) -> Template:
        view = await reading(db_reads, ui_services.transcript, access=access, run_id=run_id)
        return page("run.html", org_id=access.organization_id, org_name=org_name, view=view)


# --- answers that are pages ----------------------------------------------------------------------


def _to_login(request: Request[Any, Any, Any], _: Unauthorized) -> Response[Any]:
    """No valid session: the sign-in page, forgetting a cookie that no longer works.

    A link followed from another site (a chat message, a CI log) arrives without the
    cookie: it is answered with a page that opens the same address again, from this site,
    so a signed-in user lands on the page and not on the sign-in form."""
    if followed_from_elsewhere(request):
        return page("reopen.html", here=here(request))
    cookies = [cleared_cookie(request)] if COOKIE in request.cookies else None
    return Redirect(
        login_url(request), status_code=HTTP_303_SEE_OTHER, cookies=cookies, headers=PAGE_HEADERS
    )


def _not_found(_: Request[Any, Any, Any], exc: NotFound) -> Response[Any]:
    return page("error.html", HTTP_404_NOT_FOUND, title="Not found", detail=exc.detail)


def _forbidden(_: Request[Any, Any, Any], exc: PermissionDenied) -> Response[Any]:
    return page("error.html", HTTP_403_FORBIDDEN, title="Not allowed", detail=exc.detail)


def _bad_address(_: Request[Any, Any, Any], __: ValidationException) -> Response[Any]:
    detail = "this address is malformed (an id that is not one, or a missing parameter)"
    return page("error.html", HTTP_400_BAD_REQUEST, title="Bad address", detail=detail)


def ui_router() -> Router:
    """The pages, behind the session guard."""
    return Router(
        UI_PATH,
        route_handlers=[SessionController, OrganizationController, BatchController, RunController],
        guards=[authorize_session],
        exception_handlers={
            Unauthorized: _to_login,
            NotFound: _not_found,
            PermissionDenied: _forbidden,
            ValidationException: _bad_address,
        },
        response_headers=[ResponseHeader(name=k, value=v) for k, v in PAGE_HEADERS.items()],
        include_in_schema=False,
    )


def ui_assets() -> Router:
    """The stylesheet and the script: public, like Swagger UI's assets."""
    return create_static_files_router(
        path=f"{UI_PATH}/static",
        directories=[HERE / "static"],
        name="ui-static",
        cache_control=CacheControlHeader(no_cache=True),
    )
