import hashlib

from shared import security


def test_tokens_are_prefixed_random_and_previewed_without_the_secret_middle():
    first = security.new_token(security.PLATFORM_TOKEN_PREFIX)
    second = security.new_token(security.PLATFORM_TOKEN_PREFIX)
    assert first.startswith("pat_") and second.startswith("pat_")
    assert first != second
    assert len(first) > 40
    body = first[4:]
    preview = security.token_preview(first)
    assert preview == f"pat_{body[:4]}…{body[-4:]}"
    assert body[4:-4] not in preview


def test_digest_is_sha256_hex():
    assert security.token_digest("ust_abc") == hashlib.sha256(b"ust_abc").hexdigest()


def test_passwords_hash_with_argon2id_and_verify():
    hashed = security.hash_password("s3cret-password")
    assert hashed.startswith("$argon2id$")
    assert "s3cret-password" not in hashed
    assert security.verify_password(hashed, "s3cret-password")
    assert not security.verify_password(hashed, "wrong-password")


def test_missing_or_corrupt_hash_never_matches():
    assert not security.verify_password(None, "anything")
    assert not security.verify_password("not-a-hash", "anything")


def test_production_hashes_with_the_real_parameters_and_either_profile_verifies_both():
    from argon2 import extract_parameters, profiles

    from shared.settings import settings_from_env

    production = settings_from_env({}).password_hash_profile
    assert production == security.DEFAULT_PASSWORD_HASH_PROFILE == "RFC_9106_LOW_MEMORY"
    real = security.hash_password("s3cret-password", profile=production)
    assert extract_parameters(real) == profiles.RFC_9106_LOW_MEMORY
    assert (extract_parameters(real).time_cost, extract_parameters(real).memory_cost) == (3, 65536)
    assert extract_parameters(security.hash_password("s3cret-password")) == (
        profiles.RFC_9106_LOW_MEMORY
    )
    cheap = security.hash_password("s3cret-password", profile="CHEAPEST")
    assert extract_parameters(cheap) == profiles.CHEAPEST
    for hashed in (real, cheap):
        for profile in (production, "CHEAPEST"):
            assert security.verify_password(hashed, "s3cret-password", profile=profile)
            assert not security.verify_password(hashed, "wrong-password", profile=profile)
    assert (
        settings_from_env({"SPAR_PASSWORD_HASH_PROFILE": "cheapest"}).password_hash_profile
        == "CHEAPEST"
    )
