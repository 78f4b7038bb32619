r"""Keeping an organization's secrets out of what Spar stores, returns and logs.

Whatever an outbound call brings back — an agent's reply, a judge's critique and evidence,
an error message, a usage field — may hold a secret: an agent that echoes the request it
received echoes the ``{{credentials.KEY}}`` values egress put in its headers and query
string, and a provider may quote the API key it was sent.  :class:`Redactor` is the one
function that takes them out; :class:`~shared.outbound.egress.EgressClient` applies it to
every response it hands back and every error it raises, so no caller can forget.

What is replaced by ``[redacted]``:

1. every credential value of the organization (not only those the call used), and every
   secret the call sent in an ``Authorization`` / ``X-Api-Key`` style header (a provider's
   ``credential_key``), with its ``Bearer`` / ``Basic`` scheme stripped;
2. in each form an echo gives it back in, as common encoders write it (an encoder may
   write each character in any of its ways: a URL encoder escapes some and not others):

   * as is;
   * URL-encoded: each character as is or as the ``%XX`` escapes of its UTF-8 bytes (hex
     in either case), a space also as ``+`` (``quote``, ``quote_plus``, yarl, ...);
   * JSON-escaped: ``\`` as ``\\``, ``"`` as ``\"``, ``/`` as is or ``\/``, control
     characters as their short escape or ``\u00XX``, non-ASCII characters as is (UTF-8)
     or ``\uXXXX`` (a surrogate pair past U+FFFF), ``< > & ' " +`` and the backtick as is
     or ``\u00XX`` (Go, .NET, Jinja's ``tojson``); hex in either case.  Also escaped twice
     (JSON in a JSON string);
   * HTML-escaped: ``&amp; &lt; &gt; &quot; &apos;``, the HTML 4 names of non-ASCII
     characters (``&eacute;``, ``&euro;``), and numeric references (``&#34;``, ``&#034;``,
     ``&#x22;``, hex in either case) for ``& < > " ' + =``, the backtick and non-ASCII
     characters (``html.escape`` with or without ``quote``, markupsafe, Go, PHP, ...).
     Also JSON then HTML-escaped (JSON shown in a page) and HTML then JSON-escaped (HTML in
     a JSON string);
   * as a server reads a header holding non-ASCII bytes (UTF-8 read as Latin-1: Python's
     http.server, Starlette), then as is, JSON-escaped or HTML-escaped;
3. and base64 of any of those forms: standard or URL-safe alphabet, padded or not, alone
   or anywhere inside a longer encoded value (``Basic base64(user:secret)``, the base64 of
   a JSON object of headers).  Every run of 11 or more base64 characters (``\/`` and
   ``%2B`` ``%2F`` read as ``/`` and ``+``, as JSON and URL encoders write them) is
   decoded at each of its four alignments and searched like text; each base64 character
   holding a bit of a secret is replaced.

Not recognised: a secret whose characters are in different forms (one JSON-escaped, the
next HTML-escaped), other encodings (hex, UTF-16, base64 of base64), base64 wrapped across
lines, a form URL-encoded again, a secret split by other text.

Short values: a value of ``MIN_ANYWHERE`` (8) characters or more is replaced wherever it
occurs.  A shorter one is too weak to be a real secret, and replacing it inside every word
would corrupt replies (a 3-character value is in most English sentences), so it is
replaced only where it stands as a whole token (no letter or digit right before or after
it), and not in base64 (a short base64 fragment matches unrelated data).  Keep credential
values at 8 characters or more.
"""

from __future__ import annotations

import binascii
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from html.entities import codepoint2name
from typing import Any

PLACEHOLDER = "[redacted]"
MIN_ANYWHERE = 8
_SCHEMES = re.compile(r"^(?:bearer|basic|token|apikey|api-key)\s+", re.IGNORECASE)
_ALONE_BEFORE = r"(?<![A-Za-z0-9])"
_ALONE_AFTER = r"(?![A-Za-z0-9])"

# --- the forms of one character --------------------------------------------------------------

