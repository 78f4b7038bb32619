"""Secrets at rest: opaque tokens (stored as SHA-256 digests), argon2id password hashes, and
the Standard Webhooks secrets webhooks are signed with."""

from __future__ import annotations

import base64
import hashlib
import secrets
from functools import cache

from argon2 import PasswordHasher, profiles
from argon2.exceptions import InvalidHashError, VerificationError

from shared.settings import Settings

USER_TOKEN_PREFIX = "ust_"
PLATFORM_TOKEN_PREFIX = "pat_"

# argon2id parameters by the name of one of argon2-cffi's profiles (``argon2.profiles``),
# ``SPAR_PASSWORD_HASH_PROFILE``: RFC 9106's low-memory choice, the library's own default,
# in production; the test suite hashes with ``CHEAPEST``.  A hash carries its parameters,
# so a hash made under any profile verifies under any other.
PASSWORD_HASH_PROFILES = ("RFC_9106_LOW_MEMORY", "RFC_9106_HIGH_MEMORY", "CHEAPEST")
DEFAULT_PASSWORD_HASH_PROFILE = Settings().password_hash_profile


def new_token(prefix: str) -> str:
    """A fresh opaque token: the prefix and 256 random bits."""
    return prefix + secrets.token_urlsafe(32)


WEBHOOK_SECRET_PREFIX = "whsec_"
WEBHOOK_SECRET_BYTES = 32


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64 (a trigger's,
    which callers sign with; a webhook endpoint's, which Spar signs with)."""
    return (
        WEBHOOK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(WEBHOOK_SECRET_BYTES)).decode()
    )


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_preview(token: str) -> str:
    """Prefix, first 4 and last 4 characters of the random part: enough to recognise it."""
    prefix, _, body = token.partition("_")
    return f"{prefix}_{body[:4]}…{body[-4:]}"


@cache
def _hasher(profile: str) -> tuple[PasswordHasher, str]:
    """The profile's hasher, and a hash of its own to verify against when the email is
    unknown, so a miss costs as much as a hit."""
    if profile not in PASSWORD_HASH_PROFILES:
        raise ValueError(f"unknown password hash profile {profile!r}")
    hasher = PasswordHasher.from_parameters(getattr(profiles, profile))
    return hasher, hasher.hash(secrets.token_urlsafe(16))


def hash_password(password: str, *, profile: str = DEFAULT_PASSWORD_HASH_PROFILE) -> str:
    return _hasher(profile)[0].hash(password)


def verify_password(
    password_hash: str | None, password: str, *, profile: str = DEFAULT_PASSWORD_HASH_PROFILE
) -> bool:
    """Constant-work check; ``None`` (no password set, e.g. an invited user) never matches."""
    hasher, dummy = _hasher(profile)
    try:
        return hasher.verify(password_hash or dummy, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False
