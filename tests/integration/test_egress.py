"""The egress client against real loopback servers (DESIGN §5.1 "Egress").

Allow-list matching, the entry's headers and query params with credentials resolved,
DNS pinning (Host header), the SSRF guard, redirects and retries.  No test talks to
anything but 127.0.0.1: DNS is faked with the client's ``resolver=``, and every refused
address is refused before a connection — the SSRF tests also route through
``loopback_only_http()`` so that even a regression could not reach a real private address.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import math
import socket
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from shared.outbound import egress
from shared.outbound.egress import (
    BlockedAddress,
    DomainRule,
    EgressClient,
    EgressError,
    EgressPolicy,
    EgressTransportError,
    HostNotAllowed,
    is_public_address,
    new_http_session,
)
from tests.support.fakes import FakeServer, Reply, loopback_only_http, unused_loopback_url

# Private, loopback, link-local, CGNAT, unspecified, and the IPv6 forms that embed them.
BLOCKED_ADDRESSES = [
    "127.0.0.1",
    "::1",
    "10.0.0.5",
    "172.16.1.1",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "0.0.0.0",  # noqa: S104 - an address to refuse, not to bind
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "fd00:ec2::254",
    "fe80::1",
    "64:ff9b::7f00:1",
    "2002:7f00:1::",
]
NUMERIC_LOOPBACK_FORMS = ["2130706433", "017700000001", "0x7f000001", "127.1"]


class FakeDNS:
    """A resolver for ``EgressClient(resolver=...)``: fixed records, every lookup recorded.
    Unknown names fail like getaddrinfo does, so nothing ever reaches a real DNS server."""

    def __init__(self, records: dict[str, list[str]] | None = None) -> None:
        self.records = records or {}
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        if host not in self.records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.records[host])


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays the egress client waits between attempts, in order; each is waited as
    no time at all, so a test reads what the client chose instead of timing it."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, result: Any = None) -> Any:
        delays.append(delay)
        return await real_sleep(0, result)

    # Only the egress module's view of asyncio: the loop's other tasks sleep as ever.
    monkeypatch.setattr(egress, "asyncio", SimpleNamespace(**{**vars(asyncio), "sleep": sleep}))
    return delays


def make_client(policy: EgressPolicy, **options: Any) -> EgressClient:
    """A client with test-sized timeouts and backoff."""
    settings: dict[str, Any] = {
        "timeout_s": 1.0,
        "connect_timeout_s": 1.0,
        "backoff_s": 0.01,
        "max_attempts": 3,
    }
    settings.update(options)
    return EgressClient(policy, **settings)


def loopback_policy(**rule: Any) -> EgressPolicy:
    return EgressPolicy(rules=[DomainRule("127.0.0.1", **rule)], allow_private=True)


def url_for(host: str, port: int, path: str = "/") -> str:
    netloc = f"[{host}]" if ":" in host else host
    return f"http://{netloc}:{port}{path}"


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with FakeServer(default=Reply(json={"ok": True})) as server:
        yield server


@pytest.fixture
async def guarded_http() -> AsyncIterator[aiohttp.ClientSession]:
    async with loopback_only_http() as http:
        yield http


# --- allow-list ------------------------------------------------------------------------------


async def test_a_host_not_on_the_allow_list_is_refused_by_name_before_any_request(
    fake: FakeServer,
) -> None:
    dns = FakeDNS()
    policy = EgressPolicy(rules=[DomainRule("api.example.com")], allow_private=True)

    with pytest.raises(HostNotAllowed) as refused:
        await make_client(policy, resolver=dns).request("GET", f"{fake.url}/x")

    assert refused.value.host == "127.0.0.1"
    assert "'127.0.0.1'" in str(refused.value)
    assert "allowed domains" in str(refused.value)
    assert fake.requests == []
    assert dns.calls == []


async def test_an_empty_allow_list_refuses_everything(fake: FakeServer) -> None:
    with pytest.raises(HostNotAllowed):
        await make_client(EgressPolicy(rules=[], allow_private=True)).request("GET", fake.url)
    assert fake.requests == []


async def test_an_exact_entry_matches_only_that_host(fake: FakeServer) -> None:
    dns = FakeDNS({"api.example.com": ["127.0.0.1"], "eu.api.example.com": ["127.0.0.1"]})
    policy = EgressPolicy(rules=[DomainRule("api.example.com")], allow_private=True)
    client = make_client(policy, resolver=dns)

    response = await client.request("GET", url_for("api.example.com", fake.port, "/ok"))
    assert response.status_code == 200
    assert response.json() == {"ok": True}
    assert fake.paths == ["/ok"]

    with pytest.raises(HostNotAllowed) as refused:
        await client.request("GET", url_for("eu.api.example.com", fake.port))
    assert refused.value.host == "eu.api.example.com"
    assert len(fake.requests) == 1


async def test_host_names_are_matched_case_insensitively(fake: FakeServer) -> None:
    dns = FakeDNS({"api.example.com": ["127.0.0.1"]})
    policy = EgressPolicy(rules=[DomainRule("api.example.com")], allow_private=True)

    response = await make_client(policy, resolver=dns).request(
        "GET", url_for("API.Example.COM", fake.port)
    )

    assert response.status_code == 200
    assert dns.calls == [("api.example.com", fake.port)]


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("sub.example.com", True),
        ("a.b.example.com", True),
        ("example.com", False),
        ("badexample.com", False),
        ("example.com.evil.net", False),
    ],
)
async def test_a_wildcard_entry_matches_subdomains_only(
    fake: FakeServer, host: str, allowed: bool
) -> None:
    dns = FakeDNS({host: ["127.0.0.1"]})  # every name lands on the fake if allowed
    policy = EgressPolicy(rules=[DomainRule("*.example.com")], allow_private=True)
    client = make_client(policy, resolver=dns)

    if allowed:
        response = await client.request("GET", url_for(host, fake.port, "/w"))
        assert response.status_code == 200
        assert fake.requests[0].header("host") == f"{host}:{fake.port}"
    else:
        with pytest.raises(HostNotAllowed) as refused:
            await client.request("GET", url_for(host, fake.port, "/w"))
        assert refused.value.host == host
        assert fake.requests == []
        assert dns.calls == []


async def test_the_most_specific_entry_supplies_the_headers(fake: FakeServer) -> None:
    hosts = ["api.example.com", "x.eu.example.com", "other.example.com"]
    dns = FakeDNS({host: ["127.0.0.1"] for host in hosts})
    policy = EgressPolicy(
        rules=[
            DomainRule("*.example.com", headers={"X-Rule": "wildcard"}),
            DomainRule("api.example.com", headers={"X-Rule": "exact"}),
            DomainRule("*.eu.example.com", headers={"X-Rule": "longer-wildcard"}),
        ],
        allow_private=True,
    )
    client = make_client(policy, resolver=dns)

    for host in hosts:
        await client.request("GET", url_for(host, fake.port))

    assert [r.header("x-rule") for r in fake.requests] == ["exact", "longer-wildcard", "wildcard"]


# --- the entry's headers and query params -----------------------------------------------------


async def test_entry_headers_and_query_params_are_added_with_credentials_resolved(
    fake: FakeServer,
) -> None:
    policy = EgressPolicy(
        rules=[
            DomainRule(
                "127.0.0.1",
                headers={
                    "X-Api-Key": "{{credentials.API_KEY}}",
                    "Authorization": "Bearer {{ credentials.TOKEN }}",
                    "X-Static": "plain",
                },
                query_params={"key": "{{credentials.QUERY_KEY}}", "region": "eu"},
            )
        ],
        credentials={"API_KEY": "k-123", "TOKEN": "t-456", "QUERY_KEY": "q &=/?#"},
        allow_private=True,
    )

    response = await make_client(policy).request(
        "POST",
        f"{fake.url}/v1/do?existing=1",
        json={"a": 1},
        headers={"X-Caller": "caller", "X-Api-Key": "spoofed by the caller"},
    )

    assert response.status_code == 200
    [received] = fake.requests
    assert received.method == "POST"
    assert received.path == "/v1/do"
    assert received.header("x-api-key") == "k-123"  # the entry wins over the caller
    assert received.header("authorization") == "Bearer t-456"
    assert received.header("x-static") == "plain"
    assert received.header("x-caller") == "caller"
    assert received.header("content-type") == "application/json"
    assert received.query == {"existing": ["1"], "key": ["q &=/?#"], "region": ["eu"]}
    assert received.json == {"a": 1}


@pytest.mark.parametrize("where", ["headers", "query_params"])
async def test_a_missing_credential_fails_before_any_request(fake: FakeServer, where: str) -> None:
    rule = DomainRule("127.0.0.1", **{where: {"X-Key": "{{credentials.NOT_THERE}}"}})
    policy = EgressPolicy(rules=[rule], credentials={"OTHER": "v"}, allow_private=True)

    with pytest.raises(EgressError, match="NOT_THERE"):
        await make_client(policy).request("GET", fake.url)

    assert fake.requests == []


async def test_the_connection_is_pinned_to_the_checked_address_with_the_original_host(
    fake: FakeServer,
) -> None:
    dns = FakeDNS({"api.example.com": ["127.0.0.1"]})
    policy = EgressPolicy(rules=[DomainRule("api.example.com")], allow_private=True)

    response = await make_client(policy, resolver=dns).request(
        "GET", url_for("api.example.com", fake.port, "/pinned?q=1")
    )

    assert response.status_code == 200
    [received] = fake.requests
    assert received.header("host") == f"api.example.com:{fake.port}"
    assert received.path == "/pinned"
    assert received.query == {"q": ["1"]}
    # Resolved once, by the guard; the connection used that answer, not a second lookup.
    assert dns.calls == [("api.example.com", fake.port)]


async def test_an_ipv6_literal_host_header_is_bracketed(fake: FakeServer) -> None:
    """[::ffff:127.0.0.1] is the fake's own 127.0.0.1 (IPv4-mapped).  The Host header is a
    uri-host (RFC 9110 §7.2, RFC 3986 §3.2.2): an IPv6 literal keeps its brackets, else
    "::ffff:127.0.0.1:port" cannot be told apart from a host and a port."""
    mapped = str(ipaddress.ip_address("::ffff:127.0.0.1"))
    policy = EgressPolicy(rules=[DomainRule(mapped)], allow_private=True)

    response = await make_client(policy).request("GET", url_for("::ffff:127.0.0.1", fake.port))

    assert response.status_code == 200
    assert fake.requests[0].header("host") == f"[::ffff:127.0.0.1]:{fake.port}"


async def test_a_name_that_does_not_resolve_is_a_transport_error(fake: FakeServer) -> None:
    policy = EgressPolicy(rules=[DomainRule("*.example.com")], allow_private=True)
    client = make_client(policy, resolver=FakeDNS({"empty.example.com": []}))

    with pytest.raises(EgressTransportError, match=r"could not resolve 'missing\.example\.com'"):
        await client.request("GET", url_for("missing.example.com", fake.port))
    with pytest.raises(EgressTransportError, match="no addresses"):
        await client.request("GET", url_for("empty.example.com", fake.port))
    assert fake.requests == []


# --- SSRF guard ------------------------------------------------------------------------------


@pytest.mark.parametrize("address", BLOCKED_ADDRESSES)
async def test_a_private_address_literal_is_refused(
    fake: FakeServer, guarded_http: aiohttp.ClientSession, address: str
) -> None:
    canonical = str(ipaddress.ip_address(address))
    policy = EgressPolicy(rules=[DomainRule(canonical)], allow_private=False)
    dns = FakeDNS()

    with pytest.raises(BlockedAddress) as refused:
        await make_client(policy, http=guarded_http, resolver=dns).request(
            "GET", url_for(address, fake.port, "/latest/meta-data")
        )

    assert refused.value.address == canonical
    assert "SPAR_EGRESS_ALLOW_PRIVATE" in str(refused.value)
    assert fake.requests == []
    assert dns.calls == []  # a literal is checked as is


@pytest.mark.parametrize("address", BLOCKED_ADDRESSES)
async def test_a_name_resolving_to_a_private_address_is_refused(
    fake: FakeServer, guarded_http: aiohttp.ClientSession, address: str
) -> None:
    dns = FakeDNS({"internal.example.com": [address]})
    policy = EgressPolicy(rules=[DomainRule("*.example.com")], allow_private=False)

    with pytest.raises(BlockedAddress) as refused:
        await make_client(policy, http=guarded_http, resolver=dns).request(
            "GET", url_for("internal.example.com", fake.port)
        )

    assert refused.value.host == "internal.example.com"
    assert refused.value.address == address
    assert fake.requests == []


@pytest.mark.parametrize(
    "addresses",
    [["8.8.8.8", "10.0.0.5"], ["10.0.0.5", "8.8.8.8"], ["2606:4700:4700::1111", "127.0.0.1"]],
)
async def test_a_name_resolving_to_public_and_private_addresses_is_refused(
    fake: FakeServer, guarded_http: aiohttp.ClientSession, addresses: list[str]
) -> None:
    dns = FakeDNS({"mixed.example.com": addresses})
    policy = EgressPolicy(rules=[DomainRule("mixed.example.com")], allow_private=False)

    with pytest.raises(BlockedAddress) as refused:
        await make_client(policy, http=guarded_http, resolver=dns).request(
            "GET", url_for("mixed.example.com", fake.port)
        )

    assert not is_public_address(refused.value.address)
    assert fake.requests == []


async def test_loopback_is_refused_on_the_default_transport_too(fake: FakeServer) -> None:
    """The guard does not depend on an injected HTTP session."""
    dns = FakeDNS({"local.example.com": ["127.0.0.1"]})
    policy = EgressPolicy(
        rules=[DomainRule("127.0.0.1"), DomainRule("local.example.com")], allow_private=False
    )
    client = make_client(policy, resolver=dns)

    with pytest.raises(BlockedAddress):
        await client.request("GET", fake.url)
    with pytest.raises(BlockedAddress):
        await client.request("GET", url_for("local.example.com", fake.port))
    assert fake.requests == []


async def test_allow_private_lets_the_same_request_through(fake: FakeServer) -> None:
    rules = [DomainRule("127.0.0.1")]
    with pytest.raises(BlockedAddress):
        await make_client(EgressPolicy(rules=rules, allow_private=False)).request("GET", fake.url)
    assert fake.requests == []

    response = await make_client(EgressPolicy(rules=rules, allow_private=True)).request(
        "GET", fake.url
    )
    assert response.status_code == 200
    assert len(fake.requests) == 1


@pytest.mark.parametrize("form", NUMERIC_LOOPBACK_FORMS)
async def test_numeric_host_forms_do_not_match_an_allowed_ip(fake: FakeServer, form: str) -> None:
    """2130706433 is 127.0.0.1 to getaddrinfo, but not the allowed entry "127.0.0.1"."""
    policy = EgressPolicy(rules=[DomainRule("127.0.0.1")], allow_private=True)

    with pytest.raises(HostNotAllowed) as refused:
        await make_client(policy).request("GET", url_for(form, fake.port))

    assert refused.value.host == form
    assert fake.requests == []


@pytest.mark.parametrize("form", NUMERIC_LOOPBACK_FORMS)
async def test_numeric_host_forms_allowed_literally_resolve_to_loopback_and_are_refused(
    fake: FakeServer, guarded_http: aiohttp.ClientSession, form: str
) -> None:
    # The real resolver: getaddrinfo parses these numerically (no DNS query).
    policy = EgressPolicy(rules=[DomainRule(form)], allow_private=False)

    with pytest.raises(BlockedAddress) as refused:
        await make_client(policy, http=guarded_http).request("GET", url_for(form, fake.port))

    assert refused.value.address == "127.0.0.1"
    assert fake.requests == []


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "2002:808:808::",
        "64:ff9b::808:808",
    ],
)
def test_public_addresses(address: str) -> None:
    assert is_public_address(address)


@pytest.mark.parametrize(
    "address",
    [
        *BLOCKED_ADDRESSES,
        "127.255.255.254",
        "10.255.255.255",
        "172.31.255.255",
        "100.127.255.255",
        "224.0.0.1",
        "255.255.255.255",
        "::",
        "ff02::1",
        "fc00::1",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "2002:a9fe:a9fe::",
    ],
)
def test_private_and_reserved_addresses(address: str) -> None:
    assert not is_public_address(address)


def test_deprecated_site_local_ipv6_is_not_public() -> None:
    """fec0::/10 (RFC 3879 site-local) is a private range like fc00::/7; Python's
    ``is_global`` does not know it, so the guard has to."""
    assert not is_public_address("fec0::1")


# --- URLs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1/file",
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/_",
        "javascript:alert(1)",
        "//127.0.0.1/no-scheme",
        "127.0.0.1/no-scheme",
        "http:///no-host",
    ],
)
async def test_non_http_urls_are_refused(fake: FakeServer, url: str) -> None:
    with pytest.raises(EgressError, match="not an absolute http") as refused:
        await make_client(loopback_policy()).request("GET", url)
    assert type(refused.value) is EgressError
    assert fake.requests == []


@pytest.mark.parametrize(
    "template",
    [
        "http://user:secret@127.0.0.1:{port}/",
        "http://user@127.0.0.1:{port}/",
        "http://127.0.0.1:{port}@127.0.0.1:{port}/",
    ],
)
async def test_urls_with_user_info_are_refused(fake: FakeServer, template: str) -> None:
    with pytest.raises(EgressError, match="user info"):
        await make_client(loopback_policy()).request("GET", template.format(port=fake.port))
    assert fake.requests == []


# --- redirects -----------------------------------------------------------------------------------


async def test_a_redirect_on_the_same_allowed_host_is_followed_and_rechecked(
    fake: FakeServer,
) -> None:
    fake.enqueue(Reply.redirect("/next?step=2"), Reply.redirect(f"{fake.url}/last", status=307))
    client = make_client(loopback_policy(headers={"X-Rule": "yes"}))

    response = await client.request("POST", f"{fake.url}/start", json={"n": 1})

    assert response.status_code == 200
    assert response.url == f"{fake.url}/last"
    assert fake.paths == ["/start", "/next", "/last"]
    assert fake.requests[1].query == {"step": ["2"]}
    assert [r.header("x-rule") for r in fake.requests] == ["yes", "yes", "yes"]
    assert [r.method for r in fake.requests] == ["POST", "POST", "POST"]
    assert fake.requests[2].json == {"n": 1}  # 307 keeps the method and the body


async def test_a_303_redirect_continues_with_a_get_without_body(fake: FakeServer) -> None:
    fake.enqueue(Reply.redirect("/result", status=303))

    response = await make_client(loopback_policy()).request("POST", fake.url, json={"n": 1})

    assert response.status_code == 200
    assert [(r.method, r.path) for r in fake.requests] == [("POST", "/"), ("GET", "/result")]
    assert fake.requests[1].body == b""


async def test_a_redirect_to_a_host_not_on_the_allow_list_is_refused(fake: FakeServer) -> None:
    fake.enqueue(Reply.redirect("http://metadata.internal/latest/meta-data"))
    dns = FakeDNS()

    with pytest.raises(HostNotAllowed) as refused:
        await make_client(loopback_policy(), resolver=dns).request("GET", f"{fake.url}/go")

    assert refused.value.host == "metadata.internal"
    assert fake.paths == ["/go"]
    assert dns.calls == []


async def test_the_callers_authorization_does_not_follow_a_redirect_to_another_host(
    fake: FakeServer,
) -> None:
    """A provider's key is for the provider: a redirect to another allowed host must not
    carry it along (what httpx, requests and curl do); that host's own entry applies."""
    dns = FakeDNS({"other.example.com": ["127.0.0.1"]})
    policy = EgressPolicy(
        rules=[
            DomainRule("127.0.0.1", headers={"X-Entry": "first"}),
            DomainRule("other.example.com", headers={"X-Entry": "second"}),
        ],
        allow_private=True,
    )
    fake.enqueue(Reply.redirect(url_for("other.example.com", fake.port, "/landing")))

    response = await make_client(policy, resolver=dns).request(
        "POST",
        f"{fake.url}/v1/chat/completions",
        json={},
        headers={"Authorization": "Bearer sk-provider-key"},
    )

    assert response.status_code == 200
    first, second = fake.requests
    assert first.header("authorization") == "Bearer sk-provider-key"
    assert second.header("host") == f"other.example.com:{fake.port}"
    assert [first.header("x-entry"), second.header("x-entry")] == ["first", "second"]
    assert second.header("authorization") is None


