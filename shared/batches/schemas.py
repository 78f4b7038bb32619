"""Request and response bodies of batch runs (spec 15, DESIGN §3 and §5.3)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated
from uuid import UUID

import msgspec

from shared.calibration.schemas import JudgeTrust
from shared.scenarios.schemas import MAX_JUDGE_REPETITIONS, RunStatus, Tag
from shared.schemas import Input, Output


class BatchStatus(enum.StrEnum):
    """``queued`` until its first runs are handed out, ``running``, then ``completed`` when
    every run is terminal, or ``error`` when it could not proceed or was cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"


MAX_BATCH_SCENARIOS = 10_000


def _doc(description: str) -> msgspec.Meta:
    return msgspec.Meta(description=description)


MAX_REPETITIONS = 20
Repetitions = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=MAX_REPETITIONS,
        description="How many times each scenario runs, each run its own conversation "
        "(session_id); max_concurrency bounds all of the batch's runs.",
    ),
]

JudgeRepetitions = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=MAX_JUDGE_REPETITIONS,
        description="How many times the judge decides each llm_evaluated criterion on the "
        "same conversation: the verdict is the majority of the votes (a tie is FAIL).",
    ),
]


class BatchRunCreate(Input):
    agent_id: UUID
    scenario_ids: Annotated[list[UUID], msgspec.Meta(max_length=MAX_BATCH_SCENARIOS)] = []
    tags: Annotated[list[Tag], msgspec.Meta(max_length=50)] = []
    max_concurrency: Annotated[int, msgspec.Meta(ge=1, le=100)] = 10
    repetitions: Repetitions = 1
    judge_repetitions: JudgeRepetitions = 1
    baseline_batch_id: (
        Annotated[
            UUID,
            msgspec.Meta(
                description="A batch of the same organization and agent to compare this one "
                "with: once both are over, the comparison is stored on this batch "
                "(`comparison`)."
            ),
        ]
        | None
    ) = None


class BatchReplayCreate(Input):
    """A replay's options: how many times the judge decides each criterion (else as the
    replayed batch did)."""

    judge_repetitions: JudgeRepetitions | None = None


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


class ScenarioTrials(Output):
    """One scenario's runs in a batch: ``trials`` are its runs that passed or failed (a run
    that ended in error is no trial: it says nothing about the agent), ``passes`` those
    that passed, ``errors`` those that ended in error; ``flaky`` when it passed some trials
    and failed others."""

    scenario_id: UUID
    scenario_name: str
    trials: int
    passes: int
    errors: int
    flaky: bool


class PassRateDifference(Output):
    """A mean difference of pass rates, B - A, over the scenarios both batches ran (the
    pairs), with its 95 % paired bootstrap interval: the scenarios resampled with
    replacement ``resamples`` times from the random generator's ``seed``."""

    difference: float
    low: float
    high: float
    pairs: int
    resamples: int
    seed: int


class ScenarioChange(Output):
    """How one scenario moved from batch A to batch B: its trials and passes on each side,
    and the one-sided Fisher exact test that B's pass proportion is lower than A's."""

    scenario_id: UUID
    scenario_name: str
    change: Change
    a_trials: int
    a_passes: int
    b_trials: int
    b_passes: int
    # Null where a side has no trial or the scenario was edited between A and B.
    p_value: float | None
    significant: bool  # p_value < 0.05: a regression more than chance


class StoredComparison(Output):
    """The comparison of a completed batch (B) with its baseline (A), stored once both are
    over: the counts, the pass-rate difference and every scenario that did not stay
    ``unchanged``."""

    baseline_batch_id: UUID
    computed_at: datetime
    regressions: int
    fixes: int
    edited: int
    significant_regressions: int
    pass_rate_difference: PassRateDifference | None
    scenarios: list[ScenarioChange]


