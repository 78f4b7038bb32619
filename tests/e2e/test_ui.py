"""The results web UI (``/ui``), in a real headless Chromium against a real HTTP server.

The app is served by uvicorn on a loopback port (``tests.support.live_server``) against
the session's database; setup goes through the API (the test client), and batches are
played in-process as the workers do (``dispatch_committed`` and ``execute_run`` against a
loopback :class:`FakeAgent`), one run at a time while the browser watches.  The rules
that need no browser (sign-in, isolation, permissions, escaping) are plain HTTP requests
to the same server.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import deque
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from playwright.async_api import Browser, Page, async_playwright, expect
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from api.app import create_app
from api.ui.controllers import BATCH_PAGE
from api.ui.session import COOKIE
from client.api import Api, Target
from client.batch import outcomes
from client.reports import json_report, junit_xml
from shared.batches.schemas import BatchRunRead
from shared.batches.window import dispatch_committed
from shared.calibration.schemas import (
    Interval,
    JudgeTrust,
    TrustedCriterion,
    UncalibratedCriterion,
)
from shared.db.base import utcnow
from shared.db.models import BatchRun
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import (
    World,
    create_batch,
    drain,
    failing_turn,
    make_scenario,
    make_world,
    passing_turn,
)
from tests.support.factories import create_org, create_token, tenant
from tests.support.fakes import (
    FakeAgent,
    FakeFlakyAgent,
    FakeOpenAI,
    FakeSimulator,
    Reply,
    VoteQuota,
)
from tests.support.live_server import LiveServer

# Debian's package (.ci/run installs it); SPAR_TEST_CHROMIUM names another Chromium or Chrome.
CHROMIUM = Path(os.environ.get("SPAR_TEST_CHROMIUM") or "/usr/bin/chromium")

# One worker takes the module: one Chromium and one server for all of it under xdist.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ui")]


@pytest.fixture(scope="module")
def server(settings: Settings) -> Iterator[LiveServer]:
    with LiveServer(create_app(settings)) as live:
        yield live


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        await browser.close()


@pytest.fixture
async def page(browser: Browser, server: LiveServer) -> AsyncIterator[Page]:
    context = await browser.new_context(base_url=server.url)
    context.set_default_timeout(10_000)
    yield await context.new_page()
    await context.close()


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"Echo: {body['message']}") as fake:
        yield fake


def http(server: LiveServer, token: str | None = None) -> httpx.AsyncClient:
    """A client of the live server, signed in with ``token`` (the UI's cookie) if given."""
    cookies = {COOKIE: token} if token else None
    return httpx.AsyncClient(base_url=server.url, cookies=cookies, timeout=10)


async def runs_by_scenario(client: AsyncTestClient, w: World, batch_id: str) -> dict[str, str]:
    response = await client.get(f"{w.batches}/{batch_id}", headers=w.headers)
    assert response.status_code == 200, response.text
    return {run["scenario_id"]: run["id"] for run in response.json()["runs"]}


# --- in the browser ----------------------------------------------------------------------------


async def test_a_user_signs_in_watches_a_batch_move_reads_a_failure_and_finds_a_regression(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    server: LiveServer,
    page: Page,
) -> None:
    w = await make_world(client, agent)
    greets = await make_scenario(client, w, "greets", turns=[passing_turn(1)])
    refuses = await make_scenario(client, w, "refuses", turns=[failing_turn(2)])
    thanks = await make_scenario(client, w, "thanks", turns=[passing_turn(3)])
    scenario_ids = [greets["id"], refuses["id"], thanks["id"]]
    first = await create_batch(client, w, scenario_ids=scenario_ids)
    batches = f"/ui/orgs/{w.t.id}/batches"

    # No cookie: the sign-in page, which comes back to the page asked for.
    await page.goto(batches)
    await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    await page.fill("#token", w.t.owner.token)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(f"{server.url}{batches}")
    listed = page.locator(f'tr[data-batch="{first["id"]}"]')
    await expect(listed).to_contain_text("bot")
    await expect(listed).to_contain_text("0 / 3")
    # Whose batches these are, and Spar's own icon.
    await expect(page.locator("header #org-name")).to_have_text("Acme")
    await expect(page).to_have_title(re.compile(r"· Acme · Spar$"))
    icon = await page.get_attribute('link[rel="icon"]', "href")
    fetched = await page.request.get(f"{server.url}{icon}")
    assert fetched.status == 200 and fetched.headers["content-type"] == "image/svg+xml"

    # A link followed from another site ("localhost" is not "127.0.0.1") arrives without
    # the SameSite=Strict cookie, yet opens the page, not the sign-in form.
    await page.goto(server.url.replace("127.0.0.1", "localhost") + "/ui/login")
    await page.evaluate(
        """href => { const a = document.createElement("a"); a.href = href; a.id = "away";
                     a.textContent = "away"; document.body.append(a); }""",
        f"{server.url}{batches}",
    )
    await page.click("#away")
    await expect(page).to_have_url(f"{server.url}{batches}")

    # The batch, open while it runs: its counter and bar move as runs end, without a reload.
    await listed.get_by_role("link", name="Open").click()
    await expect(page.locator("#completed")).to_have_text("0")
    await expect(page.locator("#total")).to_have_text("3")
    await page.evaluate("window.sameDocument = true")
    database = app.state.database
    pending = deque(await dispatch_committed(database, UUID(first["id"])))
    done = 0
    while pending:
        run_id = pending.popleft()
        pending.extend(await execute_run(database, settings, run_id) or [])
        done += 1
        await expect(page.locator("#completed")).to_have_text(str(done))
        row = page.locator(f'tr[data-run="{run_id}"] [data-field="status"]')
        await expect(row).to_have_text(re.compile("^(passed|failed)$"))
        if done < 3:  # the last run ends the batch, and the page reloads for its final state
            ended = page.locator(f'tr[data-run="{run_id}"] [data-field="completed_at"]')
            await expect(ended).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
            await expect(page.locator('#batch [data-field="status"]')).to_have_text("running")
            assert await page.evaluate("window.sameDocument === true")
            assert await page.eval_on_selector("#progress", "bar => bar.value") == done
    assert done == 3
    # Completed, but not all passed: the badge says so, not in green; the failure first.
    badge = page.locator('#batch [data-field="status"]')
    await expect(badge).to_have_text("completed: 1 failed")
    await expect(badge).to_have_class("status status-failed")
    await expect(page.locator("#passed")).to_have_text("2")
    await expect(page.locator("#failed")).to_have_text("1")
    await expect(page.locator("#runs tbody tr").first).to_contain_text("refuses")

    # The failed run's transcript: the turn, the reply, the criterion's verdict and critique.
    failed = page.locator("tr[data-run]", has_text="refuses")
    await expect(failed.locator('[data-field="status"]')).to_have_text("failed")
    await failed.get_by_role("link", name="Transcript").click()
    await expect(page.locator("h1")).to_have_text("refuses")
    await expect(page.locator(".message.user pre")).to_have_text("hello 2")
    await expect(page.locator(".message.agent pre")).to_have_text("Echo: hello 2")
    criterion = page.locator("tr.criterion")
    await expect(criterion).to_contain_text("never-said")
    await expect(criterion.locator(".verdict")).to_have_text("FAIL")
    await expect(criterion.locator(".critique")).to_have_text("reply does not contain 'never-said'")

    # The agent now fails "greets" (a regression), and "thanks" is edited so that it fails
    # too (not the agent's doing): a second batch of the same scenarios, against the first.
    agent.reply = lambda body: "Hi" if body["message"] == "hello 1" else f"Echo: {body['message']}"
    edited = await client.put(
        f"/v1/orgs/{w.t.id}/scenarios/{thanks['id']}",
        json={"turns": [failing_turn(3)]},
        headers=w.headers,
    )
    assert edited.status_code == 200, edited.text
    second = await create_batch(client, w, scenario_ids=scenario_ids)
    await drain(app, settings, second["id"])
    run_a = (await runs_by_scenario(client, w, first["id"]))[greets["id"]]
    run_b = (await runs_by_scenario(client, w, second["id"]))[greets["id"]]

    await page.goto(batches)
    await page.check(f'tr[data-batch="{first["id"]}"] input[name="a"]')
    await page.check(f'tr[data-batch="{second["id"]}"] input[name="b"]')
    await page.get_by_role("button", name="Compare A with B").click()
    await expect(page).to_have_url(re.compile(r"/batches/compare\?"))
    assert sorted(page.url.split("?")[1].split("&")) == [f"a={first['id']}", f"b={second['id']}"]
    await expect(page.locator("#summary")).to_contain_text(
        "1 regression, 0 fixes, 1 scenario edited between A and B"
    )
    rows = page.locator("#scenarios tbody tr")
    await expect(rows).to_have_count(3)
    regression = rows.first
    await expect(regression).to_have_attribute("data-change", "regressed")
    await expect(regression).to_contain_text("greets")
    await expect(regression).to_contain_text("Regression (pass → fail)")
    # The edited scenario is not put down to the agent: its runs played different turns.
    await expect(rows.nth(1)).to_have_attribute("data-change", "edited")
    await expect(rows.nth(1)).to_contain_text("thanks")
    await expect(rows.nth(1)).to_contain_text("Scenario edited between A and B")
    await expect(rows.nth(2)).to_have_attribute("data-change", "unchanged")
    compared = await client.get(
        f"{w.batches}/compare", params={"a": first["id"], "b": second["id"]}, headers=w.headers
    )
    body = compared.json()
    assert (body["regressions"], body["fixes"], body["edited"]) == (1, 0, 1), body
    links = regression.get_by_role("link")
    assert [await link.get_attribute("href") for link in await links.all()] == [
        f"/ui/orgs/{w.t.id}/runs/{run_a}",
        f"/ui/orgs/{w.t.id}/runs/{run_b}",
    ]
    await links.nth(1).click()
    await expect(page.locator("h1")).to_have_text("greets")
    await expect(page.locator("tr.criterion .verdict")).to_have_text("FAIL")

    # A simulated user's conversation: its turns marked, how it ended, the verdicts of
    # its conversation criteria.
    with FakeSimulator(done_at=2) as simulator:
        made = await client.post(
            f"/v1/orgs/{w.t.id}/llm-providers",
            json={
                "name": "simulator",
                "provider": "openai_compatible",
                "base_url": f"{simulator.url}/v1",
                "default_model": "sim-model",
                "is_default_simulator": True,
            },
            headers=w.headers,
        )
        assert made.status_code == 201, made.text
        rebook = await client.post(
            f"/v1/orgs/{w.t.id}/scenarios",
            json={
                "name": "rebook",
                "turns": [passing_turn(4)],
                "simulation": {"persona": "a hurried traveller", "goal": "move the booking"},
                "conversation_criteria": [
                    {"question": "customer message 1", "criteria_type": "contains"},
                    {"question": "refund", "criteria_type": "contains"},
                ],
            },
            headers=w.headers,
        )
        assert rebook.status_code == 201, rebook.text
        simulated = await create_batch(client, w, scenario_ids=[rebook.json()["id"]])
        await drain(app, settings, simulated["id"])
    (simulated_run,) = (await runs_by_scenario(client, w, simulated["id"])).values()
    await page.goto(f"/ui/orgs/{w.t.id}/runs/{simulated_run}")
    await expect(page.locator("h1")).to_have_text("rebook")
    await expect(page.locator("#simulation-outcome")).to_have_text(
        "Simulated user: reached its goal"
    )
    turns = page.locator("section[data-turn]")
    await expect(turns).to_have_count(2)
    await expect(turns.nth(0)).to_have_attribute("data-source", "scripted")
    await expect(turns.nth(0).locator(".simulated")).to_have_count(0)
    second = turns.nth(1)
    await expect(second).to_have_attribute("data-source", "simulated")
    await expect(second.locator("h2 .simulated")).to_have_text("simulated")
    await expect(second.locator(".message.user .who")).to_have_text("Simulated user")
    await expect(second.locator(".message.user pre")).to_have_text("customer message 1")
    await expect(second.locator(".message.agent pre")).to_have_text("Echo: customer message 1")
    judged = page.locator("#conversation tr.criterion")
    await expect(judged).to_have_count(2)
    await expect(judged.nth(0).locator(".verdict")).to_have_text("PASS")
    await expect(judged.nth(0).locator(".critique")).to_have_text(
        "the reply of turn 2 contains 'customer message 1'"
    )
    await expect(judged.nth(1)).to_contain_text("refund")
    await expect(judged.nth(1).locator(".verdict")).to_have_text("FAIL")

    # Signing out (a form's POST) ends this browser's session only: the pages ask to sign
    # in again, and the token pasted to sign in still works.
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(f"{server.url}/ui/login")
    assert await page.context.cookies() == []
    await page.goto(batches)
    await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    assert (await client.get("/v1/auth/me", headers=w.headers)).status_code == 200


# --- over plain HTTP ---------------------------------------------------------------------------


async def test_without_a_valid_session_every_page_sends_the_browser_to_sign_in(
    client: AsyncTestClient, server: LiveServer
) -> None:
    t = await tenant(client)
    async with http(server) as anonymous:
        for path, back in (
            ("/ui", "%2Fui"),
            (f"/ui/orgs/{t.id}/batches", f"%2Fui%2Forgs%2F{t.id}%2Fbatches"),
            (f"/ui/orgs/{t.id}/runs/{t.id}", f"%2Fui%2Forgs%2F{t.id}%2Fruns%2F{t.id}"),
        ):
            response = await anonymous.get(path)
            assert response.status_code == 303, (path, response.text)
            assert response.headers["location"] == f"/ui/login?next={back}"
            assert "set-cookie" not in response.headers
    # A cookie that no longer signs anyone in is dropped on the way.
    async with http(server, "ust_no-such-token") as stale:
        response = await stale.get(f"/ui/orgs/{t.id}/batches")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/ui/login?next=")
    assert f"{COOKIE}=" in response.headers["set-cookie"]
    assert "max-age=0" in response.headers["set-cookie"].lower()


async def test_signing_in_checks_the_token_keeps_it_in_a_strict_cookie_and_never_shows_it(
    client: AsyncTestClient, server: LiveServer
) -> None:
    t = await tenant(client)
    async with http(server) as browser_like:
        form = await browser_like.get("/ui/login")
        assert form.status_code == 200
        assert 'name="token"' in form.text

        refused = await browser_like.post(
            "/ui/login", data={"token": "ust_made-up-secret-value", "next": "/ui"}
        )
        assert refused.status_code == 400
        assert "This token was refused" in refused.text
        assert "made-up-secret-value" not in refused.text
        assert "set-cookie" not in refused.headers

        # Another site's form posting a token (login CSRF): refused, no cookie.
        forged = await browser_like.post(
            "/ui/login",
            data={"token": t.owner.token, "next": "/ui"},
            headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        )
        assert forged.status_code == 403 and "set-cookie" not in forged.headers
        old_browser = await browser_like.post(
            "/ui/login",
            data={"token": t.owner.token, "next": "/ui"},
            headers={"Origin": "https://evil.example"},
        )
        assert old_browser.status_code == 403 and "set-cookie" not in old_browser.headers

        # A valid token: a session of this browser's own in the cookie (never the token
        # pasted, which may be a CLI's), and back to a page of the UI (never another site).
        signed_in = await browser_like.post(
            "/ui/login", data={"token": t.owner.token, "next": "https://evil.example/ui"}
        )
        assert signed_in.status_code == 303
        assert signed_in.headers["location"] == "/ui"
        assert t.owner.token not in signed_in.text
        cookie = signed_in.headers["set-cookie"]
        attributes = {part.strip().lower() for part in cookie.split(";")}
        session = browser_like.cookies[COOKIE]
        assert session.startswith("ust_") and session != t.owner.token
        assert t.owner.token not in cookie
        assert {"httponly", "samesite=strict", "path=/ui"} <= attributes
        assert "secure" not in attributes  # plain http here; https requests get Secure

        # One organization: straight to its batches.
        home = await browser_like.get("/ui")
        assert home.status_code == 303
        assert home.headers["location"] == f"/ui/orgs/{t.id}/batches"
        listing = await browser_like.get(home.headers["location"])
        assert listing.status_code == 200
        assert t.owner.token not in listing.text
        assert "No batch runs yet." in listing.text

        # Several: a list to pick from.
        await create_org(client, t.owner, name="Beta & Co")
        picker = await browser_like.get("/ui")
        assert picker.status_code == 200
        assert f'href="/ui/orgs/{t.id}/batches">Acme</a>' in picker.text
        assert "Beta &amp; Co" in picker.text

        # Signing out is a POST from Spar's own pages: a link (GET) or another site's form
        # signs nobody out.
        assert (await browser_like.get("/ui/logout")).status_code == 405
        forged = await browser_like.post("/ui/logout", headers={"Sec-Fetch-Site": "cross-site"})
        assert forged.status_code == 403 and "set-cookie" not in forged.headers
        assert (await browser_like.get("/ui")).status_code == 200  # still signed in
        same_site = {"Sec-Fetch-Site": "same-origin"}
        signed_out = await browser_like.post("/ui/logout", headers=same_site)
        assert signed_out.status_code == 303
        assert signed_out.headers["location"] == "/ui/login"
        assert "max-age=0" in signed_out.headers["set-cookie"].lower()
        assert COOKIE not in browser_like.cookies
        assert (await browser_like.get("/ui")).headers["location"].startswith("/ui/login")

    # It revoked this browser's session, and nothing else: the token pasted still works.
    async with http(server, session) as replayed:
        assert (await replayed.get("/ui")).headers["location"].startswith("/ui/login")
    assert (await client.get("/v1/auth/me", headers=t.owner.headers)).status_code == 200
    # Even a cookie holding login's token itself (an older sign-in kept the token pasted)
    # is only forgotten: sign-out revokes browser sessions alone.
    async with http(server, t.owner.token) as older:
        forgotten = await older.post("/ui/logout")
        assert forgotten.status_code == 303
        assert "max-age=0" in forgotten.headers["set-cookie"].lower()
    assert (await client.get("/v1/auth/me", headers=t.owner.headers)).status_code == 200

    # A platform token signs the browser in as itself (there is no user to make a session
    # of); signing out forgets it and does not revoke it: CI may be using it.
    pat = await create_token(client, t.owner, t.id, ["scenarios:read"])
    async with http(server) as browser_like:
        await browser_like.post("/ui/login", data={"token": pat.token, "next": "/ui"})
        assert browser_like.cookies[COOKIE] == pat.token
        signed_out = await browser_like.post("/ui/logout")
        assert signed_out.status_code == 303 and COOKIE not in browser_like.cookies
    listed = await client.get(f"/v1/orgs/{t.id}/scenarios", headers=pat.headers)
    assert listed.status_code == 200


async def test_the_batch_list_pages_back_through_older_batches(
    client: AsyncTestClient, agent: FakeAgent, server: LiveServer, db: AsyncSession
) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, "greets", tags=["p"])
    newest = await create_batch(client, w, tags=["p"])
    # BATCH_PAGE older batches, made directly: the list's pages, not the fan-out, are tested.
    base = datetime.now(UTC) - timedelta(days=1)
    for n in range(BATCH_PAGE):
        db.add(
            BatchRun(
                id=uuid4(),
                organization_id=UUID(w.t.id),
                agent_id=UUID(w.agent_id),
                agent_name="bot",
                status="completed",
                created_at=base - timedelta(minutes=n),
                updated_at=base,
            )
        )
    await db.commit()
    mine = f"/ui/orgs/{w.t.id}/batches"
    async with http(server, w.t.owner.token) as browser_like:
        first = await browser_like.get(mine)
        assert first.status_code == 200
        assert first.text.count("data-batch=") == BATCH_PAGE
        assert newest["id"] in first.text and 'id="newer"' not in first.text
        assert f"1 to {BATCH_PAGE} of {BATCH_PAGE + 1}" in first.text
        assert f'href="{mine}?offset={BATCH_PAGE}"' in first.text
        older = await browser_like.get(f"{mine}?offset={BATCH_PAGE}")
        assert older.text.count("data-batch=") == 1 and newest["id"] not in older.text
        assert 'id="older"' not in older.text and f'href="{mine}?offset=0"' in older.text
        assert (await browser_like.get(f"{mine}?offset=-1")).status_code == 400


