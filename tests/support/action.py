"""Spar's GitHub Action (``action.yml`` at the repository's root) as the tests read it:
its inputs, its steps, and the environment its script step gets from given inputs, so a
test runs the script exactly as the runner would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ACTION_FILE = ROOT / "action.yml"
SCRIPT = ROOT / ".github" / "actions" / "spar" / "run.sh"
INPUT = re.compile(r"\$\{\{\s*inputs\.([A-Za-z0-9_-]+)\s*\}\}")


def action() -> dict[str, Any]:
    return yaml.safe_load(ACTION_FILE.read_text())


def script_step() -> dict[str, Any]:
    """The step that runs :data:`SCRIPT`."""
    (step,) = [s for s in action()["runs"]["steps"] if SCRIPT.name in s.get("run", "")]
    return step


def script_env(**given: str) -> dict[str, str]:
    """The script step's environment for the inputs ``given`` (``fail_under`` for the
    input ``fail-under``), the others at their defaults, as the runner fills it in."""
    inputs = action()["inputs"]
    values = {name: str(spec.get("default", "")) for name, spec in inputs.items()}
    for name, value in given.items():
        name = name.replace("_", "-")
        assert name in inputs, f"action.yml has no input {name}"
        values[name] = value
    return {
        variable: INPUT.sub(lambda m: values[m.group(1)], str(template))
        for variable, template in script_step()["env"].items()
    }
