"""The one way Spar talks to the outside: every agent and LLM call goes through here.

For each request (and each redirect hop):

1. the host must match the organization's allow-list (exact host, IP, or ``*.suffix``);
   the matching entry's headers and query parameters are added, with
   ``{{credentials.KEY}}`` resolved;
2. the host name is resolved, and unless private egress is allowed every address must be
   public (no private, loopback, link-local, CGNAT, multicast, reserved or metadata
   ranges; IPv4-mapped, 6to4 and NAT64 forms are unwrapped first);
3. the connection goes to the address that was checked (the URL is pinned to it, with the
   original ``Host`` header and TLS server name), so DNS cannot change between check
   and connect;
4. 408, 409, 429 and 5xx answers (Anthropic's 529 too) and connection failures are
   retried a bounded number of times, as the official OpenAI and Anthropic SDKs do (and,
   like them, as an ``x-should-retry`` header says), with exponential backoff or the wait
   ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date) asks; redirects are
   re-checked from 1.  The timeout bounds the whole call: every attempt, wait and
   redirect; a wait that would end past it is not started, and the answer that asked for
   it is the call's.
   With a :class:`~shared.outbound.limits.DestinationLimiter` (every run's calls), each
   attempt first takes a slot of its destination (the organization's agent, judge or
   simulator calls to that host), and a 429, 503 or 529 is not an attempt: it halves the
   destination's limit and holds it for its Retry-After, and the call tries again once
   the hold has passed, without spending its bounded retries, until it has been refused or
   held back for ``SPAR_RATE_LIMIT_WAIT_S`` (then it fails, naming the host).  Time spent
   waiting for the destination or being refused does not count against the timeout,
   which bounds the call's other attempts and waits.

The HTTP engine is one pooled ``aiohttp`` session per process (:func:`new_http_session`):
its connection pool hands out a kept-alive connection in constant time, where httpx's
scanned every pooled connection on each request.  The session keeps no cookies, so
nothing one organization's call was given rides along on another's.

5. what comes back is redacted (:mod:`shared.outbound.redact`): the response's text, JSON
   and headers, and every error raised, have each credential value of the organization and
   each secret sent in an ``Authorization``-style header replaced, in every encoded form an
   echo produces, so no caller can store, return or log one;
6. and it is storable: text PostgreSQL cannot hold (NUL characters, lone UTF-16
   surrogates from a ``\ud800`` escape) is replaced by U+FFFD (:func:`storable`), so a
   reply, a critique or an error body can never make the write that records it fail.

Nothing here logs header values or bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import random
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit
from uuid import UUID

import aiohttp
import msgspec
from multidict import CIMultiDict

from shared.outbound.limits import (
    THROTTLE_STATUSES,
    Destination,
    DestinationLimiter,
    Lease,
    RateLimited,
)
from shared.outbound.redact import Redactor, redactor_for, secret_of_header

CREDENTIAL_REF = re.compile(r"\{\{\s*credentials\.([A-Za-z0-9_.-]{1,128})\s*\}\}")
RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx (:func:`_should_retry`)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_GRACE_S = 0.05  # past the call's timeout, for what no attempt's own timeout bounds
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

Resolver = Callable[[str, int], Awaitable[list[str]]]


# --- errors ----------------------------------------------------------------------------------


class EgressError(Exception):
    """An outbound call that could not be made or did not succeed; the message says why."""


class HostNotAllowed(EgressError):
    def __init__(self, host: str) -> None:
        super().__init__(
            f"host {host!r} is not on the organization's allowed domains; add it to allow calls"
        )
        self.host = host


class BlockedAddress(EgressError):
    def __init__(self, host: str, address: str) -> None:
        super().__init__(
            f"host {host!r} resolves to {address}, a private or reserved address; "
            "refused (SPAR_EGRESS_ALLOW_PRIVATE=true allows it)"
        )
        self.host = host
        self.address = address


class EgressTransportError(EgressError):
    """Connecting, sending or reading failed (after retries)."""


# --- policy ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DomainRule:
    pattern: str  # "api.example.com", "10.0.0.1", "::1" or "*.example.com"
    headers: dict[str, str] = field(default_factory=dict)
    query_params: dict[str, str] = field(default_factory=dict)

    def matches(self, host: str) -> bool:
        if self.pattern.startswith("*."):
            return host.endswith(self.pattern[1:]) and len(host) > len(self.pattern) - 1
        return host == self.pattern


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    rules: list[DomainRule]
    # Every credential of the organization: the referenced ones are injected, all redacted.
    credentials: dict[str, str] = field(default_factory=dict, repr=False)
    allow_private: bool = False

    def rule_for(self, host: str) -> DomainRule | None:
        """The most specific matching entry: an exact host beats the longest wildcard."""
        matching = [rule for rule in self.rules if rule.matches(host)]
        if not matching:
            return None
        return max(matching, key=lambda r: (not r.pattern.startswith("*."), len(r.pattern)))

    def redactor(self, *extra_secrets: str | None) -> Redactor:
        """What takes every credential value (and ``extra_secrets``) out of a text."""
        extra = (secret for secret in extra_secrets if secret)
        return redactor_for(frozenset((*self.credentials.values(), *extra)))

    def redact(self, text: str, *extra_secrets: str | None) -> str:
        """``text`` with every credential value (and ``extra_secrets``) replaced."""
        return self.redactor(*extra_secrets).text(text)

    def keys_in(self, text: str) -> list[str]:
        """The keys of the credentials whose values ``text`` holds, in any form the
        redactor takes out (a scan per credential: call it once redaction changed a text)."""
        return sorted(
            key
            for key, value in self.credentials.items()
            if value and redactor_for(frozenset({value})).text(text) != text
        )

    def resolve_templates(self, values: Mapping[str, str]) -> dict[str, str]:
        def substitute(match: Any) -> str:
            key = match.group(1)
            if key not in self.credentials:
                raise EgressError(f"credential {key!r} referenced by an allowed domain is missing")
            return self.credentials[key]

        return {name: CREDENTIAL_REF.sub(substitute, value) for name, value in values.items()}


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """An LLM provider ready to call: its API key decrypted, for this call only."""

    id: UUID
    provider: str
    base_url: str
    default_model: str
    api_key: str | None = field(repr=False, default=None)
    input_cost_per_mtok: float | None = None
    output_cost_per_mtok: float | None = None
    # Merged into each request body (shared.llm.models); never holds Spar's own fields.
    request_options: Mapping[str, Any] = field(default_factory=dict)
    anthropic_version: str | None = None  # anthropic: the anthropic-version header


# --- addresses -------------------------------------------------------------------------------


def normalize_host(host: str) -> str:
    host = host.strip("[]").lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(str(embedded))
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved or ip.is_link_local:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:  # deprecated fec0::/10
        return False
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return False
    return ip.is_global


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# --- what comes back -------------------------------------------------------------------------

REPLACEMENT = "\ufffd"


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: each NUL, and each lone surrogate (a JSON
    ``\ud800`` escape decodes to one; UTF-8 cannot encode it), replaced by U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Paired surrogates become the character they encode; lone ones are replaced.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: bytes | str) -> Any:
    """JSON as received from outside: by msgspec, or, for what msgspec refuses but JSON's
    grammar allows (a lone ``\ud800`` escape), by the standard library; raises
    ``msgspec.DecodeError`` when it is not JSON at all.  Pass what it gives through
    :func:`storable` before keeping any of it (:meth:`EgressResponse.json` does)."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        try:
            return json.loads(raw, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):
            raise msgspec.DecodeError("not JSON") from None


