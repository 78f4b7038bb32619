"""Failed-login throttling: guessing passwords gets slow, locking a real user out does not work.

The rule, applied to every ``POST /v1/auth/login`` before its password is verified, so a
refused attempt costs no argon2 time (settings ``SPAR_LOGIN_*``):

1. Three counters of failed logins, each a window that opens at its first failure:
   per (account, client address) pair — tight (5 per 15 min); per account, whatever the
   address — looser and short (20 per 5 min), so an attacker spreading guesses over many
   addresses slows down but locks the account for minutes, not hours; per client address,
   whatever the account — (50 per 15 min), against one address spraying many accounts.
2. An attempt is refused (429, ``Retry-After`` = seconds until the blocking window ends)
   while any of its counters has reached its limit.  Refused attempts count nothing.
3. An address that logged in to the account successfully in the last
   ``SPAR_LOGIN_KNOWN_ADDRESS_S`` (30 days) is exempt from the per-account limit: however
   hard others hammer the account, its owner keeps logging in from where they usually do.
   The pair and address limits still apply to it.
4. An admitted attempt counts as a failure at once (check and count are one atomic step,
   so a burst of concurrent guesses cannot slip past the limit together); a success takes
   it back, clears the pair's counter and marks the address known.
5. The account is the normalized email, whether or not an account exists (the answers
   never tell), hashed so that keys stay short and hold no plain email.  An IPv6 address
   counts as its /64 network: one host commonly holds the whole /64.

State lives in Redis under ``SPAR_LOGIN_KEY_PREFIX`` (several processes share it); with no
Redis configured (``spar dev``) an in-process store keeps the same rule.  Redis being
unreachable lets logins through unthrottled (logged): an outage must not lock everyone out.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import redis
from redis.exceptions import RedisError

from shared.errors import TooManyRequests
from shared.settings import Settings

log = logging.getLogger("spar.identity")


@dataclass(frozen=True, slots=True)
class Counter:
    """One failure counter: ``limit`` failures per ``window_ms``; ``checked`` False counts
    without refusing (the account counter for a known address)."""

    key: str
    limit: int
    window_ms: int
    checked: bool = True


@dataclass(frozen=True, slots=True)
class Attempt:
    """An admitted login attempt, counted as a failure until :meth:`LoginThrottle.succeeded`."""

    pair: str
    account: str
    address: str
    known: str


class Store(Protocol):
    """Atomic primitives over expiring counters; :class:`LoginThrottle` holds the rule."""

    async def exists(self, key: str) -> bool: ...

    async def admit(self, counters: list[Counter]) -> int:
        """0 after counting one failure on every counter, or the milliseconds until the
        longest-blocking checked counter at its limit expires (counting nothing)."""
        ...

    async def settle(
        self, decrement: list[str], delete: list[str], remember: str | None, ttl_ms: int
    ) -> None:
        """Take one failure back from ``decrement``, drop ``delete``, set ``remember``."""
        ...

    async def clear(self, prefix: str) -> None: ...

    async def close(self) -> None: ...


# KEYS: counters; ARGV: limits (0 = not checked), then windows in ms.
_ADMIT = """
local n = #KEYS
local wait = 0
for i = 1, n do
  local limit = tonumber(ARGV[i])
  if limit > 0 and tonumber(redis.call('GET', KEYS[i]) or '0') >= limit then
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl < 0 then ttl = tonumber(ARGV[n + i]) end
    if ttl > wait then wait = ttl end
  end
end
if wait > 0 then return wait end
for i = 1, n do
  redis.call('INCR', KEYS[i])
  if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], ARGV[n + i]) end
end
return 0
"""

# KEYS: counters to decrement, counters to delete, the key to remember (if any);
# ARGV: how many to decrement, how many to delete, the remembered key's ttl in ms.
_SETTLE = """
local n, d = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, n do
  if tonumber(redis.call('GET', KEYS[i]) or '0') > 0 then redis.call('DECR', KEYS[i]) end