async def test_a_redirect_loop_stops_after_max_redirects(fake: FakeServer) -> None:
    fake.default = Reply.redirect("/loop")

    with pytest.raises(EgressError, match="too many redirects") as refused:
        await make_client(loopback_policy(), max_redirects=2).request("GET", f"{fake.url}/loop")

    assert type(refused.value) is EgressError
    assert len(fake.requests) == 3  # the first request and two redirects


# --- retries -------------------------------------------------------------------------------------


async def test_5xx_answers_are_retried_until_success(fake: FakeServer) -> None:
    fake.enqueue(Reply(status=503), Reply(status=503))

    response = await make_client(loopback_policy()).request("POST", fake.url, json={"x": 1})

    assert response.status_code == 200
    assert response.attempts == 3
    assert len(fake.requests) == 3
    assert [r.json for r in fake.requests] == [{"x": 1}] * 3


@pytest.mark.parametrize("status", [408, 409, 429, 500, 501, 502, 503, 504, 529])
async def test_the_statuses_the_official_sdks_retry_are_retried(
    fake: FakeServer, status: int, slept: list[float]
) -> None:
    """As the OpenAI and Anthropic SDKs do: 408, 409, 429 and every 5xx (Anthropic's 529
    ``overloaded_error`` among them)."""
    fake.enqueue(Reply(status=status, json={"error": "try again"}))
    response = await make_client(loopback_policy()).request("GET", fake.url)
    assert (response.status_code, response.attempts) == (200, 2)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_errors_are_not_retried(fake: FakeServer, status: int) -> None:
    fake.enqueue(Reply(status=status, json={"error": "no"}))
    response = await make_client(loopback_policy()).request("GET", fake.url)
    assert (response.status_code, response.attempts) == (status, 1)
    assert response.json() == {"error": "no"}
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("headers", "status", "attempts"),
    [({"x-should-retry": "false"}, 503, 1), ({"x-should-retry": "true"}, 400, 2)],
)
async def test_x_should_retry_is_obeyed_as_the_sdks_do(
    fake: FakeServer, headers: dict[str, str], status: int, attempts: int, slept: list[float]
) -> None:
    fake.enqueue(Reply(status=status, headers=headers))
    response = await make_client(loopback_policy()).request("GET", fake.url)
    assert response.attempts == attempts


