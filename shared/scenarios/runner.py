"""Executes one scenario run (DESIGN §5.2): idempotent and resumable.

Every state change is guarded in SQL (:mod:`shared.scenarios.store`), so a redelivered
message changes nothing twice:

* claiming moves ``pending`` (or ``running`` with a dead heartbeat) to ``running`` and
  counts the delivery (:mod:`shared.work`: the heartbeat while it plays, the end in error
  of a run whose deliveries ran out); a terminal run, or one a live worker plays, is left
  alone;
* each finished turn is committed with its criterion results and the run's cost, all or
  nothing, before the next turn starts; ``(run_id, turn_index)`` is unique, so a
  duplicate execution cannot write a turn twice;
* a retried or redelivered message resumes after the last committed turn, rebuilding
  the conversation from what was stored;
* finishing only moves a ``pending`` or ``running`` run to a terminal state, never back,
  and counts it in its batch, whose next run takes its place, in the same commit.

The user message is rendered in a renderer process (:mod:`shared.scenarios.sandbox`);
deterministic checks read the agent's reply and tool calls as it sent them, the judge and
the store read them redacted (and the calls capped, :mod:`shared.outbound.tool_calls`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import aiohttp

from shared import work
from shared.db.engine import Database
from shared.errors import NotFound
from shared.knowledge.context import AgentKnowledge, KnowledgeNotReady
from shared.knowledge.context import load as load_knowledge
from shared.llm.judge import Judgement, judge
from shared.metrics import RUNS_IN_FLIGHT, in_flight
from shared.outbound import tool_calls
from shared.outbound.agents import AgentConfig, AgentReply, Message, call_agent
from shared.outbound.configuration import load_outbound
from shared.outbound.egress import EgressClient, EgressError, ProviderConfig
from shared.outbound.limits import DestinationLimiter
from shared.outbound.schemas import ToolCall
from shared.scenarios import checks, sandbox, store, tracing
from shared.scenarios.records import (
    CallCost,
    Claimed,
    CostSummary,
    CriterionRecord,
    DoneTurn,
    ErrorTurn,
    Snapshot,
    SnapshotCriterion,
    SnapshotTurn,
    TurnRecord,
)
from shared.scenarios.schemas import TOOL_CRITERIA, RunStatus
from shared.scenarios.tracing import run_finished
from shared.settings import Settings
from shared.work import RUNS

log = logging.getLogger("spar.runs")


class RunAborted(Exception):
    """The run cannot go on; it ends as ``error`` with this message (and the turn it ended
    on, when a turn was being played)."""

    def __init__(self, message: str, turn: ErrorTurn | None = None) -> None:
        super().__init__(message)
        self.turn = turn

    def on(self, turn: ErrorTurn) -> RunAborted:
        """The same end, on ``turn``."""
        return RunAborted(str(self), turn)


async def render_message(template: str, customer_context: dict[str, Any], turn: int) -> str:
    """A turn's user message rendered in the sandbox with the customer context's keys; a
    template that cannot render ends the run in error, naming its turn (counted from 1)."""
    try:
        return await sandbox.render(template, customer_context)
    except sandbox.TemplateFailed as exc:
        raise RunAborted(f"user message template failed (turn {turn}): {exc}") from None


@dataclass(slots=True)
class _Context:
    run_id: UUID
    session_id: str
    snapshot: Snapshot
    agent: AgentConfig
    egress: EgressClient
    judge_provider: ProviderConfig | None
    judge_model: str | None
    business_information: str
    cost: CostSummary  # the run's cost_summary as committed so far
    knowledge: AgentKnowledge | None = None  # an llm agent's bookmarked documents


def _price(provider: ProviderConfig | None, tokens_in: int, tokens_out: int) -> float:
    if provider is None:
        return 0.0
    return (tokens_in * (provider.input_cost_per_mtok or 0.0)) / 1e6 + (
        tokens_out * (provider.output_cost_per_mtok or 0.0)
    ) / 1e6


async def _load(
    database: Database,
    settings: Settings,
    run_id: UUID,
    run: Claimed,
    http: aiohttp.ClientSession | None,
    limiter: DestinationLimiter | None,
) -> _Context:
    """What playing the claimed run needs: the agent, the egress policy, the judge, an llm
    agent's knowledge."""
    try:
        outbound = await load_outbound(
            database, settings, run.organization_id, run.agent_id, run.outbound_version
        )
    except NotFound as exc:
        raise RunAborted(f"cannot start: {exc.detail}") from None
    knowledge = None
    if outbound.agent.kind == "llm":  # only Spar's own llm agents are given documents
        try:
            knowledge = await load_knowledge(
                database, run.organization_id, run.agent_id, wait_s=settings.knowledge_wait_s
            )
        except KnowledgeNotReady as exc:
            raise RunAborted(f"cannot start: {exc}") from None
    return _Context(
        run_id=run_id,
        session_id=run.session_id or f"spar-{run_id}",
        snapshot=run.snapshot,
        agent=outbound.agent,
        egress=EgressClient(
            outbound.policy,
            http=http,
            timeout_s=settings.egress_timeout_s,
            limiter=limiter,
            organization_id=run.organization_id,
        ),
        judge_provider=outbound.judge,
        judge_model=outbound.agent.judge_model,
        business_information=run.business_information,
        cost=run.cost_summary,
        knowledge=None if knowledge is None or knowledge.empty else knowledge,
    )