end
for i = n + 1, n + d do redis.call('DEL', KEYS[i]) end
if #KEYS > n + d then redis.call('SET', KEYS[n + d + 1], '1', 'PX', ARGV[3]) end
return 0
"""


class RedisStore:
    """Counters shared by every API process.  A blocking client on worker threads: a login is
    rare enough, and the client then belongs to no event loop (startup, requests and
    shutdown may each run on another)."""

    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._admit = self._redis.register_script(_ADMIT)
        self._settle = self._redis.register_script(_SETTLE)

    async def exists(self, key: str) -> bool:
        return bool(await asyncio.to_thread(self._redis.exists, key))

    async def admit(self, counters: list[Counter]) -> int:
        keys = [c.key for c in counters]
        args = [c.limit if c.checked else 0 for c in counters] + [c.window_ms for c in counters]
        return int(await asyncio.to_thread(self._admit, keys, args))

    async def settle(
        self, decrement: list[str], delete: list[str], remember: str | None, ttl_ms: int
    ) -> None:
        keys = [*decrement, *delete, *([remember] if remember else [])]
        await asyncio.to_thread(self._settle, keys, [len(decrement), len(delete), ttl_ms])

    async def clear(self, prefix: str) -> None:
        def clear() -> None:
            keys = list(self._redis.scan_iter(match=f"{prefix}*", count=500))
            if keys:
                self._redis.delete(*keys)

        await asyncio.to_thread(clear)

    async def close(self) -> None:
        self._redis.close()


class MemoryStore:
    """One process's counters (``spar dev``): the same primitives, guarded by a lock."""

    _SWEEP_ABOVE = 10_000

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, float]] = {}  # key -> (count, expires at, ms)
        self._lock = threading.Lock()

    @staticmethod
    def _now() -> float:
        return time.monotonic() * 1000

    def _live(self, key: str, now: float) -> tuple[int, float] | None:
        entry = self._entries.get(key)
        if entry is not None and entry[1] <= now:
            del self._entries[key]
            return None
        return entry

    async def exists(self, key: str) -> bool:
        with self._lock:
            return self._live(key, self._now()) is not None

    async def admit(self, counters: list[Counter]) -> int:
        with self._lock:
            now = self._now()
            if len(self._entries) > self._SWEEP_ABOVE:
                for key in [k for k, (_, end) in self._entries.items() if end <= now]:
                    del self._entries[key]
            wait = 0.0
            for counter in counters:
                entry = self._live(counter.key, now)
                if counter.checked and entry is not None and entry[0] >= counter.limit:
                    wait = max(wait, entry[1] - now)
            if wait > 0:
                return max(1, math.ceil(wait))
            for counter in counters:
                count, end = self._live(counter.key, now) or (0, now + counter.window_ms)
                self._entries[counter.key] = (count + 1, end)
            return 0

    async def settle(
        self, decrement: list[str], delete: list[str], remember: str | None, ttl_ms: int
    ) -> None:
        with self._lock:
            now = self._now()
            for key in decrement:
                entry = self._live(key, now)
                if entry is not None and entry[0] > 0:
                    self._entries[key] = (entry[0] - 1, entry[1])
            for key in delete:
                self._entries.pop(key, None)
            if remember:
                self._entries[remember] = (1, now + ttl_ms)

    async def clear(self, prefix: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k.startswith(prefix)]:
                del self._entries[key]

    async def close(self) -> None:
        return None


def _client_network(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an IP (a unix socket, a test client): counted as given
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class LoginThrottle:
    """The rule of the module docstring over a :class:`Store`."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self._settings = settings
        self._store = store
        self._prefix = settings.login_key_prefix

    @classmethod
    def from_settings(cls, settings: Settings) -> LoginThrottle:
        store: Store = RedisStore(settings.redis_url) if settings.redis_url else MemoryStore()
        return cls(settings, store)

    def _attempt(self, email: str, address: str) -> Attempt:
        account = hashlib.sha256(email.encode()).hexdigest()[:32]
        where = _client_network(address).replace(":", "_")
        return Attempt(
            pair=f"{self._prefix}pair:{account}:{where}",
            account=f"{self._prefix}account:{account}",
            address=f"{self._prefix}address:{where}",
            known=f"{self._prefix}known:{account}:{where}",
        )

    async def admit(self, email: str, address: str) -> Attempt:
        """Count an attempt for the normalized ``email`` from ``address``, or raise
        :class:`TooManyRequests` if one of its counters is at its limit."""
        attempt = self._attempt(email, address)
        s = self._settings
        try:
            known = await self._store.exists(attempt.known)
            wait_ms = await self._store.admit(
                [
                    Counter(attempt.pair, s.login_pair_limit, _ms(s.login_pair_window_s)),
                    Counter(
                        attempt.account,
                        s.login_account_limit,
                        _ms(s.login_account_window_s),
                        checked=not known,
                    ),
                    Counter(attempt.address, s.login_address_limit, _ms(s.login_address_window_s)),
                ]
            )
        except RedisError as exc:
            log.warning("login throttle unavailable, attempt let through: %s", exc)
            return attempt
        if wait_ms:
            retry_after = max(1, math.ceil(wait_ms / 1000))
            raise TooManyRequests(
                f"too many failed logins; try again in {retry_after} seconds",
                retry_after=retry_after,
            )
        return attempt

    async def succeeded(self, attempt: Attempt) -> None:
        """The password matched: the attempt was no failure, the pair starts afresh."""
        await self._settle(attempt, succeeded=True)

    async def abandoned(self, attempt: Attempt) -> None:
        """The attempt ended without a verdict (an error): it counts as nothing."""
        await self._settle(attempt, succeeded=False)

    async def _settle(self, attempt: Attempt, *, succeeded: bool) -> None:
        taken_back = [attempt.account, attempt.address]
        try:
            if succeeded:
                known_ms = _ms(self._settings.login_known_address_s)
                await self._store.settle(taken_back, [attempt.pair], attempt.known, known_ms)
            else:
                await self._store.settle([*taken_back, attempt.pair], [], None, 0)
        except RedisError as exc:
            log.warning("login throttle unavailable, attempt not settled: %s", exc)

    async def clear(self) -> None:
        """Forget every counter and known address under this throttle's prefix."""
        await self._store.clear(self._prefix)

    async def close(self) -> None:
        await self._store.close()
