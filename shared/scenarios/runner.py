"""Executes one scenario run (DESIGN §5.2, §5.9): idempotent and resumable.

A run plays the scenario's scripted turns, then (with a ``simulation``) the simulated
user's turns until it is done or has played ``max_turns``, then judges the conversation
criteria on the whole conversation.  A failed required turn stops it there: what comes
after (simulated turns, conversation criteria) is not played, and the run fails.

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
* a simulated turn is committed like a scripted one, its message (the simulator's) with
  the agent's reply: the simulator is asked again only for a turn no delivery committed
  (one killed between the simulator's answer and the commit), never for a committed one;
  its ``done`` answer is committed at once (the run's ``simulation_outcome``), and a turn
  is never written after it;
* finishing only moves a ``pending`` or ``running`` run to a terminal state, never back,
  and counts it in its batch, whose next run takes its place, in the same commit.

The user message is rendered in a renderer process (:mod:`shared.scenarios.sandbox`);
deterministic checks read the agent's reply and tool calls as it sent them, the judge and
the store read them redacted (and the calls capped, :mod:`shared.outbound.tool_calls`).
A text check among the conversation criteria reads every reply as it was sent too: what
it finds in each is committed with its turn (``conversation_matches``), so its verdict at
the end does not depend on which delivery played which turn; a tool check among them
reads every turn's calls as they were committed.

The judge decides each ``llm_evaluated`` criterion ``judge_repetitions`` times (the run's,
so a resumed run judges the same), its calls at once; the verdict is their majority (a tie
fails) and the result keeps the votes.  A replay's run (``replay_of_run_id``) plays the
conversation its source run stored (:mod:`shared.scenarios.replay`): each message and
reply, tool calls and simulated turns taken from it, the agent and the simulator never
called; deterministic checks then read the stored (redacted) reply.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import aiohttp

from shared import work
from shared.db.engine import Database
from shared.errors import NotFound
from shared.knowledge.context import AgentKnowledge, KnowledgeNotReady
from shared.knowledge.context import load as load_knowledge
from shared.llm import simulator
from shared.llm.judge import Judgement, judge
from shared.metrics import RUNS_IN_FLIGHT, in_flight
from shared.outbound import tool_calls
from shared.outbound.agents import AgentConfig, AgentReply, Message, call_agent
from shared.outbound.configuration import load_outbound, load_provider
from shared.outbound.egress import EgressClient, EgressError, ProviderConfig
from shared.outbound.limits import DestinationLimiter
from shared.outbound.schemas import ToolCall
from shared.scenarios import checks, sandbox, store, tracing
from shared.scenarios import replay as replay_
from shared.scenarios.records import (
    CallCost,
    Claimed,
    CostSummary,
    CriterionRecord,
    DoneTurn,
    ErrorTurn,
    Snapshot,
    SnapshotCriterion,
    SnapshotSimulation,
    SnapshotTurn,
    TurnRecord,
)
from shared.scenarios.schemas import TOOL_CRITERIA, RunStatus
from shared.scenarios.tracing import run_finished
from shared.settings import Settings
from shared.work import RUNS

log = logging.getLogger("spar.runs")
NO_SIMULATOR = (
    "simulator: no simulator provider (set the scenario's simulation.provider_id, mark an "
    "LLM provider is_default_simulator, or give the agent a judge: the simulated user "
    "falls back on it)"
)
NO_JUDGE = (
    "judge: no judge provider (set the agent's judge_provider_id or an LLM provider with "
    "is_default_judge)"
)


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
    batch_id: UUID | None  # its batch's, when it is one's
    session_id: str
    snapshot: Snapshot
    agent: AgentConfig
    egress: EgressClient
    judge_provider: ProviderConfig | None
    judge_model: str | None
    business_information: str
    cost: CostSummary  # the run's cost_summary as committed so far
    knowledge: AgentKnowledge | None = None  # an llm agent's bookmarked documents
    # The simulated user's provider, when the scenario has one and it is still to play.
    simulator: ProviderConfig | None = None
    simulation_outcome: str | None = None  # as an earlier delivery settled it
    judge_repetitions: int = 1  # votes per llm_evaluated criterion
    # A replay's run: the stored conversation it re-judges (no agent, no simulator).
    replay: replay_.Transcript | None = None


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
    agent's knowledge, the simulated user's provider."""
    try:
        outbound = await load_outbound(
            database, settings, run.organization_id, run.agent_id, run.outbound_version
        )
    except NotFound as exc:
        raise RunAborted(f"cannot start: {exc.detail}") from None
    transcript = None
    if run.replay_of_run_id is not None:
        try:
            transcript = await replay_.load(
                database, run_id=run_id, source_id=run.replay_of_run_id, snapshot=run.snapshot
            )
        except replay_.NotReplayable as exc:
            raise RunAborted(str(exc)) from None
    knowledge = None
    # Only Spar's own llm agents are given documents; a replay's were stored with its turns.
    if outbound.agent.kind == "llm" and transcript is None:
        try:
            knowledge = await load_knowledge(
                database, run.organization_id, run.agent_id, wait_s=settings.knowledge_wait_s
            )
        except KnowledgeNotReady as exc:
            raise RunAborted(f"cannot start: {exc}") from None
    return _Context(
        run_id=run_id,
        batch_id=run.batch_run_id,
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
        simulator=(
            None
            if transcript is not None
            else await _simulator_of(database, settings, run, outbound.simulator)
        ),
        simulation_outcome=run.simulation_outcome,
        judge_repetitions=run.judge_repetitions,
        replay=transcript,
    )