@pytest.mark.parametrize("retry_after", ["0", "Wed, 21 Oct 2015 07:28:00 GMT"])
async def test_retry_after_now_is_honoured_instead_of_backoff(
    fake: FakeServer, retry_after: str, slept: list[float]
) -> None:
    fake.enqueue(Reply(status=429, headers={"Retry-After": retry_after}))
    client = make_client(loopback_policy(), backoff_s=3.0)  # backoff alone would wait ≥ 1.5 s

    response = await client.request("GET", fake.url)

    assert slept == [0.0]  # what Retry-After said, not the backoff
    assert (response.status_code, response.attempts) == (200, 2)


@pytest.mark.parametrize(
    ("headers", "asked"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # milliseconds win
        ({"Retry-After": "2"}, 2.0),
        ({"Retry-After": "0.75"}, 0.75),  # a fraction, as the SDKs allow
    ],
)
async def test_the_wait_asked_for_is_the_wait(
    fake: FakeServer, headers: dict[str, str], asked: float, slept: list[float]
) -> None:
    fake.enqueue(Reply(status=429, headers=headers))
    response = await make_client(loopback_policy(), timeout_s=5.0).request("GET", fake.url)

    assert response.status_code == 200
    assert slept == [pytest.approx(asked)]


async def test_a_retry_after_http_date_is_honoured(fake: FakeServer, slept: list[float]) -> None:
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3))
    fake.enqueue(Reply(status=503, headers={"Retry-After": date}))

    await make_client(loopback_policy(), timeout_s=10.0).request("GET", fake.url)

    [waited] = slept
    assert 1.5 <= waited <= 3.5  # the date has a one-second resolution