_JSON_SHORT = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
# Written as \u00XX by some encoders though JSON does not need it: Go and Jinja's tojson
# (< > & ', so JSON is safe inside HTML), .NET (those, " + and `).
_JSON_AS_UNICODE = frozenset("<>&'\"+`")
# Given a character reference by some HTML escaper: the five of html.escape and
# markupsafe, and + = ` of Go's html/template.
_HTML_ESCAPED = frozenset("&<>\"'+=`")
_HTML_NAMES = {**codepoint2name, ord("'"): "apos"}

Encoder = Callable[[str], set[str]]  # a character → every way the encoder may write it
Form = tuple[Encoder, ...]  # encoders applied in turn


def _url(char: str) -> set[str]:
    """Every way a URL encoder writes ``char``."""
    data = char.encode()
    spellings = {char, "".join(f"%{b:02X}" for b in data), "".join(f"%{b:02x}" for b in data)}
    if char == " ":
        spellings.add("+")
    return spellings


def _json(char: str) -> set[str]:
    """Every way a JSON encoder writes ``char`` inside a string."""
    code = ord(char)
    spellings = {_JSON_SHORT[char]} if char in _JSON_SHORT else set()
    if char not in '"\\' and code >= 0x20:
        spellings.add(char)
    if code < 0x20 or code > 0x7E or char in _JSON_AS_UNICODE:
        utf16 = char.encode("utf-16-be")
        units = [int.from_bytes(utf16[i : i + 2], "big") for i in range(0, len(utf16), 2)]
        spellings |= {"".join(f"\\u{unit:04{case}}" for unit in units) for case in "xX"}
    return spellings


def _html(char: str) -> set[str]:
    """Every way an HTML escaper writes ``char``."""
    code = ord(char)
    spellings = {char}
    if code in _HTML_NAMES and (char in _HTML_ESCAPED or code > 0x7F):
        spellings.add(f"&{_HTML_NAMES[code]};")
    if char in _HTML_ESCAPED or code > 0x7F:
        spellings |= {f"&#{code};", f"&#x{code:x};", f"&#x{code:X};"}
        if code < 100:
            spellings.add(f"&#{code:03};")  # PHP: &#039;
    return spellings


def _latin1(char: str) -> set[str]:
    """``char`` as is, or its UTF-8 bytes read as Latin-1: how HTTP servers hand over a
    header holding non-ASCII bytes (Python's http.server, Starlette and so FastAPI)."""
    return {char, char.encode().decode("latin-1")}


# The textual forms: each is encoders applied in turn, and each encoder may write any
# character in any of its ways (a URL encoder escapes some characters and not others).
# Forms do not mix within a secret: mixed, a run of backslashes could be split between
# them in exponentially many ways.  Adding a form is one line.
_FORMS: tuple[Form, ...] = (
    (),  # as is
    (_url,),
    (_json,),
    (_json, _json),  # JSON in a JSON string
    (_html,),
    (_json, _html),  # JSON shown in a page
    (_html, _json),  # HTML in a JSON string
    (_latin1,),  # a header as a server read it
    (_latin1, _json),
    (_latin1, _html),
)
# Past this many ways, a character's pattern in a composed form is built by composing
# patterns (see _char_pattern).
_FEW_WAYS = 16


def _encoded(text: str, form: Form) -> set[str]:
    """Every way ``text`` comes out of the encoders of ``form`` applied in turn."""
    spellings = {text}
    for encode in form:
        spellings = {
            "".join(parts)
            for spelling in spellings
            for parts in itertools.product(*(encode(char) for char in spelling))
        }
    return spellings


@lru_cache(maxsize=4096)
def _spellings(char: str, form: Form) -> frozenset[str]:
    return frozenset(_encoded(char, form))


@lru_cache(maxsize=4096)
def _char_pattern(char: str, form: Form) -> str:
    """A regex matching ``char`` written in ``form``.

    A few ways are a trie, common prefixes factored out (the engine rejects a branch on its
    first character without entering it).  Many (a 3-byte character read as Latin-1, then
    HTML-escaped, has 80) are the last encoder's pattern for each character of the earlier
    encoders' ways: a pattern that grows with the sum of the ways, not their product.
    """
    if len(form) > 1 and len(_spellings(char, form)) > _FEW_WAYS:
        *inner, outer = form
        return _any_of(
            "".join(_char_pattern(part, (outer,)) for part in spelling)
            for spelling in sorted(_spellings(char, tuple(inner)))
        )
    trie: dict[str, Any] = {}
    for spelling in _spellings(char, form):
        node = trie
        for part in spelling:
            node = node.setdefault(part, {})
        node[""] = {}
    return _render_spellings(trie)


