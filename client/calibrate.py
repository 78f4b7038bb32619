"""``spar calibrate FILE.jsonl``: measure the agent's judge against human labels.

One labelled example per line (``id``, ``user_message``, ``agent_response``,
``criterion_question`` or ``criteria_id``, ``human_verdict``, optional ``human_critique``
and ``tags``), checked locally with the API's own body type: an error names its line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.table import Table

from client.api import Api, UsageProblem, output_file
from client.profiles import org_option, profile_option, target
from client.terminal import make_console
from shared.calibration.schemas import LabeledExample
from shared.validation import locate

POLL_S = 1.0


def load_examples(path: Path) -> list[dict[str, Any]]:
    examples, problems = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
            msgspec.convert(document, LabeledExample, strict=True)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{number}: not JSON: {exc.msg}")
            continue
        except msgspec.ValidationError as exc:
            loc, message = locate(exc)
            where = ".".join(["body", "examples", str(len(examples)), *loc])
            problems.append(f"{path}:{number}: {message} (loc: {where})")
            continue
        examples.append(document)
    if problems:
        raise UsageProblem("\n".join(problems))
    if not examples:
        raise UsageProblem(f"{path}: no examples")
    return examples


def _pct(value: float) -> str:
    return f"{value:.1%}"


def _interval(body: dict[str, Any], name: str) -> str:
    interval = body.get(f"{name}_interval") or {}
    return f"{_pct(interval.get('low', 0))} to {_pct(interval.get('high', 1))}"


@click.command(
    "calibrate", short_help="Measure an agent's judge against labelled examples (JSONL)."
)
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE.jsonl"
)
@click.option(
    "--agent",
    required=True,
    metavar="NAME|ID",
    help="The agent whose judge is measured, by name or id (the REST API takes its id).",
)
@output_file(
    "--json", "json_path", "Write the calibration (metrics and every example's result) as JSON."
)
@profile_option
@org_option
def calibrate(
    file: Path, agent: str, json_path: Path | None, profile: str | None, org: str | None
) -> None:
    """Send the labelled examples of FILE.jsonl (one JSON object per line) to be judged by
    the agent's judge, wait for the verdicts and print how far the judge agrees with the
    humans: agreement, Cohen's kappa, TPR and TNR with 95 % intervals, the disagreements.
    Exit 0 once measured, 2 if the calibration failed, 3 on usage or connection problems."""
    examples = load_examples(file)
    console = make_console()
    api = Api(target(profile, org))
    try:
        chosen = api.resolve_agent(agent)
        body = api.call(
            "POST",
            api.path("scenarios/calibrate"),
            params={"agent_id": chosen["id"]},
            json={"examples": examples},
            timeout=120.0,
        )
        with console.status(f"judging {len(examples)} examples…"):
            while body["status"] not in ("completed", "failed"):
                time.sleep(POLL_S)
                body = api.call("GET", api.path(f"scenarios/calibrations/{body['id']}"))
    finally:
        api.close()
    if json_path is not None:
        json_path.write_text(json.dumps(body, indent=2))
    if body["status"] == "failed":
        console.print(f"[red]calibration {body['id']} failed:[/] {body.get('error')}")
        raise SystemExit(2)
    table = Table(title=f"calibration {body['id']} of {chosen['name']}'s judge")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("95 % interval")
    table.add_row("examples (undecided)", f"{body['total']} ({body['undecided']})", "")
    table.add_row("agreement", _pct(body["agreement_rate"]), _interval(body, "agreement_rate"))
    table.add_row("Cohen's kappa", f"{body['kappa']:.3f}", "")
    table.add_row("TPR (human PASS judged PASS)", _pct(body["tpr"]), _interval(body, "tpr"))
    table.add_row("TNR (human FAIL judged FAIL)", _pct(body["tnr"]), _interval(body, "tnr"))
    console.print(table)
    disagreements = [r for r in body.get("results", []) if not r["agrees"]]
    for result in disagreements[:20]:
        console.print(
            f"  {result['example_id']}: human {result['human_verdict']}, judge "
            f"{result['judge_verdict'] or 'undecided'} — {result['judge_critique']}",
            markup=False,
        )
    if len(disagreements) > 20:
        console.print(f"  … and {len(disagreements) - 20} more (see --json)")