async def test_a_wait_past_the_calls_timeout_is_not_started(
    fake: FakeServer, slept: list[float]
) -> None:
    """Waiting longer than the call may last is pointless: the answer that asked for the
    wait is the call's answer, at once."""
    fake.enqueue(Reply(status=503, headers={"Retry-After": "120"}, json={"error": "later"}))

    response = await make_client(loopback_policy(), timeout_s=2.0).request("GET", fake.url)

    assert (response.status_code, response.attempts) == (503, 1)
    assert response.json() == {"error": "later"}
    assert slept == []


async def test_a_nan_retry_after_does_not_stall_the_call(
    fake: FakeServer, slept: list[float]
) -> None:
    """float("nan") parses; sleeping NaN seconds never ends.  A server must not be able to
    hang a worker with one header: fall back to the backoff."""
    fake.enqueue(Reply(status=503, headers={"Retry-After": "nan"}))
    client = make_client(loopback_policy())

    response = await asyncio.wait_for(client.request("GET", fake.url), timeout=1.0)

    assert (response.status_code, response.attempts) == (200, 2)
    assert len(slept) == 1 and math.isfinite(slept[0]), slept


async def test_a_persistent_500_is_returned_after_max_attempts(fake: FakeServer) -> None:
    fake.default = Reply(status=500, json={"error": "boom"})

    response = await make_client(loopback_policy(), max_attempts=3).request("GET", fake.url)

    assert response.status_code == 500
    assert response.attempts == 3
    assert response.json() == {"error": "boom"}
    assert len(fake.requests) == 3


