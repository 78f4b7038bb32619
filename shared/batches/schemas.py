"""Request and response bodies of batch runs (spec 15, DESIGN §3 and §5.3)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated
from uuid import UUID

import msgspec

from shared.calibration.schemas import JudgeTrust
from shared.scenarios.schemas import RunStatus, Tag
from shared.schemas import Input, Output


class BatchStatus(enum.StrEnum):
    """``queued`` until its first runs are handed out, ``running``, then ``completed`` when
    every run is terminal, or ``error`` when it could not proceed or was cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"


MAX_BATCH_SCENARIOS = 10_000


class BatchRunCreate(Input):
    agent_id: UUID
    scenario_ids: Annotated[list[UUID], msgspec.Meta(max_length=MAX_BATCH_SCENARIOS)] = []
    tags: Annotated[list[Tag], msgspec.Meta(max_length=50)] = []
    max_concurrency: Annotated[int, msgspec.Meta(ge=1, le=100)] = 10


class BatchRunItemSummary(Output):
    id: UUID
    scenario_id: UUID
    scenario_name: str
    status: RunStatus
    passed_turns: int
    total_turns: int
    completed_at: datetime | None = None
    started_at: datetime | None = None


class RateLimitedRead(Output):
    """A destination whose rate limit holds a running batch's calls back."""

    destination: str  # the host
    kind: str  # whose calls: agent, judge or simulator
    since: datetime  # its first refusal of this spell


class BatchRunRead(Output):
    id: UUID
    organization_id: UUID
    agent_id: UUID
    agent_name: str
    status: BatchStatus
    total_scenarios: int
    completed_scenarios: int
    passed_scenarios: int
    failed_scenarios: int
    error_scenarios: int
    max_concurrency: int
    started_at: datetime | None
    completed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    error_message: str | None = None
    runs: list[BatchRunItemSummary] | msgspec.UnsetType = msgspec.UNSET
    # The detail only: null while the batch runs; once it is over, each LLM-judged
    # criterion's raw pass rate and, where calibrated, the corrected one.
    judge_trust: JudgeTrust | None | msgspec.UnsetType = msgspec.UNSET
    # The detail and the event stream's progress only: while the batch runs, the
    # destination (its agent's or its judge's host) refusing its calls now (a 429, 503 or
    # 529 in the last 30 s, or a Retry-After in force), else null.
    rate_limited: RateLimitedRead | None | msgspec.UnsetType = msgspec.UNSET


class BatchRunList(Output):
    batch_runs: list[BatchRunRead]
    total: int


class Change(enum.StrEnum):
    """How a scenario's outcome moved from one batch (A) to another (B)."""

    REGRESSED = "regressed"  # passed in A, failed in B
    FIXED = "fixed"  # failed in A, passed in B
    CHANGED = "changed"  # any other difference (an error, a run not over yet)
    # The scenario was edited between A and B (its turns, criteria or context): its two
    # runs played different things, so whatever their outcomes, not the agent's doing.
    EDITED = "edited"
    UNCHANGED = "unchanged"
    ONLY_IN_A = "only_in_a"
    ONLY_IN_B = "only_in_b"


class ScenarioComparison(Output):
    scenario_id: UUID
    scenario_name: str
    change: Change
    a: BatchRunItemSummary | None  # its run in batch A, if A ran it
    b: BatchRunItemSummary | None


class BatchComparison(Output):
    a: BatchRunRead
    b: BatchRunRead
    scenarios: list[ScenarioComparison]  # regressions first
    regressions: int
    fixes: int
    edited: int  # scenarios edited between A and B (counted neither as regressions nor fixes)