def storable_json(value: Any, redact: Callable[[str], str] | None = None) -> Any:
    """A decoded JSON value with every string in it (keys too) storable, and redacted by
    ``redact`` when given."""
    if isinstance(value, str):
        value = storable(value)
        return redact(value) if redact is not None else value
    if isinstance(value, dict):
        return {storable_json(k, redact): storable_json(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_json(v, redact) for v in value]
    return value


# --- the client --------------------------------------------------------------------------------


@dataclass(slots=True)
class EgressResponse:
    """A response as Spar may use it: everything read from it is redacted."""

    status_code: int
    headers: Mapping[str, str]  # case-insensitive, values redacted
    raw: bytes = field(repr=False)  # as received: read it through content, text or json()
    url: str
    latency_ms: float  # whole call, retries and redirects included
    attempts: int
    redactor: Redactor = field(repr=False)

    @property
    def content(self) -> bytes:
        return self.redactor.bytes(self.raw)

    def json(self) -> Any:
        # Decoded first: a secret written with JSON escapes is matched once unescaped.
        return storable_json(decode_json(self.raw), self.redactor.text)

    def json_as_received(self) -> Any:
        """The JSON as the far end sent it, storable but **not redacted**: only for checks
        that must see what was said (a criterion looking for a leaked key); never store,
        return or log what it gives."""
        return storable_json(decode_json(self.raw))

    @property
    def text(self) -> str:
        return self.redactor.text(storable(self.raw.decode("utf-8", errors="replace")))


_SENSITIVE = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})


