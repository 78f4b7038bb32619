"""A scenario run's trace (docs/operations.md, "Traces"), when tracing is on
(:mod:`shared.traces`; each helper costs a check of a module flag when it is off):

* :func:`traced` — each delivery of a run plays in a trace of its own, under the run's
  span ``scenario_run {scenario name}``: the run, its scenario, agent, batch, delivery
  and conversation (``gen_ai.conversation.id``, the ``session_id`` the agent is sent).
  The run records the trace id of its latest delivery (``trace_id``): the trace it ended
  in, which holds its end.  A redelivered run (a worker died, a time limit) starts a new
  trace whose run span names the one before (``spar.run.previous_trace_id``); a trace
  is never continued from another process's, whose spans may never have left it.
* :func:`turn` — a span per turn, ``turn {index}``, under the run's;
* :func:`verdicts` — each criterion's verdict, a ``gen_ai.evaluation.result`` event on the
  current span (the turn's): the criterion's question (cut to
  :data:`EVALUATION_NAME_CHARS`), PASS or FAIL, and the critique (cut to
  :data:`EXPLANATION_CHARS`); never the evidence, which quotes the reply;
* :func:`run_finished` — a run's end, counted (:func:`shared.metrics.run_finished`) and,
  in its trace, its status on the run's span (``spar.run.status``); an end in error marks
  the span failed, with the kind of error (``agent``, ``judge``, ...) as ``error.type``,
  never the error message, which can quote what an agent answered.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar
from uuid import UUID

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from shared import metrics, traces
from shared.db.engine import Database
from shared.scenarios import store
from shared.scenarios.records import Claimed, SnapshotCriterion
from shared.scenarios.schemas import RunStatus

log = logging.getLogger("spar.runs")
T = TypeVar("T")

# The event the conventions name for an evaluation's result (the package has constants for
# attributes, none for event names).
EVALUATION_RESULT = "gen_ai.evaluation.result"
EVALUATION_NAME_CHARS = 200
EXPLANATION_CHARS = 500
# The kind of an error a run ended in: its message's first words, before a colon or a
# parenthesis ("agent: ...", "user message template failed (turn 2): ...").
_ERROR_KIND = re.compile(r"[a-z][a-z _-]{0,39}?(?=:| \()")


class Verdict(Protocol):
    verdict: str
    critique: str


def traced(
    database: Database, run_id: UUID, run: Claimed, play: Callable[[], Awaitable[T]]
) -> Callable[[], Awaitable[T]]:
    """``play`` (a delivery's play of the claimed run) in the run's trace, which the run
    records; ``play`` itself when tracing is off."""
    if not traces.enabled():
        return play

    async def play_traced() -> T:
        attributes: dict[str, Any] = {
            "spar.run.id": str(run_id),
            "spar.run.delivery": run.attempts,
            "spar.scenario.name": run.snapshot.name,
            "spar.agent.id": str(run.agent_id),
        }
        if run.session_id:
            attributes[gen_ai.GEN_AI_CONVERSATION_ID] = run.session_id
        with traces.root(f"scenario_run {run.snapshot.name}", attributes) as span:
            if span is not None:
                await _record(database, run_id, span)
            return await play()

    return play_traced


async def _record(database: Database, run_id: UUID, span: Any) -> None:
    """Record the trace's id on the run, and put on the run's span what the claim did not
    read: its scenario, batch and previous trace.  A failure loses the trace id, not the
    run."""
    trace_id = traces.trace_id(span)
    if trace_id is None:  # not sampled: nothing of it is exported
        return
    try:
        recorded = await store.trace(database, run_id, trace_id)
    except Exception:
        log.warning("could not record the trace id of run %s", run_id, exc_info=True)
        return
    if recorded is None:
        return
    span.set_attribute("spar.scenario.id", str(recorded.scenario_id))
    if recorded.batch_run_id is not None:
        span.set_attribute("spar.batch.id", str(recorded.batch_run_id))
    if recorded.previous_trace_id is not None:
        span.set_attribute("spar.run.previous_trace_id", recorded.previous_trace_id)


def turn(index: int, source: str | None = None) -> AbstractContextManager[Any]:
    """The span of the turn ``index`` (``source``: scripted or simulated, where known),
    around its playing."""
    if not traces.enabled():
        return traces.OFF
    attributes: dict[str, Any] = {"spar.turn.index": index}
    if source is not None:
        attributes["spar.turn.source"] = source
    return traces.child(f"turn {index}", attributes)


def verdicts(criteria: Sequence[SnapshotCriterion], results: Sequence[Verdict]) -> None:
    """Each criterion's verdict as an evaluation event on the current span."""
    if not traces.enabled():
        return
    span = traces.current()
    if span is None:
        return
    for criterion, result in zip(criteria, results, strict=True):
        attributes = {
            gen_ai.GEN_AI_EVALUATION_NAME: criterion.question[:EVALUATION_NAME_CHARS]
            or criterion.id,
            gen_ai.GEN_AI_EVALUATION_SCORE_LABEL: result.verdict,
            "spar.criterion.id": criterion.id,
            "spar.criterion.type": criterion.criteria_type,
        }
        # The judge's critique only: a check's quotes what the reply or its tool calls held.
        if result.critique and criterion.criteria_type == "llm_evaluated":
            attributes[gen_ai.GEN_AI_EVALUATION_EXPLANATION] = result.critique[:EXPLANATION_CHARS]
        span.add_event(EVALUATION_RESULT, attributes)


def run_finished(status: RunStatus, error: str | None = None) -> None:
    """A run reached ``status`` in this delivery (``error``: why it ended in error)."""
    metrics.run_finished(status)
    span = traces.run_span()
    if span is None:
        return
    span.set_attribute("spar.run.status", str(status))
    if status == RunStatus.ERROR:
        kind = _ERROR_KIND.match(error or "")
        traces.failed(span, kind.group(0) if kind else "error")
