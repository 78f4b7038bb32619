"""Request and response bodies of judge calibration (spec 16, DESIGN §5.6)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

import msgspec

from shared.scenarios.schemas import LongText, Tag
from shared.schemas import Input, Output, text

Verdict = Literal["PASS", "FAIL"]


class CalibrationStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class LabeledExample(Input):
    """One labelled example.  Its criterion is a free ``criterion_question``, or a
    scenario criterion named by ``criteria_id``, a turn's or a conversation criterion (its
    question and few-shot examples are used, a conversation criterion is judged as one, and
    the calibration is tied to that criterion's version)."""

    id: Annotated[str, text(1, 255)]
    user_message: LongText
    agent_response: LongText
    human_verdict: Verdict
    criterion_question: Annotated[str, text(1, 10_000)] | None = None
    criteria_id: UUID | None = None
    human_critique: LongText = ""
    tags: Annotated[list[Tag], msgspec.Meta(max_length=50)] = []


class StoredExample(msgspec.Struct, frozen=True):
    """An example as the calibration keeps it: its criterion resolved."""

    id: str
    user_message: str
    agent_response: str
    human_verdict: str
    criterion_question: str
    criteria_id: UUID | None = None
    few_shot_examples: list[dict[str, str]] = []
    tags: list[str] = []
    # Its criterion is a conversation criterion: judged as one (of the whole exchange).
    conversation: bool = False


class CalibrateBody(Input):
    # At least 1; at most SPAR_CALIBRATION_MAX_EXAMPLES (checked by the service).
    examples: Annotated[list[LabeledExample], msgspec.Meta(min_length=1)]


class CalibrationResultItem(Output):
    example_id: str
    criterion: str
    human_verdict: Verdict
    # None when the judge could not decide (counted apart as ``undecided``).
    judge_verdict: Verdict | None
    agrees: bool
    judge_critique: str


class Interval(Output):
    low: float
    high: float


class Agreement(Output):
    """The spec's aggregate metrics, over the examples the judge decided."""

    total: int
    agreements: int
    agreement_rate: float
    true_positives: int
    true_negatives: int
    false_positives: int
    false_negatives: int
    tpr: float
    tnr: float
    kappa: float
    undecided: int
    agreement_rate_interval: Interval
    tpr_interval: Interval
    tnr_interval: Interval


class CalibrationMetrics(Agreement):
    results: list[CalibrationResultItem]
    by_tag: dict[str, Agreement]


class CriterionCalibration(Output):
    """A scenario criterion the calibration measured, and whether it still describes it:
    ``stale`` once the criterion's question or few-shot examples, or the agent's judge,
    changed since (``reason`` says which), or the criterion is gone."""

    criteria_id: UUID
    version: str
    stale: bool
    reason: str | None = None


class CalibrationRead(Output):
    """A calibration: its metrics (spec 16's fields at the top level) once ``completed``."""

    id: UUID
    status: CalibrationStatus
    agent_id: UUID | None
    example_count: int
    created_at: datetime
    completed_at: datetime | None
    error: str | None = None
    criteria: list[CriterionCalibration] = []
    total: int | msgspec.UnsetType = msgspec.UNSET
    agreements: int | msgspec.UnsetType = msgspec.UNSET
    agreement_rate: float | msgspec.UnsetType = msgspec.UNSET
    true_positives: int | msgspec.UnsetType = msgspec.UNSET
    true_negatives: int | msgspec.UnsetType = msgspec.UNSET
    false_positives: int | msgspec.UnsetType = msgspec.UNSET
    false_negatives: int | msgspec.UnsetType = msgspec.UNSET
    tpr: float | msgspec.UnsetType = msgspec.UNSET
    tnr: float | msgspec.UnsetType = msgspec.UNSET
    kappa: float | msgspec.UnsetType = msgspec.UNSET
    undecided: int | msgspec.UnsetType = msgspec.UNSET
    agreement_rate_interval: Interval | msgspec.UnsetType = msgspec.UNSET
    tpr_interval: Interval | msgspec.UnsetType = msgspec.UNSET
    tnr_interval: Interval | msgspec.UnsetType = msgspec.UNSET
    results: list[CalibrationResultItem] | msgspec.UnsetType = msgspec.UNSET
    by_tag: dict[str, Agreement] | msgspec.UnsetType = msgspec.UNSET


class CalibrationPending(Output, forbid_unknown_fields=True):
    """The 202 answer: still judging; poll ``GET …/scenarios/calibrations/{id}``.  Nothing
    else is in it (documented ``additionalProperties: false``), so no finished calibration
    reads as one."""

    id: UUID
    status: Literal["queued", "running"]


class CalibrationList(Output):
    calibrations: list[CalibrationRead]
    total: int


# --- judge trust: a batch's pass rates with the judge's measured error taken out ---------------


class UncalibratedCriterion(Output):
    """An LLM-judged criterion of a batch: one question with its few-shot examples, however
    many scenarios ask it (``criteria_ids``), and its raw pass rate over every verdict."""

    question: str
    criteria_ids: list[UUID]
    scenarios: int
    judged: int
    passed: int
    raw_pass_rate: float
    # A conversation criterion: asked of each run's whole conversation.
    conversation: bool = False


class TrustedCriterion(UncalibratedCriterion, kw_only=True):
    """A criterion a calibration measured the judge on: the corrected pass rate with its
    95 % interval (the batch's sampling error and the calibration's both carried).
    ``corrected_pass_rate`` is ``None`` where the judge is no better than chance (TPR + TNR
    ≤ 1), and ``message`` says so.  ``stale``: the criterion or the judge changed since
    the calibration (``stale_reason`` says which); the numbers are the stale ones."""

    calibration_id: UUID
    calibration_examples: int
    tpr: float
    tnr: float
    corrected_pass_rate: float | None
    interval: Interval | None
    stale: bool
    stale_reason: str | None = None
    message: str | None = None


class JudgeTrust(Output):
    """``computing`` until the ``calibration`` queue has worked it out for a batch that is
    over, then ``ready`` with each LLM-judged criterion, calibrated or not."""

    status: Literal["computing", "ready"]
    computed_at: datetime | None = None
    criteria: list[TrustedCriterion] = []
    uncalibrated: list[UncalibratedCriterion] = []