def _sent_secrets(headers: Mapping[str, str]) -> list[str]:
    """The secrets a caller put in sensitive headers (a provider's API key), scheme-less."""
    return [
        secret
        for name, value in headers.items()
        if name.lower() in _SENSITIVE
        for secret in (value, secret_of_header(value))
    ]


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait an answer asks for, in seconds, as the official SDKs read it:
    ``retry-after-ms``, else ``Retry-After`` in seconds (a fraction allowed) or as an HTTP
    date; ``None`` when it asks for none (or for something that is not a finite wait)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if not raw:
            continue
        try:
            seconds = float(raw) / scale
        except ValueError:
            continue
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _should_retry(response: _Received) -> bool:
    """Whether an answer is worth another attempt, as the official SDKs decide: what
    ``x-should-retry`` says, else 408, 409, 429 and every 5xx."""
    told = response.headers.get("x-should-retry")
    if told in {"true", "false"}:
        return told == "true"
    return response.status in RETRY_STATUSES or response.status >= 500


def new_http_session(connector: aiohttp.BaseConnector | None = None) -> aiohttp.ClientSession:
    """The pooled HTTP session egress goes through; make it inside the event loop that uses
    it, and close it with that loop.

    No cookie jar (a cookie one organization's agent set must never reach another's call),
    no proxy settings from the environment, no redirects followed (:class:`EgressClient`
    checks every hop), and a generous connection cap instead of a small per-host one: one
    worker holds many conversations with the same agent and judge at once.
    """
    return aiohttp.ClientSession(
        connector=connector or aiohttp.TCPConnector(limit=1000, use_dns_cache=False),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        headers={"User-Agent": "spar"},
    )


@dataclass(frozen=True, slots=True)
class _Received:
    status: int
    headers: CIMultiDict[str]
    content: bytes


