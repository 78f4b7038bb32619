"""What the UI's pages show that no API body carries as such: a run's transcript under the
name of the scenario it played (from the run's snapshot), a batch's badge, the order its
runs are listed in, its flaky scenarios and its pass^k curve."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec
from psycopg import AsyncConnection

from shared.batches.schemas import BatchRunItemSummary, BatchRunRead, BatchStatus
from shared.identity.access import OrgAccess
from shared.scenarios import services as scenarios
from shared.scenarios.records import Snapshot
from shared.scenarios.schemas import RunStatus, ScenarioRunRead


class Transcript(msgspec.Struct, frozen=True):
    run: ScenarioRunRead
    scenario_name: str


async def transcript(
    connection: AsyncConnection[Any], *, access: OrgAccess, run_id: UUID
) -> Transcript:
    """The run of the organization with its turns and verdicts (404 for another's run)."""
    run = await scenarios.get_run(connection, access=access, run_id=run_id)
    snapshot = msgspec.convert(run.snapshot, Snapshot)
    return Transcript(run=scenarios.run_read(run, with_results=True), scenario_name=snapshot.name)


class Badge(msgspec.Struct, frozen=True):
    """A batch's status as its pages show it: what happened, and its colour (``tone``, a
    run status's: ``passed`` is green, ``failed`` and ``error`` red, ``running`` amber)."""

    text: str
    tone: str


def badge(batch: BatchRunRead) -> Badge:
    """Green only for a batch whose every run passed; a batch that completed with failed or
    errored runs says how many, in red."""
    if batch.status in (BatchStatus.QUEUED, BatchStatus.RUNNING):
        return Badge(batch.status.value, "running")
    bad = []
    if batch.failed_scenarios:
        bad.append(f"{batch.failed_scenarios} failed")
    if batch.error_scenarios:
        errors = batch.error_scenarios
        bad.append(f"{errors} error" if errors == 1 else f"{errors} errors")
    if batch.status == BatchStatus.ERROR:
        return Badge(f"error: {', '.join(bad)}" if bad else "error", "error")
    if not bad:
        return Badge("all passed" if batch.total_scenarios else "completed", "passed")
    return Badge(f"completed: {', '.join(bad)}", "error" if batch.error_scenarios else "failed")


# Failed and errored runs first, then the others in the batch's order.
_FIRST = {RunStatus.ERROR: 0, RunStatus.FAILED: 1}


def runs_in_order(batch: BatchRunRead) -> list[BatchRunItemSummary]:
    """The batch's runs as its page lists them: those that errored, then those that failed,
    then the rest, each in the batch's order."""
    runs = batch.runs if isinstance(batch.runs, list) else []
    return sorted(runs, key=lambda run: _FIRST.get(run.status, 2))


def flaky(batch: BatchRunRead) -> set[UUID]:
    """The scenarios of the batch that passed some trials and failed others."""
    scenarios = batch.scenarios if isinstance(batch.scenarios, list) else []
    return {scenario.scenario_id for scenario in scenarios if scenario.flaky}


class Point(msgspec.Struct, frozen=True):
    j: int
    value: float
    x: float
    y: float


class Curve(msgspec.Struct, frozen=True):
    """pass^j against j, drawn in an SVG ``width`` x ``height``: the plot's corners, the
    points (j, pass^j) where some scenario had j trials, and the polyline through them."""

    width: int
    height: int
    left: float
    right: float
    top: float
    bottom: float
    points: list[Point]
    polyline: str


def pass_hat_curve(batch: BatchRunRead, *, width: int = 360, height: int = 180) -> Curve:
    """The batch's pass^1..pass^k as a curve: j along, the rate up (0 to 100 %)."""
    left, right, top, bottom = 44.0, width - 12.0, 12.0, height - 28.0
    rates = batch.pass_hat_k if isinstance(batch.pass_hat_k, list) else []
    step = (right - left) / max(len(rates) - 1, 1)
    points = [
        Point(
            j=j,
            value=rate,
            x=round(left + (j - 1) * step, 1),
            y=round(bottom - rate * (bottom - top), 1),
        )
        for j, rate in enumerate(rates, 1)
        if rate is not None
    ]
    return Curve(
        width=width,
        height=height,
        left=left,
        right=right,
        top=top,
        bottom=bottom,
        points=points,
        polyline=" ".join(f"{p.x},{p.y}" for p in points),
    )