async def test_a_batch_badge_says_what_happened_and_is_green_only_when_all_passed(
    client: AsyncTestClient, agent: FakeAgent, server: LiveServer, db: AsyncSession
) -> None:
    """A completed batch is not shown green when some of its runs failed or errored: the
    badge on the list, the batch's page and the comparison says what happened."""
    w = await make_world(client, agent)
    made = {}
    base = datetime.now(UTC) - timedelta(days=1)
    for n, (status, passed, failed, errors) in enumerate(
        [
            ("completed", 3, 0, 0),
            ("completed", 1, 2, 0),
            ("completed", 1, 1, 1),
            ("error", 0, 0, 3),  # cancelled: the batch itself ended in error
            ("running", 0, 0, 0),
        ]
    ):
        done = passed + failed + errors
        made[n] = uuid4()
        db.add(
            BatchRun(
                id=made[n],
                organization_id=UUID(w.t.id),
                agent_id=UUID(w.agent_id),
                agent_name="bot",
                status=status,
                total_scenarios=3,
                completed_scenarios=done,
                passed_scenarios=passed,
                failed_scenarios=failed,
                error_scenarios=errors,
                dispatched_scenarios=done,
                created_at=base - timedelta(minutes=n),
                updated_at=base,
            )
        )
    await db.commit()
    expected = {
        0: ("passed", "all passed"),
        1: ("failed", "completed: 2 failed"),
        2: ("error", "completed: 1 failed, 1 error"),
        3: ("error", "error: 3 errors"),
        4: ("running", "running"),
    }
    badge = re.compile(r'<span class="status status-(\w+)"[^>]*>([^<]*)</span>')
    mine = f"/ui/orgs/{w.t.id}/batches"
    async with http(server, w.t.owner.token) as owner:
        listing = (await owner.get(mine)).text
        for n, shown in expected.items():
            row = listing[listing.index(f'data-batch="{made[n]}"') :]
            assert badge.search(row).groups() == shown, (n, row[:600])  # type: ignore[union-attr]
            page = (await owner.get(f"{mine}/{made[n]}")).text
            batch = page[page.index('id="batch"') :]
            assert badge.search(batch).groups() == shown, n  # type: ignore[union-attr]
        compared = (await owner.get(f"{mine}/compare?a={made[0]}&b={made[1]}")).text
        assert [m.groups() for m in badge.finditer(compared)][:2] == [expected[0], expected[1]]


