"""Keeping an organization's secrets out of what Spar stores, returns and logs.

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
2. in the forms an echo produces: as is, URL-encoded (by any encoder: every character may
   be escaped or not, hex in either case), JSON-escaped (ASCII-only or not, once or
   twice), and base64 (standard and URL-safe alphabets, at each of the three alignments a
   secret can have inside a longer encoded value, such as ``Basic base64(user:secret)``;
   only the characters that depend on the secret alone are matched, so a character
   mixing the secret's first or last bits with its neighbour's may remain).

Short values: a value of ``MIN_ANYWHERE`` (8) characters or more is replaced wherever it
occurs.  A shorter one is too weak to be a real secret, and replacing it inside every word
would corrupt replies (a 3-character value is in most English sentences), so it is
replaced only where it stands as a whole token (no letter or digit right before or after
it), and not in base64 (a short base64 fragment matches unrelated data).  Keep credential
values at 8 characters or more.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

PLACEHOLDER = "[redacted]"
MIN_ANYWHERE = 8
_SCHEMES = re.compile(r"^(?:bearer|basic|token|apikey|api-key)\s+", re.IGNORECASE)
_ALONE_BEFORE = r"(?<![A-Za-z0-9])"
_ALONE_AFTER = r"(?![A-Za-z0-9])"


def _json_escaped(value: str) -> set[str]:
    forms = set()
    for ascii_only in (True, False):
        once = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
        forms |= {once, json.dumps(once, ensure_ascii=ascii_only)[1:-1]}
    return forms


def _base64_cores(value: str) -> set[str]:
    """The part of ``base64(prefix + value + suffix)`` fixed by ``value`` alone, for each
    length of prefix modulo 3, in both alphabets."""
    raw = value.encode()
    cores = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        start = -(-8 * offset // 6)  # the first character made only of the value's bits
        end = 8 * (offset + len(raw)) // 6  # past the last such character
        core = encoded[start:end]
        if len(core) >= MIN_ANYWHERE:
            cores |= {core, core.translate(str.maketrans("+/", "-_"))}
    return cores


def _url_pattern(secret: str) -> str:
    """``secret`` URL-encoded by any encoder: each character as is or as its %XX escapes
    (either case of hex), a space also as ``+``.  Encoders differ in what they leave alone
    (``quote`` keeps ``/``, ``quote_plus`` does not; yarl decodes ``%2F`` and ``%3F`` again
    in a query string), so no one encoded form would do."""
    pieces = []
    for char in secret:
        escaped = "".join(
            f"%[{hex_[0]}{hex_[0].lower()}][{hex_[1]}{hex_[1].lower()}]"
            for hex_ in (f"{byte:02X}" for byte in char.encode())
        )
        plain = re.escape(char) + ("|\\+" if char == " " else "")
        pieces.append(f"(?:{plain}|{escaped})")
    return "".join(pieces)


def _patterns(secret: str) -> list[tuple[int, str, str]]:
    """(length, regex, the characters a match can start with) for each form of ``secret``."""
    found = {re.escape(form): (len(form), form[0]) for form in _json_escaped(secret) - {secret}}
    # The raw value is one of its URL forms.
    found[_url_pattern(secret)] = (len(secret), secret[0] + "%" + ("+" if secret[0] == " " else ""))
    if len(secret) < MIN_ANYWHERE:
        return [(n, f"{_ALONE_BEFORE}{p}{_ALONE_AFTER}", c) for p, (n, c) in found.items()]
    for core in _base64_cores(secret):
        found[re.escape(core)] = (len(core), core[0])
    return [(n, p, c) for p, (n, c) in found.items()]


class Redactor:
    """Replaces a fixed set of secret values, in all their forms, by ``[redacted]``."""

    __slots__ = ("_pattern",)

    def __init__(self, secrets: Iterable[str | None]) -> None:
        forms: dict[str, int] = {}
        starts: set[str] = set()
        for secret in secrets:
            if secret:
                for length, pattern, first in _patterns(secret):
                    forms[pattern] = max(length, forms.get(pattern, 0))
                    starts.update(first)
        # Longest first: where two forms start at the same place, the whole one goes.
        ordered = sorted(forms, key=lambda p: (-forms[p], p))
        # The look-ahead lets the engine skip, at C speed, every position no form starts at.
        start = "".join(re.escape(c) for c in sorted(starts))
        alternatives = "|".join(ordered)
        self._pattern = re.compile(f"(?=[{start}])(?:{alternatives})") if ordered else None

    def __repr__(self) -> str:
        return "Redactor(...)"  # never show what it hides

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(PLACEHOLDER, text)

    def bytes(self, content: bytes) -> bytes:
        """``content`` redacted as UTF-8 text; bytes that are not UTF-8 pass unchanged."""
        if self._pattern is None:
            return content
        return self.text(content.decode("utf-8", "surrogateescape")).encode(
            "utf-8", "surrogateescape"
        )

    def value(self, value: Any) -> Any:
        """A decoded JSON value with every string in it (keys too) redacted."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                (self.text(k) if isinstance(k, str) else k): self.value(v) for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


def secret_of_header(value: str) -> str:
    """An ``Authorization``-style header value without its scheme (``Bearer sk-…`` → ``sk-…``)."""
    return _SCHEMES.sub("", value.strip())


@lru_cache(maxsize=256)
def redactor_for(secrets: frozenset[str]) -> Redactor:
    """The :class:`Redactor` of ``secrets``, built once per set per process (a run's every
    call uses the same organization's set)."""
    return Redactor(secrets)
