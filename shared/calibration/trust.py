"""Judge trust (DESIGN §5.6): a batch's pass rates once the judge's measured error is
taken out.

A criterion, here, is a question with its few-shot examples, asked of a turn's reply or
of a whole conversation (a conversation criterion, DESIGN §5.9): the same question asked
in many scenarios of a batch is one criterion with many verdicts (``criteria_ids`` lists
them), which is what gives its pass rate a sample.  For each LLM-judged criterion of a
batch that is over, the raw pass rate (PASS verdicts among those judged) is corrected with
the TPR and TNR that the latest completed calibration of the batch's agent measured on
that very question and few-shot examples (:func:`stats.correct`: Rogan-Gladen, with a
seeded parametric bootstrap over the batch's and the calibration's binomials).

A calibration is **stale** for the batch when it measured another judge (provider or
model) than the agent's now, or measured the criterion before an edit (its examples named
one of the batch's criteria by id, or the same place in the same scenario, with another
question or few-shot examples); the stale numbers are shown, flagged.  Criteria no
calibration measured are listed as uncalibrated, with their raw rate only.

The bootstrap is work for the ``calibration`` queue, never the request: reading the detail
of a batch that is over asks for it once (:func:`request`, guarded in SQL, so two readers
send one message), the actor stores it on the batch (:func:`compute`), and the detail
shows ``computing`` until then.  A request lost with its message is made again after
:data:`REQUEST_STALL`.  A batch with no LLM-judged criterion has nothing to work out: its
report is ``ready`` (and empty) at once, with no message.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

import dramatiq
import msgspec
from sqlalchemy import and_, func, literal, or_, select, update
from sqlalchemy.dialects.postgresql import JSONPATH, distinct_on
from sqlalchemy.ext.asyncio import AsyncSession

from shared.batches.schemas import BatchStatus
from shared.calibration import schemas
from shared.calibration.schemas import CalibrationStatus
from shared.calibration.services import place_of
from shared.calibration.stats import Confusion, correct
from shared.db.base import utcnow
from shared.db.engine import Database
from shared.db.models import Agent, BatchRun, Calibration, CriterionResult, ScenarioRun, TurnResult
from shared.outbound.configuration import judge_provider_of
from shared.queue import JUDGE_TRUST, send_after_commit
from shared.scenarios.records import Snapshot

REQUEST_STALL = timedelta(minutes=5)
DRAWS = 2000
LATEST_CALIBRATIONS = 100  # the most recent completed calibrations of the agent consulted
OVER = (BatchStatus.COMPLETED, BatchStatus.ERROR)
NO_BETTER_THAN_CHANCE = (
    "the judge is no better than chance on this criterion (TPR + TNR <= 1): its verdicts "
    "say nothing about the true pass rate"
)


def read(batch: Any) -> schemas.JudgeTrust | None:
    """The batch's judge trust as stored (``None`` while the batch is not over)."""
    if batch.status not in OVER:
        return None
    if batch.judge_trust is None or batch.judge_trust.get("status") != "ready":
        return schemas.JudgeTrust(status="computing")
    return msgspec.convert(batch.judge_trust, schemas.JudgeTrust)


def due(batch: Any) -> bool:
    """Whether ``batch`` (a :class:`BatchRun` or a row of its table) is due to ask for its
    judge trust (:func:`request`): over, and its trust neither ready nor asked for within
    :data:`REQUEST_STALL`."""
    if batch.status not in OVER:
        return False
    known = batch.judge_trust or {}
    return not (
        known.get("status") == "ready"
        or known.get("requested_at", "") >= (utcnow() - REQUEST_STALL).isoformat()
    )


async def request(session: AsyncSession, *, batch: BatchRun, broker: dramatiq.Broker) -> bool:
    """Mark the judge trust of a batch that is over ``computing``, once, and send it to the
    actor once the caller commits: True when this call did.  A batch with no LLM-judged
    criterion is marked ``ready`` (with no criterion) instead, and nothing is sent."""
    if not due(batch):
        return False  # as read: nothing to ask (the guarded UPDATE below decides races)
    now = utcnow()
    judged = await _asks_the_judge(session, batch.id)
    if judged:
        report = {"status": "computing", "requested_at": now.isoformat()}
    else:  # nothing to work out: ready at once, with no criterion
        report = msgspec.to_builtins(schemas.JudgeTrust(status="ready", computed_at=now))
    trust = BatchRun.judge_trust
    asked = await session.scalar(
        update(BatchRun)
        .where(
            BatchRun.id == batch.id,
            or_(
                trust.is_(None),
                and_(
                    trust["status"].astext == "computing",
                    trust["requested_at"].astext < (now - REQUEST_STALL).isoformat(),
                ),
            ),
        )
        .values(judge_trust=report)
        .returning(BatchRun.id)
    )
    if asked is None or not judged:
        return False
    send_after_commit(session, broker, JUDGE_TRUST, str(batch.id))
    return True