async def test_pages_follow_the_apis_isolation_and_permissions(
    client: AsyncTestClient, agent: FakeAgent, server: LiveServer
) -> None:
    w = await make_world(client, agent, with_roles=("VIEWER", "GUEST"))
    scenario = await make_scenario(client, w, "greets")
    batch = await create_batch(client, w, scenario_ids=[scenario["id"]])
    (run_id,) = (await runs_by_scenario(client, w, batch["id"])).values()
    mine = f"/ui/orgs/{w.t.id}"
    pages = [
        f"{mine}/batches",
        f"{mine}/batches/{batch['id']}",
        f"{mine}/batches/{batch['id']}/progress",
        f"{mine}/batches/compare?a={batch['id']}&b={batch['id']}",
        f"{mine}/runs/{run_id}",
    ]
    async with http(server, w.t.members["VIEWER"].token) as viewer:
        for path in pages:
            response = await viewer.get(path)
            assert response.status_code == 200, (path, response.text)
        progress = (await viewer.get(pages[2])).json()
        assert progress["over"] is False
        assert progress["batch"]["total_scenarios"] == 1

        for path in (
            "/ui/orgs/not-an-id/batches",
            f"{mine}/runs/not-an-id",
            f"{mine}/batches/compare?a={batch['id']}",
        ):
            response = await viewer.get(path)
            assert response.status_code == 400, (path, response.text)
            assert "Bad address" in response.text

    # Someone else's organization: not a member, and their ids in one's own organization.
    other = await tenant(client)
    theirs = f"/ui/orgs/{other.id}"
    async with http(server, other.owner.token) as outsider:
        for path in pages:
            response = await outsider.get(path)
            assert response.status_code == 404, (path, response.text)
            assert "Not found" in response.text
            assert response.headers["cache-control"] == "no-store"
        for path in (
            f"{theirs}/batches/{batch['id']}",
            f"{theirs}/batches/{batch['id']}/progress",
            f"{theirs}/batches/compare?a={batch['id']}&b={batch['id']}",
            f"{theirs}/runs/{run_id}",
        ):
            response = await outsider.get(path)
            assert response.status_code == 404, (path, response.text)
        assert (await outsider.get(f"{theirs}/batches")).status_code == 200

    # Members (or tokens) without scenarios:read.
    no_read = await create_token(client, w.t.owner, w.t.id, ["agents:read"])
    for token in (w.t.members["GUEST"].token, no_read.token):
        async with http(server, token) as member:
            for path in pages:
                response = await member.get(path)
                assert response.status_code == 403, (path, response.text)
                assert "missing permission scenarios:read" in response.text


