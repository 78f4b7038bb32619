"""``Output.from_row``: the one way a row (an ORM object, or a row of the direct pool with
an attribute per column) becomes a response body."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import UUID, uuid4

import msgspec
import pytest

from shared.schemas import Output


class Inner(Output):
    label: str


class Body(Output):
    id: UUID
    name: str
    inner: Inner
    note: str | None = None
    extra: list[int] | msgspec.UnsetType = msgspec.UNSET


class Renamed(Output, rename="camel"):
    organization_id: UUID
    display_name: str = "none"


def test_each_field_is_read_off_the_rows_attribute_of_its_name_nested_ones_too() -> None:
    row = SimpleNamespace(id=uuid4(), name="a", inner=SimpleNamespace(label="x"), other=1)
    body = Body.from_row(row)
    assert (body.id, body.name, body.inner, body.note) == (row.id, "a", Inner(label="x"), None)
    assert body.extra is msgspec.UNSET


def test_a_computed_value_replaces_the_rows_and_unset_leaves_the_field_to_its_default() -> None:
    row = SimpleNamespace(id=uuid4(), name="a", inner={"label": "x"}, note="kept", extra=[9])
    body = Body.from_row(row, name="computed", extra=msgspec.UNSET)
    assert body.name == "computed"
    assert body.inner == Inner(label="x")  # JSON read from the row, as from a JSON column
    assert body.note == "kept"
    assert body.extra is msgspec.UNSET, "UNSET left the row's value out"
    # A field the row does not hold at all, given nowhere: its default.
    bare = SimpleNamespace(id=uuid4(), name="a", inner={"label": "x"})
    assert Body.from_row(bare, extra=[1]).note is None


def test_a_renamed_body_is_read_by_its_fields_names_with_or_without_computed_values() -> None:
    org = uuid4()
    row = SimpleNamespace(organization_id=org, display_name="Acme")
    assert Renamed.from_row(row) == Renamed(organization_id=org, display_name="Acme")
    assert Renamed.from_row(row, display_name="Other").display_name == "Other"
    assert Renamed.from_row(SimpleNamespace(organization_id=org), display_name=msgspec.UNSET) == (
        Renamed(organization_id=org)
    )


def test_a_required_field_neither_held_nor_computed_is_a_validation_error_naming_it() -> None:
    with pytest.raises(msgspec.ValidationError, match="name"):
        Body.from_row(SimpleNamespace(id=uuid4(), inner={"label": "x"}), note="n")