async def _simulator_of(
    database: Database, settings: Settings, run: Claimed, default: ProviderConfig | None
) -> ProviderConfig | None:
    """The provider of the scenario's simulated user, if it is still to play: the one its
    ``simulation`` names, else ``default`` (the organization's default simulator, else the
    agent's judge: :class:`shared.outbound.configuration.OutboundConfig`)."""
    simulation = run.snapshot.simulation
    if simulation is None or run.simulation_outcome is not None:
        return None
    if simulation.provider_id is None:
        return default
    try:
        async with database.transaction() as session:
            return await load_provider(
                session,
                settings=settings,
                org_id=run.organization_id,
                provider_id=UUID(simulation.provider_id),
            )
    except NotFound:
        raise RunAborted(
            f"simulator: the scenario's simulator provider {simulation.provider_id} no longer "
            "exists"
        ) from None


LLM = "llm_evaluated"
TEXT = ("contains", "not_contains", "regex")  # the checks that read the reply's text


@dataclass(frozen=True, slots=True)
class _Verdict:
    """A criterion's verdict on a turn, and the judge's calls (its votes) when the judge
    decided it."""

    verdict: str
    critique: str
    evidence: str
    judgements: tuple[Judgement, ...] = ()

    @property
    def votes(self) -> dict[str, int] | None:
        if not self.judgements:
            return None
        passes = sum(j.verdict == "PASS" for j in self.judgements)
        return {"PASS": passes, "FAIL": len(self.judgements) - passes}


def _majority(judgements: Sequence[Judgement]) -> _Verdict:
    """The verdict of the judge's votes on one criterion: PASS when more than half passed
    (a tie is FAIL), with the critique and evidence of the first vote that agrees."""
    passes = sum(j.verdict == "PASS" for j in judgements)
    verdict = "PASS" if 2 * passes > len(judgements) else "FAIL"
    agreeing = next(j for j in judgements if j.verdict == verdict)
    return _Verdict(verdict, agreeing.critique, agreeing.evidence, tuple(judgements))


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
    if kind != LLM:
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
    return await _judged(context, criterion, conversation)


