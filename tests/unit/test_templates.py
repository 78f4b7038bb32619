"""User message templates: plain text skips Jinja but must render exactly as Jinja would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.scenarios.runner import _templates, render_message

# Text with every kind of newline and the characters around Jinja's markup, minus the
# markup itself (whose absence is what sends a message down the plain path).
plain = st.text(
    alphabet=st.sampled_from(["a", "é", " ", "\n", "\r", "\t", "{", "}", "%", "#", "-", "x"]),
    max_size=40,
).filter(lambda text: not any(m in text for m in ("{{", "{%", "{#")))


@settings(max_examples=400, deadline=None)
@given(plain)
def test_plain_text_renders_as_jinja_renders_it(text: str) -> None:
    assert render_message(text, {}) == _templates.from_string(text).render({})


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
    assert render_message(text, {"unused": 1}) == rendered


def test_markup_still_goes_through_the_sandbox() -> None:
    assert render_message("Hi {{ name }}!\n", {"name": "Ada"}) == "Hi Ada!"
    assert render_message("{# a comment #}Hi", {}) == "Hi"


def test_a_plain_message_over_the_limit_is_refused_too() -> None:
    from shared.scenarios.runner import MAX_RENDERED_CHARS, RunAborted

    assert len(render_message("x" * MAX_RENDERED_CHARS, {})) == MAX_RENDERED_CHARS
    with pytest.raises(RunAborted, match="too long"):
        render_message("x" * (MAX_RENDERED_CHARS + 1), {})


# --- the check at save ----------------------------------------------------------------------------


def test_runs_and_the_check_at_save_share_one_environment() -> None:
    from shared.scenarios.templates import environment

    assert _templates is environment


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
