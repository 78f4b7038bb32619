"""Spar's GitHub Action (``action.yml``) and its script agree: every input the action
declares reaches a step, every variable the script reads comes from the action, every
output the action declares the script writes, and the token travels only in the
environment.  tests/e2e/test_cli.py runs the script against a local Spar."""

from __future__ import annotations

import re

from tests.support.action import INPUT, SCRIPT, action, script_env, script_step


def test_every_input_is_used_and_every_variable_the_script_reads_is_an_input() -> None:
    declared = action()["inputs"]
    steps = action()["runs"]["steps"]
    used = {name for step in steps for name in INPUT.findall(str(step))}
    assert used == set(declared)
    # python-version goes to actions/setup-python; every other input to the script.
    (setup,) = [s for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
    assert INPUT.findall(str(setup)) == ["python-version"]
    env = script_step()["env"]
    assert {INPUT.fullmatch(value).group(1) for value in env.values()} == set(declared) - {
        "python-version"
    }
    read = set(re.findall(r"\$\{?(SPAR_[A-Z_]+)", SCRIPT.read_text()))
    # The script reads each SPAR_ACTION_ input; spar itself reads where Spar is and who calls.
    assert read | {"SPAR_URL", "SPAR_TOKEN", "SPAR_ORG"} == set(env)
    # A required input has no default; the others have one (empty: not given).
    assert {n for n, spec in declared.items() if spec.get("required")} == {
        "url",
        "token",
        "agent",
        "tags",
    }
    assert all("default" in spec for spec in declared.values() if not spec.get("required"))


def test_every_output_is_written_by_the_script_and_the_token_is_no_argument() -> None:
    outputs = action()["outputs"]
    script = SCRIPT.read_text()
    for name, spec in outputs.items():
        assert spec["value"] == f"${{{{ steps.{script_step()['id']}.outputs.{name} }}}}"
        assert f"{name}=" in script, name
    steps = action()["runs"]["steps"]
    assert all("inputs.token" not in step.get("run", "") for step in steps)
    assert script_env(token="pat_x", url="u", agent="a", tags="t")["SPAR_TOKEN"] == "pat_x"
    # The script only checks that the token is there: spar reads it from the environment.
    uses = [line for line in script.splitlines() if "SPAR_TOKEN" in line and line[0] != "#"]
    assert uses == [': "${SPAR_TOKEN:?the token input is empty}"']
    assert "set -x" not in script