async def _judged(
    context: _Context,
    criterion: SnapshotCriterion,
    conversation: list[Message],
    *,
    whole_conversation: bool = False,
) -> _Verdict:
    """The judge's verdict on an ``llm_evaluated`` criterion: the majority of the run's
    ``judge_repetitions`` votes on the same conversation, asked at once."""
    provider = context.judge_provider
    if provider is None:
        raise RunAborted(NO_JUDGE)
    try:
        votes = await asyncio.gather(
            *(
                judge(
                    context.egress,
                    provider,
                    question=criterion.question,
                    conversation=conversation,
                    few_shot_examples=criterion.few_shot_examples,
                    business_information=context.business_information,
                    model=context.judge_model,
                    whole_conversation=whole_conversation,
                )
                for _ in range(context.judge_repetitions)
            )
        )
    except EgressError as exc:
        raise RunAborted(f"judge: {exc}") from None
    return _majority(votes)


async def _conversation_matches(context: _Context, reply: AgentReply) -> dict[str, str] | None:
    """What each text check among the conversation criteria (``contains``,
    ``not_contains``, ``regex``) finds in ``reply`` as the agent sent it (criterion id ->
    evidence, redacted like the reply), to be judged with the other replies' once the
    conversation ends; ``None`` when the scenario has none."""
    checked = [c for c in context.snapshot.conversation_criteria if c.criteria_type in TEXT]
    if not checked:
        return None
    redact = context.egress.policy.redact
    matches = {}
    for criterion in checked:
        try:
            found = await checks.match(criterion.criteria_type, criterion.question, reply.received)
        except checks.CheckUndecided as exc:
            raise RunAborted(f"criterion: {exc}") from None
        if found is not None:
            matches[criterion.id] = redact(found)
    return matches


async def _evaluate_conversation(
    context: _Context, criterion: SnapshotCriterion, progress: _Progress
) -> _Verdict:
    """A conversation criterion's verdict: the judge's on the whole conversation; a tool
    check's on the calls of every turn; a text check's on what it found in the agent's
    replies (:func:`checks.over_conversation`)."""
    kind = criterion.criteria_type
    if kind == LLM:
        return await _judged(context, criterion, progress.history, whole_conversation=True)
    redact = context.egress.policy.redact
    if kind in TOOL_CRITERIA:
        calls = progress.calls()
        verdict, critique, evidence = checks.tool_verdict(
            kind, criterion.question, criterion.expected_arguments, [c for _, c in calls]
        )
        turns = sorted({index + 1 for index, c in calls if c.name == criterion.question})
        if turns:
            critique += f" (called in turn{'s' if len(turns) > 1 else ''} "
            critique += ", ".join(map(str, turns)) + ")"
        return _Verdict(verdict, redact(critique), redact(evidence))
    found = progress.found.get(criterion.id, [])
    verdict, critique, evidence = checks.over_conversation(kind, criterion.question, found)
    return _Verdict(verdict, redact(critique), evidence)


