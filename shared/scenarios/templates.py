"""User message templates (DESIGN §5.2): the one sandboxed Jinja environment that renders
them in runs (:mod:`shared.scenarios.runner`) and checks them when a scenario is saved
(:mod:`shared.scenarios.services`).

A template's variables are the top-level keys of the scenario's ``customer_context``.  The
check at save finds, without rendering anything, what would certainly fail every run: a
syntax error, the reserved name ``self``, a variable that is not a key of the context, or
a constant path into the context that leads nowhere (``booking.id`` with no ``id`` in
``booking``).  What only rendering can tell (an unsafe call, a value too large) still
ends the run as ``error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

MAX_RENDERED_CHARS = 100_000
RESERVED = "self"  # Jinja binds it to the template itself


class _Sandbox(SandboxedEnvironment):
    """Jinja's sandbox, also refusing the arithmetic that builds huge values."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            raise SecurityError("the power operator is not allowed in templates")
        if isinstance(left, int) and not isinstance(left, bool) and isinstance(right, str | list):
            left, right = right, left
        if (
            isinstance(left, str | list)
            and isinstance(right, int)
            and len(left) * right > MAX_RENDERED_CHARS
        ):
            raise SecurityError("template value too large")
        return super().call_binop(context, operator, left, right)


environment = _Sandbox(undefined=StrictUndefined, autoescape=False)


def uses_reserved_name(parsed: nodes.Template) -> bool:
    """Whether the template names ``self``, which can never be a context variable."""
    return any(node.name == RESERVED for node in parsed.find_all(nodes.Name))


def _path(node: nodes.Node) -> tuple[str, list[Any]] | None:
    """``(variable, keys)`` when ``node`` is a variable followed by constant attributes or
    subscripts only (``booking.id``, ``items[0]['sku']``), else ``None``."""
    keys: list[Any] = []
    while isinstance(node, nodes.Getattr | nodes.Getitem):
        if isinstance(node, nodes.Getattr):
            keys.append(node.attr)
        elif isinstance(node.arg, nodes.Const):
            keys.append(node.arg.value)
        else:
            return None
        node = node.node
    if not isinstance(node, nodes.Name) or not keys:
        return None
    return node.name, keys[::-1]


def _missing_step(value: Any, keys: list[Any]) -> int | None:
    """How many of ``keys`` lead somewhere from ``value`` when the next one certainly does
    not (as the sandbox looks it up: item or attribute); ``None`` when they all do, or when
    the value met is not plain data the check can follow."""
    for step, key in enumerate(keys):
        if isinstance(value, dict):
            if key in value:
                value = value[key]
                continue
            if isinstance(key, str) and hasattr(value, key):  # a dict method: items, get…
                return None
            return step
        if isinstance(value, list) and isinstance(key, int) and not isinstance(key, bool):
            if -len(value) <= key < len(value):
                value = value[key]
                continue
            return step
        return None
    return None


def _dotted(name: str, keys: list[Any]) -> str:
    return name + "".join(f".{k}" if isinstance(k, str) else f"[{k!r}]" for k in keys)


def problem(template: str, customer_context: Mapping[str, Any]) -> str | None:
    """Why ``template`` cannot render with ``customer_context``, as far as can be told
    without rendering it; ``None`` when nothing is certainly wrong."""
    try:
        parsed = environment.parse(template)
    except TemplateSyntaxError as exc:
        return f"Invalid template: {exc.message} (line {exc.lineno})"
    if uses_reserved_name(parsed):
        return f"'{RESERVED}' is reserved in templates and cannot be a variable"
    undeclared = meta.find_undeclared_variables(parsed)
    missing = sorted(undeclared - customer_context.keys())
    if missing:
        names = ", ".join(repr(name) for name in missing)
        return f"Template variable {names} is not a key of customer_context"
    # A name the template also assigns ({% set %}, a loop) may be that local: not checked.
    local = {node.name for node in parsed.find_all(nodes.Name) if node.ctx in ("store", "param")}
    for node in parsed.find_all((nodes.Getattr, nodes.Getitem)):
        found = _path(node)
        if found is None or found[0] in local or found[0] not in undeclared:
            continue
        name, keys = found
        step = _missing_step(customer_context[name], keys)
        if step is not None:
            return (
                f"Template refers to {_dotted(name, keys[: step + 1])}, "
                f"which customer_context does not have"
            )
    return None
