"""The rules a scenario must keep beyond its types: user message templates that render
with the scenario's ``customer_context``, regular expressions that compile (in its turns'
criteria and its conversation criteria).  The scenario service applies them on create
and update; ``spar scenarios push`` applies the same ones to files before it sends
anything (so this module stays light: no database, no metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.errors import InvalidInput
from shared.scenarios import schemas, templates
from shared.scenarios.checks import PatternError, compile_pattern


def check_scenario(body: schemas.ScenarioCreate) -> None:
    """Every rule of this module, on a whole scenario."""
    check_turns(body.turns, body.customer_context)
    check_conversation_criteria(body.conversation_criteria)


def check_turns(turns: list[schemas.ScenarioTurnCreate], customer_context: dict[str, Any]) -> None:
    """Refuse turns a run could never play: a user message template that cannot render
    with ``customer_context``, a regular expression that does not compile."""
    for t, turn in enumerate(turns):
        problem = templates.problem(turn.user_message, customer_context)
        if problem is not None:
            raise InvalidInput(
                ("body", "turns", str(t), "user_message"), problem, input=turn.user_message
            )
        _check_criteria(turn.criteria, ("body", "turns", str(t), "criteria"))


def check_conversation_criteria(criteria: list[schemas.CriterionCreate]) -> None:
    """Refuse a conversation criterion's regular expression that does not compile."""
    _check_criteria(criteria, ("body", "conversation_criteria"))


def _check_criteria(criteria: list[schemas.CriterionCreate], loc: Sequence[str]) -> None:
    for c, criterion in enumerate(criteria):
        if criterion.criteria_type == "regex":
            try:
                compile_pattern(criterion.question)
            except PatternError as exc:
                raise InvalidInput(
                    (*loc, str(c), "question"),
                    f"Invalid regular expression: {exc}",
                    input=criterion.question,
                ) from None