async def test_a_server_that_is_down_is_a_transport_error_after_max_attempts() -> None:
    url = unused_loopback_url()

    with pytest.raises(EgressTransportError, match="after 3 attempts") as failed:
        await make_client(loopback_policy(), max_attempts=3).request("GET", f"{url}/x")

    assert "could not reach" in str(failed.value)
    assert url.removeprefix("http://") in str(failed.value)


# --- the timeout bounds the whole call -----------------------------------------------------------


async def test_a_hung_server_ends_the_call_within_its_timeout(fake: FakeServer) -> None:
    """Attempts, waits and redirects share one timeout: a hung answer takes all of it, and
    no attempt is started after it (per attempt, this was 3 x 0.4 s and the backoff)."""
    fake.default = Reply(json={}, delay=10)
    client = make_client(loopback_policy(), timeout_s=0.4, max_attempts=3)

    started = time.monotonic()
    with pytest.raises(EgressTransportError, match="timed out") as failed:
        await client.request("GET", f"{fake.url}/slow")
    elapsed = time.monotonic() - started

    assert elapsed < 0.4 + 0.3, elapsed
    assert "after 1 attempt " in str(failed.value)
    assert len(fake.requests) == 1


async def test_a_slow_first_answer_leaves_the_retry_only_what_remains(fake: FakeServer) -> None:
    """A 503 after most of the timeout: the retry (here hung) gets only the rest."""
    fake.enqueue(Reply(status=503, delay=0.3))
    fake.default = Reply(json={}, delay=10)
    client = make_client(loopback_policy(), timeout_s=0.6, backoff_s=0.01)

    started = time.monotonic()
    with pytest.raises(EgressTransportError, match="timed out"):
        await client.request("GET", fake.url)

    assert time.monotonic() - started < 0.6 + 0.3
    assert len(fake.requests) == 2


