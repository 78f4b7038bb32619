"""Rendering message templates (DESIGN §5.2) where a template cannot stall a worker.

A scenario's user messages and a trigger's message are Jinja templates written by any
member, and Jinja's sandbox stops unsafe calls, not work: two nested loops of ten thousand
steps each take seconds of CPU, and a loop that emits text builds as much of it as it is
told to.  Rendered in the worker's event loop, such a template stalls every run of the
worker for as long.  So templates are rendered here:

* in **processes of their own** (up to :data:`MAX_PROCESSES` per event loop, started as
  renders need them, with the same interpreter, spoken to over pipes): the worker's
  event loop only waits, and a slow template holds up one renderer, not the others;
* each render is bounded in **CPU time** (:data:`CPU_S`, a profiling timer in the
  child), in **output while it renders** (the text is generated piece by piece and
  refused past :data:`~shared.scenarios.templates.MAX_RENDERED_CHARS`) and in **memory**
  (the child's address space is capped at :data:`MEMORY_BYTES`);
* a child that does not answer within :data:`WALL_S` is killed and replaced.

A failed render raises :class:`TemplateFailed` with the reason; the caller names the
template (a turn's message, a trigger's message) and ends its run or execution in error.
Plain text never comes here: it renders as itself (:func:`render`).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec
from jinja2 import TemplateError

from shared.scenarios.templates import (
    MAX_RENDERED_CHARS,
    RESERVED,
    environment,
    uses_reserved_name,
)

CPU_S = 1.0
WALL_S = 10.0
MEMORY_BYTES = 1 << 30
MAX_PROCESSES = 4
_MARKUP = ("{{", "{%", "{#")
_NEWLINE = re.compile(r"\r\n|\r|\n")
_LINE_LIMIT = 1 << 24  # a reply line: the rendered text, JSON-encoded


class TemplateFailed(Exception):
    """The template could not be rendered; the message says why."""


class _Request(msgspec.Struct, array_like=True):
    template: str
    context: dict[str, Any]


class _Reply(msgspec.Struct, array_like=True, omit_defaults=True):
    text: str | None = None
    error: str | None = None
    spent: bool = False  # the renderer ran out of memory: replace it, do not reuse it


# --- the parent's side ---------------------------------------------------------------------------


async def render(template: str, context: dict[str, Any]) -> str:
    """``template`` rendered with ``context`` (its top-level keys are the variables), under
    the bounds of this module; raises :class:`TemplateFailed`."""
    if not any(markup in template for markup in _MARKUP):
        # Plain text renders as itself, as Jinja would render it (newlines normalized, one
        # trailing newline dropped), without a round trip to a renderer.
        rendered = _NEWLINE.sub("\n", template)
        rendered = rendered[:-1] if rendered.endswith("\n") else rendered
        if len(rendered) > MAX_RENDERED_CHARS:
            raise TemplateFailed(f"the rendered message is longer than {MAX_RENDERED_CHARS:,}")
        return rendered
    request = msgspec.json.encode(_Request(template, context)) + b"\n"
    async with _renderers().borrow() as child:
        reply = await child.ask(request)
    if reply.error is not None:
        raise TemplateFailed(reply.error)
    return reply.text or ""


class _Child:
    """One renderer process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.killed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    async def ask(self, request: bytes) -> _Reply:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(request)
            await stdin.drain()
            line = await asyncio.wait_for(stdout.readline(), timeout=WALL_S)
        except TimeoutError:
            self.kill()
            return _Reply(error=f"rendering did not finish within {WALL_S:g} s")
        except (ConnectionError, ValueError, asyncio.LimitOverrunError):
            self.kill()
            return _Reply(error="the renderer stopped")
        except BaseException:
            # Cancelled mid-render: its answer must never reach the next caller.
            self.kill()
            raise
        if not line:  # the child died: its memory cap, most likely
            self.kill()
            return _Reply(error="the renderer stopped (rendering used too much memory)")
        reply = msgspec.json.decode(line, type=_Reply)
        if reply.spent:  # what it allocated may stay mapped: a fresh one takes its place
            self.kill()
            await self.process.wait()
        return reply

    @property
    def alive(self) -> bool:
        # Killed: gone, even before its exit is reaped (returncode still None until then).
        return not self.killed and self.process.returncode is None

    def kill(self) -> None:
        self.killed = True
        with suppress(ProcessLookupError):
            self.process.kill()


