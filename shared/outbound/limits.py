"""One adaptive concurrency limit per outbound destination, shared by every worker.

A destination is an organization's agent, judge or simulator calls to one host (the host of
an agent endpoint or of a provider's ``base_url``): a throttled judge never slows the
agent's calls, even on the same host.  Its limit follows AIMD:

* a 429, 503 or 529 answer halves it (never below 1; once per burst: refusals of calls
  that started before the last cut do not cut again) and holds every new call to the
  destination until the answer's Retry-After has passed (``retry-after-ms``, seconds or an
  HTTP date; :data:`DEFAULT_HOLD_S` when it names none);
* each other answer adds ``1 / limit``, up to ``SPAR_OUTBOUND_MAX_CONCURRENCY``, where a
  destination also starts (and starts again once its state has been idle for
  :data:`IDLE_S`, or Redis lost it): the first refusal corrects it.  For
  :data:`PROBE_S` after a cut, it grows only to one below the limit that was refused:
  a refusal costs the whole destination its Retry-After (a second, where the provider
  rounds up), many round trips, so climbing straight back to where it was refused, as
  plain AIMD does every few round trips, would spend most of the time held.

A call waits for a free slot of its destination before each attempt; a slot is a lease
that expires (``lease_s``: the call's own timeout and a margin), so a killed process cannot
leak one for longer than that.  Waiting is not an attempt (:mod:`shared.outbound.egress`).

Two implementations of one interface (:class:`DestinationLimiter`): :class:`RedisLimiter`
(every worker process shares the limits, each step one atomic Lua script) and
:class:`LocalLimiter` (one process: ``spar dev``'s in-memory broker, no Redis).  Which one
is chosen where the runtime is built (:func:`limiter_for`), never by callers.
:meth:`DestinationLimiter.held_back` tells which of some destinations is refusing now (a
hold in force, or a refusal in the last :data:`RECENT_S`) and since when: a batch's
detail shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

from shared import metrics
from shared.settings import Settings

KINDS = metrics.LIMIT_KINDS  # agent, judge, simulator
THROTTLE_STATUSES = frozenset({429, 503, 529})
DEFAULT_HOLD_S = 1.0  # a refusal that names no wait holds its destination this long
RECENT_S = 30.0  # a destination that refused this recently is holding its callers back
IDLE_S = 3600.0  # a destination's state untouched this long is forgotten (back to the start)
POLL_S = 0.05  # how often a call waiting for a full destination looks again
PROBE_S = 60.0  # after a cut, the limit stays below the one refused this long (default)
KEY_PREFIX = "spar:outbound:"

log = logging.getLogger("spar.outbound")


@dataclass(frozen=True, slots=True)
class Destination:
    organization_id: str
    kind: str  # agent, judge or simulator
    host: str

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}{self.organization_id}:{self.kind}:{self.host}"


@dataclass(slots=True)
class Lease:
    """A slot of a destination, held for one attempt."""

    destination: Destination
    token: str
    acquired_ms: int  # the limiter's clock, for "once per burst"
    # When the call was first held back by a rate limit (monotonic), else None.
    refused_since: float | None = None


class RateLimited(Exception):
    """A destination kept refusing for longer than ``SPAR_RATE_LIMIT_WAIT_S``."""

    def __init__(self, destination: Destination, waited_s: float) -> None:
        super().__init__(
            f"rate limited by {destination.host} ({destination.kind} calls): refused or held "
            f"back for {waited_s:.0f} s, past the {destination.kind} call's limit of waiting "
            "(SPAR_RATE_LIMIT_WAIT_S)"
        )
        self.destination = destination


@dataclass(frozen=True, slots=True)
class _Tried:
    granted: bool
    wait_s: float  # > 0: the destination is held this much longer
    limit: float
    acquired_ms: int = 0


class DestinationLimiter:
    """The interface: :meth:`acquire` a slot before an attempt, :meth:`release` it with the
    attempt's outcome.  Subclasses hold the state (:meth:`_try`, :meth:`_settle`)."""

    def __init__(
        self, *, max_concurrency: int, wait_s: float, lease_s: float, probe_s: float = PROBE_S
    ) -> None:
        self.max_concurrency = max_concurrency
        self.wait_s = wait_s  # SPAR_RATE_LIMIT_WAIT_S
        self.lease_s = lease_s
        self.probe_s = probe_s  # after a cut, the limit stays below the one refused

    async def acquire(self, destination: Destination, *, refused_since: float | None) -> Lease:
        """Wait for a slot of ``destination``.  ``refused_since``: when this call was first
        refused or held back (monotonic), if it was; raises :class:`RateLimited` once that
        is ``wait_s`` ago."""
        token = uuid.uuid4().hex
        waiting = False
        try:
            while True:
                tried = await self._try(destination, token)
                metrics.OUTBOUND_LIMIT.labels(destination.kind).set(tried.limit)
                if tried.granted:
                    return Lease(destination, token, tried.acquired_ms, refused_since)
                now = time.monotonic()
                if tried.wait_s > 0 and refused_since is None:
                    refused_since = now  # held back by another call's refusal
                if refused_since is not None and now - refused_since >= self.wait_s:
                    raise RateLimited(destination, now - refused_since)
                if not waiting:
                    waiting = True
                    metrics.OUTBOUND_WAITING.labels(destination.kind).inc()
                pause = tried.wait_s if tried.wait_s > 0 else POLL_S
                if refused_since is not None:
                    pause = min(pause, max(refused_since + self.wait_s - now, 0.0) + 0.001)
                # Spread out: the calls a hold stopped must not all come back at once.
                await asyncio.sleep(pause + random.uniform(0, POLL_S))  # noqa: S311
        finally:
            if waiting:
                metrics.OUTBOUND_WAITING.labels(destination.kind).dec()

    def release(
        self, lease: Lease, *, status: int | None, retry_after_s: float | None
    ) -> asyncio.Future[float]:
        """Give the slot back: ``status`` the attempt's answer (``None``: no answer).

        Given back at once, before any later :meth:`acquire` of this limiter's (it is that
        one's in-process step, or its script is queued ahead of that one's on the Redis
        connection); the future is the destination's new limit, for whoever must know it.
        A call does not wait for it: its answer goes back to its caller while the slot is
        given back (a round trip to Redis, once per outbound call, off the conversation's
        path)."""
        if status in THROTTLE_STATUSES:
            outcome = "throttled"
            metrics.OUTBOUND_RATE_LIMITED.labels(lease.destination.kind).inc()
        else:
            outcome = "ok" if status is not None and status < 500 else "other"
        hold_s = retry_after_s if retry_after_s is not None else DEFAULT_HOLD_S
        limit: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        gauge = metrics.OUTBOUND_LIMIT.labels(lease.destination.kind)

        def settled(value: float) -> None:
            gauge.set(value)
            limit.set_result(value)

        self._settle(lease, outcome, hold_s, settled)
        return limit

    async def held_back(self, destinations: list[Destination]) -> tuple[Destination, float] | None:
        """Of ``destinations``, the one refusing for the longest now, and since when
        (epoch seconds: the first refusal after a quiet spell of :data:`RECENT_S`)."""
        now = _now_ms()
        found: tuple[Destination, float] | None = None
        for destination in destinations:
            since, refused, hold = await self._refusals(destination)
            refusing = since and (hold > now or now - refused <= _ms(RECENT_S))
            if refusing and (found is None or since / 1000 < found[1]):
                found = (destination, since / 1000)
        return found

    async def close(self) -> None:
        return None

    async def _refusals(self, destination: Destination) -> tuple[int, int, int]:
        """(streak started, last refusal, hold until), epoch ms, 0 when none."""
        raise NotImplementedError

    async def _try(self, destination: Destination, token: str) -> _Tried:
        raise NotImplementedError

    def _settle(
        self, lease: Lease, outcome: str, hold_s: float, settled: Callable[[float], None]
    ) -> None:
        """Started before it returns, ``settled(limit)`` once done; never fails (the lease
        ends a slot not given back)."""
        raise NotImplementedError


