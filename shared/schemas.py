"""Building blocks shared by every domain's request and response Structs.

Strings are checked where they are declared: ``text()`` refuses the characters PostgreSQL
and UTF-8 cannot hold.  Free-form JSON (``JsonObject``, or any type marked ``STORABLE``)
has no declared strings, so ``Input`` walks it after decoding: the same characters are
refused in its keys and values at any depth, and its nesting is bounded.

A field marked ``SECRET`` (a password, a credential's value) is never repeated: an error
about it, or about a value that holds it, quotes nothing of it (:func:`holds_secret`).
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Self, Union, get_args, get_origin
from zoneinfo import available_timezones

import msgspec

# Characters PostgreSQL and UTF-8 can hold: no NUL, no lone surrogates.
_SURROGATES = "\\ud800-\\udfff"
_STORABLE = f"\\x00{_SURROGATES}"
TEXT_PATTERN = f"^[^{_STORABLE}]*$"
# Text sent in an HTTP header or query value as it is: one line (a CR or LF would end the
# header and start another one of the caller's making), storable.
HEADER_TEXT_PATTERN = f"^[^{_STORABLE}\\r\\n]*$"
_UNSTORABLE = re.compile(f"[{_STORABLE}]")
MAX_JSON_DEPTH = 32


def documented_pattern(pattern: str) -> str:
    """``pattern`` as the OpenAPI document states it: without the lone surrogates.

    Spar refuses them (PostgreSQL cannot store them), but none can reach it: a JSON body is
    UTF-8, which cannot encode a surrogate, msgspec refuses a ``\\ud800`` escape, a
    percent-encoded path or query is decoded as UTF-8 too (bytes that are not become
    U+FFFD) and headers as Latin-1.  Naming them, the pattern is
    valid ECMA-262 that the regex engines of generated clients refuse ("hexadecimal
    literal is not a Unicode scalar value" in pydantic's, in Rust's ``regex``); without
    them it says the rule a request can break, no NUL, in a form every engine takes.  The
    server goes on checking the whole pattern."""
    return pattern.replace(_SURROGATES, "")


def text(min_length: int = 0, max_length: int | None = None, **extra: str) -> msgspec.Meta:
    """Constraints of an input string: its length bounds, and storable characters only."""
    return msgspec.Meta(min_length=min_length, max_length=max_length, pattern=TEXT_PATTERN, **extra)


class _Mark:
    """A mark on a field's type, ``Annotated[..., MARK]``, that code reads off the Struct."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


STORABLE = _Mark("STORABLE")
"""Marks a free-form field of an ``Input``: its value is checked by ``check_json``."""
SECRET = _Mark("SECRET")
"""Marks a field whose value is never repeated, not even in the error that refuses it."""

Name255 = Annotated[str, text(1, 255)]
Email = Annotated[
    str,
    msgspec.Meta(
        min_length=3,
        max_length=320,
        pattern=f"^[^@\\s{_STORABLE}]+@[^@\\s{_STORABLE}]+\\.[^@\\s{_STORABLE}]+$",
        description="An email address.",
    ),
]
TimezoneName = Annotated[str, text(1, 64, description="An IANA time zone, e.g. Europe/Paris.")]


@functools.cache
def iana_zones() -> frozenset[str]:
    """The names a ``TimezoneName`` may hold: the IANA zones.  Not the host's own files
    that the zoneinfo search path also lists ("localtime", which is whatever the host is
    set to, and "Factory"), nor the "posix/" and "right/" copies."""
    return frozenset(
        name
        for name in available_timezones()
        if name not in _HOST_ZONE_FILES and not name.startswith(("posix/", "right/"))
    ) | {"UTC"}


_HOST_ZONE_FILES = frozenset({"localtime", "posixrules", "Factory"})


JsonObject = Annotated[
    dict[str, Any],
    msgspec.Meta(
        description=f"Any JSON object, nested at most {MAX_JSON_DEPTH} levels deep; "
        "no NUL characters or lone surrogates in its keys or strings."
    ),
    STORABLE,
]


class UnstorableJson(ValueError):
    """A free-form value that cannot be stored; ``path`` leads from the field to the fault."""

    def __init__(
        self, message: str, *, path: tuple[str, ...], type: str, ctx: dict[str, Any], input: Any
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.type = type
        self.ctx = ctx
        self.input = input


def _nodes(value: Any, path: tuple[str, ...]) -> Iterator[tuple[Any, tuple[str, ...], int]]:
    """Every value inside ``value`` in document order, with its path and nesting depth.

    Iterative on purpose: a body nested a thousand levels must not exhaust the stack."""
    pending = [(value, path, 0)]
    while pending:
        current, at, depth = pending.pop()
        yield current, at, depth
        if isinstance(current, dict):
            children = [(item, (*at, str(key)), depth + 1) for key, item in current.items()]
        elif isinstance(current, list):
            children = [(item, (*at, str(i)), depth + 1) for i, item in enumerate(current)]
        else:
            continue
        pending.extend(reversed(children))


def within_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests at most ``limit`` objects or arrays in one another."""
    return all(
        depth < limit for node, _, depth in _nodes(value, ()) if isinstance(node, dict | list)
    )


def _unstorable_text(text: str, path: tuple[str, ...]) -> UnstorableJson:
    return UnstorableJson(
        "Text may not contain NUL characters or lone surrogates",
        path=path,
        type="string_pattern_mismatch",
        ctx={"pattern": TEXT_PATTERN},
        input=text,
    )


def check_json(value: Any, path: tuple[str, ...] = ()) -> None:
    """Refuse what PostgreSQL cannot store in ``value``: NUL or a lone surrogate in any key
    or string, and nesting deeper than ``MAX_JSON_DEPTH``.  Raises ``UnstorableJson``."""
    for node, at, depth in _nodes(value, path):
        if isinstance(node, str):
            if _UNSTORABLE.search(node):
                raise _unstorable_text(node, at)
        elif isinstance(node, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise UnstorableJson(
                    f"Nested more than {MAX_JSON_DEPTH} levels deep",
                    path=at,
                    type="too_deeply_nested",
                    ctx={"max_depth": MAX_JSON_DEPTH},
                    input=None,  # echoing it back could be as deep as what was refused
                )
            if isinstance(node, dict):
                for key in node:
                    if isinstance(key, str) and _UNSTORABLE.search(key):
                        raise _unstorable_text(key, (*at, key))


def _is_marked(annotation: Any, mark: _Mark) -> bool:
    if mark in getattr(annotation, "__metadata__", ()):
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_marked(arg, mark) for arg in get_args(annotation))
    return False


@functools.cache
def _free_form_fields(struct: type[msgspec.Struct]) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(struct) if _is_marked(f.type, STORABLE))


def _members(annotation: Any) -> Iterator[Any]:
    """The types a value of ``annotation`` may have: a union's members, unannotated."""
    if get_origin(annotation) is Annotated:
        yield from _members(get_args(annotation)[0])
    elif get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            yield from _members(arg)
    else:
        yield annotation


def _is_struct(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def _inside(annotation: Any, key: str) -> Iterator[Any]:
    """The types of what ``key`` (a field's name, an index, a key) leads to in a value of
    ``annotation``."""
    for kind in _members(annotation):
        origin, args = get_origin(kind), get_args(kind)
        if _is_struct(kind):
            yield from (f.type for f in msgspec.structs.fields(kind) if f.encode_name == key)
        elif origin in (list, tuple, set, frozenset) and args:
            yield args[0]
        elif origin is dict and len(args) == 2:
            yield args[1]


def _holds_marked(annotation: Any, mark: _Mark, seen: set[Any]) -> bool:
    if _is_marked(annotation, mark):
        return True
    for kind in _members(annotation):
        if kind in seen:
            continue
        seen.add(kind)
        if _is_struct(kind):
            inner = [f.type for f in msgspec.structs.fields(kind)]
        else:
            inner = list(get_args(kind))
        if any(_holds_marked(item, mark, seen) for item in inner):
            return True
    return False


def holds_secret(annotation: Any, path: Sequence[str]) -> bool:
    """Whether the value at ``path`` (field names, indexes, keys) in a body of type
    ``annotation`` is a ``SECRET`` field's value, is inside one or holds one: a value an
    error must not repeat."""
    if _is_marked(annotation, SECRET):
        return True
    if path:
        return any(holds_secret(inner, path[1:]) for inner in _inside(annotation, path[0]))
    return _holds_marked(annotation, SECRET, set())


class Input(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of request bodies: unknown fields are refused, so mass assignment is impossible.

    Free-form fields (annotated ``JsonObject`` or ``STORABLE``) are checked after decoding;
    msgspec reports the ``UnstorableJson`` as a ``ValidationError`` at this Struct's path,
    with the error as its ``__cause__``.  A subclass defining ``__post_init__`` calls super.
    """

    def __post_init__(self) -> None:
        for name in _free_form_fields(type(self)):
            check_json(getattr(self, name), (name,))

    def changes(self) -> dict[str, Any]:
        """The fields the client sent: those of an update body left ``UNSET`` are not."""
        return {
            name: value
            for name in self.__struct_fields__
            if (value := getattr(self, name)) is not msgspec.UNSET
        }

    def apply_to(self, row: object, **computed: Any) -> None:
        """The one way a PATCH is applied: each field the client sent (:meth:`changes`), then
        the values the service ``computed`` from them, set on ``row``.  ``updated_at`` is
        the model's (``onupdate``), set when the session flushes the change."""
        for name, value in {**self.changes(), **computed}.items():
            setattr(row, name, value)


class Output(msgspec.Struct, kw_only=True):
    """Base of response bodies."""

    @classmethod
    def from_row(cls, row: object, **computed: Any) -> Self:
        """The one way a row becomes a body: each field from the attribute of its name on
        ``row`` (an ORM object or a result row), nested bodies from loaded relationships or
        JSON values; a field the row does not hold (or holds otherwise) given in
        ``computed`` (``UNSET`` there leaves the field out: it takes its default)."""
        if not computed:
            return msgspec.convert(row, cls, from_attributes=True)
        # The fields gathered in a dict, not read through a proxy object: msgspec read a
        # proxy's every attribute through Python (its ``__getattr__``, and an exception for
        # each field left out), 16 µs for a run's row against 2.3 from a dict.
        values: dict[str, Any] = {}
        for name, key in _keys(cls):
            if name in computed:
                value = computed[name]
                if value is not msgspec.UNSET:  # left out: msgspec gives it its default
                    values[key] = value
                continue
            try:
                values[key] = getattr(row, name)
            except AttributeError:  # not held by the row: the field's default
                # (any other error, such as a relationship not loaded, is raised: never
                # taken for a field the row does not have)
                continue
        return msgspec.convert(values, cls, from_attributes=True)


@functools.cache
def _keys(body: type[msgspec.Struct]) -> tuple[tuple[str, str], ...]:
    """Each field of ``body`` with the key it is read from in a mapping (its name, or the
    name it is renamed to)."""
    return tuple((field.name, field.encode_name) for field in msgspec.structs.fields(body))
