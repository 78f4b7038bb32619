"""Executes one scenario run (DESIGN §5.2): idempotent and resumable.

Every state change is guarded in SQL, so a redelivered message changes nothing twice:

* claiming moves ``pending`` to ``running`` (a terminal run is left alone);
* each finished turn is committed with its criterion results and the run's cost in one
  transaction, before the next turn starts; ``(run_id, turn_index)`` is unique, so a
  duplicate execution cannot write a turn twice;
* a retried or redelivered message resumes after the last committed turn, rebuilding
  the conversation from what was stored;
* finishing only moves a ``running`` run to a terminal state, never back.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx
from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared.batches.services import count_terminal_run
from shared.db.base import utcnow
from shared.db.engine import session_scope
from shared.db.models import CriterionResult, Organization, ScenarioRun, TurnResult
from shared.errors import NotFound
from shared.llm.judge import Judgement, judge
from shared.outbound import services as outbound
from shared.outbound.agents import AgentConfig, call_agent
from shared.outbound.egress import EgressClient, EgressError, ProviderConfig
from shared.scenarios.schemas import TERMINAL_STATUSES
from shared.settings import Settings

log = logging.getLogger("spar.runs")

MAX_RENDERED_CHARS = 100_000


class _Sandbox(SandboxedEnvironment):
    """Jinja's sandbox, also refusing the arithmetic that builds huge values."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            raise SecurityError("the power operator is not allowed in templates")
        if isinstance(left, int) and not isinstance(left, bool) and isinstance(right, str | list):
            left, right = right, left
        if (
            isinstance(left, str | list)
            and isinstance(right, int)
            and len(left) * right > MAX_RENDERED_CHARS
        ):
            raise SecurityError("template value too large")
        return super().call_binop(context, operator, left, right)


_templates = _Sandbox(undefined=StrictUndefined, autoescape=False)


class RunAborted(Exception):
    """The run cannot go on; it ends as ``error`` with this message."""


def render_message(template: str, customer_context: dict[str, Any]) -> str:
    """A turn's user message rendered in the sandbox with the customer context's keys."""
    try:
        parsed = _templates.parse(template)
        if any(node.name == "self" for node in parsed.find_all(nodes.Name)):
            # Jinja binds "self" to the template itself; it cannot be a context variable.
            raise RunAborted(
                "user message template failed: 'self' is reserved in templates; "
                "rename that customer_context key"
            )
        # One mapping, not keywords: no context key can collide with render()'s parameters.
        rendered = _templates.from_string(parsed).render(customer_context)
    except (TemplateError, ArithmeticError, TypeError, ValueError, MemoryError) as exc:
        raise RunAborted(f"user message template failed: {type(exc).__name__}: {exc}") from None
    if len(rendered) > MAX_RENDERED_CHARS:
        raise RunAborted("user message template failed: the rendered message is too long")
    return rendered


def deterministic_verdict(kind: str, pattern: str, reply: str) -> tuple[str, str, str]:
    """(verdict, critique, evidence) for the free checks: contains, not_contains, regex."""
    if kind == "regex":
        match = re.search(pattern, reply)
        if match:
            return "PASS", f"reply matches /{pattern}/", match.group(0)
        return "FAIL", f"reply does not match /{pattern}/", ""
    found = pattern.casefold() in reply.casefold()
    if kind == "contains":
        return (
            ("PASS", f"reply contains {pattern!r}", pattern)
            if found
            else (
                "FAIL",
                f"reply does not contain {pattern!r}",
                "",
            )
        )
    return (
        ("FAIL", f"reply contains {pattern!r}", pattern)
        if found
        else (
            "PASS",
            f"reply does not contain {pattern!r}",
            "",
        )
    )


@dataclass(slots=True)
class _Context:
    run_id: UUID
    org_id: UUID
    session_id: str
    snapshot: dict[str, Any]
    agent: AgentConfig
    egress: EgressClient
    judge_provider: ProviderConfig | None
    judge_model: str | None
    business_information: str


def _empty_cost() -> dict[str, Any]:
    side = {"calls": 0, "input_tokens": 0, "output_tokens": 0, "latency_ms": 0.0}
    return {"agent": dict(side), "judge": dict(side), "estimated_cost_usd": 0.0}


def _price(provider: ProviderConfig | None, tokens_in: int, tokens_out: int) -> float:
    if provider is None:
        return 0.0
    return (tokens_in * (provider.input_cost_per_mtok or 0.0)) / 1e6 + (
        tokens_out * (provider.output_cost_per_mtok or 0.0)
    ) / 1e6