# --- Redis: every process shares the limits --------------------------------------------------

# KEYS: state hash (limit, hold, cut), holders zset (token -> lease end, ms).
# ARGV: token, lease_ms, max, idle_ms.  -> {granted, wait_ms, limit, now}
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local limit = math.min(tonumber(redis.call('HGET', KEYS[1], 'limit') or max), max)
local hold = tonumber(redis.call('HGET', KEYS[1], 'hold') or '0')
if hold > now then return {0, hold - now, tostring(limit), now} end
if redis.call('ZCARD', KEYS[2]) < math.max(1, math.floor(limit)) then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('HSET', KEYS[1], 'limit', tostring(limit))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return {1, 0, tostring(limit), now}
end
return {0, 0, tostring(limit), now}
"""

# ARGV: token, outcome (ok / throttled / other), hold_ms, acquired_ms, max, idle_ms,
# recent_ms, probe_ms -> limit
_RELEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[5])
redis.call('ZREM', KEYS[2], ARGV[1])
local limit = math.min(tonumber(redis.call('HGET', KEYS[1], 'limit') or max), max)
if ARGV[2] == 'throttled' then
  if tonumber(ARGV[4]) > tonumber(redis.call('HGET', KEYS[1], 'cut') or '0') then
    redis.call('HSET', KEYS[1], 'ceiling', math.max(1, math.floor(limit) - 1))
    limit = math.max(1, math.floor(limit / 2))
    redis.call('HSET', KEYS[1], 'cut', now)
  end
  if now - tonumber(redis.call('HGET', KEYS[1], 'refused') or '0') > tonumber(ARGV[7]) then
    redis.call('HSET', KEYS[1], 'since', now)
  end
  redis.call('HSET', KEYS[1], 'refused', now)
  local hold = tonumber(redis.call('HGET', KEYS[1], 'hold') or '0')
  redis.call('HSET', KEYS[1], 'hold', math.max(hold, now + tonumber(ARGV[3])))
elseif ARGV[2] == 'ok' then
  local top = max
  if now - tonumber(redis.call('HGET', KEYS[1], 'cut') or '0') < tonumber(ARGV[8]) then
    top = math.min(max, tonumber(redis.call('HGET', KEYS[1], 'ceiling') or max))
  end
  limit = math.max(limit, math.min(top, limit + 1 / limit))
end
redis.call('HSET', KEYS[1], 'limit', tostring(limit))
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return tostring(limit)
"""