async def test_pages_escape_what_users_wrote_and_stay_out_of_the_api_schema(
    client: AsyncTestClient, agent: FakeAgent, server: LiveServer
) -> None:
    w = await make_world(client, agent)
    name = '<img src=x onerror="alert(1)">'
    scenario = await make_scenario(client, w, name)
    batch = await create_batch(client, w, scenario_ids=[scenario["id"]])
    (run_id,) = (await runs_by_scenario(client, w, batch["id"])).values()
    async with http(server, w.t.owner.token) as owner:
        for path in (
            f"/ui/orgs/{w.t.id}/batches/{batch['id']}",
            f"/ui/orgs/{w.t.id}/runs/{run_id}",
        ):
            response = await owner.get(path)
            assert response.status_code == 200, response.text
            assert name not in response.text
            assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in response.text
            assert "script-src" not in response.headers["content-security-policy"]
            assert "default-src 'self'" in response.headers["content-security-policy"]
            assert response.headers["cache-control"] == "no-store"
        assets = [await owner.get(f"/ui/static/ui.{kind}") for kind in ("css", "js")]
        assert [a.status_code for a in assets] == [200, 200]
        schema: dict[str, Any] = (await owner.get("/schema/openapi.json")).json()
    assert schema["paths"]
    assert not [path for path in schema["paths"] if path.startswith("/ui")]