async def finish(
    database: Database,
    run_id: UUID,
    status: RunStatus,
    error: str | None = None,
    error_turn: ErrorTurn | None = None,
    *,
    batch_id: UUID | None = None,
) -> list[UUID] | None:
    """Move a non-terminal run (of the batch ``batch_id``, if any) to ``status``, counted in
    its batch with the run that takes its place handed out
    (:func:`shared.scenarios.store.end`): ``None`` when the run was already terminal, else
    the successors to send."""
    successors = await store.end(database, run_id, status, error, error_turn, batch_id=batch_id)
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
    claimed: Callable[[], None] | None = None,
) -> list[UUID] | None:
    """Play the run to a terminal state (or leave it to the delivery that owns it).

    ``None`` when this delivery did not end the run; otherwise the batch runs handed out in
    its place, for the caller to send (see :func:`finish`).  Claimed, kept alive and given
    up on as every unit of work is (:mod:`shared.work`); ``claimed()`` is called once the
    claim is committed, or found not to be this delivery's.
    """
    try:
        run = await store.claim(database, settings, run_id)
    except store.Unreadable as exc:
        if claimed is not None:
            claimed()
        # Played again, it would fail the same way at every delivery: it ends now.
        log.error("run %s cannot be read: %s", run_id, exc)
        return await finish(database, run_id, RunStatus.ERROR, f"cannot start: {exc}")
    if claimed is not None:
        claimed()
    if run is None:
        return None

    async def play() -> list[UUID] | None:
        try:
            context = await _load(database, settings, run_id, run, http, limiter)
            return await _run_turns(database, context, run.done)
        except RunAborted as exc:
            log.info("run %s ends in error: %s", run_id, exc)
            return await finish(
                database, run_id, RunStatus.ERROR, str(exc), exc.turn, batch_id=run.batch_run_id
            )

    async def give_up(reason: str) -> list[UUID] | None:
        return await finish(database, run_id, RunStatus.ERROR, reason, batch_id=run.batch_run_id)

    traced = tracing.traced(database, run_id, run, play)  # the delivery's trace, when on
    return await work.perform(
        RUNS, database, settings, run_id, run.attempts, play=traced, give_up=give_up
    )


class _Overtaken(Exception):
    """Another delivery of the run wrote first (a turn, the outcome): this one stops."""


@dataclass(slots=True)
class _Progress:
    """The conversation as committed so far: what the agent and the user said, whether
    every turn passed, what the deterministic conversation criteria found in each reply,
    how many simulated turns were played."""

    history: list[Message]
    all_passed: bool
    found: dict[str, list[tuple[int, str]]]  # criterion id -> [(turn_index, evidence)]
    simulated: int

    @classmethod
    def of(cls, snapshot: Snapshot, done: list[DoneTurn]) -> _Progress:
        progress = cls(history=[], all_passed=True, found={}, simulated=0)
        for turn in done:
            progress.add(turn.turn_index, turn.passed, turn.conversation_matches)
            progress.history += [
                {"role": "user", "content": turn.user_message},
                {
                    "role": "assistant",
                    "content": turn.response_content,
                    "tool_calls": turn.tool_calls,
                },
            ]
            if turn.turn_index >= len(snapshot.turns):
                progress.simulated += 1
        return progress

    def add(self, index: int, passed: bool, matches: dict[str, str] | None) -> None:
        self.all_passed = self.all_passed and passed
        for criterion_id, evidence in (matches or {}).items():
            self.found.setdefault(criterion_id, []).append((index, evidence))

    def calls(self) -> list[tuple[int, ToolCall]]:
        """Every tool call of the conversation, with its turn's index, as committed."""
        replies = (m for m in self.history if m["role"] == "assistant")
        return [
            (index, call) for index, m in enumerate(replies) for call in m.get("tool_calls") or ()
        ]

    def played(self, played: _Played) -> None:
        record = played.record
        self.add(record.turn_index, record.passed, record.conversation_matches)
        self.history = played.conversation


