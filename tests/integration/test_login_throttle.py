"""Failed logins are throttled per (account, address), per account and per address, in Redis
(shared/identity/throttle.py): 429 with Retry-After, no lock-out of the real user for long,
no hint whether an account exists."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.app import create_app
from shared.errors import TooManyRequests
from shared.identity.throttle import LoginThrottle, MemoryStore, RedisStore
from shared.settings import Settings
from tests.support.factories import PASSWORD, register, unique_email

WRONG = "not-the-password"
BASE_URL = "http://testserver.local"

Login = Callable[..., Awaitable[httpx.Response]]


@asynccontextmanager
async def throttled(settings: Settings, **limits: Any) -> AsyncIterator[Login]:
    """An app with the given ``login_*`` settings; ``login(email, password, address=...)``
    posts to it from that client address (uvicorn puts the real one in the ASGI scope)."""
    defaults: dict[str, Any] = {
        "login_pair_limit": 100,
        "login_account_limit": 100,
        "login_address_limit": 100,
    }
    app: Litestar = create_app(msgspec.structs.replace(settings, **(defaults | limits)))
    clients: dict[str, httpx.AsyncClient] = {}
    async with AsyncTestClient(app=app, base_url=BASE_URL):  # runs the app's startup

        async def login(email: str, password: str, address: str = "198.51.100.1") -> Any:
            if address not in clients:
                transport = httpx.ASGITransport(app=app, client=(address, 40000))
                clients[address] = httpx.AsyncClient(transport=transport, base_url=BASE_URL)
            return await clients[address].post(
                "/v1/auth/login", json={"email": email, "password": password}
            )

        try:
            yield login
        finally:
            for http in clients.values():
                await http.aclose()


def assert_throttled(response: httpx.Response, at_most_s: float) -> int:
    assert response.status_code == 429, response.text
    assert set(response.json()) == {"detail"}
    assert isinstance(response.json()["detail"], str)
    retry_after = int(response.headers["retry-after"])
    assert 1 <= retry_after <= max(1, at_most_s)
    return retry_after


async def test_failed_logins_on_one_account_end_in_429_with_retry_after(
    client: AsyncTestClient, settings: Settings, db: AsyncSession
) -> None:
    user = await register(client)
    async with throttled(settings, login_pair_limit=3, login_pair_window_s=60) as login:
        failures = [await login(user.email, WRONG) for _ in range(3)]
        refused = await login(user.email, WRONG)
        correct = await login(user.email, PASSWORD)

    assert [r.status_code for r in failures] == [401, 401, 401]
    assert_throttled(refused, 60)
    # The right password does not open a locked pair, and no token was issued for it.
    assert_throttled(correct, 60)
    tokens = await db.scalar(
        text(
            "SELECT count(*) FROM user_tokens t JOIN users u ON u.id = t.user_id WHERE u.email = :e"
        ),
        {"e": user.email},
    )
    assert tokens == 1  # the registration's


async def test_the_real_user_from_another_address_still_gets_in(
    client: AsyncTestClient, settings: Settings
) -> None:
    user = await register(client)
    async with throttled(settings, login_pair_limit=3, login_pair_window_s=60) as login:
        for _ in range(3):
            await login(user.email, WRONG, address="203.0.113.66")
        attacker = await login(user.email, PASSWORD, address="203.0.113.66")
        owner = await login(user.email, PASSWORD, address="192.0.2.10")

    assert_throttled(attacker, 60)
    assert owner.status_code == 200, owner.text
    me = await client.get(
        "/v1/auth/me", headers={"Authorization": f"Bearer {owner.json()['access_token']}"}
    )
    assert me.status_code == 200, me.text


async def test_an_account_guessed_from_many_addresses_locks_briefly_but_not_its_known_address(
    client: AsyncTestClient, settings: Settings
) -> None:
    user = await register(client)
    async with throttled(settings, login_account_limit=3, login_account_window_s=60) as login:
        home = await login(user.email, PASSWORD, address="192.0.2.10")  # now a known address
        spread = [await login(user.email, WRONG, address=f"203.0.113.{i}") for i in range(3)]
        new_address = await login(user.email, PASSWORD, address="198.51.100.77")
        from_home = await login(user.email, PASSWORD, address="192.0.2.10")

    assert home.status_code == 200, home.text
    assert [r.status_code for r in spread] == [401] * 3
    # The account's window is short, and Retry-After never exceeds it.
    assert_throttled(new_address, 60)
    assert from_home.status_code == 200, from_home.text


async def test_an_ipv6_client_counts_as_its_slash_64(
    client: AsyncTestClient, settings: Settings
) -> None:
    user = await register(client)
    async with throttled(settings, login_pair_limit=1, login_pair_window_s=60) as login:
        await login(user.email, WRONG, address="2001:db8:0:1::1")
        same_network = await login(user.email, PASSWORD, address="2001:db8:0:1::2")
        next_network = await login(user.email, PASSWORD, address="2001:db8:0:2::1")

    assert_throttled(same_network, 60)
    assert next_network.status_code == 200, next_network.text


async def test_one_address_failing_on_many_accounts_is_stopped(
    client: AsyncTestClient, settings: Settings
) -> None:
    users = [await register(client) for _ in range(4)]
    sprayer = "203.0.113.99"
    async with throttled(settings, login_address_limit=3, login_address_window_s=60) as login:
        sprayed = [await login(u.email, WRONG, address=sprayer) for u in users[:3]]
        fourth = await login(users[3].email, PASSWORD, address=sprayer)
        unknown = await login(unique_email("nobody"), WRONG, address=sprayer)
        elsewhere = await login(users[3].email, PASSWORD, address="192.0.2.10")

    assert [r.status_code for r in sprayed] == [401] * 3
    assert_throttled(fourth, 60)
    assert_throttled(unknown, 60)
    assert elsewhere.status_code == 200, elsewhere.text


async def test_a_success_clears_the_pairs_count(
    client: AsyncTestClient, settings: Settings
) -> None:
    user = await register(client)
    async with throttled(settings, login_pair_limit=3, login_pair_window_s=60) as login:
        before = [await login(user.email, WRONG) for _ in range(2)]
        success = await login(user.email, PASSWORD)
        after = [await login(user.email, WRONG) for _ in range(3)]
        refused = await login(user.email, WRONG)

    assert [r.status_code for r in before] == [401, 401]
    assert success.status_code == 200, success.text
    assert [r.status_code for r in after] == [401, 401, 401]
    assert_throttled(refused, 60)


async def test_a_lock_out_ends_with_its_window(client: AsyncTestClient, settings: Settings) -> None:
    user = await register(client)
    async with throttled(settings, login_pair_limit=1, login_pair_window_s=2.0) as login:
        await login(user.email, WRONG)
        locked = await login(user.email, PASSWORD)
        retry_after = assert_throttled(locked, 2)
        await asyncio.sleep(retry_after + 0.1)
        unlocked = await login(user.email, PASSWORD)

    assert unlocked.status_code == 200, unlocked.text


async def test_a_missing_account_is_throttled_exactly_like_an_existing_one(
    client: AsyncTestClient, settings: Settings
) -> None:
    user = await register(client)
    missing = unique_email("ghost")
    async with throttled(settings, login_pair_limit=2, login_pair_window_s=60) as login:
        existing = [await login(user.email, WRONG) for _ in range(3)]
        ghost = [await login(missing, WRONG) for _ in range(3)]

    for first, second in zip(existing, ghost, strict=True):
        assert first.status_code == second.status_code
        assert first.json() == second.json()
    assert existing[-1].status_code == 429
    assert existing[-1].headers["retry-after"] == ghost[-1].headers["retry-after"]


async def test_a_burst_of_concurrent_guesses_gets_no_more_than_the_limit(
    client: AsyncTestClient, settings: Settings
) -> None:
    user = await register(client)
    async with throttled(settings, login_pair_limit=3, login_pair_window_s=60) as login:
        burst = await asyncio.gather(*(login(user.email, WRONG) for _ in range(10)))

    codes = sorted(r.status_code for r in burst)
    assert codes == [401] * 3 + [429] * 7


async def test_registration_and_tokens_keep_working_from_a_throttled_address(
    client: AsyncTestClient, settings: Settings
) -> None:
    user = await register(client)
    address = "203.0.113.5"
    async with throttled(settings, login_address_limit=1, login_address_window_s=60) as login:
        await login(user.email, WRONG, address=address)
        assert_throttled(await login(user.email, PASSWORD, address=address), 60)
        app_client = httpx.ASGITransport(app=client.app, client=(address, 40000))
        async with httpx.AsyncClient(transport=app_client, base_url=BASE_URL) as http:
            email = unique_email()
            registered = await http.post(
                "/v1/auth/register",
                json={"email": email, "password": PASSWORD, "first_name": "A", "last_name": "B"},
            )
            me = await http.get("/v1/auth/me", headers=user.headers)

    assert registered.status_code == 201, registered.text
    assert me.status_code == 200, me.text


async def test_the_default_limits_still_allow_a_few_typos(client: AsyncTestClient) -> None:
    user = await register(client)

    typos = [
        await client.post("/v1/auth/login", json={"email": user.email, "password": WRONG})
        for _ in range(4)
    ]
    fixed = await client.post("/v1/auth/login", json={"email": user.email, "password": PASSWORD})

    assert [r.status_code for r in typos] == [401] * 4
    assert fixed.status_code == 200, fixed.text


# --- the rule is the same on Redis and in one process (spar dev) -------------------------------


Throttle = Callable[..., LoginThrottle]


@pytest.fixture(params=["redis", "memory"])
async def make_throttle(
    request: pytest.FixtureRequest, settings: Settings
) -> AsyncIterator[Throttle]:
    """``make_throttle(**login_settings)``: a throttle on Redis, or on the in-process store."""
    assert settings.redis_url
    store = RedisStore(settings.redis_url) if request.param == "redis" else MemoryStore()
    base = msgspec.structs.replace(
        settings,
        login_pair_limit=2,
        login_account_limit=3,
        login_address_limit=4,
        login_key_prefix=settings.login_key_prefix + "unit:",
    )
    yield lambda **limits: LoginThrottle(msgspec.structs.replace(base, **limits), store)
    await store.clear(base.login_key_prefix)
    await store.close()


async def fail(throttle: LoginThrottle, email: str, address: str) -> None:
    """A failed attempt: admitted, then never settled."""
    await throttle.admit(email, address)


async def test_each_store_applies_the_same_rule(make_throttle: Throttle) -> None:
    throttle = make_throttle()
    # Pair: 2 failures, then refused; a success on another pair resets only that pair.
    await fail(throttle, "a@example.com", "10.0.0.1")
    await fail(throttle, "a@example.com", "10.0.0.1")
    with pytest.raises(TooManyRequests) as pair:
        await throttle.admit("a@example.com", "10.0.0.1")
    assert 1 <= pair.value.retry_after <= 900  # the default pair window
    ok = await throttle.admit("a@example.com", "10.0.0.2")
    await throttle.succeeded(ok)  # took its count back: the account has 2 failures
    # Account: a third failure from yet another address reaches its limit of 3...
    await fail(throttle, "a@example.com", "10.0.0.3")
    with pytest.raises(TooManyRequests):
        await throttle.admit("a@example.com", "10.0.0.4")
    # ...but the address that succeeded is known and exempt from it.
    await throttle.succeeded(await throttle.admit("a@example.com", "10.0.0.2"))
    # Address: 4 failures across accounts, then refused for any account.
    for n in range(4):
        await fail(throttle, f"b{n}@example.com", "10.0.0.9")
    with pytest.raises(TooManyRequests):
        await throttle.admit("c@example.com", "10.0.0.9")
    # An attempt that ended in an error counts nothing.
    for _ in range(3):
        await throttle.abandoned(await throttle.admit("d@example.com", "10.0.0.8"))
    await throttle.admit("d@example.com", "10.0.0.8")


async def test_each_store_forgets_failures_when_the_window_ends(make_throttle: Throttle) -> None:
    throttle = make_throttle(login_pair_window_s=0.3)
    await fail(throttle, "e@example.com", "10.0.0.7")
    await fail(throttle, "e@example.com", "10.0.0.7")
    with pytest.raises(TooManyRequests) as locked:
        await throttle.admit("e@example.com", "10.0.0.7")
    assert locked.value.retry_after == 1  # whole seconds, rounded up

    await asyncio.sleep(0.4)

    await throttle.admit("e@example.com", "10.0.0.7")
