"""Secrets redacted in every form an echo gives them back in (shared.outbound.redact, issue 21).

Each secret is put in a set of request headers, which real encoders turn into an echo: the
header lines, their JSON, their query string, their HTML, and base64 of each.  What comes
back must be that echo with exactly the secret's form replaced by ``[redacted]``.
"""

from __future__ import annotations

import base64
import html
import json
import re
import string
from collections.abc import Callable
from html.entities import codepoint2name
from urllib.parse import quote, quote_plus, urlencode
from xml.sax.saxutils import escape as xml_escape

import markupsafe
import msgspec
import pytest
import yarl
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.utils import htmlsafe_json_dumps

from shared.outbound.egress import EgressResponse
from shared.outbound.redact import PLACEHOLDER, Redactor

SECRETS = [
    'S3cr3t+Agent/Key="<&>"',
    "pässwörd-ünïcode-€",
    "back\\slash\\secret\\42",
    "quote\"and'apos<&>secret",
    "emoji😀and\u2028separator",
]
REDACTOR = Redactor([*SECRETS, "sk-live-0123456789abcdefABCDEF", "pin42"])
MARK = "SECRETMARK"  # stands in for the secret: every encoder leaves it as it is

Headers = dict[str, str]


def headers_with(secret: str) -> Headers:
    return {"accept": "*/*", "x-agent-token": secret, "user-agent": "spar/1.0"}


def lines(headers: Headers) -> str:
    return "\n".join(f"{name}: {value}" for name, value in headers.items())


def as_latin1(headers: Headers) -> Headers:
    """The headers as Python's http.server and Starlette hand them over: UTF-8 read as
    Latin-1."""
    return {name: value.encode().decode("latin-1") for name, value in headers.items()}


def upper_hex(text: str) -> str:
    return re.sub(r"\\u[0-9a-f]{4}", lambda m: "\\u" + m.group()[2:].upper(), text)


def go_json(headers: Headers) -> str:
    """Go's encoding/json: non-ASCII as is; < > & U+2028 U+2029 as \\u00XX."""
    text = json.dumps(headers, ensure_ascii=False)
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


ENCODERS: dict[str, Callable[[Headers], str]] = {
    "as is": lines,
    "JSON": json.dumps,
    "JSON, non-ASCII as is": lambda h: json.dumps(h, ensure_ascii=False),
    "JSON, / escaped (PHP)": lambda h: json.dumps(h).replace("/", "\\/"),
    "JSON, upper-case hex": lambda h: upper_hex(json.dumps(h)),
    "JSON, Go": go_json,
    "JSON, safe in HTML (Jinja's tojson)": lambda h: str(htmlsafe_json_dumps(h)),
    "JSON, msgspec": lambda h: msgspec.json.encode(h).decode(),
    "JSON twice": lambda h: json.dumps(json.dumps(h)),
    "JSON twice, non-ASCII as is": lambda h: json.dumps(
        json.dumps(h, ensure_ascii=False), ensure_ascii=False
    ),
    "query, quote": lambda h: urlencode(h, quote_via=quote),
    "query, quote keeping /": lambda h: urlencode(h, safe="/", quote_via=quote),
    "query, quote_plus": urlencode,
    "query, lower-case hex": lambda h: re.sub(
        r"%[0-9A-F]{2}", lambda m: m.group().lower(), urlencode(h)
    ),
    "query, yarl": lambda h: (
        yarl.URL.build(scheme="https", host="a.example", query=h).raw_query_string
    ),
    "HTML, html.escape": lambda h: html.escape(lines(h)),
    "HTML, html.escape without quote": lambda h: html.escape(lines(h), quote=False),
    "HTML, markupsafe": lambda h: str(markupsafe.escape(lines(h))),
    "XML, &apos;": lambda h: xml_escape(lines(h), {'"': "&quot;", "'": "&apos;"}),
    "HTML, ASCII with decimal references": lambda h: (
        html.escape(lines(h)).encode("ascii", "xmlcharrefreplace").decode()
    ),
    "HTML, hex references": lambda h: "".join(
        f"&#x{ord(c):X};" if c in "\"'<>&" or ord(c) > 0x7F else c for c in lines(h)
    ),
    "HTML, named entities (PHP's htmlentities)": lambda h: "".join(
        f"&{codepoint2name[ord(c)]};" if ord(c) in codepoint2name else c for c in lines(h)
    ),
    "JSON shown in HTML": lambda h: html.escape(json.dumps(h)),
    "JSON shown in HTML, markupsafe": lambda h: str(
        markupsafe.escape(json.dumps(h, ensure_ascii=False))
    ),
    "HTML in JSON": lambda h: json.dumps(html.escape(lines(h))),
    "HTML in JSON, safe in HTML": lambda h: str(htmlsafe_json_dumps(html.escape(lines(h)))),
    "read as Latin-1": lambda h: lines(as_latin1(h)),
    "read as Latin-1, JSON": lambda h: json.dumps(as_latin1(h)),
    "read as Latin-1, JSON, non-ASCII as is": lambda h: json.dumps(
        as_latin1(h), ensure_ascii=False
    ),
    "read as Latin-1, HTML": lambda h: html.escape(lines(as_latin1(h))),
}


