"""Which values of a body an error may repeat: none of a field marked ``SECRET``."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from shared.identity.schemas import LoginBody, RegisterBody
from shared.outbound.schemas import CredentialPut
from shared.schemas import SECRET, Input, holds_secret


class Key(Input):
    name: str
    value: Annotated[str, msgspec.Meta(min_length=1), SECRET] | msgspec.UnsetType = msgspec.UNSET


class Keyring(Input):
    label: str
    keys: list[Key] = []
    by_name: dict[str, Key] = {}
    spare: Key | None = None


@pytest.mark.parametrize(
    ("path", "secret"),
    [
        ([], True),  # the whole body holds secrets
        (["label"], False),
        (["keys"], True),
        (["keys", "3"], True),
        (["keys", "3", "value"], True),
        (["keys", "3", "value", "0"], True),  # inside a secret (an array sent for it)
        (["keys", "3", "name"], False),
        (["by_name", "prod", "value"], True),
        (["by_name", "prod", "name"], False),
        (["spare", "value"], True),
        (["spare", "name"], False),
        (["unknown"], False),  # a field the body does not have (an extra_forbidden)
    ],
)
def test_a_path_is_secret_when_it_is_inside_or_holds_a_secret_field(
    path: list[str], secret: bool
) -> None:
    assert holds_secret(Keyring, path) is secret


def test_the_api_marks_passwords_and_credential_values() -> None:
    assert holds_secret(RegisterBody, ["password"]) and holds_secret(LoginBody, ["password"])
    assert holds_secret(CredentialPut, ["value"])
    assert not holds_secret(RegisterBody, ["email"])
    assert not holds_secret(CredentialPut, ["description"])
    assert not holds_secret(None, [])  # a handler that takes no body