async def test_backoff_never_outlasts_the_timeout(fake: FakeServer) -> None:
    """A 503 whose backoff would end past the call's timeout is the call's answer."""
    fake.enqueue(Reply(status=503, json={"error": "busy"}))
    client = make_client(loopback_policy(), timeout_s=0.5, backoff_s=5.0)

    started = time.monotonic()
    response = await client.request("GET", fake.url)

    assert time.monotonic() - started < 0.5
    assert (response.status_code, response.attempts) == (503, 1)


async def test_a_failed_connection_is_retried_within_the_timeout(fake: FakeServer) -> None:
    url = unused_loopback_url()
    client = make_client(loopback_policy(), timeout_s=0.3, backoff_s=5.0, max_attempts=3)

    with pytest.raises(EgressTransportError, match=r"within the call's 0\.3 s"):
        await client.request("GET", f"{url}/x")


async def test_latency_covers_the_whole_call(fake: FakeServer) -> None:
    fake.enqueue(Reply(status=503, delay=0.1))
    fake.default = Reply(json={}, delay=0.15)

    response = await make_client(loopback_policy(), backoff_s=0.001).request("GET", fake.url)

    assert response.status_code == 200
    assert response.latency_ms >= 250
    assert response.latency_ms < 1000


# --- the shared session ------------------------------------------------------------------------