async def _claim(
    factory: async_sessionmaker[AsyncSession],
    settings: Settings,
    run_id: UUID,
    http: httpx.AsyncClient | None,
) -> tuple[_Context, list[TurnResult]] | None:
    async with session_scope(factory) as session:
        run = await session.get(ScenarioRun, run_id, with_for_update=True)
        if run is None or run.status in TERMINAL_STATUSES:
            return None
        now = utcnow()
        run.status = "running"
        run.started_at = run.started_at or now
        run.updated_at = now
        done = list(
            await session.scalars(
                select(TurnResult)
                .where(TurnResult.run_id == run_id)
                .order_by(TurnResult.turn_index)
            )
        )
        try:
            agent = await outbound.load_agent(session, settings, run.organization_id, run.agent_id)
            policy = await outbound.load_egress_policy(session, settings, run.organization_id)
            judge_id = agent.judge_provider_id or await outbound.default_judge_provider_id(
                session, run.organization_id
            )
            judge_provider = (
                await outbound.load_provider(session, settings, run.organization_id, judge_id)
                if judge_id
                else None
            )
        except NotFound as exc:
            raise RunAborted(f"cannot start: {exc.detail}") from None
        business = await session.scalar(
            select(Organization.business_information).where(Organization.id == run.organization_id)
        )
        context = _Context(
            run_id=run.id,
            org_id=run.organization_id,
            session_id=run.session_id or f"spar-{run.id}",
            snapshot=run.snapshot,
            agent=agent,
            egress=EgressClient(policy, http=http, timeout_s=settings.egress_timeout_s),
            judge_provider=judge_provider,
            judge_model=agent.judge_model,
            business_information=business or "",
        )
        return context, done


async def _evaluate(
    context: _Context, criterion: dict[str, Any], conversation: list[dict[str, str]], reply: str
) -> tuple[dict[str, Any], Judgement | None]:
    kind = criterion["criteria_type"]
    if kind != "llm_evaluated":
        verdict, critique, evidence = deterministic_verdict(kind, criterion["question"], reply)
        return {"verdict": verdict, "critique": critique, "evidence": evidence}, None
    if context.judge_provider is None:
        raise RunAborted(
            "judge: no judge provider (set the agent's judge_provider_id or an LLM provider "
            "with is_default_judge)"
        )
    try:
        result = await judge(
            context.egress,
            context.judge_provider,
            question=criterion["question"],
            conversation=conversation,
            few_shot_examples=criterion.get("few_shot_examples"),
            business_information=context.business_information,
            model=context.judge_model,
        )
    except EgressError as exc:
        raise RunAborted(f"judge: {exc}") from None
    return {
        "verdict": result.verdict,
        "critique": result.critique,
        "evidence": result.evidence,
    }, result


async def _record_turn(
    factory: async_sessionmaker[AsyncSession],
    context: _Context,
    *,
    turn_index: int,
    user_message: str,
    reply_content: str,
    passed: bool,
    stopped_early: bool,
    criteria: list[tuple[dict[str, Any], dict[str, Any], Judgement | None]],
    cost_delta: dict[str, Any],
) -> bool:
    """Commit one turn with its results and cost; False if it was already written or the run
    is no longer running (another delivery got there first)."""
    try:
        async with session_scope(factory) as session:
            run = await session.get(ScenarioRun, context.run_id, with_for_update=True)
            if run is None or run.status != "running":
                return False
            turn = TurnResult(
                id=uuid.uuid4(),
                run_id=context.run_id,
                turn_index=turn_index,
                user_message=user_message,
                response_content=reply_content,
                passed=passed,
                stopped_early=stopped_early,
            )
            session.add(turn)
            await session.flush()
            session.add_all(
                CriterionResult(
                    turn_result_id=turn.id,
                    criteria_id=UUID(criterion["id"]),
                    order_index=criterion["order_index"],
                    verdict=verdict["verdict"],
                    critique=verdict["critique"],
                    evidence=verdict["evidence"],
                    input_tokens=judgement.input_tokens if judgement else 0,
                    output_tokens=judgement.output_tokens if judgement else 0,
                )
                for criterion, verdict, judgement in criteria
            )
            cost = run.cost_summary or _empty_cost()
            merged = {side: dict(cost.get(side) or {}) for side in ("agent", "judge")}
            for side in ("agent", "judge"):
                for key, value in cost_delta[side].items():
                    merged[side][key] = merged[side].get(key, 0) + value
            merged["estimated_cost_usd"] = round(
                (cost.get("estimated_cost_usd") or 0.0) + cost_delta["estimated_cost_usd"], 8
            )
            run.cost_summary = merged
            run.updated_at = utcnow()
    except IntegrityError:
        return False
    return True