async def test_the_page_and_the_cli_name_each_criterion_as_its_run_asked_it(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    server: LiveServer,
) -> None:
    """After the scenario is edited (its criteria replaced), a run still names the
    criterion it was judged on: the API's criterion result carries the question and type
    from the run's snapshot, and the results page and the CLI's report read it there (a
    tool check by its type and tool, beside the calls the reply reported)."""
    w = await make_world(client, agent)
    agent.tool_calls = [{"name": "lookup_order", "arguments": {"order_id": "<AB-1>"}}]
    tool_check = {"question": "refund_order", "criteria_type": "tool_called"}
    failing = failing_turn(1)
    failing["criteria"].append(tool_check)
    scenario = await make_scenario(client, w, "refuses", turns=[failing])
    batch = await create_batch(client, w, scenario_ids=[scenario["id"]])
    await drain(app, settings, batch["id"])
    edited = await client.put(
        f"/v1/orgs/{w.t.id}/scenarios/{scenario['id']}",
        json={"turns": [passing_turn(1)]},
        headers=w.headers,
    )
    assert edited.status_code == 200, edited.text
    (run_id,) = (await runs_by_scenario(client, w, batch["id"])).values()
    old_id = scenario["turns"][0]["criteria"][0]["id"]

    async with http(server, w.t.owner.token) as owner:
        page = (await owner.get(f"/ui/orgs/{w.t.id}/runs/{run_id}")).text
    assert "never-said" in page and "(contains)" in page and "removed" not in page
    assert 'refund_order <span class="muted">(tool_called)</span>' in page
    assert '<code class="tool-name">lookup_order</code>' in page
    assert "({&#34;order_id&#34;:&#34;&lt;AB-1&gt;&#34;})" in page

    api = Api(Target(url=server.url, token=w.t.owner.token, org=w.t.id))
    try:
        detail = api.read(api.path(f"scenarios/batch-runs/{batch['id']}"), BatchRunRead)
        (outcome,) = await asyncio.to_thread(outcomes, api, detail)
    finally:
        api.close()
    (turn,) = outcome.failed
    assert turn.criteria == [
        ("never-said", "FAIL", "reply does not contain 'never-said'"),
        (
            "tool_called refund_order",
            "FAIL",
            "refund_order was not called; calls seen: lookup_order",
        ),
    ]
    assert turn.tool_calls == ['lookup_order({"order_id":"<AB-1>"})']
    report = junit_xml(detail, [outcome]).decode() + json_report(detail, [outcome])
    assert "turn 1: never-said" in report and old_id not in report
    assert "FAIL: tool_called refund_order" in report