# A snapshot (shared.scenarios.records.Snapshot) holding a criterion the LLM judge decides,
# in a turn or among its conversation criteria.
_JUDGED = (
    '$.turns[*].criteria[*] ? (@.criteria_type == "llm_evaluated")',
    '$.conversation_criteria[*] ? (@.criteria_type == "llm_evaluated")',
)


async def _asks_the_judge(session: AsyncSession, batch_id: UUID) -> bool:
    """Whether any run of the batch has an LLM-judged criterion (the only ones judge trust
    reports on)."""
    judged = select(ScenarioRun.id).where(
        ScenarioRun.batch_run_id == batch_id,
        or_(
            *(
                func.jsonb_path_exists(ScenarioRun.snapshot, literal(path, JSONPATH))
                for path in _JUDGED
            )
        ),
    )
    return bool(await session.scalar(select(judged.exists())))


def text_key(question: str, few_shot_examples: Any, *, conversation: bool = False) -> str:
    """A criterion's identity for judge trust: its question and few-shot examples, and
    whether it is asked of a whole conversation."""
    identity = [question, list(few_shot_examples or [])]
    if conversation:
        identity.append("conversation")
    return hashlib.sha256(msgspec.json.encode(identity)).hexdigest()[:16]


@dataclass(slots=True)
class _Judged:
    """A criterion (a question and its few-shot examples) as the batch asked it."""

    question: str
    conversation: bool = False
    criteria_ids: list[UUID] = field(default_factory=list)
    scenarios: set[UUID] = field(default_factory=set)
    places: set[str] = field(default_factory=set)
    passed: int = 0
    judged: int = 0


async def _judged_criteria(session: AsyncSession, batch_id: UUID) -> dict[str, _Judged]:
    """The batch's LLM-judged criteria that have verdicts, by :func:`text_key`."""
    # A verdict on a turn, or on a run's whole conversation.
    run_id = func.coalesce(TurnResult.run_id, CriterionResult.run_id)
    counts = {
        criteria_id: (passed, judged)
        for criteria_id, passed, judged in await session.execute(
            select(
                CriterionResult.criteria_id,
                func.count().filter(CriterionResult.verdict == "PASS"),
                func.count(),
            )
            .select_from(CriterionResult)
            .outerjoin(TurnResult, TurnResult.id == CriterionResult.turn_result_id)
            .join(ScenarioRun, ScenarioRun.id == run_id)
            .where(
                ScenarioRun.batch_run_id == batch_id,
                CriterionResult.verdict.in_(("PASS", "FAIL")),
            )
            .group_by(CriterionResult.criteria_id)
        )
    }
    snapshots = await session.execute(
        select(ScenarioRun.scenario_id, ScenarioRun.snapshot)
        .where(ScenarioRun.batch_run_id == batch_id)
        .ext(distinct_on(ScenarioRun.scenario_id))
        .order_by(ScenarioRun.scenario_id, ScenarioRun.created_at)
    )
    judged: dict[str, _Judged] = {}
    for scenario_id, raw in snapshots:
        snapshot = msgspec.convert(raw, Snapshot)
        asked = [(turn.order_index, c) for turn in snapshot.turns for c in turn.criteria]
        asked += [(None, c) for c in snapshot.conversation_criteria]
        for turn_index, criterion in asked:
            criteria_id = UUID(criterion.id)
            if criterion.criteria_type != "llm_evaluated" or criteria_id not in counts:
                continue
            conversation = turn_index is None
            key = text_key(
                criterion.question, criterion.few_shot_examples, conversation=conversation
            )
            entry = judged.setdefault(
                key, _Judged(question=criterion.question, conversation=conversation)
            )
            entry.criteria_ids.append(criteria_id)
            entry.scenarios.add(scenario_id)
            entry.places.add(place_of(scenario_id, turn_index, criterion.order_index))
            passed, total = counts[criteria_id]
            entry.passed += passed
            entry.judged += total
    return judged


@dataclass(frozen=True, slots=True)
class _Measured:
    """What one calibration measured of one criterion (question and few-shot examples)."""

    calibration_id: UUID
    same_judge: bool
    confusion: Confusion
    examples: int


