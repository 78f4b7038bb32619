"""The house rules the code relies on, checked on the source: which process imports which,
who opens a transaction, who sends after commit, how services take their arguments."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "client", "workers", "scheduler", "shared")


def _modules(package: str) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        yield name.removesuffix(".__init__"), ast.parse(path.read_text(), str(path))


def _imported(tree: ast.Module) -> Iterator[str]:
    """Every module an ``import`` anywhere in ``tree`` names (lazy imports included)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def _calls(tree: ast.Module, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called == name:
                return True
    return False


def test_the_api_imports_neither_the_workers_nor_the_scheduler() -> None:
    offending = {
        (module, imported)
        for module, tree in _modules("api")
        for imported in _imported(tree)
        if imported.split(".")[0] in {"workers", "scheduler"}
    }
    assert offending == set()


def test_shared_and_the_client_import_no_process() -> None:
    offending = {
        (module, imported)
        for package, processes in (
            ("shared", {"api", "workers", "scheduler", "client"}),
            ("client", {"api", "workers", "scheduler"}),
        )
        for module, tree in _modules(package)
        for imported in _imported(tree)
        if imported.split(".")[0] in processes
    }
    assert offending == set()


def test_only_the_database_object_makes_sessions() -> None:
    makers = {"async_sessionmaker", "sessionmaker", "AsyncSession"}
    offending = {
        module
        for package in PACKAGES
        for module, tree in _modules(package)
        if module != "shared.db.engine" and any(_calls(tree, maker) for maker in makers)
    }
    assert offending == set()


def test_only_services_send_after_commit() -> None:
    """Controllers, actors and the scheduler call a service; the service that writes the row
    says what to send once it commits."""
    offending = {
        module
        for package in ("api", "client", "workers", "scheduler")
        for module, tree in _modules(package)
        if _calls(tree, "send_after_commit")
    }
    assert offending == set()


# The domains' packages; shared/db, shared/work, shared/queue and shared/paging are the
# plumbing services are made of, with signatures of their own.
DOMAINS = (
    "identity",
    "outbound",
    "scenarios",
    "batches",
    "knowledge",
    "calibration",
    "triggers",
    "notifications",
)


# What a service reads and writes on: its caller's session, or (the frequent reads) its
# caller's connection of the direct pool.
SERVICE_FIRST = ("session", "connection")


def _service_functions() -> Iterator[tuple[str, object]]:
    for module_name, tree in _modules("shared"):
        parts = module_name.split(".")
        if len(parts) < 3 or parts[1] not in DOMAINS:
            continue
        takes_session = any(
            isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef)
            and node.args.args
            and node.args.args[0].arg in SERVICE_FIRST
            and not node.name.startswith("_")
            for node in tree.body
        )
        if not takes_session:
            continue
        module = import_module(module_name)
        for name, function in vars(module).items():
            if (
                inspect.isfunction(function)
                and function.__module__ == module_name
                and not name.startswith("_")
            ):
                parameters = list(inspect.signature(function).parameters.values())
                if parameters and parameters[0].name in SERVICE_FIRST:
                    yield f"{module_name}.{name}", function


SERVICES = list(_service_functions())


def test_there_are_services_to_check() -> None:
    assert len(SERVICES) > 50


@pytest.mark.parametrize(("name", "function"), SERVICES, ids=[name for name, _ in SERVICES])
def test_a_service_takes_its_session_then_keywords_only(name: str, function: object) -> None:
    parameters = list(inspect.signature(function).parameters.values())  # type: ignore[arg-type]
    positional = [p.name for p in parameters[1:] if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert positional == [], f"{name} takes {positional} positionally"


def test_no_service_takes_a_database() -> None:
    """A service works inside its caller's transaction; a job that opens transactions is
    not a service and lives apart from ``services`` modules."""
    offending = {
        f"{module}.{node.name}"
        for module, tree in _modules("shared")
        if module.endswith(".services")
        for node in tree.body
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef)
        and any(arg.arg in {"database", "factory"} for arg in node.args.args + node.args.kwonlyargs)
    }
    assert offending == set()
