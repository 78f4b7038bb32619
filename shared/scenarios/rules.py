"""The rules a scenario's turns must keep beyond their types: a user message template
that renders with the scenario's ``customer_context``, a regular expression that
compiles.  The scenario service applies them on create and update; ``spar scenarios
push`` applies the same ones to files before it sends anything (so this module stays
light: no database, no metrics)."""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidInput
from shared.scenarios import schemas, templates
from shared.scenarios.checks import PatternError, compile_pattern


def check_turns(turns: list[schemas.ScenarioTurnCreate], customer_context: dict[str, Any]) -> None:
    """Refuse turns a run could never play: a user message template that cannot render
    with ``customer_context``, a regular expression that does not compile."""
    for t, turn in enumerate(turns):
        problem = templates.problem(turn.user_message, customer_context)
        if problem is not None:
            raise InvalidInput(
                ("body", "turns", str(t), "user_message"), problem, input=turn.user_message
            )
        for c, criterion in enumerate(turn.criteria):
            if criterion.criteria_type == "regex":
                try:
                    compile_pattern(criterion.question)
                except PatternError as exc:
                    raise InvalidInput(
                        ("body", "turns", str(t), "criteria", str(c), "question"),
                        f"Invalid regular expression: {exc}",
                        input=criterion.question,
                    ) from None