async def test_a_cookie_one_call_was_given_never_rides_along_on_the_next(
    fake: FakeServer, guarded_http: aiohttp.ClientSession
) -> None:
    """Every organization's calls share the process's session: it must keep no cookies."""
    fake.enqueue(Reply(json={}, headers={"Set-Cookie": "session=org-a-secret; Path=/"}))
    first = make_client(loopback_policy(), http=guarded_http)
    second = make_client(loopback_policy(), http=guarded_http)

    await first.request("GET", f"{fake.url}/login")
    await first.request("GET", f"{fake.url}/again")
    await second.request("GET", f"{fake.url}/other-org")

    assert [r.header("cookie") for r in fake.requests] == [None, None, None]


async def test_an_oversized_answer_is_refused(fake: FakeServer) -> None:
    fake.default = Reply(body=b"x" * 2048)
    client = make_client(loopback_policy(), max_response_bytes=1024)

    with pytest.raises(EgressError, match="more than 1024 bytes"):
        await client.request("GET", f"{fake.url}/big")
    assert len(fake.requests) == 1  # refused, not retried

    fake.default = Reply(body=b"x" * 1024)
    assert len((await client.request("GET", f"{fake.url}/fits")).content) == 1024


async def test_a_compressed_answer_is_measured_after_decompression(fake: FakeServer) -> None:
    fake.default = Reply(body=gzip.compress(b"x" * 4096), headers={"Content-Encoding": "gzip"})
    client = make_client(loopback_policy(), max_response_bytes=1024)

    with pytest.raises(EgressError, match="more than 1024 bytes"):
        await client.request("GET", f"{fake.url}/bomb")

    fake.default = Reply(body=gzip.compress(b"y" * 1000), headers={"Content-Encoding": "gzip"})
    assert (await client.request("GET", f"{fake.url}/small")).content == b"y" * 1000