def _any_of(patterns: Iterable[str]) -> str:
    unique = list(dict.fromkeys(patterns))
    return unique[0] if len(unique) == 1 else f"(?:{'|'.join(unique)})"


def _render_spellings(node: dict[str, Any]) -> str:
    leaves = sorted(c for c, child in node.items() if c and child.keys() == {""})
    branches = [
        re.escape(c) + _render_spellings(child)
        for c, child in sorted(node.items())
        if c and c not in leaves
    ]
    if len(leaves) > 1:
        branches.append("[" + "".join(re.escape(c) for c in leaves) + "]")
    elif leaves:
        branches.append(re.escape(leaves[0]))
    if "" in node:
        return f"(?:{'|'.join(branches)})?" if branches else ""
    return _any_of(branches)


# --- the forms of secrets --------------------------------------------------------------------


def _forms(secret: str) -> list[Form]:
    """The forms worth matching ``secret`` in: a form is left out where another one writes
    each of its characters in all the same ways and more (URL-encoded includes as is, so a
    key of letters, digits and dashes is matched in that form alone)."""
    ways = [[_spellings(char, form) for char in secret] for form in _FORMS]

    def covers(wider: int, narrower: int) -> bool:
        return all(a <= b for a, b in zip(ways[narrower], ways[wider], strict=True))

    return [
        form
        for i, form in enumerate(_FORMS)
        if not any(
            covers(j, i) and (j < i or not covers(i, j)) for j in range(len(_FORMS)) if j != i
        )
    ]


def _starts(secret: str) -> set[str]:
    """The characters a form of ``secret`` can start with."""
    return {spelling[0] for form in _forms(secret) for spelling in _spellings(secret[0], form)}


def _secrets_pattern(secrets: Iterable[str], order: list[str]) -> str:
    """A regex matching each of ``secrets`` in each of its forms.

    The (secret, form) pairs are a trie of per-character patterns, so a prefix that several
    share is tried once, and a secret before a shorter one it extends.  An empty group ends
    each pair's branch; ``order`` receives their secrets in the order of those groups, so a
    match's ``lastindex`` tells which secret it is.
    """
    trie: dict[str, Any] = {}
    for secret in secrets:
        for form in _forms(secret):
            node = trie
            for char in secret:
                node = node.setdefault(_char_pattern(char, form), {})
            node[""] = secret
    return _render_secrets(trie, order)


def _render_secrets(node: dict[str, Any], order: list[str]) -> str:
    branches = [
        pattern + _render_secrets(child, order)
        for pattern, child in sorted(node.items())
        if pattern
    ]
    if "" in node:
        order.append(node[""])
        branches.append("()")
    return _any_of(branches)


# --- base64 ------------------------------------------------------------------------------------

# A run of base64 characters long enough to hold MIN_ANYWHERE bytes (the look-ahead skips
# shorter words at C speed).
_BASE64_RUN = re.compile(r"(?=[A-Za-z0-9+/_%\\-]{11})(?:[A-Za-z0-9+/_-]|\\/|%2[BbFf]){11,}")
_BASE64_TOKEN = re.compile(r"\\/|%2[BbFf]|.")
_BASE64_UNESCAPED = {"\\/": "/", "%2B": "+", "%2b": "+", "%2F": "/", "%2f": "/"}
_TO_STANDARD = str.maketrans("-_", "+/")