async def test_an_errored_runs_page_shows_the_turn_it_ended_on_and_what_was_sent(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    server: LiveServer,
) -> None:
    """A run that ended in error is not a run that has not started: its page shows the
    error and the turn it ended on, with the message sent (and the reply, when the agent
    answered before the judge failed)."""
    w = await make_world(client, agent)
    broken = await make_scenario(
        client, w, "broken", turns=[passing_turn(1), {**passing_turn(2), "required": True}]
    )
    unjudged = await make_scenario(
        client,
        w,
        "unjudged",
        turns=[{"user_message": "judge me", "criteria": [{"question": "Was it polite?"}]}],
    )
    batch = await create_batch(client, w, scenario_ids=[broken["id"]], max_concurrency=1)
    agent.enqueue(Reply(json={"content": "Echo: hello 1"}), Reply(status=400, json={}))
    await drain(app, settings, batch["id"])
    judged = await create_batch(client, w, scenario_ids=[unjudged["id"]])
    await drain(app, settings, judged["id"])
    (broken_run,) = (await runs_by_scenario(client, w, batch["id"])).values()
    (unjudged_run,) = (await runs_by_scenario(client, w, judged["id"])).values()

    async with http(server, w.t.owner.token) as owner:
        page = (await owner.get(f"/ui/orgs/{w.t.id}/runs/{broken_run}")).text
        assert "No turn has been played yet" not in page
        assert "agent: " in page  # the run's error
        ended = page[page.index('data-error-turn="1"') :]
        assert "Turn 2" in ended and "hello 2" in ended and "No reply" in ended
        assert "hello 1" in page[: page.index('data-error-turn="1"')]  # the turn that passed

        page = (await owner.get(f"/ui/orgs/{w.t.id}/runs/{unjudged_run}")).text
        assert "No turn has been played yet" not in page
        ended = page[page.index('data-error-turn="0"') :]
        assert "judge me" in ended and "Echo: judge me" in ended
        assert "judge: no judge provider" in page


