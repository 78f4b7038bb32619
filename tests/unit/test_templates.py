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