@dataclass(frozen=True, slots=True)
class _Verdict:
    """A criterion's verdict on a turn, and the judge's call when one decided it."""

    verdict: str
    critique: str
    evidence: str
    judgement: Judgement | None = None


async def _evaluate(
    context: _Context,
    criterion: SnapshotCriterion,
    conversation: list[Message],
    reply: AgentReply,
    calls: list[ToolCall],
) -> _Verdict:
    """A criterion's verdict: a deterministic check reads the reply and the tool ``calls``
    as the agent sent them (a leak check must see the leak); the judge reads the
    conversation redacted."""
    kind = criterion.criteria_type
    if kind != "llm_evaluated":
        if kind in TOOL_CRITERIA:
            verdict, critique, evidence = checks.tool_verdict(
                kind, criterion.question, criterion.expected_arguments, calls
            )
        else:
            try:
                verdict, critique, evidence = await checks.verdict(
                    kind, criterion.question, reply.received
                )
            except checks.CheckUndecided as exc:
                raise RunAborted(f"criterion: {exc}") from None
        # What a check quotes of the reply (a regex's match) is kept: redacted, like the reply.
        redact = context.egress.policy.redact
        return _Verdict(verdict, redact(critique), redact(evidence))
    if context.judge_provider is None:
        raise RunAborted(
            "judge: no judge provider (set the agent's judge_provider_id or an LLM provider "
            "with is_default_judge)"
        )
    try:
        result = await judge(
            context.egress,
            context.judge_provider,
            question=criterion.question,
            conversation=conversation,
            few_shot_examples=criterion.few_shot_examples,
            business_information=context.business_information,
            model=context.judge_model,
        )
    except EgressError as exc:
        raise RunAborted(f"judge: {exc}") from None
    return _Verdict(result.verdict, result.critique, result.evidence, result)


async def finish(
    database: Database,
    run_id: UUID,
    status: RunStatus,
    error: str | None = None,
    error_turn: ErrorTurn | None = None,
) -> list[UUID] | None:
    """Move a non-terminal run to ``status``, counted in its batch with the run that takes
    its place handed out (:func:`shared.scenarios.store.end`): ``None`` when the run was
    already terminal, else the successors to send."""
    successors = await store.end(database, run_id, status, error, error_turn)
    if successors is not None:
        run_finished(status, error)
    return successors


@in_flight(RUNS_IN_FLIGHT)
async def execute_run(
    database: Database,
    settings: Settings,
    run_id: UUID,
    *,
    http: aiohttp.ClientSession | None = None,
    limiter: DestinationLimiter | None = None,
) -> list[UUID] | None:
    """Play the run to a terminal state (or leave it to the delivery that owns it).

    ``None`` when this delivery did not end the run; otherwise the batch runs handed out in
    its place, for the caller to send (see :func:`finish`).  Claimed, kept alive and given
    up on as every unit of work is (:mod:`shared.work`).
    """
    run = await store.claim(database, settings, run_id)
    if run is None:
        return None

    async def play() -> list[UUID] | None:
        try:
            context = await _load(database, settings, run_id, run, http, limiter)
            return await _run_turns(database, context, run.done)
        except RunAborted as exc:
            log.info("run %s ends in error: %s", run_id, exc)
            return await finish(database, run_id, RunStatus.ERROR, str(exc), exc.turn)

    async def give_up(reason: str) -> list[UUID] | None:
        return await finish(database, run_id, RunStatus.ERROR, reason)

    traced = tracing.traced(database, run_id, run, play)  # the delivery's trace, when on
    return await work.perform(
        RUNS, database, settings, run_id, run.attempts, play=traced, give_up=give_up
    )


async def _run_turns(
    database: Database, context: _Context, done: list[DoneTurn]
) -> list[UUID] | None:
    """Play the turns not yet committed and end the run (its last turn is written in the
    same commit as its end).  ``None`` if another delivery won, else the successors."""
    history = _history(done)
    all_passed = all(t.passed for t in done)
    remaining = _remaining(context.snapshot, done)
    if not remaining or any(t.stopped_early for t in done):  # nothing left to play
        return await finish(database, context.run_id, _outcome(all_passed))
    for position, turn in enumerate(remaining):
        with tracing.turn(turn.order_index):
            played = await _play(context, turn, history)
        all_passed = all_passed and played.record.passed
        last = played.record.stopped_early or position == len(remaining) - 1
        cost = context.cost + played.cost
        # The turns a failed required turn leaves unplayed are recorded with the run's end.
        skipped = [t.order_index for t in remaining[position + 1 :]] if last else []
        outcome = await store.record_turn(
            database,
            context.run_id,
            played.record,
            played.results,
            cost,
            end=_outcome(all_passed) if last else None,
            skipped=skipped,
        )
        if outcome is None or last:
            if outcome is not None:
                run_finished(_outcome(all_passed))
            return outcome
        context.cost = cost
        history = played.conversation
    raise AssertionError("unreachable: the last remaining turn ends the run")


