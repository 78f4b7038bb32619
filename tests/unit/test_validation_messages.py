"""msgspec's messages become the spec's error types and contexts."""

import pytest

from shared.validation import classify


@pytest.mark.parametrize(
    ("message", "kind", "ctx", "field"),
    [
        ("Object missing required field `name`", "missing", {}, "name"),
        ("Object contains unknown field `x`", "extra_forbidden", {}, "x"),
        ("Expected `str` of length >= 1", "string_too_short", {"min_length": 1}, None),
        ("Expected `str` of length <= 255", "string_too_long", {"max_length": 255}, None),
        ("Expected `array` of length >= 1", "too_short", {"min_length": 1}, None),
        ("Expected `int` >= 1", "greater_than_equal", {"ge": 1}, None),
        ("Expected `int` <= 500", "less_than_equal", {"le": 500}, None),
        ("Expected `int`, got `str`", "int_type", {}, None),
        ("Expected `str`, got `int`", "str_type", {}, None),
        ("Expected `object`, got `array`", "object_type", {}, None),
        ("Invalid UUID", "uuid_parsing", {}, None),
        ("Invalid enum value 'nope'", "enum", {}, None),
        ("Something new", "value_error", {}, None),
    ],
)
def test_messages_map_to_types(message, kind, ctx, field):
    assert classify(message) == (kind, ctx, field)