async def test_a_batch_that_is_over_shows_its_judge_trust(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    db: AsyncSession,
    agent: FakeAgent,
    server: LiveServer,
) -> None:
    w = await make_world(client, agent)
    checked = await make_scenario(client, w, "greets")  # a deterministic check only
    scenario = await make_scenario(
        client, w, "polite", turns=[{"user_message": "hi", "criteria": [{"question": "Polite?"}]}]
    )
    unjudged = await create_batch(client, w, scenario_ids=[checked["id"]])
    batch = await create_batch(client, w, scenario_ids=[scenario["id"]])
    path = f"/ui/orgs/{w.t.id}/batches/{batch['id']}"
    async with http(server, w.t.owner.token) as owner:
        running = await owner.get(path)
        assert "data-progress-url" in running.text
        assert "Judge trust" not in running.text  # null while the batch runs
        await drain(app, settings, batch["id"])
        over = await owner.get(path)
        assert "data-progress-url" not in over.text  # nothing left to watch
        assert "Computing: the pass rates" in over.text  # asked of the calibration queue

        # No criterion for the judge: nothing to compute, and the page says so at once.
        await drain(app, settings, unjudged["id"])
        page = (await owner.get(f"/ui/orgs/{w.t.id}/batches/{unjudged['id']}")).text
        assert "Computing" not in page
        assert "No criterion of this batch was judged by the LLM judge." in page

        criterion = {"criteria_ids": [uuid4()], "scenarios": 4, "judged": 8, "passed": 4}
        report = JudgeTrust(
            status="ready",
            computed_at=utcnow(),
            criteria=[
                TrustedCriterion(
                    question="Was the agent polite?",
                    raw_pass_rate=0.5,
                    calibration_id=uuid4(),
                    calibration_examples=40,
                    tpr=0.9,
                    tnr=0.75,
                    corrected_pass_rate=0.625,
                    interval=Interval(low=0.4, high=0.8),
                    stale=True,
                    stale_reason="the agent's judge changed since the calibration",
                    **criterion,
                )
            ],
            uncalibrated=[
                UncalibratedCriterion(
                    question="Did it <b>upsell</b>?", raw_pass_rate=0.25, **criterion
                )
            ],
        )
        await db.execute(
            update(BatchRun)
            .where(BatchRun.id == UUID(batch["id"]))
            .values(judge_trust=msgspec.to_builtins(report))
        )
        await db.commit()
        ready = (await owner.get(path)).text
    trust = ready[ready.index('id="judge-trust"') :]
    for shown in (
        "Was the agent polite?",
        "4 / 8",
        "50.0 %",  # raw
        "62.5 %",  # corrected
        "40.0 % \N{EN DASH} 80.0 %",
        "90.0 % / 75.0 %",
        "stale</strong>: the agent&#39;s judge changed since the calibration",
        "Did it &lt;b&gt;upsell&lt;/b&gt;?: 25.0 %",
    ):
        assert shown in trust, shown