# A call waiting to be sent: the script (``None`` for a plain command), its keys, its
# arguments (a plain command's are the command), its answer.
_Call = tuple[str | None, list[str], list[object], "asyncio.Future[object]"]
ROUND_TRIP_S = 5.0  # a round trip to Redis longer than this fails (the call goes unlimited)
CLOSE_S = 3.0  # the longest a closing limiter waits to give back the slots queued for release
WIRE_NAME = "spar-outbound-limits"  # the limiter's connection, in Redis's CLIENT LIST


class _Wire:
    """The limiter's one connection to Redis (its scripts and its one read): commands
    written and replies read by hiredis, a round trip at a time (:class:`_Scripts`
    sends one batch at once).

    Through redis-py's pipeline (its pipeline object, retry wrapper, connection pool, a
    timeout per read and a health check, each time) a call's acquire and release cost the
    worker 640 µs of CPU alone and 155 µs each at 30 calls at once; on this connection,
    324 and 49 µs (measured on this 2-core VM on 2026-11-28, uuids and metrics included).
    The limiter runs for every outbound call: it took a fifth of a worker's CPU in
    ``bench/batch.py`` before.
    The URL is read as redis-py reads it (``redis://``, ``rediss://``, ``unix://``,
    user, password, database); any failure closes the connection, the next round trip
    opens another."""

    def __init__(self, url: str) -> None:
        self._options = parse_url(url)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._replies = hiredis.Reader()

    async def round_trip(self, commands: list[list[object]]) -> list[Any]:
        """The replies to ``commands``, in order; an error reply is returned as a
        :class:`RedisError` (``NoScriptError`` for ``NOSCRIPT``), not raised.  A connection
        Redis closed (a restart, an idle timeout) is opened again once, as redis-py does:
        the scripts are safe to run twice (the same token, a limit moved by the same
        outcome once per burst)."""
        async with asyncio.timeout(ROUND_TRIP_S):
            try:
                return await self._once(commands)
            except RedisConnectionError as exc:
                if isinstance(exc.__cause__, TimeoutError):
                    raise
                return await self._once(commands)

    async def _once(self, commands: list[list[object]]) -> list[Any]:
        try:
            if self._writer is None:
                await self._open()
            return await self._exchange(commands)
        except BaseException as exc:  # the connection's state is unknown: a new one next time
            self._close()
            if isinstance(exc, (OSError, TimeoutError, hiredis.ProtocolError)):
                raise RedisConnectionError(f"outbound limits: Redis: {exc!r}") from exc
            raise

    async def _exchange(self, commands: list[list[object]]) -> list[Any]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(b"".join(hiredis.pack_command(tuple(c)) for c in commands))
        replies: list[Any] = []
        while len(replies) < len(commands):
            reply = self._replies.gets()
            if reply is False:  # not all there yet
                data = await self._reader.read(65536)
                if not data:
                    raise OSError("connection closed by Redis")
                self._replies.feed(data)
            elif isinstance(reply, hiredis.ReplyError):
                message = str(reply)
                error = NoScriptError if message.startswith("NOSCRIPT") else RedisError
                replies.append(error(message))
            else:
                replies.append(reply)
        return replies

    async def _open(self) -> None:
        options = self._options
        kind = options.get("connection_class")
        if kind is UnixDomainSocketConnection:
            self._reader, self._writer = await asyncio.open_unix_connection(options["path"])
        else:
            tls = None
            if kind is SSLConnection:
                tls = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
                if str(options.get("ssl_cert_reqs", "required")).lower() in ("none", "0"):
                    tls.check_hostname = False
                    tls.verify_mode = ssl.CERT_NONE
            self._reader, self._writer = await asyncio.open_connection(
                options.get("host", "localhost"), options.get("port", 6379), ssl=tls
            )
        self._replies = hiredis.Reader()
        hello: list[list[object]] = []
        if options.get("password") is not None:
            user = [options["username"]] if options.get("username") else []
            hello.append(["AUTH", *user, options["password"]])
        if options.get("db"):
            hello.append(["SELECT", options["db"]])
        hello.append(["CLIENT", "SETNAME", WIRE_NAME])  # as CLIENT LIST names it
        for reply in await self._exchange(hello):
            if isinstance(reply, Exception):
                raise RedisError(f"outbound limits: Redis refused the connection: {reply}")

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def close(self) -> None:
        writer = self._writer
        self._close()
        if writer is not None:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class _Scripts:
    """The limiter's scripts (and its one plain read, :meth:`command`), sent to Redis
    together: the calls made while one round trip is in flight wait for it and go in the
    next, one pipeline (``EVALSHA`` each, the scripts loaded once when Redis answers
    ``NOSCRIPT``) on the limiter's own connection (:class:`_Wire`), which never carries
    two round trips at once.  Every outbound call runs two scripts, and a worker's calls
    come many at a time.  A task sends, not a caller: a caller cancelled mid-send strands
    no other's answer.  redis-py's own pipelined scripts ask ``SCRIPT EXISTS`` first: one
    more round trip every time."""

    def __init__(self, wire: _Wire, *scripts: str) -> None:
        self._wire = wire
        self._shas = {script: hashlib.sha1(script.encode()).hexdigest() for script in scripts}  # noqa: S324
        self._queued: list[_Call] = []
        self._sender: asyncio.Task[None] | None = None

    async def command(self, *command: object) -> object:
        """A plain command's answer, sent with the scripts; raises as :meth:`submit`'s
        answer does."""
        return await self._queue((None, [], list(command)))

    def submit(self, script: str, keys: list[str], args: list[object]) -> asyncio.Future[object]:
        """The script's answer to come (a :class:`RedisError` when Redis did not give one),
        queued now: it runs before any script submitted after it."""
        return self._queue((script, keys, args))

    def _queue(self, call: tuple[str | None, list[str], list[object]]) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._queued.append((*call, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())
        return future

    async def flush(self) -> None:
        """Until every call queued so far has had its round trip (or failed); cancelled, it
        stops the sending, and the calls not sent fail."""
        sender = self._sender
        if sender is None or sender.done():
            return
        try:
            await asyncio.wait({sender})
        except asyncio.CancelledError:
            sender.cancel()
            raise

    async def _send(self) -> None:
        while self._queued:
            batch, self._queued = self._queued, []
            try:
                answers = await self._round_trip(batch)
            except asyncio.CancelledError:
                for *_, future in [*batch, *self._queued]:
                    if not future.done():
                        future.set_exception(RedisError("outbound limits: the limiter closed"))
                self._queued = []
                raise
            except Exception as exc:  # RedisError or worse: every caller of the batch gets it
                failure = exc if isinstance(exc, RedisError) else RedisError(repr(exc))
                answers = [failure] * len(batch)
            for (_, _, _, future), answer in zip(batch, answers, strict=True):
                if future.done():  # its caller was cancelled
                    continue
                if isinstance(answer, Exception):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)

    async def _round_trip(self, batch: list[_Call]) -> list[Any]:
        answers = await self._wire.round_trip(self._commands(batch))
        unknown = [i for i, answer in enumerate(answers) if isinstance(answer, NoScriptError)]
        if unknown:  # Redis restarted or flushed: load, then send again what did not run
            loaded = await self._wire.round_trip([["SCRIPT", "LOAD", s] for s in self._shas])
            failed = next((answer for answer in loaded if isinstance(answer, Exception)), None)
            if failed is not None:
                raise failed
            again = await self._wire.round_trip(self._commands([batch[i] for i in unknown]))
            for i, answer in zip(unknown, again, strict=True):
                answers[i] = answer
        return answers

    def _commands(self, batch: list[_Call]) -> list[list[object]]:
        return [
            args if script is None else ["EVALSHA", self._shas[script], len(keys), *keys, *args]
            for script, keys, args, _ in batch
        ]