class BatchRunRead(Output):
    id: UUID
    organization_id: UUID
    agent_id: UUID
    agent_name: str
    status: BatchStatus
    # Runs, not scenarios, with repetitions: total is scenarios x repetitions, and each
    # counter counts runs (`scenarios` counts per scenario).
    total_scenarios: Annotated[int, _doc("The batch's runs: scenarios x repetitions.")]
    completed_scenarios: Annotated[int, _doc("Runs ended: passed + failed + error.")]
    passed_scenarios: Annotated[int, _doc("Runs that passed.")]
    failed_scenarios: Annotated[int, _doc("Runs that failed.")]
    error_scenarios: Annotated[int, _doc("Runs that ended in error (or were cancelled).")]
    max_concurrency: int
    started_at: datetime | None
    completed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    error_message: str | None = None
    repetitions: Annotated[int, _doc("Runs of each scenario.")] = 1
    baseline_batch_id: Annotated[
        UUID | None, _doc("The batch this one is compared with, if any.")
    ] = None
    judge_repetitions: Annotated[
        int, _doc("Votes of the judge on each llm_evaluated criterion (the majority kept).")
    ] = 1
    replay_of: Annotated[
        UUID | None,
        _doc("A replay: the batch whose stored transcripts this one re-judges; else null."),
    ] = None
    runs: list[BatchRunItemSummary] | msgspec.UnsetType = msgspec.UNSET
    # The detail only: null while the batch runs; once it is over, each LLM-judged
    # criterion's raw pass rate and, where calibrated, the corrected one.
    judge_trust: JudgeTrust | None | msgspec.UnsetType = msgspec.UNSET
    # The detail and the event stream's progress only: while the batch runs, the
    # destination (its agent's or its judge's host) refusing its calls now (a 429, 503 or
    # 529 in the last 30 s, or a Retry-After in force), else null.
    rate_limited: RateLimitedRead | None | msgspec.UnsetType = msgspec.UNSET
    scenarios: (
        Annotated[
            list[ScenarioTrials],
            _doc(
                "The detail only: each scenario's trials (its runs that passed or failed; "
                "a run in error is none), passes and runs in error so far."
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    pass_hat_k: (
        Annotated[
            list[float | None],
            _doc(
                "The detail only: pass^j for j = 1..repetitions (index j - 1), the mean over "
                "the scenarios with at least j trials of C(passes, j) / C(trials, j); null "
                "where no scenario has j trials."
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    pass_at_k: (
        Annotated[
            float | None,
            _doc(
                "The detail only: the share of scenarios with a trial that passed at least "
                "once; null before any trial."
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    flaky_scenarios: (
        Annotated[int, _doc("The detail only: scenarios with 0 < passes < trials.")]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    judge_flip_rate: (
        Annotated[
            float | None,
            _doc(
                "The detail only: of the criterion results the judge decided, the share "
                "whose votes were not unanimous (the judge's noise); null with "
                "judge_repetitions 1 or before any."
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    replays: (
        Annotated[
            list[UUID], _doc("The detail only: the batches replaying this one, oldest first.")
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    comparison: (
        Annotated[
            StoredComparison | None,
            _doc(
                "The detail only: with a baseline, the comparison with it, stored once this "
                "batch has completed and the baseline is over; null until then."
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET


class BatchRunList(Output):
    batch_runs: list[BatchRunRead]
    total: int


class ScenarioComparison(ScenarioChange):
    # Its run in batch A, if A ran it (with repetitions, its first).
    a: BatchRunItemSummary | None
    b: BatchRunItemSummary | None


class BatchComparison(Output):
    a: BatchRunRead
    b: BatchRunRead
    scenarios: list[ScenarioComparison]  # regressions first
    regressions: int
    fixes: int
    edited: int  # scenarios edited between A and B (counted neither as regressions nor fixes)
    significant_regressions: int  # regressions whose p-value is below 0.05
    # Null when no scenario has trials on both sides (and was not edited).
    pass_rate_difference: PassRateDifference | None