async def finish(
    factory: async_sessionmaker[AsyncSession], run_id: UUID, status: str, error: str | None = None
) -> UUID | None:
    """Move a non-terminal run to ``status`` and, in the same transaction, count it in its
    batch.  Returns the batch to refill, if the run belongs to one and was counted now."""
    async with session_scope(factory) as session:
        now = utcnow()
        moved = (
            await session.execute(
                update(ScenarioRun)
                .where(ScenarioRun.id == run_id, ScenarioRun.status.in_(("pending", "running")))
                .values(status=status, completed_at=now, updated_at=now, error_message=error)
                .returning(ScenarioRun.batch_run_id)
                .execution_options(synchronize_session=False)
            )
        ).first()
        if moved is None or moved[0] is None:
            return None
        await count_terminal_run(session, moved[0], status)
        return moved[0]


async def execute_run(
    factory: async_sessionmaker[AsyncSession],
    settings: Settings,
    run_id: UUID,
    *,
    http: httpx.AsyncClient | None = None,
) -> UUID | None:
    """Play the run to a terminal state (or leave it to the delivery that owns it).

    Returns the batch whose window this run's end has freed, for the caller to refill.
    """
    try:
        claimed = await _claim(factory, settings, run_id, http)
        if claimed is None:
            return None
        context, done = claimed
        status = await _run_turns(factory, context, done)
    except RunAborted as exc:
        log.info("run %s ends in error: %s", run_id, exc)
        return await finish(factory, run_id, "error", str(exc))
    if status is None:
        return None
    return await finish(factory, run_id, status)


async def _run_turns(
    factory: async_sessionmaker[AsyncSession], context: _Context, done: list[TurnResult]
) -> str | None:
    """Play the turns not yet committed; the final status, or None if another delivery won."""
    history: list[dict[str, str]] = []
    for turn in done:
        history += [
            {"role": "user", "content": turn.user_message},
            {"role": "assistant", "content": turn.response_content},
        ]
    if any(t.stopped_early for t in done):
        return "failed"
    all_passed = all(t.passed for t in done)
    done_indexes = {t.turn_index for t in done}
    customer_context = context.snapshot.get("customer_context") or {}
    for turn in context.snapshot["turns"]:
        index = turn["order_index"]
        if index in done_indexes:
            continue
        message = render_message(turn["user_message"], customer_context)
        try:
            reply = await call_agent(
                context.egress,
                context.agent,
                session_id=context.session_id,
                message=message,
                history=history,
                customer_context=customer_context,
                metadata={"run_id": str(context.run_id), "turn_index": index},
            )
        except EgressError as exc:
            raise RunAborted(f"agent: {exc}") from None
        conversation = [
            *history,
            {"role": "user", "content": message},
            {"role": "assistant", "content": reply.content},
        ]
        evaluated = await asyncio.gather(
            *(_evaluate(context, c, conversation, reply.content) for c in turn["criteria"])
        )
        passed = all(verdict["verdict"] == "PASS" for verdict, _ in evaluated)
        stopped = bool(turn["required"]) and not passed
        judgements = [j for _, j in evaluated if j is not None]
        judge_in = sum(j.input_tokens for j in judgements)
        judge_out = sum(j.output_tokens for j in judgements)
        cost_delta = {
            "agent": {
                "calls": 1,
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "latency_ms": round(reply.latency_ms, 1),
            },
            "judge": {
                "calls": sum(j.calls for j in judgements),
                "input_tokens": judge_in,
                "output_tokens": judge_out,
                "latency_ms": round(sum(j.latency_ms for j in judgements), 1),
            },
            "estimated_cost_usd": _price(
                context.agent.provider, reply.input_tokens, reply.output_tokens
            )
            + _price(context.judge_provider, judge_in, judge_out),
        }
        recorded = await _record_turn(
            factory,
            context,
            turn_index=index,
            user_message=message,
            reply_content=reply.content,
            passed=passed,
            stopped_early=stopped,
            criteria=[(c, v, j) for c, (v, j) in zip(turn["criteria"], evaluated, strict=True)],
            cost_delta=cost_delta,
        )
        if not recorded:
            return None
        history = conversation
        all_passed = all_passed and passed
        if stopped:
            return "failed"
    return "passed" if all_passed else "failed"