async def _run_turns(
    database: Database, context: _Context, done: list[DoneTurn]
) -> list[UUID] | None:
    """Play what is not yet committed and end the run: the scripted turns, then the
    simulated user's, then the conversation criteria (the run's end is written in the same
    commit as its last turn, or as the conversation criteria's verdicts).  ``None`` if
    another delivery won, else the successors."""
    snapshot = context.snapshot
    progress = _Progress.of(snapshot, done)
    if any(t.stopped_early for t in done):  # a failed required turn ended the conversation
        return await finish(
            database, context.run_id, _outcome(progress.all_passed), batch_id=context.batch_id
        )
    # Whether the conversation goes on after its scripted turns (a replay's: as it did).
    simulated = snapshot.simulation is not None
    if context.replay is not None:
        simulated = bool(context.replay.simulated) or context.replay.simulation_outcome is not None
    goes_on = simulated or bool(snapshot.conversation_criteria)
    remaining = _remaining(snapshot, done)
    if not remaining and not goes_on:  # nothing left to play
        return await finish(
            database, context.run_id, _outcome(progress.all_passed), batch_id=context.batch_id
        )
    try:
        for position, turn in enumerate(remaining):
            with tracing.turn(turn.order_index, "scripted"):
                played = await _play_scripted(context, turn, progress.history)
            progress.played(played)
            last = played.record.stopped_early or (position == len(remaining) - 1 and not goes_on)
            # The turns a failed required turn leaves unplayed are recorded with the run's end.
            skipped = [t.order_index for t in remaining[position + 1 :]] if last else []
            end = _outcome(progress.all_passed) if last else None
            successors = await _commit(database, context, played, end=end, skipped=skipped)
            if last:
                return successors
        outcome = context.simulation_outcome
        if context.replay is not None:
            outcome = await _replay_simulated(database, context, context.replay, progress)
        elif snapshot.simulation is not None and outcome is None:
            outcome = await _simulate(database, context, snapshot.simulation, progress)
    except _Overtaken:
        return None
    return await _conclude(database, context, progress, outcome)


async def _commit(
    database: Database,
    context: _Context,
    played: _Played,
    *,
    end: RunStatus | None = None,
    skipped: list[int] | None = None,
) -> list[UUID]:
    """Write a played turn (and, with ``end``, the run's end); raises :class:`_Overtaken`
    when another delivery wrote first."""
    cost = context.cost + played.cost
    outcome = await store.record_turn(
        database,
        context.run_id,
        played.record,
        played.results,
        cost,
        batch_id=context.batch_id,
        end=end,
        skipped=skipped or [],
    )
    if outcome is None:
        raise _Overtaken
    if end is not None:
        run_finished(end)
    context.cost = cost
    return outcome


async def _simulate(
    database: Database, context: _Context, simulation: SnapshotSimulation, progress: _Progress
) -> str:
    """Play the simulated user's turns until it is done or has played ``max_turns``: how
    the conversation ended.  Each turn is committed like a scripted one (its message with
    the agent's reply: a delivery killed before that commit has the simulator asked again
    for that turn, never for one committed), and a ``done`` answer is committed at once."""
    while progress.simulated < simulation.max_turns:
        answer = await _ask_simulator(context, simulation, progress)
        if answer.done:
            context.cost = context.cost + answer.cost
            outcome = str(answer.outcome)
            if not await store.settle_outcome(database, context.run_id, outcome, context.cost):
                raise _Overtaken
            return outcome
        index = len(context.snapshot.turns) + progress.simulated
        with tracing.turn(index, "simulated"):
            played = await _play(
                context,
                index=index,
                message=answer.message,
                criteria=[],
                required=False,
                history=progress.history,
                source="simulated",
                extra=answer.cost,
            )
        await _commit(database, context, played)
        progress.played(played)
        progress.simulated += 1
    return "max_turns"


async def _replay_simulated(
    database: Database, context: _Context, transcript: replay_.Transcript, progress: _Progress
) -> str | None:
    """A replay's simulated turns: the source run's, as stored, each committed like a
    played one (none written twice); how the source's simulated conversation ended."""
    for stored in transcript.simulated[progress.simulated :]:
        with tracing.turn(stored.turn_index, "simulated"):
            played = await _play(
                context,
                index=stored.turn_index,
                message=stored.user_message,
                criteria=[],
                required=False,
                history=progress.history,
                source="simulated",
            )
        await _commit(database, context, played)
        progress.played(played)
        progress.simulated += 1
    return transcript.simulation_outcome


@dataclass(frozen=True, slots=True)
class _Answer:
    """The simulator's answer, and what asking cost the run."""

    message: str
    done: bool
    outcome: str | None
    cost: CostSummary