class Redactor:
    """Replaces a fixed set of secret values, in all their forms, by ``[redacted]``."""

    __slots__ = ("_anywhere", "_pattern", "_secrets")

    def __init__(self, secrets: Iterable[str | None]) -> None:
        unique = {secret for secret in secrets if secret}
        self._anywhere = any(len(secret) >= MIN_ANYWHERE for secret in unique)
        # Group i + 1 of the pattern ends the branch of self._secrets[i].
        order: list[str] = []
        branches = []
        if self._anywhere:
            branches.append(_secrets_pattern((s for s in unique if len(s) >= MIN_ANYWHERE), order))
        if any(len(secret) < MIN_ANYWHERE for secret in unique):
            short = _secrets_pattern((s for s in unique if len(s) < MIN_ANYWHERE), order)
            branches.append(f"{_ALONE_BEFORE}{short}{_ALONE_AFTER}")
        self._secrets = tuple(order)
        # The look-ahead lets the engine skip, at C speed, every position no form starts at.
        starts = "".join(sorted(set().union(*map(_starts, unique))))
        self._pattern = (
            re.compile(f"(?=[{re.escape(starts)}])(?:{'|'.join(branches)})") if unique else None
        )

    def __repr__(self) -> str:
        return "Redactor(...)"  # never show what it hides

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text
        text = self._pattern.sub(PLACEHOLDER, text)
        # Base64 is decoded, not matched: its spelling of a secret depends on the bytes
        # around it, so matching it would take every form at every alignment in both
        # alphabets, and still leave the characters the secret shares with its neighbours.
        if self._anywhere:
            text = _BASE64_RUN.sub(self._base64_run, text)
        return text

    def bytes(self, content: bytes) -> bytes:
        """``content`` redacted as UTF-8 text; bytes that are not UTF-8 pass unchanged."""
        if self._pattern is None:
            return content
        return self.text(content.decode("utf-8", "surrogateescape")).encode(
            "utf-8", "surrogateescape"
        )

    def _base64_run(self, match: re.Match[str]) -> str:
        """A run of base64 characters with those holding a secret's bits replaced."""
        run = match.group()
        tokens: list[str] | str = _BASE64_TOKEN.findall(run) if "\\" in run or "%" in run else run
        alphabet = "".join(_BASE64_UNESCAPED.get(t, t) for t in tokens).translate(_TO_STANDARD)
        spans = []
        # The run may start anywhere in an encoded value: try each alignment.
        for offset in range(4):
            chunk = alphabet[offset:]
            if len(chunk) % 4 == 1:  # a last character of its own holds no whole byte
                chunk = chunk[:-1]
            decoded = binascii.a2b_base64(chunk + "=" * (-len(chunk) % 4))
            text = decoded.decode("utf-8", "surrogateescape")
            for start, end in self._long_matches(text):
                first = len(text[:start].encode("utf-8", "surrogateescape"))
                last = first + len(text[start:end].encode("utf-8", "surrogateescape"))
                # Byte i is in characters 4i/3 to (4i+4)/3: keep none with a secret's bit.
                spans.append((offset + first * 4 // 3, offset - (-last * 4 // 3)))
        if not spans:
            return run
        bounds = list(itertools.accumulate(map(len, tokens), initial=0))
        pieces, done = [], 0
        for start, end in sorted(spans):
            if start > done:
                pieces += [run[bounds[done] : bounds[start]], PLACEHOLDER]
            elif not pieces:
                pieces.append(PLACEHOLDER)
            done = max(done, min(end, len(alphabet)))
        pieces.append(run[bounds[done] :])
        return "".join(pieces)

    def _long_matches(self, text: str) -> Iterator[tuple[int, int]]:
        """Where secrets of MIN_ANYWHERE characters or more are in ``text``."""
        assert self._pattern is not None
        position = 0
        while match := self._pattern.search(text, position):
            if len(self._secrets[match.lastindex - 1]) >= MIN_ANYWHERE:  # type: ignore[operator]
                yield match.span()
                position = match.end()
            else:
                position = match.start() + 1


def secret_of_header(value: str) -> str:
    """An ``Authorization``-style header value without its scheme (``Bearer sk-…`` → ``sk-…``)."""
    return _SCHEMES.sub("", value.strip())


@lru_cache(maxsize=256)
def redactor_for(secrets: frozenset[str]) -> Redactor:
    """The :class:`Redactor` of ``secrets``, built once per set per process (a run's every
    call uses the same organization's set)."""
    return Redactor(secrets)