class _Renderers:
    """The renderer processes of one event loop: at most :data:`MAX_PROCESSES`, each
    serving one render at a time, a new one started while all are busy."""

    def __init__(self) -> None:
        self.idle: asyncio.Queue[_Child] = asyncio.Queue()
        self.started = 0

    @asynccontextmanager
    async def borrow(self) -> AsyncIterator[_Child]:
        if self.idle.empty() and self.started < MAX_PROCESSES:
            self.started += 1
            try:
                child = await _start()
            except BaseException:
                self.started -= 1
                raise
        else:
            child = await self.idle.get()
        try:
            yield child
        finally:
            if child.alive:
                self.idle.put_nowait(child)
            else:
                self.started -= 1

    @property
    def pids(self) -> list[int]:
        """The renderers idle now (for tests that look at them)."""
        return [child.pid for child in self.idle._queue]  # type: ignore[attr-defined]

    async def warm_up(self) -> None:
        """Start a renderer now rather than on the first template."""
        if self.started == 0:
            self.started += 1
            self.idle.put_nowait(await _start())


_by_loop: dict[asyncio.AbstractEventLoop, _Renderers] = {}


def _renderers() -> _Renderers:
    loop = asyncio.get_running_loop()
    renderers = _by_loop.get(loop)
    if renderers is None:
        renderers = _by_loop[loop] = _Renderers()
    return renderers


async def warm_up() -> None:
    """Start this event loop's first renderer (a worker does it as it boots)."""
    await _renderers().warm_up()


def renderer_pids() -> list[int]:
    """The process ids of this event loop's idle renderers."""
    return _renderers().pids


# The directory this code was imported from: a renderer runs the very same code.
_ROOT = str(Path(__file__).resolve().parents[2])


async def _start() -> _Child:
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __name__,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
        limit=_LINE_LIMIT,
    )
    return _Child(process)


# --- the child's side ----------------------------------------------------------------------------


class _OutOfTime(BaseException):
    """Raised by the CPU timer's signal; a BaseException, so no template code catches it."""


def _out_of_time(signum: int, frame: Any) -> None:
    raise _OutOfTime


@lru_cache(maxsize=256)
def _compiled(template: str) -> Any:
    parsed = environment.parse(template)
    if uses_reserved_name(parsed):
        # Scenarios saved before templates were checked at save may still hold one.
        raise TemplateFailed(
            f"'{RESERVED}' is reserved in templates; rename that customer_context key"
        )
    return environment.from_string(parsed)


def _render_here(template: str, context: dict[str, Any]) -> _Reply:
    pieces: list[str] = []
    size = 0
    signal.setitimer(signal.ITIMER_PROF, CPU_S)
    try:
        for piece in _compiled(template).generate(context):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:
                return _Reply(error=f"the rendered message is longer than {MAX_RENDERED_CHARS:,}")
            pieces.append(piece)
    except _OutOfTime:
        return _Reply(error=f"rendering used more than {CPU_S:g} s of CPU")
    except TemplateFailed as exc:
        return _Reply(error=str(exc))
    except MemoryError:
        return _Reply(error="rendering used more memory than allowed", spent=True)
    except (TemplateError, ArithmeticError, TypeError, ValueError, RecursionError) as exc:
        return _Reply(error=f"{type(exc).__name__}: {exc}")
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    return _Reply(text="".join(pieces))


def main() -> None:
    """The renderer: one request a line on stdin, one reply a line on stdout, until EOF."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    signal.signal(signal.SIGPROF, _out_of_time)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's
    decoder = msgspec.json.Decoder(_Request)
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            request = decoder.decode(line)
            reply = _render_here(request.template, request.context)
        except _OutOfTime:  # the timer fired as the render ended
            reply = _Reply(error=f"rendering used more than {CPU_S:g} s of CPU")
        except Exception as exc:  # never die on one request
            reply = _Reply(error=f"{type(exc).__name__}: {exc}")
        out.write(encoder.encode(reply) + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