async def _ask_simulator(
    context: _Context, simulation: SnapshotSimulation, progress: _Progress
) -> _Answer:
    """The simulated user's next message, or its end; a simulator that cannot be reached
    or gives no usable answer ends the run in error, put down to the simulator."""
    if context.simulator is None:
        raise RunAborted(NO_SIMULATOR)
    try:
        answer = await simulator.next_turn(
            context.egress,
            context.simulator,
            persona=simulation.persona,
            goal=simulation.goal,
            customer_context=context.snapshot.customer_context,
            conversation=progress.history,
            turns_left=simulation.max_turns - progress.simulated,
            model=simulation.model,
        )
    except EgressError as exc:
        raise RunAborted(f"simulator: {exc}") from None
    cost = CostSummary(
        simulator=CallCost(
            calls=answer.calls,
            input_tokens=answer.input_tokens,
            output_tokens=answer.output_tokens,
            latency_ms=round(answer.latency_ms, 1),
        ),
        estimated_cost_usd=_price(context.simulator, answer.input_tokens, answer.output_tokens),
    )
    return _Answer(answer.message, answer.done, answer.outcome, cost)


async def _conclude(
    database: Database, context: _Context, progress: _Progress, outcome: str | None
) -> list[UUID] | None:
    """Judge the conversation criteria on the whole conversation and end the run with their
    verdicts and the simulation's ``outcome``: passed when every turn and every
    conversation criterion passed."""
    criteria = context.snapshot.conversation_criteria
    verdicts = await asyncio.gather(
        *(_evaluate_conversation(context, c, progress) for c in criteria)
    )
    tracing.verdicts(criteria, verdicts)  # on the run's span
    results = [_result(criterion, v) for criterion, v in zip(criteria, verdicts, strict=True)]
    judged = _judge_cost(context, verdicts)
    passed = progress.all_passed and all(v.verdict == "PASS" for v in verdicts)
    status = _outcome(passed)
    successors = await store.conclude(
        database,
        context.run_id,
        status,
        context.cost + judged,
        batch_id=context.batch_id,
        outcome=outcome,
        results=results,
    )
    if successors is not None:
        run_finished(status)
    return successors


def _outcome(all_passed: bool) -> RunStatus:
    return RunStatus.PASSED if all_passed else RunStatus.FAILED


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


async def _play_scripted(context: _Context, turn: SnapshotTurn, history: list[Message]) -> _Played:
    """Render a scripted turn's message (a replay's: the message its source sent) and play
    it."""
    customer_context = context.snapshot.customer_context or {}
    if context.replay is not None:
        message = _stored(context.replay, turn.order_index).user_message
    else:
        try:
            message = await render_message(
                turn.user_message, customer_context, turn.order_index + 1
            )
        except RunAborted as exc:
            raise exc.on(ErrorTurn(turn.order_index)) from None
    return await _play(
        context,
        index=turn.order_index,
        message=message,
        criteria=turn.criteria,
        required=turn.required,
        history=history,
    )


async def _play(
    context: _Context,
    *,
    index: int,
    message: str,
    criteria: list[SnapshotCriterion],
    required: bool,
    history: list[Message],
    source: str = "scripted",
    extra: CostSummary | None = None,
) -> _Played:
    """Send the turn's message to the agent (a replay's: take the reply its source run
    stored), judge every criterion of the turn at once and look for the conversation
    criteria's texts in the reply.  ``extra``: what the turn cost besides the agent and the
    judge (the simulator that wrote its message)."""
    if context.replay is not None:
        stored = _stored(context.replay, index)
        reply, given, searched = _replayed(stored), stored.knowledge, []
    else:
        reply, given, searched = await _call_agent(context, index, message, history)
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
            *(_evaluate(context, c, conversation, reply, received_calls) for c in criteria)
        )
        matches = await _conversation_matches(context, reply)
    except RunAborted as exc:  # a check or the judge: the agent had answered
        raise exc.on(ErrorTurn(index, message, reply.content, calls)) from None
    tracing.verdicts(criteria, verdicts)
    passed = all(v.verdict == "PASS" for v in verdicts)
    record = TurnRecord(
        id=uuid.uuid4(),
        turn_index=index,
        user_message=message,
        response_content=reply.content,
        passed=passed,
        stopped_early=required and not passed,
        knowledge=given,
        redacted_keys=list(reply.redacted_keys),
        refusal=reply.refusal,
        tool_calls=calls,
        source=source,
        conversation_matches=matches,
    )
    results = [_result(criterion, v) for criterion, v in zip(criteria, verdicts, strict=True)]
    cost = _turn_cost(context, reply, verdicts)
    return _Played(record, results, cost + extra if extra else cost, conversation)