async def test_a_repeated_batch_shows_pass_hat_k_its_flaky_scenarios_and_its_comparison(
    client: AsyncTestClient, app: Litestar, settings: Settings, server: LiveServer
) -> None:
    """Four runs of each scenario, the second batch against the first: the page draws
    pass^1..pass^4, badges the flaky scenario and shows the stored comparison with each
    changed scenario's p-value and the pass-rate interval; so does the comparison page."""
    with FakeFlakyAgent() as agent:
        w = await make_world(client, agent)
        # wobbly fails 1 of every 4 conversations; lost passes its first 4, then fails 4.
        for name, share in (("steady", ""), ("wobbly", " [fails 1/4]"), ("lost", " [fails 4/8]")):
            check = [{"question": "hello", "criteria_type": "contains"}]
            turns = [{"user_message": f"hello {name}{share}", "criteria": check}]
            await make_scenario(client, w, name, tags=["k"], turns=turns)
        baseline = await create_batch(client, w, tags=["k"], repetitions=4)
        await drain(app, settings, baseline["id"])
        batch = await create_batch(
            client, w, tags=["k"], repetitions=4, baseline_batch_id=baseline["id"]
        )
        await drain(app, settings, batch["id"])
    mine = f"/ui/orgs/{w.t.id}/batches"
    async with http(server, w.t.owner.token) as owner:
        text = (await owner.get(f"{mine}/{batch['id']}")).text
        compared = (await owner.get(f"{mine}/compare?a={baseline['id']}&b={batch['id']}")).text
    reliability = text[text.index('id="reliability"') : text.index('id="comparison"')]
    # steady 4/4, wobbly 3/4, lost 0/4: pass^j = (1 + C(3,j)/C(4,j) + 0) / 3.
    cells = re.findall(r"<td>([^<]*)</td>", reliability[reliability.index('id="pass-hat-k"') :])
    assert cells[:5] == ["58.3 %", "50.0 %", "41.7 %", "33.3 %", "66.7 %"]
    assert reliability.count('<circle class="dot"') == 4
    assert "<title>pass^4: 33.3 %</title>" in reliability
    wobbly_row = reliability[reliability.index("<td>wobbly</td>") :].split("</tr>")[0]
    assert "3 / 4" in wobbly_row and "status-flaky" in wobbly_row
    assert reliability.count("status-flaky") == 1  # wobbly only
    runs = text[text.index('id="runs"') :]
    assert runs.count('wobbly <span class="status status-flaky">flaky</span>') == 4

    comparison = text[text.index('id="comparison"') : text.index('id="runs"')]
    assert '<strong id="significant">1</strong> significant' in comparison
    lost = comparison[comparison.index("<td>lost</td>") :].split("</tr>")[0]
    assert re.findall(r"<td>([^<]*)</td>", lost)[:5] == [
        "lost",
        "regressed",
        "4 / 4",
        "0 / 4",
        "0.0143",
    ]
    assert "significant</span>" in lost
    # The pairs' differences: 0, 0 and -1.
    assert "<strong>-33.3 %</strong>" in comparison and "2000 resamples, seed 0" in comparison
    assert '0.0143 <span class="status status-failed">significant</span>' in compared
    assert "<strong>1</strong> significant\n  regression (p &lt; 0.05)" in compared


async def test_a_batch_shows_its_judge_votes_and_flip_rate_and_links_replays_both_ways(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, server: LiveServer
) -> None:
    """Three votes on a criterion the judge passes 2-1: the run page shows "2-1" (an en dash), the
    batch page the flip rate; the batch links its replay, the replay its source, and a
    completed batch says how to replay it."""
    w = await make_world(client, agent)
    with FakeOpenAI(reply=VoteQuota()) as judge:
        provider = await client.post(
            f"/v1/orgs/{w.t.id}/llm-providers",
            json={
                "name": "judge",
                "provider": "openai_compatible",
                "base_url": f"{judge.url}/v1",
                "default_model": "judge-model",
                "is_default_judge": True,
            },
            headers=w.headers,
        )
        assert provider.status_code == 201, provider.text
        turns = [{"user_message": "hi", "criteria": [{"question": "Polite? [judge:votes 2/3]"}]}]
        scenario = await make_scenario(client, w, "voted", turns=turns)
        batch = await create_batch(client, w, scenario_ids=[scenario["id"]], judge_repetitions=3)
        await drain(app, settings, batch["id"])
        made = await client.post(f"{w.batches}/{batch['id']}/replay", headers=w.headers)
        assert made.status_code == 201, made.text
        replay = made.json()
        await drain(app, settings, replay["id"])
    run_id = (await runs_by_scenario(client, w, batch["id"]))[scenario["id"]]
    mine = f"/ui/orgs/{w.t.id}"
    async with http(server, w.t.owner.token) as owner:
        source_page = (await owner.get(f"{mine}/batches/{batch['id']}")).text
        replay_page = (await owner.get(f"{mine}/batches/{replay['id']}")).text
        run_page = (await owner.get(f"{mine}/runs/{run_id}")).text
    assert '<strong id="flip-rate">100.0 %</strong>' in source_page
    replays = source_page[source_page.index('id="replays"') :]
    assert f'href="{mine}/batches/{replay["id"]}"' in replays
    assert f"spar batch replay {batch['id']}" in replays
    assert f'A replay of <a href="{mine}/batches/{batch["id"]}">' in replay_page
    assert '<span class="verdict verdict-PASS">PASS</span> <span class="votes"' in run_page
    assert ">2&ndash;1</span>" in run_page
