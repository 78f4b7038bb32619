"""``spar scenarios push DIR``: scenarios kept as YAML files, one per file, synced to Spar.

A scenario's ``name`` is its key: a file whose name Spar does not know is created, one
whose content differs is updated (shown as a diff), one equal is left alone, and with
``--prune`` a scenario no file names is deleted.  Every file is checked locally first,
with the API's own body types and the scenario service's own rules (templates that render,
regular expressions that compile), and an error names its file, line and the ``loc`` the
API's 422 would give; nothing is sent unless every file is valid.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import msgspec
import yaml
from rich.console import Console
from rich.text import Text

from client.api import Api, UsageProblem
from client.profiles import org_option, profile_option, target
from client.terminal import make_console, say
from shared.errors import InvalidInput
from shared.scenarios.rules import check_turns
from shared.scenarios.schemas import ScenarioCreate
from shared.validation import locate

SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class ScenarioFile:
    path: Path
    body: dict[str, Any]  # the API's create body, normalized (see :func:`normalized`)


def _line_of(node: yaml.Node | None, loc: list[str]) -> int:
    """The 1-based line of the node at ``loc`` in a composed YAML document (the deepest
    node that exists along it)."""
    line = node.start_mark.line + 1 if node is not None else 1
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = [v for k, v in node.value if getattr(k, "value", None) == key]
            node = found[0] if found else None
        elif isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            node = node.value[int(key)]
        else:
            node = None
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _problem(path: Path, line: int, loc: list[str], message: str) -> str:
    where = ".".join(["body", *loc])
    return f"{path}:{line}: {message} (loc: {where})"


def normalized(body: ScenarioCreate | dict[str, Any]) -> dict[str, Any]:
    """A scenario in the one shape both sides are compared in: the create body's fields,
    criteria without their ``order_index`` (their position is their order) and with
    ``expected_arguments`` only where set."""
    data = msgspec.to_builtins(body) if isinstance(body, ScenarioCreate) else body
    return {
        "name": data["name"],
        "description": data.get("description"),
        "tags": list(data.get("tags") or []),
        "customer_context": data.get("customer_context") or {},
        "turns": [
            {
                "user_message": t["user_message"],
                "required": bool(t.get("required", False)),
                "criteria": [
                    {
                        "question": c["question"],
                        "criteria_type": c.get("criteria_type", "llm_evaluated"),
                        "few_shot_examples": [
                            {
                                "response": e["response"],
                                "verdict": e["verdict"],
                                "critique": e.get("critique", ""),
                            }
                            for e in c.get("few_shot_examples") or []
                        ],
                        **_expected_arguments(c),
                    }
                    for c in t.get("criteria") or []
                ],
            }
            for t in data["turns"]
        ],
    }


def _expected_arguments(criterion: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_called`` criterion's ``expected_arguments``, when it has some: left out
    otherwise, so the criteria of every other type read (and diff) as they always did."""
    expected = criterion.get("expected_arguments")
    return {} if expected is None else {"expected_arguments": expected}


def load(path: Path) -> ScenarioFile:
    """One file, parsed and checked as the API would; a :class:`UsageProblem` naming the
    file and line otherwise."""
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise UsageProblem(f"{path}:{line}: not valid YAML: {problem}") from None
    if not isinstance(document, dict):
        raise UsageProblem(f"{path}:1: a scenario file holds one mapping (name, turns, ...)")
    try:
        body = msgspec.convert(document, ScenarioCreate, strict=True)
        check_turns(body.turns, body.customer_context)  # the service's own rules
    except msgspec.ValidationError as exc:
        loc, message = locate(exc)
        raise UsageProblem(_problem(path, _line_of(node, loc), loc, message)) from None
    except InvalidInput as exc:
        loc = list(exc.loc[1:])  # after "body"
        raise UsageProblem(_problem(path, _line_of(node, loc), loc, exc.detail)) from None
    return ScenarioFile(path=path, body=normalized(body))