@dataclass(slots=True)
class _Calibrated:
    """Every criterion the consulted calibrations measured, the latest measure of each:
    by :func:`text_key`, and by the scenario criterion (id, place) examples named."""

    by_text: dict[str, _Measured] = field(default_factory=dict)
    by_criterion: dict[str, _Measured] = field(default_factory=dict)

    def add(self, calibration: Calibration, judge: tuple[UUID | None, str | None]) -> None:
        same_judge = (calibration.judge_provider_id, calibration.judge_model) == judge
        text_of: dict[str, str] = {}
        named: dict[str, set[str]] = defaultdict(set)
        places = calibration.criterion_places or {}
        for example in msgspec.convert(calibration.examples, list[schemas.StoredExample]):
            key = text_key(
                example.criterion_question,
                example.few_shot_examples,
                conversation=example.conversation,
            )
            text_of[example.id] = key
            if example.criteria_id is not None:
                criteria_id = str(example.criteria_id)
                named[key] |= {criteria_id, places.get(criteria_id, "")}
        results = (calibration.metrics or {}).get("results", [])
        pairs: dict[str, list[tuple[str, str]]] = defaultdict(list)
        counted: dict[str, int] = defaultdict(int)
        for result in msgspec.convert(results, list[schemas.CalibrationResultItem]):
            key = text_of[result.example_id]
            counted[key] += 1
            if result.judge_verdict is not None:
                pairs[key].append((result.human_verdict, result.judge_verdict))
        for key, examples in counted.items():
            measured = _Measured(calibration.id, same_judge, Confusion.of(pairs[key]), examples)
            self.by_text.setdefault(key, measured)
            for name in named[key] - {""}:
                self.by_criterion.setdefault(name, measured)


def _seed(batch_id: UUID, key: str) -> int:
    return int.from_bytes(hashlib.sha256(batch_id.bytes + key.encode()).digest()[:8], "big")


def _report(
    batch_id: UUID, judged: dict[str, _Judged], calibrated: _Calibrated
) -> tuple[list[schemas.TrustedCriterion], list[schemas.UncalibratedCriterion]]:
    """Pure: each criterion matched to its latest measure, corrected.  CPU work (the
    bootstrap): called in a thread."""
    trusted, uncalibrated = [], []
    for key, j in sorted(judged.items(), key=lambda item: item[1].question):
        common: dict[str, Any] = {
            "question": j.question,
            "conversation": j.conversation,
            "criteria_ids": sorted(j.criteria_ids),
            "scenarios": len(j.scenarios),
            "judged": j.judged,
            "passed": j.passed,
            "raw_pass_rate": j.passed / j.judged if j.judged else 0.0,
        }
        measured = calibrated.by_text.get(key)
        reason = None
        if measured is None:
            names = {str(i) for i in j.criteria_ids} | j.places
            earlier = [calibrated.by_criterion[n] for n in names if n in calibrated.by_criterion]
            if not earlier:
                uncalibrated.append(schemas.UncalibratedCriterion(**common))
                continue
            measured = earlier[0]
            reason = "the criterion's question or few-shot examples changed since its calibration"
        elif not measured.same_judge:
            reason = "the agent's judge (provider or model) changed since the calibration"
        confusion = measured.confusion
        result = correct(j.passed, j.judged, confusion, draws=DRAWS, seed=_seed(batch_id, key))
        interval = None
        if result is not None:
            low, high = result.interval
            interval = schemas.Interval(low=round(low, 6), high=round(high, 6))
        trusted.append(
            schemas.TrustedCriterion(
                **common,
                calibration_id=measured.calibration_id,
                calibration_examples=measured.examples,
                tpr=confusion.tpr,
                tnr=confusion.tnr,
                corrected_pass_rate=round(result.rate, 6) if result else None,
                interval=interval,
                stale=reason is not None,
                stale_reason=reason,
                message=None if result else NO_BETTER_THAN_CHANCE,
            )
        )
    return trusted, uncalibrated


async def compute(database: Database, batch_id: UUID) -> None:
    """Work out and store the batch's judge trust (the actor).  Idempotent: the bootstrap
    is seeded by the batch and criterion, so a redelivery stores the same report."""
    calibrated = _Calibrated()
    async with database.transaction() as session:
        batch = await session.get(BatchRun, batch_id)
        if batch is None or batch.status not in OVER:
            return
        judged = await _judged_criteria(session, batch_id)
        agent = await session.get(Agent, batch.agent_id)
        if agent is not None and judged:
            judge_id = await judge_provider_of(
                session, org_id=batch.organization_id, own=agent.judge_provider_id
            )
            for calibration in await session.scalars(
                select(Calibration)
                .where(
                    Calibration.organization_id == batch.organization_id,
                    Calibration.agent_id == agent.id,
                    Calibration.status == CalibrationStatus.COMPLETED,
                )
                .order_by(Calibration.completed_at.desc(), Calibration.id)
                .limit(LATEST_CALIBRATIONS)
            ):
                calibrated.add(calibration, (judge_id, agent.judge_model))
    trusted, uncalibrated = await asyncio.to_thread(_report, batch_id, judged, calibrated)
    report = schemas.JudgeTrust(
        status="ready", computed_at=utcnow(), criteria=trusted, uncalibrated=uncalibrated
    )
    async with database.transaction() as session:
        await session.execute(
            update(BatchRun)
            .where(BatchRun.id == batch_id)
            .values(judge_trust=msgspec.to_builtins(report))
        )