def _outcome(all_passed: bool) -> RunStatus:
    return RunStatus.PASSED if all_passed else RunStatus.FAILED


def _history(done: list[DoneTurn]) -> list[Message]:
    """The conversation the committed turns held, to resume it."""
    history: list[Message] = []
    for turn in done:
        history += [
            {"role": "user", "content": turn.user_message},
            {"role": "assistant", "content": turn.response_content, "tool_calls": turn.tool_calls},
        ]
    return history


def _remaining(snapshot: Snapshot, done: list[DoneTurn]) -> list[SnapshotTurn]:
    done_indexes = {t.turn_index for t in done}
    return [t for t in snapshot.turns if t.order_index not in done_indexes]


@dataclass(frozen=True, slots=True)
class _Played:
    """A turn played, not yet committed: what to write, and the conversation after it."""

    record: TurnRecord
    results: list[CriterionRecord]
    cost: CostSummary
    conversation: list[Message]


async def _play(context: _Context, turn: SnapshotTurn, history: list[Message]) -> _Played:
    """Render the turn's message, send it to the agent, judge every criterion at once."""
    customer_context = context.snapshot.customer_context or {}
    try:
        message = await render_message(turn.user_message, customer_context, turn.order_index + 1)
    except RunAborted as exc:
        raise exc.on(ErrorTurn(turn.order_index)) from None
    system_context, given, searched = None, None, []
    if context.knowledge is not None:
        knowledge = await context.knowledge.for_message(message)
        system_context, given, searched = (
            knowledge.system_context,
            knowledge.given,
            knowledge.tool_calls,
        )
    try:
        reply = await call_agent(
            context.egress,
            context.agent,
            session_id=context.session_id,
            message=message,
            history=history,
            customer_context=customer_context,
            metadata={"run_id": str(context.run_id), "turn_index": turn.order_index},
            system_context=system_context,
        )
    except EgressError as exc:
        raise RunAborted(f"agent: {exc}", ErrorTurn(turn.order_index, message)) from None
    # What the agent did for this reply: Spar's knowledge search for an llm agent, the
    # calls an http agent reported.  Checked as received, kept redacted and capped.
    received_calls = [*searched, *reply.received_tool_calls]
    calls = tool_calls.capped([*searched, *reply.tool_calls])
    conversation: list[Message] = [
        *history,
        {"role": "user", "content": message},
        {"role": "assistant", "content": reply.content, "tool_calls": calls},
    ]
    try:
        verdicts = await asyncio.gather(
            *(_evaluate(context, c, conversation, reply, received_calls) for c in turn.criteria)
        )
    except RunAborted as exc:  # a check or the judge: the agent had answered
        raise exc.on(ErrorTurn(turn.order_index, message, reply.content, calls)) from None
    tracing.verdicts(turn.criteria, verdicts)
    passed = all(v.verdict == "PASS" for v in verdicts)
    record = TurnRecord(
        id=uuid.uuid4(),
        turn_index=turn.order_index,
        user_message=message,
        response_content=reply.content,
        passed=passed,
        stopped_early=turn.required and not passed,
        knowledge=given,
        redacted_keys=list(reply.redacted_keys),
        refusal=reply.refusal,
        tool_calls=calls,
    )
    results = [
        CriterionRecord(
            id=uuid.uuid4(),
            criteria_id=UUID(criterion.id),
            order_index=criterion.order_index,
            verdict=v.verdict,
            critique=v.critique,
            evidence=v.evidence,
            input_tokens=v.judgement.input_tokens if v.judgement else 0,
            output_tokens=v.judgement.output_tokens if v.judgement else 0,
        )
        for criterion, v in zip(turn.criteria, verdicts, strict=True)
    ]
    return _Played(record, results, _turn_cost(context, reply, verdicts), conversation)


def _turn_cost(context: _Context, reply: AgentReply, verdicts: list[_Verdict]) -> CostSummary:
    """What one turn cost: the agent's call, the judge's calls, their estimated price."""
    judgements = [v.judgement for v in verdicts if v.judgement is not None]
    judge_in = sum(j.input_tokens for j in judgements)
    judge_out = sum(j.output_tokens for j in judgements)
    return CostSummary(
        agent=CallCost(
            calls=1,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            latency_ms=round(reply.latency_ms, 1),
        ),
        judge=CallCost(
            calls=sum(j.calls for j in judgements),
            input_tokens=judge_in,
            output_tokens=judge_out,
            latency_ms=round(sum(j.latency_ms for j in judgements), 1),
        ),
        estimated_cost_usd=_price(context.agent.provider, reply.input_tokens, reply.output_tokens)
        + _price(context.judge_provider, judge_in, judge_out),
    )
