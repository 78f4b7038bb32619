"""The rules a scenario's turns must keep beyond their types: a user message template
that renders with the scenario's ``customer_context``, a regular expression that
compiles, ``expected_arguments`` only on a ``tool_called`` criterion and within its size.
The scenario service applies them on create and update; ``spar scenarios
push`` applies the same ones to files before it sends anything (so this module stays
light: no database, no metrics)."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.errors import InvalidInput
from shared.scenarios import schemas, templates
from shared.scenarios.checks import PatternError, compile_pattern


def check_turns(turns: list[schemas.ScenarioTurnCreate], customer_context: dict[str, Any]) -> None:
    """Refuse turns a run could never play: a user message template that cannot render
    with ``customer_context``, a regular expression that does not compile, expected
    arguments on a criterion that does not read them or too large to be kept."""
    for t, turn in enumerate(turns):
        problem = templates.problem(turn.user_message, customer_context)
        if problem is not None:
            raise InvalidInput(
                ("body", "turns", str(t), "user_message"), problem, input=turn.user_message
            )
        for c, criterion in enumerate(turn.criteria):
            check_criterion(criterion, ("body", "turns", str(t), "criteria", str(c)))


def check_criterion(criterion: schemas.CriterionCreate, loc: tuple[str, ...]) -> None:
    """Refuse a criterion (at ``loc``) a run could never check: a regular expression that
    does not compile, expected arguments on a criterion that does not read them or too
    large to be kept."""
    if criterion.criteria_type == "regex":
        try:
            compile_pattern(criterion.question)
        except PatternError as exc:
            raise InvalidInput(
                (*loc, "question"),
                f"Invalid regular expression: {exc}",
                input=criterion.question,
            ) from None
    if criterion.expected_arguments is None:
        return
    where = (*loc, "expected_arguments")
    if criterion.criteria_type != "tool_called":
        raise InvalidInput(
            where,
            f"expected_arguments is for tool_called criteria; a {criterion.criteria_type} "
            "criterion takes none (leave it out or null)",
            input=criterion.expected_arguments,
        )
    size = len(msgspec.json.encode(criterion.expected_arguments))
    if size > schemas.MAX_EXPECTED_ARGUMENTS_BYTES:
        raise InvalidInput(
            where,
            f"expected_arguments is {size} bytes as JSON; at most "
            f"{schemas.MAX_EXPECTED_ARGUMENTS_BYTES} are taken",
            type="too_long",
            ctx={"max_length": schemas.MAX_EXPECTED_ARGUMENTS_BYTES},
        )