async def test_a_client_resolves_and_checks_a_url_once_for_its_life(fake: FakeServer) -> None:
    """One client serves one run: its URLs are pinned on first use, like a kept-alive
    connection; the next run's client resolves afresh (and sees a changed record)."""
    dns = FakeDNS({"agent.example.com": ["127.0.0.1"]})
    policy = EgressPolicy(rules=[DomainRule("agent.example.com")], allow_private=True)
    url = url_for("agent.example.com", fake.port, "/chat")

    first = make_client(policy, resolver=dns)
    for _ in range(3):
        assert (await first.request("POST", url, json={})).status_code == 200
    assert dns.calls == [("agent.example.com", fake.port)]

    dns.records["agent.example.com"] = ["10.0.0.7"]
    refusing = make_client(EgressPolicy(rules=policy.rules, allow_private=False), resolver=dns)
    with pytest.raises(BlockedAddress):
        await refusing.request("POST", url, json={})
    assert len(dns.calls) == 2
    assert len(fake.requests) == 3


class _ClosesKeptAliveConnections:
    """A server that answers one request per connection (HTTP/1.1: kept alive, so the
    client pools it) and closes a connection when a second request arrives on it: a server
    closing an idle kept-alive connection just as the client reuses it."""

    def __init__(self) -> None:
        self.answered = 0
        self.dropped = 0

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/chat"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b'Content-Length: 11\r\n\r\n{"ok":true}')
        await writer.drain()
        self.answered += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")  # the next request on this connection
            self.dropped += 1
        writer.close()


async def test_a_kept_alive_connection_the_server_closed_is_retried_at_once_on_a_new_one() -> None:
    """Servers close idle connections (Node.js after 5 s, gunicorn after 2 s): a call on
    one that closes under it is sent again on a new connection straight away, not after
    the backoff a failure waits (here 30 s or more: past the call's own 5 s)."""
    server = _ClosesKeptAliveConnections()
    async with server as url, new_http_session() as http:
        egress = EgressClient(loopback_policy(), http=http, timeout_s=5.0, backoff_s=30.0)
        first = await egress.request("POST", url, json={"n": 1})
        second = await egress.request("POST", url, json={"n": 2})
    assert (first.status_code, first.attempts) == (200, 1)
    assert (second.status_code, second.attempts) == (200, 2)
    assert (server.answered, server.dropped) == (2, 1)