class RedisLimiter(DestinationLimiter):
    """Limits in Redis, shared by every process: each step one Lua script (Redis's clock).
    The client belongs to the event loop that first uses it (a worker process has one)."""

    def __init__(self, url: str, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._wire = _Wire(url)
        self._scripts = _Scripts(self._wire, _ACQUIRE, _RELEASE)

    @staticmethod
    def _keys(destination: Destination) -> list[str]:
        return [destination.key, destination.key + ":holders"]

    async def _try(self, destination: Destination, token: str) -> _Tried:
        try:
            granted, wait_ms, limit, now = await self._scripts.submit(  # type: ignore[misc]
                _ACQUIRE,
                self._keys(destination),
                [token, _ms(self.lease_s), self.max_concurrency, _ms(IDLE_S)],
            )
        except RedisError:
            # Redis away: the call goes, unlimited, rather than fail (logged); the limits
            # start again from the top once it is back (docs/operations.md).
            log.warning("outbound limits unavailable (Redis): calling unlimited", exc_info=True)
            return _Tried(True, 0.0, float(self.max_concurrency), _now_ms())
        return _Tried(bool(granted), int(wait_ms) / 1000, float(limit), int(now))

    def _settle(
        self, lease: Lease, outcome: str, hold_s: float, settled: Callable[[float], None]
    ) -> None:
        def answered(answer: asyncio.Future[object]) -> None:
            failure = answer.exception()
            if failure is None:
                settled(float(answer.result()))  # type: ignore[arg-type]
                return
            # Redis away: the slot's lease ends it.
            log.warning("outbound limits unavailable (Redis): slot not released: %r", failure)
            settled(float(self.max_concurrency))

        self._scripts.submit(
            _RELEASE,
            self._keys(lease.destination),
            [
                lease.token,
                outcome,
                _ms(hold_s),
                lease.acquired_ms,
                self.max_concurrency,
                _ms(IDLE_S),
                _ms(RECENT_S),
                _ms(self.probe_s),
            ],
        ).add_done_callback(answered)

    async def _refusals(self, destination: Destination) -> tuple[int, int, int]:
        try:
            values = await self._scripts.command(
                "HMGET", destination.key, "since", "refused", "hold"
            )
        except RedisError:  # a batch's detail still answers, without it
            log.warning("outbound limits unavailable (Redis)", exc_info=True)
            return 0, 0, 0
        since, refused, hold = (int(float(v)) if v else 0 for v in values)
        return since, refused, hold

    async def close(self) -> None:
        """Give back the slots queued for release first (a call does not wait for its
        release, so one still queued would keep its slot taken for the lease, a minute),
        for at most :data:`CLOSE_S`; then close the connection."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_S):
                await self._scripts.flush()
        await self._wire.close()


# --- one process -----------------------------------------------------------------------------


@dataclass
class _State:
    limit: float
    hold_ms: int = 0
    cut_ms: int = 0
    ceiling: float = 0.0  # after a cut, for PROBE_S: one below the limit refused
    since_ms: int = 0
    refused_ms: int = 0
    holders: dict[str, int] = field(default_factory=dict)  # token -> lease end
    touched_ms: int = 0


_PROCESS_STATES: dict[str, _State] = {}
_PROCESS_LOCK = threading.Lock()  # the API's and the workers' event loops may differ


class LocalLimiter(DestinationLimiter):
    """The same rule in one process (``spar dev``): the process's states in a dict (the
    API's limiter reads what the in-process workers' wrote), each step one critical
    section that never awaits."""

    def __init__(self, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._states = _PROCESS_STATES

    _SWEEP_ABOVE = 10_000

    def _state(self, destination: Destination, now: int) -> _State:
        if len(self._states) > self._SWEEP_ABOVE:  # forget the idle ones
            for key in [k for k, v in self._states.items() if now - v.touched_ms > _ms(IDLE_S)]:
                del self._states[key]
        state = self._states.get(destination.key)
        if state is None or now - state.touched_ms > _ms(IDLE_S):
            state = self._states[destination.key] = _State(limit=self.max_concurrency)
        state.limit = min(state.limit, self.max_concurrency)
        state.touched_ms = now
        return state

    async def _try(self, destination: Destination, token: str) -> _Tried:
        with _PROCESS_LOCK:
            return self._try_now(destination, token)

    def _try_now(self, destination: Destination, token: str) -> _Tried:
        now = _now_ms()
        state = self._state(destination, now)
        for holder in [t for t, end in state.holders.items() if end <= now]:
            del state.holders[holder]
        if state.hold_ms > now:
            return _Tried(False, (state.hold_ms - now) / 1000, state.limit, now)
        if len(state.holders) < max(1, math.floor(state.limit)):
            state.holders[token] = now + _ms(self.lease_s)
            return _Tried(True, 0.0, state.limit, now)
        return _Tried(False, 0.0, state.limit, now)

    def _settle(
        self, lease: Lease, outcome: str, hold_s: float, settled: Callable[[float], None]
    ) -> None:
        with _PROCESS_LOCK:
            limit = self._settle_now(lease, outcome, hold_s)
        settled(limit)

    def _settle_now(self, lease: Lease, outcome: str, hold_s: float) -> float:
        now = _now_ms()
        state = self._state(lease.destination, now)
        state.holders.pop(lease.token, None)
        if outcome == "throttled":
            if now - state.refused_ms > _ms(RECENT_S):
                state.since_ms = now
            state.refused_ms = now
            if lease.acquired_ms > state.cut_ms:
                state.ceiling = max(1, math.floor(state.limit) - 1)
                state.limit = max(1, math.floor(state.limit / 2))
                state.cut_ms = now
            state.hold_ms = max(state.hold_ms, now + _ms(hold_s))
        elif outcome == "ok":
            top = self.max_concurrency
            if now - state.cut_ms < _ms(self.probe_s):
                top = min(top, state.ceiling)
            state.limit = max(state.limit, min(top, state.limit + 1 / state.limit))
        return state.limit

    async def _refusals(self, destination: Destination) -> tuple[int, int, int]:
        with _PROCESS_LOCK:
            state = self._states.get(destination.key)
            if state is None:
                return 0, 0, 0
            return state.since_ms, state.refused_ms, state.hold_ms


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def limiter_for(settings: Settings) -> DestinationLimiter:
    """The process's limiter: Redis when ``SPAR_REDIS_URL`` is set, else in-process."""
    options = {
        "max_concurrency": settings.outbound_max_concurrency,
        "wait_s": settings.rate_limit_wait_s,
        # An attempt lasts at most the call's timeout: a dead holder's slot frees after it.
        "lease_s": settings.egress_timeout_s + 5.0,
    }
    if settings.redis_url:
        return RedisLimiter(settings.redis_url, **options)
    return LocalLimiter(**options)
