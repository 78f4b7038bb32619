"""Message templates: plain text skips Jinja but must render exactly as Jinja would;
markup renders in the sandbox's own processes, bounded in CPU time, output and memory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.scenarios import sandbox
from shared.scenarios.templates import MAX_RENDERED_CHARS, environment

# Text with every kind of newline and the characters around Jinja's markup, minus the
# markup itself (whose absence is what sends a message down the plain path).
plain = st.text(
    alphabet=st.sampled_from(["a", "é", " ", "\n", "\r", "\t", "{", "}", "%", "#", "-", "x"]),
    max_size=40,
).filter(lambda text: not any(m in text for m in ("{{", "{%", "{#")))


def render_plain(text: str, context: dict[str, object]) -> str:
    return asyncio.run(sandbox.render(text, context))


@settings(max_examples=400, deadline=None)
@given(plain)
def test_plain_text_renders_as_jinja_renders_it(text: str) -> None:
    assert render_plain(text, {}) == environment.from_string(text).render({})


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("Hello", "Hello"),
        ("line one\r\nline two\r\n", "line one\nline two"),
        ("two trailing\n\n", "two trailing\n"),
        ("braces { and } alone", "braces { and } alone"),
    ],
)
def test_plain_text_examples(text: str, rendered: str) -> None:
    assert render_plain(text, {"unused": 1}) == rendered


def test_a_plain_message_over_the_limit_is_refused_too() -> None:
    assert len(render_plain("x" * MAX_RENDERED_CHARS, {})) == MAX_RENDERED_CHARS
    with pytest.raises(sandbox.TemplateFailed, match="longer than"):
        render_plain("x" * (MAX_RENDERED_CHARS + 1), {})


async def test_markup_renders_in_the_sandbox_as_jinja_renders_it() -> None:
    for template, context in [
        ("Hi {{ name }}!\n", {"name": "Ada"}),
        ("{# a comment #}Hi", {}),
        ("{% for i in range(3) %}{{ i }}{% endfor %}\n\n", {}),
        ("{{ text }}", {"text": "ends with a newline\n"}),
        ("{{ booking.id }} {{ rows[1] }}", {"booking": {"id": "BK-1"}, "rows": [1, 2]}),
    ]:
        expected = environment.from_string(template).render(context)
        assert await sandbox.render(template, context) == expected, template


async def test_the_renderers_are_processes_of_their_own() -> None:
    await sandbox.render("{{ 1 }}", {})
    pids = sandbox.renderer_pids()
    assert pids and os.getpid() not in pids


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        # Two loops of ten thousand steps: about 10^8 steps of CPU, stopped after a second.
        (
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}hi",
            "more than 1 s of CPU",
        ),
        # Text emitted in a loop: refused as it passes the limit, not after.
        ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "longer than 100,000"),
        # A value doubled in a loop, never emitted: the memory cap ends it (or, on a busy
        # machine, the CPU bound first: copying half a gigabyte takes CPU too).
        (
            "{% set ns = namespace(s='x') %}"
            "{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "more memory than allowed|more than 1 s of CPU",
        ),
        ("{{ undefined_name }}", "UndefinedError"),
        ("{{ 'a' * 1000000000 }}", "too large"),
        ("{{ self }}", "'self' is reserved"),
    ],
    ids=["cpu", "output", "memory", "undefined", "huge-value", "self"],
)
async def test_a_template_that_cannot_render_fails_with_the_reason(
    template: str, reason: str
) -> None:
    with pytest.raises(sandbox.TemplateFailed, match=reason):
        await sandbox.render(template, {})
    # The renderers outlive what they refused (or are replaced).
    assert await sandbox.render("{{ 'still ' ~ 'here' }}", {}) == "still here"


def peak_memory_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_endless_text_is_refused_while_it_renders_not_after() -> None:
    """100 MB of text asked for: the renderer stops at the limit, never holding it all."""

    async def render_and_measure() -> list[int]:  # in a loop of its own: fresh renderers
        template = "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"
        with pytest.raises(sandbox.TemplateFailed, match="longer than"):
            await sandbox.render(template, {})
        return [peak_memory_kib(pid) for pid in sandbox.renderer_pids()]

    peaks = asyncio.run(render_and_measure())
    assert peaks and max(peaks) < 100 * 1024, f"a renderer peaked at {max(peaks)} KiB"


# --- the check at save ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "context", "mentions"),
    [
        ("Hi {{ name }}", {"name": "Ada"}, None),
        ("Hi {{ name }}", {}, "'name'"),
        ("{{ booking.id }}", {"booking": {"id": 1}}, None),
        ("{{ booking.id }}", {"booking": {"ref": 1}}, "booking.id"),
        ("{{ booking['id'] }}", {"booking": {}}, "booking.id"),
        ("{{ booking.id.deeper }}", {"booking": {"id": 1}}, None),  # only rendering can tell
        ("{{ booking[key] }}", {"booking": {}, "key": "k"}, None),  # not a constant path
        ("{{ rows[1] }}", {"rows": [1]}, "rows[1]"),
        ("{{ rows[-1] }}", {"rows": [1]}, None),
        ("{% for row in rows %}{{ row.x }}{% endfor %}", {"rows": [{}]}, None),
        ("{{ name", {"name": "Ada"}, "Invalid template"),
        ("{{ self }}", {"self": 1}, "'self' is reserved"),
    ],
)
def test_what_the_check_at_save_refuses(
    template: str, context: dict[str, object], mentions: str | None
) -> None:
    from shared.scenarios.templates import problem

    found = problem(template, context)
    if mentions is None:
        assert found is None
    else:
        assert found is not None and mentions in found, found