async def _call_agent(
    context: _Context, index: int, message: str, history: list[Message]
) -> tuple[AgentReply, Any, list[ToolCall]]:
    """The agent's reply to the turn's message, with what an llm agent was given from its
    knowledge and the searches that found it."""
    customer_context = context.snapshot.customer_context or {}
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
            metadata={"run_id": str(context.run_id), "turn_index": index},
            system_context=system_context,
        )
    except EgressError as exc:
        raise RunAborted(f"agent: {exc}", ErrorTurn(index, message)) from None
    return reply, given, searched


def _stored(transcript: replay_.Transcript, index: int) -> replay_.StoredTurn:
    """The source run's turn ``index`` (counted from 0), which a replay re-judges."""
    stored = transcript.turns.get(index)
    if stored is None:
        raise RunAborted(
            f"replay: run {transcript.run_id} has no reply for turn {index + 1} (it stopped "
            "before it): the scenario's criteria now let its conversation go further",
            ErrorTurn(index),
        )
    return stored


def _replayed(stored: replay_.StoredTurn) -> AgentReply:
    """A stored reply as the agent's: deterministic checks read it as stored (redacted),
    and it cost no call."""
    calls = tuple(stored.tool_calls)
    return AgentReply(
        content=stored.response_content,
        input_tokens=0,
        output_tokens=0,
        latency_ms=0.0,
        received=stored.response_content,
        redacted_keys=tuple(stored.redacted_keys),
        refusal=stored.refusal,
        tool_calls=calls,
        received_tool_calls=calls,
    )


def _result(criterion: SnapshotCriterion, v: _Verdict) -> CriterionRecord:
    return CriterionRecord(
        id=uuid.uuid4(),
        criteria_id=UUID(criterion.id),
        order_index=criterion.order_index,
        verdict=v.verdict,
        critique=v.critique,
        evidence=v.evidence,
        input_tokens=sum(j.input_tokens for j in v.judgements),
        output_tokens=sum(j.output_tokens for j in v.judgements),
        votes=v.votes,
    )


def _judge_cost(context: _Context, verdicts: list[_Verdict]) -> CostSummary:
    """What the judge's calls behind ``verdicts`` cost: every vote."""
    judgements = [j for v in verdicts for j in v.judgements]
    judge_in = sum(j.input_tokens for j in judgements)
    judge_out = sum(j.output_tokens for j in judgements)
    return CostSummary(
        judge=CallCost(
            calls=sum(j.calls for j in judgements),
            input_tokens=judge_in,
            output_tokens=judge_out,
            latency_ms=round(sum(j.latency_ms for j in judgements), 1),
        ),
        estimated_cost_usd=_price(context.judge_provider, judge_in, judge_out),
    )


def _turn_cost(context: _Context, reply: AgentReply, verdicts: list[_Verdict]) -> CostSummary:
    """What one turn cost: the agent's call (none for a replay's), the judge's calls,
    their estimated price."""
    agent = CostSummary(
        agent=CallCost(
            calls=0 if context.replay is not None else 1,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            latency_ms=round(reply.latency_ms, 1),
        ),
        estimated_cost_usd=_price(context.agent.provider, reply.input_tokens, reply.output_tokens),
    )
    return agent + _judge_cost(context, verdicts)