def echo_of(secret: str, encoding: str) -> tuple[str, str, str]:
    """The encoded headers holding ``secret``, as (before, the secret's form, after)."""
    encode = ENCODERS[encoding]
    before, after = encode(headers_with(MARK)).split(MARK)
    text = encode(headers_with(secret))
    assert text.startswith(before) and text.endswith(after), "the encoder depends on context"
    return before, text[len(before) : len(text) - len(after)], after


def up_to(byte_index: int) -> int:
    """How many base64 characters hold a bit of the first ``byte_index`` bytes."""
    return -(-byte_index * 4 // 3)


@pytest.mark.parametrize("encoding", ENCODERS)
@pytest.mark.parametrize("secret", SECRETS)
def test_a_secret_is_redacted_in_each_form_an_encoder_gives_it(secret: str, encoding: str) -> None:
    before, form, after = echo_of(secret, encoding)
    assert form in (secret, *(quote(secret, safe=s) for s in ("", "/"))) or secret not in form

    echo = f"You sent me:\n{before}{form}{after}\nBye."
    assert REDACTOR.text(echo) == f"You sent me:\n{before}{PLACEHOLDER}{after}\nBye."


@pytest.mark.parametrize("encoding", ENCODERS)
@pytest.mark.parametrize("secret", SECRETS)
def test_a_secret_is_redacted_in_base64_of_each_form_at_every_alignment(
    secret: str, encoding: str
) -> None:
    before, form, after = echo_of(secret, encoding)
    for prefix in ("", ":", "u:"):  # the form starts at each of the 3 positions in a group
        data = f"{prefix}{before}{form}{after}".encode()
        start = len(f"{prefix}{before}".encode())
        end = start + len(form.encode())
        for b64encode in (base64.b64encode, base64.urlsafe_b64encode):
            padded = b64encode(data).decode()
            for encoded in (padded, padded.rstrip("=")):
                # Every character holding a bit of the form goes, and only those.
                expected = f"{encoded[: start * 4 // 3]}{PLACEHOLDER}{encoded[up_to(end) :]}"
                # Alone, and glued to a word (the run starts before the encoded value).
                for glue in ("", "id"):
                    echo = f"headers (base64): {glue}{encoded}\n"
                    assert REDACTOR.text(echo) == f"headers (base64): {glue}{expected}\n"


def test_base64_is_redacted_inside_json_that_escapes_slashes_and_inside_a_query_string() -> None:
    secret = "what???>>>~~~secret"
    data = f"t={secret}!".encode()
    encoded = base64.b64encode(data).decode()
    head, tail = encoded[: 2 * 4 // 3], encoded[up_to(len(data) - 1) :]
    assert {"/", "+"} <= set(encoded[len(head) : len(encoded) - len(tail)])
    redactor = Redactor([secret])

    php = json.dumps({"token": encoded}).replace("/", "\\/")
    expected = json.dumps({"token": f"{head}{PLACEHOLDER}{tail}"}).replace("/", "\\/")
    assert redactor.text(php) == expected
    query = urlencode({"token": encoded})
    assert redactor.text(query) == f"token={quote_plus(head)}{PLACEHOLDER}{quote_plus(tail)}"


def test_a_short_value_is_redacted_only_as_a_whole_token_and_never_in_base64() -> None:
    redactor = Redactor(["pin42"])
    text = "pin: pin42, spin42x, pin420, pin%34%32 and &quot;pin42&quot;"
    expected = "pin: [redacted], spin42x, pin420, [redacted] and &quot;[redacted]&quot;"
    assert redactor.text(text) == expected
    encoded = base64.b64encode(b"user:pin42").decode()
    assert redactor.text(encoded) == encoded


def test_json_answers_and_bytes_are_redacted_like_text() -> None:
    secret = SECRETS[0]
    value = {f"key {secret}": [secret, 1, None, {"nested": f"<{secret}>"}]}
    answer = EgressResponse(
        status_code=200,
        headers={},
        raw=json.dumps(value).encode(),
        url="http://agent.example/",
        latency_ms=0.0,
        attempts=1,
        redactor=REDACTOR,
    )
    assert answer.json() == {"key [redacted]": ["[redacted]", 1, None, {"nested": "<[redacted]>"}]}
    assert answer.json_as_received() == value  # only for checks: never kept
    # Bytes that are not UTF-8 pass through untouched around the secret.
    assert REDACTOR.bytes(b"\xff " + secret.encode() + b" \xfe") == b"\xff [redacted] \xfe"


def test_a_secret_of_backslashes_is_found_among_many_backslashes() -> None:
    # Forms do not mix within a secret: mixed, the run below could be cut into the
    # secret's characters in about 3**24 ways, tried at each position.
    secret = "\\" * 24 + "end-of-key"
    redactor = Redactor([secret])
    noise = "\\" * 200 + "x"
    assert redactor.text(noise) == noise
    assert redactor.text(noise + json.dumps(secret)) == f'{noise}"[redacted]"'


ORDINARY = r"""Hello! Your order #4521 shipped on 2024-03-01 at 10:30 (100% sure), a+b=c.
{"status": "shipped", "url": "https:\/\/track.example.com\/p?id=123&lang=en",
 "note": "caf\u00e9 <b>bold</b> \"quoted\" \\ done", "id": "123e4567-e89b-12d3-a456-426614174000"}
&lt;p&gt;Thanks &amp; regards&lt;/p&gt; &quot;quoted&quot; &#39;single&#39; &#x27;hex&#x27;
https://example.com/search?q=caf%C3%A9+au+lait&page=2
token: eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0
image: iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kg==
C:\Users\agent\secret-notes.txt, √2 ≈ 1.414, emoji 😀, pässe, back\slash, S3cr3t+Agent
"""


def test_ordinary_text_without_secrets_is_unchanged() -> None:
    assert REDACTOR.text(ORDINARY) == ORDINARY
    assert REDACTOR.bytes(ORDINARY.encode()) == ORDINARY.encode()
    assert Redactor([]).text(ORDINARY) == ORDINARY


# Printable ASCII (space included) and a few characters outside it.
ALPHABET = string.printable[:95] + "éü€😀\u2028"


def left_besides_placeholders(redacted: str) -> str:
    """``redacted`` with each placeholder a character no secret has (a secret may be made
    of the placeholder's own characters)."""
    assert PLACEHOLDER in redacted
    return redacted.replace(PLACEHOLDER, "\0")


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(alphabet=ALPHABET, min_size=8, max_size=24),
    encoding=st.sampled_from(list(ENCODERS)),
)
def test_any_printable_secret_is_redacted_in_every_form_and_its_base64(
    secret: str, encoding: str
) -> None:
    redactor = Redactor([secret])
    before, form, after = echo_of(secret, encoding)
    redacted = redactor.text(f"echo {before}{form}{after} end")
    assert form not in left_besides_placeholders(redacted)

    data = f"x{before}{form}{after}".encode()
    start = len(f"x{before}".encode())
    encoded = base64.b64encode(data).decode()
    only_the_form = encoded[up_to(start) : (start + len(form.encode())) * 4 // 3]
    assert only_the_form not in left_besides_placeholders(redactor.text(encoded))