def load_dir(directory: Path) -> dict[str, ScenarioFile]:
    """Every scenario file of ``directory`` (recursively), by name; every problem of
    every file reported together."""
    files = sorted(p for p in directory.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise UsageProblem(f"no scenario files (*.yaml, *.yml) in {directory}")
    loaded: dict[str, ScenarioFile] = {}
    problems = []
    for path in files:
        try:
            scenario = load(path)
        except UsageProblem as exc:
            problems.append(exc.message)
            continue
        name = scenario.body["name"]
        if name in loaded:
            problems.append(f"{path}:1: name {name!r} is also the name in {loaded[name].path}")
            continue
        loaded[name] = scenario
    if problems:
        raise UsageProblem("\n".join(problems))
    return loaded


def _dump(body: dict[str, Any]) -> list[str]:
    return yaml.safe_dump(body, sort_keys=False, allow_unicode=True).splitlines()


def diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return list(difflib.unified_diff(_dump(old), _dump(new), "spar", "file", lineterm="", n=2))


@dataclass
class Plan:
    create: list[ScenarioFile]
    update: list[tuple[str, ScenarioFile, list[str]]]  # (id, file, diff)
    unchanged: list[str]
    delete: list[tuple[str, str]]  # (id, name)


def plan(api: Api, wanted: dict[str, ScenarioFile], *, prune: bool) -> Plan:
    existing: dict[str, str] = {}
    for summary in api.pages("scenarios", "scenarios"):
        if summary["name"] in existing and summary["name"] in wanted:
            raise UsageProblem(
                f"two scenarios in Spar are named {summary['name']!r}: rename one in Spar "
                "before pushing (a name is the key)"
            )
        existing.setdefault(summary["name"], summary["id"])
    result = Plan(create=[], update=[], unchanged=[], delete=[])
    for name, scenario in wanted.items():
        if name not in existing:
            result.create.append(scenario)
            continue
        current = normalized(api.call("GET", api.path(f"scenarios/{existing[name]}")))
        if current == scenario.body:
            result.unchanged.append(name)
        else:
            result.update.append((existing[name], scenario, diff(current, scenario.body)))
    if prune:
        result.delete = [(i, n) for n, i in sorted(existing.items()) if n not in wanted]
    return result


@click.group("scenarios")
def scenarios() -> None:
    """Scenarios kept as YAML files."""


@scenarios.command("push")
@click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR"
)
@click.option("--prune", is_flag=True, help="Delete the scenarios no file in DIR names.")
@click.option("--dry-run", is_flag=True, help="Show what would change, change nothing.")
@profile_option
@org_option
def push(directory: Path, prune: bool, dry_run: bool, profile: str | None, org: str | None) -> None:
    """Create, update (shown as a diff) or leave alone each scenario of DIR's YAML files
    (one scenario per file, its name the key); with --prune, delete the others.  Every
    file is validated first; an error names its file and line."""
    wanted = load_dir(directory)
    api = Api(target(profile, org))
    try:
        apply(api, wanted, prune=prune, dry_run=dry_run, console=make_console())
    finally:
        api.close()


def apply(
    api: Api, wanted: dict[str, ScenarioFile], *, prune: bool, dry_run: bool, console: Console
) -> Plan:
    """Make Spar's scenarios those of ``wanted``, printing each change."""
    todo = plan(api, wanted, prune=prune)
    for scenario in todo.create:
        say(console, Text(f"+ create {scenario.body['name']}  ({scenario.path})", "green"))
        if not dry_run:
            api.call("POST", api.path("scenarios"), json=scenario.body)
    for scenario_id, scenario, changes in todo.update:
        say(console, Text(f"~ update {scenario.body['name']}  ({scenario.path})", "yellow"))
        for line in changes[2:]:
            style = {"+": "green", "-": "red", "@": "cyan"}.get(line[:1], "")
            console.print(Text(f"    {line}", style=style))
        if not dry_run:
            api.call("PUT", api.path(f"scenarios/{scenario_id}"), json=scenario.body)
    for scenario_id, name in todo.delete:
        console.print(Text(f"- delete {name}", "red"))
        if not dry_run:
            api.call("DELETE", api.path(f"scenarios/{scenario_id}"))
    for name in todo.unchanged:
        console.print(Text(f"= unchanged {name}", "dim"))
    say(
        console,
        f"{len(todo.create)} created, {len(todo.update)} updated, {len(todo.delete)} deleted, "
        f"{len(todo.unchanged)} unchanged" + (" (dry run: nothing was sent)" if dry_run else ""),
    )
    return todo
