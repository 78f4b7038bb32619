"""Encryption of secrets at rest (credential values, webhook secrets).

Keys come from ``SPAR_SECRET_KEY``: a comma-separated list, newest first.  Each is
stretched with HKDF-SHA256 into a Fernet key; the first encrypts, every one decrypts,
so rotating is: prepend a new key, re-encrypt at leisure (:meth:`SecretBox.rotate`),
drop the old one.
"""

from __future__ import annotations

import base64
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


class SecretKeyMissing(RuntimeError):
    """``SPAR_SECRET_KEY`` is not set, so secrets cannot be stored or read."""


class SecretUnreadable(RuntimeError):
    """A stored secret does not decrypt with any configured key."""


def _fernet_key(secret: str) -> bytes:
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"spar-secrets-v1", info=b"fernet"
    ).derive(secret.encode())
    return base64.urlsafe_b64encode(derived)


class SecretBox:
    def __init__(self, secret_key_setting: str | None) -> None:
        secrets = [part.strip() for part in (secret_key_setting or "").split(",") if part.strip()]
        if not secrets:
            raise SecretKeyMissing("SPAR_SECRET_KEY is not set")
        self._fernet = MultiFernet([Fernet(_fernet_key(secret)) for secret in secrets])

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, ciphertext: str) -> str:
        try:
            return self._fernet.decrypt(ciphertext.encode()).decode()
        except InvalidToken:
            raise SecretUnreadable("secret does not decrypt with any configured key") from None

    def rotate(self, ciphertext: str) -> str:
        """Re-encrypt under the newest key."""
        return self._fernet.rotate(ciphertext.encode()).decode()


@lru_cache(maxsize=8)
def secret_box(secret_key_setting: str | None) -> SecretBox:
    return SecretBox(secret_key_setting)
