"""Secrets at rest (shared.crypto): Fernet under HKDF-stretched keys, newest key first."""

from __future__ import annotations

import pytest

from shared.crypto import SecretBox, SecretKeyMissing, SecretUnreadable, secret_box

PLAINTEXT = "sk-live-1234567890-very-secret"


def test_round_trip() -> None:
    box = SecretBox("a-secret-key")
    ciphertext = box.encrypt(PLAINTEXT)
    assert isinstance(ciphertext, str)
    assert box.decrypt(ciphertext) == PLAINTEXT
    # Another box built from the same setting reads it too (nothing lives in the instance).
    assert SecretBox("a-secret-key").decrypt(ciphertext) == PLAINTEXT


def test_round_trip_of_unicode_and_empty_values() -> None:
    box = SecretBox("k")
    for value in ("", "pässwörd ✓ 密码", "x" * 10_000):
        assert box.decrypt(box.encrypt(value)) == value


def test_ciphertext_is_fresh_each_time_and_hides_the_plaintext() -> None:
    box = SecretBox("a-secret-key")
    first, second = box.encrypt(PLAINTEXT), box.encrypt(PLAINTEXT)
    assert first != second
    for ciphertext in (first, second):
        assert PLAINTEXT not in ciphertext
        assert "very-secret" not in ciphertext
        assert box.decrypt(ciphertext) == PLAINTEXT


def test_the_secret_key_itself_is_not_used_raw() -> None:
    """Two different settings give boxes that cannot read each other's values."""
    ciphertext = SecretBox("key-one").encrypt(PLAINTEXT)
    with pytest.raises(SecretUnreadable):
        SecretBox("key-two").decrypt(ciphertext)


def test_rotation_old_values_read_with_new_first_and_rotate_moves_them_to_the_new_key() -> None:
    old = SecretBox("old")
    ciphertext = old.encrypt(PLAINTEXT)

    both = SecretBox("new,old")
    assert both.decrypt(ciphertext) == PLAINTEXT
    # Before rotation the new key alone cannot read it.
    with pytest.raises(SecretUnreadable):
        SecretBox("new").decrypt(ciphertext)

    rotated = both.rotate(ciphertext)
    assert rotated != ciphertext
    assert PLAINTEXT not in rotated
    assert SecretBox("new").decrypt(rotated) == PLAINTEXT
    # ...and the old key alone no longer can: it really was re-encrypted under "new".
    with pytest.raises(SecretUnreadable):
        old.decrypt(rotated)


def test_new_values_are_encrypted_with_the_first_key() -> None:
    ciphertext = SecretBox("new, old").encrypt(PLAINTEXT)
    assert SecretBox("new").decrypt(ciphertext) == PLAINTEXT
    with pytest.raises(SecretUnreadable):
        SecretBox("old").decrypt(ciphertext)


def test_wrong_key_raises_secret_unreadable() -> None:
    ciphertext = SecretBox("right").encrypt(PLAINTEXT)
    with pytest.raises(SecretUnreadable):
        SecretBox("wrong").decrypt(ciphertext)


def test_garbage_ciphertext_raises_secret_unreadable() -> None:
    with pytest.raises(SecretUnreadable):
        SecretBox("k").decrypt("not-a-fernet-token")


@pytest.mark.parametrize("setting", [None, "", "   ", ",", " , ,"])
def test_missing_key_raises_secret_key_missing(setting: str | None) -> None:
    with pytest.raises(SecretKeyMissing):
        SecretBox(setting)
    with pytest.raises(SecretKeyMissing):
        secret_box(setting)


def test_secret_box_helper_is_a_working_box() -> None:
    box = secret_box("helper-key")
    assert box is secret_box("helper-key")
    assert SecretBox("helper-key").decrypt(box.encrypt(PLAINTEXT)) == PLAINTEXT