class EgressClient:
    """Outbound HTTP under an organization's :class:`EgressPolicy`.

    ``http`` is the process's pooled session (:func:`new_http_session`); without one, each
    request opens and closes a session of its own.  A client is made for one run (or one
    call): a URL is checked, resolved and pinned on its first request and kept for the
    client's life, as a kept-alive connection would be.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        http: aiohttp.ClientSession | None = None,
        resolver: Resolver = system_resolver,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
        max_redirects: int = 3,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        limiter: DestinationLimiter | None = None,
        organization_id: UUID | str | None = None,
    ) -> None:
        self.policy = policy
        # Per destination, shared by the fleet; organization_id scopes the destinations.
        self._limiter = limiter
        self._organization_id = str(organization_id or "")
        self._http = http
        self._resolver = resolver
        self._timeout_s = timeout_s  # the whole call's: attempts, waits and redirects
        self._connect_timeout_s = connect_timeout_s
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._max_redirects = max_redirects
        self._max_response_bytes = max_response_bytes
        # A client serves one run: its few URLs are checked and pinned once, not per call.
        self._prepared: dict[tuple[str, tuple[tuple[str, str], ...]], _Prepared] = {}

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        kind: str = "agent",
    ) -> EgressResponse:
        """``kind``: whose call this is (agent, judge, simulator), the destination's kind."""
        redactor = self.policy.redactor(*_sent_secrets(headers or {}))
        try:
            try:
                # Each attempt ends itself at the deadline (and says after how many); this
                # ends what no attempt bounds, such as a name slow to resolve.
                async with asyncio.timeout(self._timeout_s + _GRACE_S) as bound:
                    deadline = _Deadline(time.monotonic() + self._timeout_s, bound)
                    return await self._request(method, url, json, headers, redactor, deadline, kind)
            except TimeoutError:
                raise EgressTransportError(
                    f"timed out calling {_display(url)}: no answer within {self._timeout_s:g} s"
                ) from None
        except RateLimited as exc:
            raise EgressError(str(exc)) from None
        except EgressError as exc:
            exc.args = tuple(
                redactor.text(storable(a)) if isinstance(a, str) else a for a in exc.args
            )
            raise

    async def _request(
        self,
        method: str,
        url: str,
        json: Any,
        headers: Mapping[str, str] | None,
        redactor: Redactor,
        deadline: _Deadline,
        kind: str,
    ) -> EgressResponse:
        started = time.perf_counter()
        attempts = 0
        for _hop in range(self._max_redirects + 1):
            response, used = await self._send_with_retries(
                method, url, json, headers or {}, deadline, kind
            )
            attempts += used
            if response.status not in REDIRECT_STATUSES or "location" not in response.headers:
                return EgressResponse(
                    status_code=response.status,
                    headers=CIMultiDict(
                        (name, redactor.text(storable(value)))
                        for name, value in response.headers.items()
                    ),
                    raw=response.content,
                    url=url,
                    latency_ms=(time.perf_counter() - started) * 1000,
                    attempts=attempts,
                    redactor=redactor,
                )
            next_url = urljoin(url, response.headers["location"])
            if _origin(next_url) != _origin(url):
                # Like every HTTP client: the caller's credentials stay with the first origin.
                headers = {k: v for k, v in (headers or {}).items() if k.lower() not in _SENSITIVE}
            url = next_url
            if response.status == 303:
                method, json = "GET", None
        raise EgressError(f"too many redirects (more than {self._max_redirects})")

    async def _send_with_retries(
        self,
        method: str,
        url: str,
        json: Any,
        headers: Mapping[str, str],
        deadline: _Deadline,
        kind: str,
    ) -> tuple[_Received, int]:
        key = (url, tuple(headers.items()))
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepared[key] = await self._prepare(url, headers)
        destination = Destination(self._organization_id, kind, prepared.host)
        refused_since: float | None = None
        attempt = 0
        while True:
            lease = await self._wait_for(destination, refused_since, deadline)
            sent_at = time.monotonic()
            answer: _Received | None = None
            failure: Exception | None = None
            try:
                answer = await self._send(method, prepared, json, deadline.at)
            except (TimeoutError, aiohttp.ClientError) as exc:  # aiohttp's timeouts too
                failure = exc
            finally:
                if lease is not None:
                    self._release(lease, answer)
            if lease is not None and answer is not None and _throttled(answer):
                # Not an attempt: the destination is held; the call waits its turn again.
                refused_since = lease.refused_since or sent_at
                deadline.extend(time.monotonic() - sent_at)
                continue
            attempt += 1
            last = attempt == self._max_attempts
            if isinstance(failure, TimeoutError):
                if last or time.monotonic() >= deadline.at:
                    raise EgressTransportError(
                        f"timed out calling {prepared.display} after {_attempts(attempt)} "
                        f"(the whole call may take {self._timeout_s:g} s)"
                    ) from failure
            elif failure is not None:
                if last:
                    raise EgressTransportError(
                        f"could not reach {prepared.display} after {_attempts(attempt)}: "
                        f"{type(failure).__name__}"
                    ) from failure
            elif answer is not None and (last or not _should_retry(answer)):
                return answer, attempt
            delay = _retry_after_s(answer.headers) if answer is not None else None
            if delay is None and attempt == 1 and _closed_by_server(failure):
                delay = 0.0  # a kept-alive connection the server had closed: at once, anew
            if delay is None:
                delay = self._backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())  # noqa: S311
            if time.monotonic() + delay >= deadline.at:
                # The wait would outlast the call: what this attempt got is the call's answer.
                if answer is not None:
                    return answer, attempt
                raise EgressTransportError(
                    f"could not reach {prepared.display} after {_attempts(attempt)} within "
                    f"the call's {self._timeout_s:g} s"
                )
            await asyncio.sleep(delay)

    async def _wait_for(
        self, destination: Destination, refused_since: float | None, deadline: _Deadline
    ) -> Lease | None:
        """A slot of ``destination`` (``None`` without a limiter); the wait is added to the
        call's deadline: waiting for the destination is not the call's time."""
        if self._limiter is None:
            return None
        with deadline.paused():
            return await self._limiter.acquire(destination, refused_since=refused_since)

    def _release(self, lease: Lease, answer: _Received | None) -> None:
        """The slot given back, not waited for (:meth:`DestinationLimiter.release`): a
        refusal's hold is still in place before this process's next attempt at the
        destination asks for a slot (this call's own included)."""
        assert self._limiter is not None
        status = answer.status if answer is not None else None
        retry_after = _retry_after_s(answer.headers) if answer is not None else None
        self._limiter.release(lease, status=status, retry_after_s=retry_after)

    async def _prepare(self, url: str, extra_headers: Mapping[str, str]) -> _Prepared:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise EgressError(f"not an absolute http(s) URL: {url!r}")
        if parts.username or parts.password:
            raise EgressError("URLs with user info are refused")
        host = normalize_host(parts.hostname)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        rule = self.policy.rule_for(host)
        if rule is None:
            raise HostNotAllowed(host)
        addresses = await self._resolve(host, port)
        if not self.policy.allow_private:
            for address in addresses:
                if not is_public_address(address):
                    raise BlockedAddress(host, address)
        address = addresses[0]
        netloc_host = f"[{address}]" if ":" in address else address
        query = parts.query
        if rule.query_params:
            extra_query = urlencode(self.policy.resolve_templates(rule.query_params))
            query = f"{query}&{extra_query}" if query else extra_query
        pinned = urlunsplit((parts.scheme, f"{netloc_host}:{port}", parts.path or "/", query, ""))
        default_port = port == (443 if parts.scheme == "https" else 80)
        name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        host_header = name if default_port else f"{name}:{port}"
        headers = {
            **dict(extra_headers),
            **self.policy.resolve_templates(rule.headers),
            "Host": host_header,
        }
        for name, value in headers.items():
            if any(char in value for char in "\r\n\x00"):
                # Never sent: a line break would let a value inject headers of its own.
                raise EgressError(
                    f"header {name!r} for {host!r} holds a line break or NUL character "
                    "(check the allowed domain's headers and the credentials they use)"
                )
        return _Prepared(
            url=pinned,
            host=host,
            headers=headers,
            sni_hostname=parts.hostname if parts.scheme == "https" else None,
            display=f"{parts.scheme}://{parts.hostname}:{port}{parts.path}",
        )

    async def _resolve(self, host: str, port: int) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        try:
            addresses = await self._resolver(host, port)
        except OSError as exc:
            raise EgressTransportError(f"could not resolve {host!r}: {exc}") from exc
        if not addresses:
            raise EgressTransportError(f"{host!r} has no addresses")
        return addresses

    async def _send(
        self, method: str, prepared: _Prepared, json: Any, deadline: float
    ) -> _Received:
        content = msgspec.json.encode(json) if json is not None else None
        headers = dict(prepared.headers)
        if content is not None:
            headers.setdefault("Content-Type", "application/json")
        # This attempt may take what is left of the call, to the millisecond (aiohttp would
        # round a timeout over 5 s up to a whole second).
        left = max(deadline - time.monotonic(), 0.001)
        limits = aiohttp.ClientTimeout(
            total=left, sock_connect=min(self._connect_timeout_s, left), ceil_threshold=math.inf
        )
        if self._http is not None:
            return await self._exchange(self._http, method, prepared, headers, content, limits)
        async with new_http_session() as http:
            return await self._exchange(http, method, prepared, headers, content, limits)

    async def _exchange(
        self,
        http: aiohttp.ClientSession,
        method: str,
        prepared: _Prepared,
        headers: dict[str, str],
        content: bytes | None,
        limits: aiohttp.ClientTimeout,
    ) -> _Received:
        async with http.request(
            method,
            prepared.url,
            data=content,
            headers=headers,
            allow_redirects=False,
            timeout=limits,
            # The URL names the checked address; TLS still verifies the host name.
            server_hostname=prepared.sni_hostname,
        ) as response:
            length = response.content_length
            if length is not None and length > self._max_response_bytes:
                raise self._too_large(prepared)
            if length is not None and "content-encoding" not in response.headers:
                body = await response.read()
            else:  # chunked or compressed: count what is actually read
                buffer = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):
                    buffer += chunk
                    if len(buffer) > self._max_response_bytes:
                        raise self._too_large(prepared)
                body = bytes(buffer)
            return _Received(response.status, CIMultiDict(response.headers), body)

    def _too_large(self, prepared: _Prepared) -> EgressError:
        return EgressError(
            f"{prepared.display} answered with more than {self._max_response_bytes} bytes"
        )


