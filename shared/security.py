"""Secrets at rest: opaque tokens (stored as SHA-256 digests) and argon2id password hashes."""

from __future__ import annotations

import hashlib
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

USER_TOKEN_PREFIX = "ust_"
PLATFORM_TOKEN_PREFIX = "pat_"

_hasher = PasswordHasher()  # argon2id with the library's current recommended parameters
# Verified against when the email is unknown, so a miss costs as much as a hit.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


def new_token(prefix: str) -> str:
    """A fresh opaque token: the prefix and 256 random bits."""
    return prefix + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_preview(token: str) -> str:
    """Prefix, first 4 and last 4 characters of the random part: enough to recognise it."""
    prefix, _, body = token.partition("_")
    return f"{prefix}_{body[:4]}…{body[-4:]}"


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """Constant-work check; ``None`` (no password set, e.g. an invited user) never matches."""
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False
