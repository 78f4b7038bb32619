import pytest

from shared.settings import SettingsError, settings_from_env


def test_defaults_are_the_embedded_setup():
    settings = settings_from_env({})
    assert settings.database_url is None  # spar dev starts its embedded PostgreSQL
    assert settings.redis_url is None
    assert settings.allow_registration is True
    assert settings.egress_allow_private is False
    assert settings.calibration_wait_s == 30.0


def test_every_variable_is_read():
    settings = settings_from_env(
        {
            "SPAR_DATABASE_URL": "postgresql+psycopg://u@h:5432/d",
            "SPAR_REDIS_URL": "redis://h:6379/1",
            "SPAR_SECRET_KEY": "k1,k2",
            "SPAR_PUBLIC_BASE_URL": "https://spar.example.com/",
            "SPAR_EGRESS_ALLOW_PRIVATE": "true",
            "SPAR_ALLOW_REGISTRATION": "no",
            "SPAR_USER_TOKEN_TTL_S": "3600",
            "SPAR_CALIBRATION_WAIT_S": "2.5",
            "SPAR_DB_POOL_SIZE": "4",
            "SPAR_WORK_POLL_MS": "20",
            "SPAR_LOG_LEVEL": "debug",
        }
    )
    assert settings.database_url == "postgresql+psycopg://u@h:5432/d"
    assert settings.require_database_url() == "postgresql+psycopg://u@h:5432/d"
    assert settings.redis_url == "redis://h:6379/1"
    assert settings.secret_key == "k1,k2"
    assert settings.public_base_url == "https://spar.example.com"
    assert settings.egress_allow_private is True
    assert settings.allow_registration is False
    assert settings.user_token_ttl_s == 3600
    assert settings.calibration_wait_s == 2.5
    assert settings.db_pool_size == 4
    assert settings.work_poll_ms == 20
    assert settings.log_level == "DEBUG"


def test_empty_values_mean_unset():
    assert settings_from_env({"SPAR_REDIS_URL": ""}).redis_url is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SPAR_ALLOW_REGISTRATION", "maybe"),
        ("SPAR_USER_TOKEN_TTL_S", "0"),
        ("SPAR_USER_TOKEN_TTL_S", "ten"),
        ("SPAR_CALIBRATION_WAIT_S", "-1"),
    ],
)
def test_bad_values_name_the_variable(variable, value):
    with pytest.raises(SettingsError, match=variable):
        settings_from_env({variable: value})


def test_a_database_url_is_required_outside_spar_dev():
    with pytest.raises(SettingsError, match="SPAR_DATABASE_URL must be set"):
        settings_from_env({}).require_database_url()