def _closed_by_server(failure: Exception | None) -> bool:
    """The connection went away under the request, before any answer: most often one kept
    alive that the server had already closed (servers close idle connections after a few
    seconds, and one answering without keep-alive may not say so), so that a new one would
    be answered.  A connection that could not be made is not one of them."""
    return isinstance(
        failure, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError
    ) and not isinstance(failure, aiohttp.ClientConnectorError)


def _throttled(answer: _Received) -> bool:
    """A rate limit's refusal: 429, 503 or 529 (unless ``x-should-retry: false``)."""
    told = answer.headers.get("x-should-retry")
    return answer.status in THROTTLE_STATUSES and told != "false"


class _Deadline:
    """When the call must end (monotonic), and the timeout that enforces it; time spent
    waiting for the destination moves both."""

    def __init__(self, at: float, bound: asyncio.Timeout) -> None:
        self.at = at
        self._bound = bound

    def extend(self, seconds: float) -> None:
        self.at += seconds
        when = self._bound.when()
        if when is not None:
            self._bound.reschedule(when + seconds)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The timeout stopped meanwhile (a wait longer than the call's timeout must not
        expire it), and moved on by the time it took."""
        when = self._bound.when()
        self._bound.reschedule(None)
        started = time.monotonic()
        try:
            yield
        finally:
            waited = time.monotonic() - started
            self.at += waited
            if when is not None:
                self._bound.reschedule(when + waited)


def _display(url: str) -> str:
    """A URL as errors name it: scheme, host, port and path (no query: it may hold keys)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def _attempts(count: int) -> str:
    return f"{count} attempt{'s' if count > 1 else ''}"


@dataclass(frozen=True, slots=True)
class _Prepared:
    url: str
    host: str  # normalized: the destination of outbound limits
    headers: dict[str, str] = field(repr=False)
    sni_hostname: str | None
    display: str
